"""`AgentConfig`: the type of every agent's hyper-parameters, named once for the registry (`agents`) and the
builders (`agents.base.BuilderBase.config`). The config classes are named for type checkers only: importing this
module loads no agent (the CLIs validate flags with `agents` before JAX loads)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from agents.d4pg.config import D4PGConfig
    from agents.dqn.config import DQNConfig
    from agents.ppo.config import PPOConfig

# Every agent's hyper-parameters: a frozen dataclass (A2C's is a PPOConfig).
AgentConfig = Union["DQNConfig", "D4PGConfig", "PPOConfig"]
# The replay agents' (`agents.base.ReplayBuilder.config`): the ones with n-step, replay size and rate-limiter fields.
ReplayAgentConfig = Union["DQNConfig", "D4PGConfig"]
