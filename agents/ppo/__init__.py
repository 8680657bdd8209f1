"""PPO (clipped ratio, GAE, value and entropy terms) and A2C (its one-epoch, unclipped setting) with quantized
actors, for discrete (classic control, MinAtar) and continuous (DM Control, Gaussian policy) tasks."""
from agents.ppo.builder import Builder
from agents.ppo.config import A2CConfig, PPOConfig

__all__ = ["A2CConfig", "Builder", "PPOConfig"]
