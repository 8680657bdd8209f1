"""Agent registry: name -> (Builder, config class), so runners and CLIs never import an agent by hand.

Agents are imported lazily: asking for "dqn" does not pay for importing D4PG's networks, and an agent whose
module fails to import only breaks the runs that ask for it.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING

from agents.configs import AgentConfig  # loads no agent: the config classes are named for type checkers only

if TYPE_CHECKING:  # the agents package stays light to import (CLIs validate flags with it before JAX loads)
    from agents.base import BuilderBase

# name -> (package, config class name inside `<package>.config`)
_AGENTS: dict[str, tuple[str, str]] = {
    "dqn": ("agents.dqn", "DQNConfig"),
    "d4pg": ("agents.d4pg", "D4PGConfig"),
    "ppo": ("agents.ppo", "PPOConfig"),
    "a2c": ("agents.ppo", "A2CConfig"),  # PPO's code in its one-epoch, unclipped setting
}
AGENT_NAMES: tuple[str, ...] = tuple(_AGENTS)


def _check_name(name: str) -> tuple[str, str]:
    if name not in _AGENTS:
        raise ValueError(f"unknown agent {name!r}: valid agents are {', '.join(AGENT_NAMES)}")
    return _AGENTS[name]


def config_class(name: str) -> type[AgentConfig]:
    """The frozen dataclass holding `name`'s hyper-parameters."""
    package, cls_name = _check_name(name)
    return getattr(importlib.import_module(f"{package}.config"), cls_name)


def builder_class(name: str) -> type["BuilderBase"]:
    package, _ = _check_name(name)
    return getattr(importlib.import_module(f"{package}.builder"), "Builder")


def make_config(name: str, **overrides: object) -> AgentConfig:
    """Default config with `overrides` applied; unknown keys or bad values raise a one-line ValueError."""
    cls = config_class(name)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown {name} config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(fields))}")
    try:
        return cls(**overrides)
    except TypeError as e:  # a value of the wrong type that the config's own checks did not catch
        raise ValueError(f"bad {name} config: {e}") from None


def task_defaults(name: str, task: str) -> dict[str, object]:
    """`name`'s tuned settings for `task` ({} where the defaults suit it), what the CLIs start from before the
    user's `--set` values: a config module may define `task_overrides(task, config_name) -> dict`."""
    package, cls_name = _check_name(name)
    hook = getattr(importlib.import_module(f"{package}.config"), "task_overrides", None)
    return {} if hook is None else dict(hook(task, cls_name))


def get_builder(name: str, **config_overrides: object) -> BuilderBase:
    """`agents.<name>.Builder(<Config>(**config_overrides))`."""
    return builder_class(name)(make_config(name, **config_overrides))


__all__ = ["AGENT_NAMES", "AgentConfig", "builder_class", "config_class", "get_builder", "make_config", "task_defaults"]
