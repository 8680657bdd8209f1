"""What every node needs to rebuild the agent's pieces in its own process (plain data, cheap to ship), and the
per-node seeds of a run."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Mapping, TypedDict

import numpy as np

import agents
from quarl.envs.factory import make_environment
from quarl.envs.spec import EnvSpec, environment_spec
from quarl.replay.items import TableConfig

if TYPE_CHECKING:  # agents.base imports JAX; the CLIs check their flags with this module before JAX loads
    from agents.base import BuilderBase, ReplayBuilder


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    """What every node needs to rebuild the agent's pieces in its own process (plain data, cheap to ship)."""

    agent: str
    task: str
    overrides: Mapping[str, object]

    def builder(self) -> "BuilderBase":
        return agents.get_builder(self.agent, **dict(self.overrides))

    def env_spec(self) -> EnvSpec:
        env = make_environment(self.task, 0)
        try:
            return environment_spec(env)
        finally:
            env.close()


def derive_seed(seed: int, *path: int) -> int:
    """Independent child seed for one node (e.g. `derive_seed(seed, ACTOR, i)`): no two nodes of one run,
    nor of runs with nearby seeds, share a random stream, which `seed + i` would not guarantee."""
    return int(np.random.SeedSequence([int(seed), *map(int, path)]).generate_state(1, np.uint32)[0] & 0x7FFFFFFF)


class TableSpec(TypedDict):
    """A replay table as plain data: its rate limiter settings and its columns ({name: [shape, dtype name]})."""

    config: TableConfig
    signature: dict[str, tuple[list[int], str]]


def table_spec(builder: "ReplayBuilder", env_spec: EnvSpec) -> TableSpec:
    """The replay table as plain data (rate limiter settings + column signature), so the replay server
    builds a `quarl.replay.table.Table` without importing the agent (and JAX) in its process."""
    signature = builder.transition_signature(env_spec)
    return {"config": builder.table_config(),
            "signature": {k: (list(shape), str(dtype)) for k, (shape, dtype) in signature.items()}}
