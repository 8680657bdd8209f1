"""Test helpers for agents' actors."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt


def act_one(actor, observation: npt.ArrayLike) -> np.ndarray:
    """An actor's action for one observation: `act` on a batch of one (actors act on batches only)."""
    actions, _ = actor.act(np.asarray(observation)[None])
    return actions[0]
