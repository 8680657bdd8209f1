"""The rate limiter's slack every replay agent's config derives (`DQNConfig.error_buffer`,
`D4PGConfig.error_buffer`). It lives apart from `agents.base` so that the configs import no builder code and
`agents.base` can name the config types (`agents.configs.AgentConfig`) without an import cycle."""
from __future__ import annotations


def error_buffer(batch_size: int, min_replay_size: int, samples_per_insert: float, tolerance: float) -> float:
    """Rate-limiter slack in sampled items, for every agent: Acme's `min_replay_size * samples_per_insert *
    tolerance`, but never less than one batch, so that a single-process loop can always alternate one insert and
    one learner step."""
    return max(float(batch_size), tolerance * samples_per_insert * min_replay_size)
