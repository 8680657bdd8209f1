"""`--set KEY=VALUE` flags -> typed agent config overrides: each value parsed by its config field's type hint, and
the whole set checked by building the agent's config, so a bad value is a one-line UsageError before a run starts."""
from __future__ import annotations

import ast
import dataclasses
import types
import typing
from typing import Sequence

import agents
from launch.cli import UsageError


def parse_overrides(agent: str, items: Sequence[str]) -> dict[str, object]:
    """`["key=value", ...]` -> typed config overrides, checked by building the agent's config.

    Values are parsed by the field's annotated type: int, float, bool (true/false/1/0/yes/no), str,
    tuple[int, ...] (comma-separated: `hidden_sizes=128,128`), and `X | None` (`none`)."""
    cls = agents.config_class(agent)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    overrides: dict[str, object] = {}
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


def _parse_value(raw: str, annotation: object) -> object:
    """`raw` as a value of the type hint `annotation` (a class or a typing form; see `parse_overrides`)."""
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
