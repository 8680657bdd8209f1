"""D4PG (distributional critic, n-step, Gaussian exploration) for continuous control, with quantized actors."""
from agents.d4pg.builder import Builder
from agents.d4pg.config import D4PGConfig, sigma_for_actor

__all__ = ["Builder", "D4PGConfig", "sigma_for_actor"]
