"""DQN (double DQN, n-step, optional prioritized replay) for discrete-action tasks, with quantized actors."""
from agents.dqn.builder import Builder
from agents.dqn.config import DQNConfig, apex_epsilon, linear_epsilon

__all__ = ["Builder", "DQNConfig", "apex_epsilon", "linear_epsilon"]
