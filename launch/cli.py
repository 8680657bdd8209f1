"""Argument parsing and validation shared by the single-process and distributed training CLIs.

Contract for every launch CLI: any bad flag ends the program with ONE line on stderr and exit code 2, and
nothing is written — so everything (agent, task, agent/task compatibility, precision, backend, counts, config
overrides, log directory) is validated here before a run creates its log directory.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Mapping, NoReturn, Sequence

import agents
from launch.experiment_config import ConfigError, ExperimentConfig

EXIT_USAGE = 2
# Files a run writes; a logdir already holding any of them belongs to another run.
RUN_FILES = ("summary.json", "evaluator.csv", "learner.csv", "actor.csv")


class UsageError(ValueError):
    """A bad command-line value; CLIs print it as one line and exit 2."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but errors are one line (`prog: error: ...`) instead of usage + error, still exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: error: {message}")


def fail(message: str) -> NoReturn:
    """Prints `message` as a single stderr line and exits with the usage exit code."""
    sys.stderr.write(" ".join(str(message).split()) + "\n")
    sys.exit(EXIT_USAGE)


# ------------------------------------------------------------------------------------------------ parsers


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every training CLI shares (the distributed one adds its fleet flags on top)."""
    parser.add_argument("--agent", required=True, help=f"one of {', '.join(agents.AGENT_NAMES)}")
    parser.add_argument("--task", required=True, help="a DM Control 'domain:task' or a gym id (CartPole-v1)")
    parser.add_argument("--precision", default="int8", help="actor precision: fp32, fp16, bf16, int2..int16")
    parser.add_argument("--backend", default="auto",
                        help="actor runtime: auto, jax, onnx or onnx-nbits (int2..int4 on MatMulNBits)")
    parser.add_argument("--steps", type=int, required=True, help="actor (environment) steps to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", required=True, help="new or empty directory for CSV logs and summary.json")
    parser.add_argument("--eval-every", type=int, default=None, help="actor steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--actor-update-period", type=int, default=None,
                        help="actor steps between weight pulls (default: the agent config's)")
    parser.add_argument("--envs-per-actor", type=int, default=1, metavar="K",
                        help="environments each actor steps together, with one policy call per step on the "
                             "batch of K observations (default 1, the paper's setting)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="agent config override, repeatable (e.g. --set batch_size=128)")
    add_qat_argument(parser)


def add_qat_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--qat-bits", type=int, default=None, metavar="B",
                        help="quantization-aware training: the learner trains the policy through int-B fake "
                             "quantization (2..8), for actors deployed at --precision intB")


# ------------------------------------------------------------------------------------------------ checks


def check_agent(name: str) -> str:
    if name not in agents.AGENT_NAMES:
        raise UsageError(f"unknown agent {name!r}: valid agents are {', '.join(agents.AGENT_NAMES)}")
    return name


def check_precision(name: str) -> str:
    from quarl.quantization import parse_precision  # pylint: disable=import-outside-toplevel
    try:
        return parse_precision(name).name
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_backend(name: str) -> str:
    from quarl.runtimes import BACKEND_NAMES  # pylint: disable=import-outside-toplevel
    if name not in BACKEND_NAMES:
        raise UsageError(f"unknown backend {name!r}: valid backends are {', '.join(BACKEND_NAMES)}")
    return name


def check_positive(flag: str, value: int | None, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if value is None or value <= 0:
        raise UsageError(f"{flag} must be a positive integer, got {value}")
    return value


def parse_resources(flag: str, values: Sequence[str]) -> dict[str, float]:
    """Ray custom resources from `NAME` or `NAME=AMOUNT` strings (amount 1 by default, finite and > 0)."""
    import math  # pylint: disable=import-outside-toplevel

    out: dict[str, float] = {}
    for value in values:
        name, sep, amount = value.partition("=")
        name = name.strip()
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise UsageError(f"{flag} wants NAME or NAME=AMOUNT (NAME letters, digits, _ or -), got {value!r}")
        try:
            number = float(amount) if sep else 1.0
        except ValueError:
            raise UsageError(f"{flag} {value!r}: the amount must be a number") from None
        if not (math.isfinite(number) and number > 0):
            raise UsageError(f"{flag} {value!r}: the amount must be finite and > 0")
        out[name] = number
    return out


def check_seed(value: int) -> int:
    if value < 0:
        raise UsageError(f"--seed must be a non-negative integer, got {value}")
    return value


def check_logdir(path: str) -> Path:
    """The directory must be new or empty of run files, and creatable/writable by us. Nothing is left behind
    (writability is probed with a temporary directory that is removed at once, see `_can_create_in`)."""
    if not path or "\x00" in path:
        raise UsageError(f"--logdir must be a non-empty path without NUL characters, got {path!r}")
    try:
        p = Path(path).expanduser()
        exists = p.exists()
    except (OSError, ValueError, RuntimeError) as e:  # e.g. an unknown ~user, an over-long name
        raise UsageError(f"--logdir {path!r} is not a usable path: {e}") from None
    if exists:
        if not p.is_dir():
            raise UsageError(f"--logdir {path!r} exists and is not a directory")
        taken = [f for f in RUN_FILES if (p / f).exists()]
        if taken:
            raise UsageError(f"--logdir {path!r} already holds a run ({', '.join(taken)}); choose a new directory")
        if not _can_create_in(p):
            raise UsageError(f"--logdir {path!r} is not writable")
        return p
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not _can_create_in(parent):
        raise UsageError(f"--logdir {path!r} cannot be created: {str(parent)!r} is not a writable directory")
    return p


def _can_create_in(directory: Path) -> bool:
    """Whether we can create entries in `directory`, found out by trying (and removing the probe at once):
    permission bits say nothing for root, read-only mounts, /proc-like file systems or ACLs."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    try:
        probe = tempfile.mkdtemp(prefix=".quarl-logdir-probe-", dir=directory)
    except OSError:
        return False
    try:
        os.rmdir(probe)
    except OSError:
        pass
    return True


def parse_overrides(agent: str, items: Sequence[str]) -> dict[str, Any]:
    """`["key=value", ...]` -> typed config overrides, checked by building the agent's config.

    Values are parsed by the field's annotated type: int, float, bool (true/false/1/0/yes/no), str,
    tuple[int, ...] (comma-separated: `hidden_sizes=128,128`), and `X | None` (`none`)."""
    cls = agents.config_class(agent)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        if key not in fields:
            raise UsageError(f"unknown {agent} config key {key!r}; valid keys: {', '.join(sorted(fields))}")
        try:
            overrides[key] = _parse_value(raw.strip(), hints[key])
        except ValueError as e:
            raise UsageError(f"--set {key}: {e}") from None
    try:
        agents.make_config(agent, **overrides)
    except ValueError as e:
        raise UsageError(f"bad --set value: {e}") from None
    return overrides


def _parse_value(raw: str, annotation: Any) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and raw.lower() in ("none", "null"):
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _parse_value(raw, inner[0])
        raise ValueError(f"cannot parse {raw!r} as {annotation}")
    if origin is tuple:
        elem = args[0] if args else str
        parts = [p.strip() for p in raw.strip("()[] ").split(",") if p.strip()]
        return tuple(_parse_value(p, elem) for p in parts)
    if annotation is bool:
        low = raw.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"expected true/false, got {raw!r}")
    if annotation is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
    if annotation is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
    if annotation is str:
        return raw
    raise ValueError(f"cannot parse {raw!r} for a field of type {annotation}")


def check_agent_task(agent: str, task: str, overrides: dict[str, Any]) -> Any:
    """Builds the env once to check the task exists and suits the agent; returns the ready builder."""
    from quarl.envs import environment_spec, list_tasks, make_environment  # pylint: disable=import-outside-toplevel
    if task not in list_tasks():
        raise UsageError(f"unknown task {task!r}; valid tasks: {', '.join(list_tasks())}")
    builder = agents.get_builder(agent, **overrides)
    env = make_environment(task, 0)
    try:
        builder.policy_spec(environment_spec(env))
    except ValueError as e:
        raise UsageError(f"--agent {agent} cannot run --task {task}: {e}") from None
    finally:
        env.close()
    return builder


def check_carbon_country() -> str:
    """The energy trackers' grid country ($QUARL_CARBON_COUNTRY), checked before anything starts."""
    from quarl.carbon import default_country  # pylint: disable=import-outside-toplevel
    try:
        return default_country()
    except ValueError as e:
        raise UsageError(str(e)) from None


def qat_overrides(qat_bits: int | None, precision: str) -> dict[str, Any]:
    """`--qat-bits B` as a config override; QAT trains for int-B actors, so an intK --precision must match."""
    if qat_bits is None:
        return {}
    from quarl.qat import check_qat_bits  # pylint: disable=import-outside-toplevel
    try:
        bits = check_qat_bits(qat_bits, "--qat-bits")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if precision.startswith("int") and precision != f"int{bits}":
        raise UsageError(f"--qat-bits {bits} trains for int{bits} actors but --precision is {precision}: "
                         f"pass --precision int{bits} (or fp32 to evaluate the trained weights unquantized)")
    return {"qat_bits": bits}


# ------------------------------------------------------------------------------------------------ the config


def flag_names(**renames: str) -> dict[str, str]:
    """ExperimentConfig field -> the flag that sets it (`--eval-every`), with a CLI's own `renames`."""
    names = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(ExperimentConfig)}
    names.update(overrides="--set", actor_resources="--actor-resource", learner_resources="--learner-resource")
    names.update(renames)
    return names


def build_config(flags: Mapping[str, str], **fields: Any) -> ExperimentConfig:
    """`ExperimentConfig(**fields)`; its one-line ConfigError becomes a UsageError naming the flag."""
    try:
        return ExperimentConfig(**fields)
    except ConfigError as e:
        raise UsageError(e.message(flags)) from None


TRAIN_FLAGS = flag_names(max_actor_steps="--steps")


def validate_common(args: argparse.Namespace) -> ExperimentConfig:
    """`launch.train`'s experiment from its flags; every check (raising UsageError) before anything is written."""
    check_carbon_country()
    overrides = parse_overrides(check_agent(args.agent), args.overrides)
    period = check_positive("--actor-update-period", args.actor_update_period, optional=True)
    if period is not None:
        overrides["actor_update_period"] = period
    config = build_config(TRAIN_FLAGS, agent=args.agent, task=args.task, precision=args.precision,
                          backend=args.backend, max_actor_steps=args.steps, seed=args.seed, logdir=args.logdir,
                          eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                          envs_per_actor=args.envs_per_actor, overrides=overrides,
                          eval_fp32=bool(getattr(args, "eval_fp32", False)),
                          learner_device=getattr(args, "learner_device", "auto"))
    qat = qat_overrides(args.qat_bits, config.precision)
    if qat:
        config = config.replace(overrides={**config.overrides, **qat})
    check_logdir(config.logdir)
    check_agent_task(config.agent, config.task, dict(config.overrides))
    return config
