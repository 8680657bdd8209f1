"""`--set PATH=VALUE`: any field of a run's config (`ExperimentConfig`) by its dotted path, each value parsed by its
field's type hint, so a bad path or value is a one-line UsageError before a run starts.

Paths: `agent.FIELD` (the agent's config: `agent.batch_size=64`), `experiment.FIELD` or a bare `FIELD` (the
experiment's own: `eval_every=5000`), `distributed.FIELD` (`distributed.num_actors=2`). A bare name is looked up in
the agent's config first (`--set batch_size=64`, as before sections existed), then the experiment, then the
distributed settings. `settings_help` is the list of every addressable field that both CLIs' --help ends with.
"""
from __future__ import annotations

import argparse
import ast
import collections.abc
import dataclasses
import difflib
import textwrap
import types
import typing
from typing import Mapping, Sequence

import agents
from launch.cli import UsageError, build_config
from launch.experiments import config as experiment_config
from quarl.quant.precision import Precision

SECTIONS = ("agent", "experiment", "distributed")
# ExperimentConfig fields that are no --set path: the agent and task choose the agent section and its task preset
# (--agent, --task); overrides, task_preset and agent_config are the agent section, distributed a section itself.
_NOT_PATHS = ("agent", "task", "overrides", "task_preset", "agent_config", "distributed")
# Agent config fields that a flag of their own sets too (where a CLI has it).
AGENT_FIELD_FLAGS = {"actor_update_period": "--actor-update-period", "qat_bits": "--qat-bits",
                     "correction": "--correction"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The --set values by section, typed, and the path each field was given as (messages name it so)."""

    agent: dict[str, object]
    experiment: dict[str, object]
    distributed: dict[str, object]
    paths: dict[tuple[str, str], str]  # (section, field) -> the path given: "eval_every", "distributed.num_actors"

    def fields(self) -> dict[str, object]:
        """The experiment and distributed values flat, as `ExperimentConfig.create` takes them."""
        return {**self.experiment, **self.distributed}

    def flags(self) -> dict[str, str]:
        """ExperimentConfig field -> `--set PATH`, for a ConfigError's message (`ConfigError.message`)."""
        return {name: f"--set {path}" for (section, name), path in self.paths.items() if section != "agent"}

    def config(self, flags: Mapping[str, str], **fields: object) -> experiment_config.ExperimentConfig:
        """`launch.cli.build_config` of the flags' `fields` with the experiment and distributed values on top; a bad
        value's UsageError names its flag, or the --set path that gave it."""
        return build_config({**flags, **self.flags()}, **{**fields, **self.fields()})

    def check_once(self, args: argparse.Namespace, parser: argparse.ArgumentParser, flags: Mapping[str, str]) -> None:
        """A field given both by its flag (away from its default) and by --set is a UsageError: neither silently
        wins. `flags`: ExperimentConfig field -> its flag in this CLI (`launch.cli.flag_names`)."""
        for (section, name), path in self.paths.items():
            flag = (AGENT_FIELD_FLAGS if section == "agent" else flags).get(name)
            if flag is None:
                continue
            # The flag's dest: its name (--eval-every: eval_every), else the field's (--actor-resource: actor_resources).
            dest = next((d for d in (flag.lstrip("-").replace("-", "_"), name) if hasattr(args, d)), None)
            if dest is not None and getattr(args, dest) != parser.get_default(dest):
                raise UsageError(f"{flag} and --set {path} both set {name}: give one")


def section_fields(section: str, agent: str) -> dict[str, object]:
    """name -> type hint of each field `section` addresses (`agent`: that agent's config fields)."""
    if section == "agent":
        cls: type = agents.config_class(agent)
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}
    cls = experiment_config.ExperimentConfig if section == "experiment" else experiment_config.DistributedConfig
    hints = typing.get_type_hints(cls, localns={"AgentConfig": object})  # agent_config's type, never a path
    # A precision is given by its name, which the config parses itself.
    return {f.name: str if hints[f.name] is Precision else hints[f.name]
            for f in dataclasses.fields(cls) if f.init and f.name not in _NOT_PATHS}


def parse_settings(agent: str, items: Sequence[str], sections: Sequence[str] = SECTIONS,
                   exclude: Sequence[str] = ()) -> Settings:
    """`["path=value", ...]` -> typed values by section (`sections`: those this CLI addresses; `exclude`: fields
    it ignores). The agent values are checked by building the agent's config; the others by the experiment's."""
    known = {s: {k: v for k, v in section_fields(s, agent).items() if k not in exclude} for s in sections}
    out: dict[str, dict[str, object]] = {s: {} for s in SECTIONS}
    paths: dict[tuple[str, str], str] = {}
    for item in items:
        path, sep, raw = item.partition("=")
        path = path.strip()
        if not sep or not path:
            raise UsageError(f"--set expects PATH=VALUE, got {item!r}")
        section, name = _resolve(path, known)
        try:
            out[section][name] = _parse_value(raw.strip(), known[section][name])
        except ValueError as e:
            raise UsageError(f"--set {path}: {e}") from None
        paths[(section, name)] = path
    try:
        agents.make_config(agent, **out["agent"])
    except ValueError as e:
        raise UsageError(f"bad --set value: {e}") from None
    return Settings(out["agent"], out["experiment"], out["distributed"], paths)


def parse_overrides(agent: str, items: Sequence[str]) -> dict[str, object]:
    """`["key=value", ...]` -> typed agent config overrides (the agent section alone: `key` or `agent.key`).

    Values are parsed by the field's annotated type: int, float, bool (true/false/1/0/yes/no), str,
    tuple[int, ...] (comma-separated: `hidden_sizes=128,128`), and `X | None` (`none`)."""
    return parse_settings(agent, items, sections=("agent",)).agent


def _resolve(path: str, known: Mapping[str, Mapping[str, object]]) -> tuple[str, str]:
    """(section, field) of a --set path, or a UsageError naming the closest paths."""
    section, dot, name = path.partition(".")
    if dot and name in known.get(section, {}):
        return section, name
    if not dot:
        for section in known:
            if path in known[section]:
                return section, path
    if dot and section in SECTIONS and section not in known:
        raise UsageError(f"--set {path}: this command takes no {section} settings")
    if path in ("agent", "task"):
        raise UsageError(f"--set {path}: the agent and task are chosen with --{path}")
    candidates = [f"{s}.{n}" for s in known for n in known[s]] + [n for s in known for n in known[s]]
    close = difflib.get_close_matches(path, candidates, n=4, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(f"--set {path}: no such field{hint} (paths: {', '.join(s + '.FIELD' for s in known)}; "
                     "--help lists every field)")


def settings_help(sections: Sequence[str] = SECTIONS, exclude: Sequence[str] = ()) -> str:
    """The fields --set addresses, one wrapped line per section (agents with the same fields share one)."""
    paths = {"agent": "agent.FIELD", "experiment": "experiment.FIELD or FIELD", "distributed": "distributed.FIELD"}
    lines = [textwrap.fill(f"--set PATH=VALUE addresses these fields ({', '.join(paths[s] for s in sections)}; a "
                           "bare FIELD is looked up in this order):", width=118)]
    rows: list[tuple[str, list[str]]] = []
    for section in sections:
        if section != "agent":
            rows.append((section, [n for n in section_fields(section, "") if n not in exclude]))
            continue
        groups: dict[tuple[str, ...], list[str]] = {}
        for agent in agents.AGENT_NAMES:
            groups.setdefault(tuple(section_fields("agent", agent)), []).append(agent)
        rows += [(f"agent ({', '.join(names)})", list(names_)) for names_, names in groups.items()]
    for title, names in rows:
        lines.append(textwrap.fill(", ".join(sorted(names)), width=116, initial_indent=f"  {title}: ",
                                   subsequent_indent="      ", break_on_hyphens=False))
    return "\n".join(lines)


def _parse_value(raw: str, annotation: object) -> object:
    """`raw` as a value of the type hint `annotation` (a class or a typing form; see `parse_overrides`); a
    mapping (Ray resources) is written `name:amount,name:amount`."""
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
        if typing.get_origin(elem) is tuple:  # tuples of tuples (observation_bounds): one group per inner tuple
            return tuple(_parse_value(group, elem) for group in _groups(raw))
        parts = [p.strip() for p in raw.strip("()[] ").split(",") if p.strip()]
        return tuple(_parse_value(p, elem) for p in parts)
    if origin is collections.abc.Mapping:
        pairs = [p.partition(":") for p in raw.split(",") if p.strip()]
        if any(not sep or not k.strip() for k, sep, _ in pairs):
            raise ValueError(f"expected name:value pairs separated by commas, got {raw!r}")
        return {_parse_value(k.strip(), args[0]): _parse_value(v.strip(), args[1]) for k, _, v in pairs}
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


def _groups(raw: str) -> list[str]:
    """The comma-separated groups of a tuple of tuples, written `1,2;3,4` or `[[1, 2], [3, 4]]` (as JSON keeps
    `observation_bounds`): one string per inner tuple."""
    if ";" in raw:
        return [g for g in (g.strip() for g in raw.split(";")) if g]
    try:
        value = ast.literal_eval(raw)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        value = None
    if not isinstance(value, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in value):
        raise ValueError(f"expected groups as `1,2;3,4` or [[1, 2], [3, 4]], got {raw!r}")
    return [",".join(str(v) for v in g) for g in value]
