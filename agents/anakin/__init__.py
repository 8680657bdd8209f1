"""Jitted (Anakin) trainers: acting on gymnax environments and learning in one XLA program, vmapped over seeds, with
actors that run the quantized policy inside the jit (`agents.anakin.common`). `launch.anakin` runs them.

`make_trainer` builds one for an agent, with the run's length in env steps per seed (PPO's learning rate anneals over
it); `ANAKIN_AGENTS` are those it knows.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from agents.configs import AgentConfig
from quarl.quant.precision import Precision

if TYPE_CHECKING:  # JAX loads with the trainers, once a CLI's flags are checked
    from agents.anakin.common import Trainer
    from quarl.envs.gymnax_env import GymnaxEnv

ANAKIN_AGENTS = ("ppo", "a2c", "dqn")


def make_trainer(agent: str, env: GymnaxEnv, config: AgentConfig, precision: Precision, *, total_env_steps: int,
                 actor_update_period: int | None = None, envs_per_actor: int = 1) -> Trainer:
    """The jitted trainer of `agent` on `env`. `actor_update_period`: PPO/A2C updates (default 1), DQN env steps of
    one environment (default the config's), between the actors' quantized weight refreshes. `envs_per_actor`: DQN's
    environments stepped together (PPO/A2C step their config's `num_envs`)."""
    if agent not in ANAKIN_AGENTS:
        raise ValueError(f"the jitted trainer runs {', '.join(ANAKIN_AGENTS)}; got {agent!r}")
    if agent == "dqn":
        from agents.anakin.dqn import DQNTrainer  # pylint: disable=import-outside-toplevel
        return DQNTrainer(env, config, precision, total_env_steps=total_env_steps,
                          actor_update_period=actor_update_period, envs_per_actor=envs_per_actor)
    from agents.anakin.ppo import PPOTrainer  # pylint: disable=import-outside-toplevel
    steps_per_update = config.num_envs * config.num_steps
    return PPOTrainer(env, config, precision, total_updates=max(1, math.ceil(total_env_steps / steps_per_update)),
                      actor_update_period=actor_update_period or 1)
