"""Argument parsing and validation shared by the single-process and distributed training CLIs.

Contract for every launch CLI: any bad flag ends the program with ONE line on stderr and exit code 2, and
nothing is written — so everything (agent, task, agent/task compatibility, precision, backend, counts, config
overrides, log directory) is validated here before a run creates its log directory.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, NoReturn, Sequence

import agents
from agents.loops import LOOP_FORMS
from launch.experiments.config import (
    ALE_EVAL_EPISODES, DISTRIBUTED_FIELDS, EVALUATION_HELP, ExperimentConfig, actor_precision,
)
from quarl.envs.factory import canonical_task, list_tasks, make_environment, unknown_task_message
from quarl.envs.spec import environment_spec
from quarl.nets.qat import check_qat_bits
from quarl.ops.carbon import default_country
from quarl.ops.checks import ConfigError, check_int
from quarl.quant.precision import Precision

if TYPE_CHECKING:  # agents.base imports JAX, which a CLI loads only once its flags are valid
    from agents.base import BuilderBase

EXIT_USAGE = 2
# Files a run writes; a logdir already holding any of them belongs to another run.
RUN_FILES = ("summary.json", "evaluator.csv", "learner.csv", "actor.csv")


class UsageError(ValueError):
    """A bad command-line value; CLIs print it as one line and exit 2."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help keeps the module docstring's layout (the whole of it is the description) and ends each flag's help
    with its default, unless the help already says it or there is none (None, False, an empty list). A default of
    0 or 0.0 is shown: it equals False, but it is a value the flag takes."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False or default == argparse.SUPPRESS or default == []:
            return text
        return f"{text} (default: %(default)s)" if action.option_strings else text


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but errors are one line (`prog: error: ...`) instead of usage + error, still exit 2; --help
    shows the whole description and every default (`HelpFormatter`), then `epilog()` where one is given (built
    only when help is asked for: the --set field list imports every agent's config)."""

    def __init__(self, prog: str | None = None, description: str | None = None,
                 formatter_class: type[argparse.HelpFormatter] = HelpFormatter,
                 epilog: Callable[[], str] | None = None):
        super().__init__(prog=prog, description=description, formatter_class=formatter_class)
        self._epilog_fn = epilog

    def format_help(self) -> str:
        if self._epilog_fn is not None:
            self.epilog = self._epilog_fn()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: error: {message}")


def fail(message: str) -> NoReturn:
    """Prints `message` as a single stderr line and exits with the usage exit code."""
    sys.stderr.write(" ".join(str(message).split()) + "\n")
    sys.exit(EXIT_USAGE)


def warn(prog: str, messages: Sequence[str]) -> None:
    """Each message as one `prog: warning: ...` line on stderr; the run goes on."""
    for message in messages:
        sys.stderr.write(f"{prog}: warning: {' '.join(str(message).split())}\n")


# ------------------------------------------------------------------------------------------------ parsers


# Both launchers' defaults: the agent, its task and its step budget (`make run`'s job for d4pg).
DEFAULT_AGENT = "d4pg"
DEFAULT_TASKS = {"d4pg": "cartpole:balance", "dqn": "CartPole-v1", "ppo": "CartPole-v1", "a2c": "CartPole-v1"}
DEFAULT_STEPS = {"d4pg": 60_000, "dqn": 25_000, "ppo": 100_000, "a2c": 100_000}
TASK_HELP = ("a DM Control 'domain:task', a gym id (CartPole-v1), MinAtar/<Game>, or ALE/<Game> (gymnasium's "
             "ALE/<Game>-v5 too); MinAtar and ALE tasks start from the agent's pixel preset (docs/pixel_tasks.md); "
             "default: " + ", ".join(f"{t} for {a}" for a, t in DEFAULT_TASKS.items()))
TARGET_RETURN_HELP = ("end the run once --target-streak evaluations in a row have a mean return at or above this; "
                      "summary.json's `solved` names the evaluation that ended that streak")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every training CLI shares (the distributed one adds its fleet flags on top)."""
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="run the experiment in this JSON file: an ExperimentConfig, or a run's summary.json "
                             "(its `experiment` object); only --logdir, --seed and --no-progress may be added")
    parser.add_argument("--agent", default=None, help=f"one of {', '.join(agents.AGENT_NAMES)} (default: "
                                                      f"{DEFAULT_AGENT})")
    parser.add_argument("--task", default=None, help=TASK_HELP)
    parser.add_argument("--list-tasks", action=ListTasksAction)
    parser.add_argument("--precision", default="int8", help="actor precision: fp32, fp16, bf16, int2..int8, int16 (shorthands 32, 16, 8..2)")
    parser.add_argument("--backend", default="auto",
                        help="actor runtime: auto, jax, onnx or onnx-nbits (int2..int4 on MatMulNBits)")
    parser.add_argument("--kernel-form", default=None, metavar="FORM",
                        help="ONNX integer kernel form to pin (u8s8, u8u8, fp32 = the dequantized graph, ...; "
                             "still self-checked): with --backend onnx and the same seed, a rerun on a CPU of the "
                             "same class computes the same numbers (default: this CPU's choice)")
    parser.add_argument("--steps", type=int, default=None, help="actor (environment) steps to run (default: "
                        + ", ".join(f"{n} for {a}" for a, n in DEFAULT_STEPS.items()) + ")")
    parser.add_argument("--seed", type=int, default=None, help="the run's seed (default: 0)")
    parser.add_argument("--logdir", default=None, help="new or empty directory for CSV logs and summary.json "
                                                       "(default: runs/train/<agent>-<task>-<precision>-<time>)")
    parser.add_argument("--eval-every", type=int, default=None,
                        help=f"actor steps between evaluations (default: {EVALUATION_HELP})")
    parser.add_argument("--eval-episodes", type=int, default=None,
                        help="greedy episodes per evaluation (default: 10; ALE: "
                             f"{ALE_EVAL_EPISODES}, its episodes run to thousands of steps)")
    parser.add_argument("--target-return", type=float, default=None, help=TARGET_RETURN_HELP + " (default: none)")
    parser.add_argument("--target-streak", type=int, default=1,
                        help="evaluations in a row that must reach --target-return")
    parser.add_argument("--actor-update-period", type=int, default=None,
                        help="actor steps between weight pulls (default: the agent config's)")
    parser.add_argument("--envs-per-actor", type=int, default=1, metavar="K",
                        help="environments each actor steps together, with one policy call per step on the "
                             "batch of K observations (default 1, the paper's setting)")
    add_set_argument(parser)
    add_learner_loop_argument(parser)
    add_qat_argument(parser)


def add_set_argument(parser: argparse.ArgumentParser, distributed: bool = False) -> None:
    example = ", distributed.num_actors=2" if distributed else ""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="any config field by its dotted path, repeatable: agent.batch_size=128 (or bare "
                             f"batch_size=128: an agent field first), eval_every=5000{example}; the fields are "
                             "listed at the end of --help")


def add_learner_loop_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--learner-loop", default="auto", choices=LOOP_FORMS,
                        help="the learner's SGD loops (K steps per call; PPO's epochs x minibatches): auto (the "
                             "scan; agents.loops says why), scan, or unroll (one jit, no loop; slower to compile)")


def add_qat_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--qat-bits", type=int, default=None, metavar="B",
                        help="quantization-aware training: the learner trains the policy through int-B fake "
                             "quantization (2..8), for actors deployed at --precision intB")


# ------------------------------------------------------------------------------------------------ checks


def check_agent(name: str) -> str:
    if name not in agents.AGENT_NAMES:
        raise UsageError(f"unknown agent {name!r}: valid agents are {', '.join(agents.AGENT_NAMES)}")
    return name


def check_actor_precision(name: str) -> Precision:
    """--precision, parsed once: an actor precision (`ACTOR_PRECISIONS`: fp32, bf16, fp16, int2..int8, int16)."""
    try:
        return actor_precision(name)
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_precision(name: str) -> str:
    """`check_actor_precision`'s canonical name, for the CLIs that key their records by it (launch.ptq,
    launch.reproduce)."""
    return check_actor_precision(name).name


def check_backend(name: str) -> str:
    from quarl.runtimes import BACKEND_NAMES  # pylint: disable=import-outside-toplevel
    if name not in BACKEND_NAMES:
        raise UsageError(f"unknown backend {name!r}: valid backends are {', '.join(BACKEND_NAMES)}")
    return name


def check_positive(flag: str, value: int | None, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    return _flag_int(flag, value, minimum=1)


def _flag_int(flag: str, value: object, *, minimum: int) -> int:
    """`quarl.ops.checks.check_int` on a flag's value, its ConfigError as the CLI's one-line UsageError."""
    try:
        return check_int(flag, value, minimum=minimum)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def parse_resources(flag: str, values: Sequence[str]) -> dict[str, float]:
    """Ray custom resources from `NAME` or `NAME=AMOUNT` strings (amount 1 by default, finite and > 0)."""
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
    return _flag_int("--seed", value, minimum=0)


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


def check_agent_task(config: ExperimentConfig) -> "BuilderBase":
    """Builds the task's env once to check it exists and suits the agent; returns the config's ready builder."""
    task = check_task(config.task)
    builder = config.builder()
    env = make_environment(task, 0)
    try:
        builder.policy_spec(environment_spec(env))
    except ValueError as e:
        raise UsageError(f"--agent {config.agent} cannot run --task {task}: {e}") from None
    finally:
        env.close()
    return builder


def check_task(task: str) -> str:
    """`task` as the environment factory names it (gymnasium's `ALE/Pong-v5` is `ALE/Pong`), or a one-line
    UsageError naming the closest valid ids."""
    name = canonical_task(task)
    if name not in list_tasks():
        raise UsageError(unknown_task_message(task) + "; --list-tasks prints them all")
    return name


class ListTasksAction(argparse.Action):
    """--list-tasks: every task id, one per line by family, then exit 0 (before any other flag is checked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print every valid --task id and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> NoReturn:
        for task in list_tasks():
            print(task)
        parser.exit(0)


def check_carbon_country() -> str:
    """The energy trackers' grid country ($QUARL_CARBON_COUNTRY), checked before anything starts."""
    try:
        return default_country()
    except ValueError as e:
        raise UsageError(str(e)) from None


def qat_overrides(qat_bits: int | None, precision: Precision) -> dict[str, object]:
    """`--qat-bits B` as a config override; QAT trains for int-B actors, so an intK --precision must match."""
    if qat_bits is None:
        return {}
    try:
        bits = check_qat_bits(qat_bits, "--qat-bits")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if precision.is_int and precision.bits != bits:
        raise UsageError(f"--qat-bits {bits} trains for int{bits} actors but --precision is {precision}: "
                         f"pass --precision int{bits} (or fp32 to evaluate the trained weights unquantized)")
    return {"qat_bits": bits}


# ------------------------------------------------------------------------------------------------ the config


def flag_names(**renames: str) -> dict[str, str]:
    """ExperimentConfig field -> the flag that sets it (`--eval-every`), with a CLI's own `renames`."""
    fields = [*(f.name for f in dataclasses.fields(ExperimentConfig)), *DISTRIBUTED_FIELDS]
    names = {name: "--" + name.replace("_", "-") for name in fields}
    names.update(overrides="--set", actor_resources="--actor-resource", learner_resources="--learner-resource")
    names.update(renames)
    return names


def build_config(flags: Mapping[str, str], **fields: object) -> ExperimentConfig:
    """`ExperimentConfig.create(**fields)`; its one-line ConfigError becomes a UsageError naming the flag."""
    try:
        return ExperimentConfig.create(**fields)
    except ConfigError as e:
        raise UsageError(e.message(flags)) from None
