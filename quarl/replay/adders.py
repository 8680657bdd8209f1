"""N-step transition adder (Acme's semantics) and a buffer that turns transitions into batched inserts. Both hand
out `quarl.replay.items.Transition`s: one per window from the adder, a batch ([N] per field) from the buffer.

Actors run the adder locally so that only finished n-step transitions cross to replay. For a window of
k <= n steps starting at t (with gamma the agent's discount and d the environment's per-step discounts):

    reward   = sum_{j<k} gamma^j * (prod_{i<j} d_{t+i}) * r_{t+j}
    discount = gamma^k * prod_{i<k} d_{t+i}

so the learner's target is `reward + discount * Q(next_observation)`. Unlike Acme (which leaves one gamma
for the learner to apply), `discount` here already holds the full gamma^k: the learner must not multiply
by gamma again. A termination makes d = 0 (no bootstrap); a truncation (time limit) keeps d = 1, so the
value of the last observation is still bootstrapped. At an episode's end the shorter windows are flushed.
With `start_transitions=True` an episode's start also yields the shorter windows from its first observation
(s_0 -> s_1, ..., s_0 -> s_{n-1}, before s_0 -> s_n), exactly the items Acme's `NStepTransitionAdder`
writes (acme/adders/reverb/transition.py), so an episode of T >= n steps gives T + n - 1 transitions.
"""
from __future__ import annotations

import collections
import math
import numbers
import dm_env
import numpy as np
import numpy.typing as npt

from quarl.replay.items import TRANSITION_KEYS, Signature, Transition, stack_items


def transition_signature(obs_dim: int, action_shape: tuple[int, ...],
                         action_dtype: npt.DTypeLike) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The replay signature of the transitions `NStepTransitionAdder` emits: {column: (shape, dtype)}."""
    if not isinstance(obs_dim, (int, np.integer)) or obs_dim < 1:
        raise ValueError(f"obs_dim must be a positive int, got {obs_dim!r}")
    return {
        "observation": ((int(obs_dim),), np.dtype(np.float32)),
        "action": (tuple(int(d) for d in action_shape), np.dtype(action_dtype)),
        "reward": ((), np.dtype(np.float32)),
        "discount": ((), np.dtype(np.float32)),
        "next_observation": ((int(obs_dim),), np.dtype(np.float32)),
    }


class NStepTransitionAdder:
    """Turns a stream of (action, timestep) into n-step transitions; see the module docstring."""

    def __init__(self, n_step: int, discount: float, *, start_transitions: bool = False):
        if not isinstance(n_step, (int, np.integer)) or isinstance(n_step, bool) or n_step < 1:
            raise ValueError(f"n_step must be a positive int, got {n_step!r}")
        if not (isinstance(discount, numbers.Real) and 0.0 <= discount <= 1.0):
            raise ValueError(f"discount must be in [0, 1], got {discount!r}")
        self.n_step = int(n_step)
        self.discount = float(discount)
        self.start_transitions = bool(start_transitions)
        # entries (observation, action, reward, env_discount) for the open windows, oldest first
        self._window: collections.deque = collections.deque()
        self._observation: np.ndarray | None = None
        self._from_start = False

    def reset(self) -> None:
        """Drops any partial windows (e.g. an episode abandoned mid-way); `add_first` must come next."""
        self._window.clear()
        self._observation = None

    def add_first(self, timestep: dm_env.TimeStep) -> None:
        """Starts an episode from its FIRST timestep."""
        if not timestep.first():
            raise ValueError(f"add_first needs a FIRST timestep, got {timestep.step_type}")
        self._window.clear()
        self._observation = _observation(timestep.observation)
        self._from_start = True  # the oldest open window still starts at s_0 (none has reached n steps yet)

    def add(self, action: npt.ArrayLike, next_timestep: dm_env.TimeStep) -> list[Transition]:
        """Records one step; returns the transitions that became complete (possibly none)."""
        if self._observation is None:
            raise ValueError("add called before add_first (or after an episode ended)")
        if next_timestep.first():
            raise ValueError("add got a FIRST timestep; start episodes with add_first")
        reward = _scalar(next_timestep.reward, "reward")
        env_discount = _scalar(next_timestep.discount, "discount")
        if not 0.0 <= env_discount <= 1.0:
            raise ValueError(f"environment discount must be in [0, 1], got {env_discount}")
        self._window.append((self._observation, np.array(action, copy=True), reward, env_discount))
        self._observation = _observation(next_timestep.observation)
        out = []
        # A window shorter than n before the episode's end can only be one that starts at s_0.
        if self.start_transitions and len(self._window) < self.n_step and not next_timestep.last():
            out.append(self._transition())
        if len(self._window) == self.n_step:
            out.append(self._transition())
            self._window.popleft()
            self._from_start = False
        if next_timestep.last():
            while self._window:
                out.append(self._transition())
                self._window.popleft()
            self._observation = None
        return out

    @property
    def pending(self) -> int:
        """Steps taken whose transitions are not emitted yet (open windows)."""
        return len(self._window)

    def flush(self) -> list[Transition]:
        """Emits the open (shorter than n) windows of an episode stopped mid-way, bootstrapping from the latest
        observation as a truncation would, and ends the episode (`add_first` must come next).

        Why: every step then yields its transition(s) (exactly one without `start_transitions`), so an actor that
        stops (end of budget, Ctrl-C, a lost node) loses none of the steps it took. With `start_transitions`, the
        window from s_0 was already emitted at the last step while no window had reached n steps: not again."""
        out = []
        if self.start_transitions and self._from_start and self._window:
            self._window.popleft()
        while self._window:
            out.append(self._transition())
            self._window.popleft()
        self._observation = None
        return out

    def _transition(self) -> Transition:
        """The transition for the window that starts at the oldest open step and ends now."""
        ret, weight = 0.0, 1.0
        for _, _, reward, env_discount in self._window:
            ret += weight * reward
            weight *= self.discount * env_discount
        obs, action, _, _ = self._window[0]
        assert self._observation is not None  # set by add_first, cleared only after the last window is out
        return Transition(obs, action, np.asarray(ret, np.float32), np.asarray(weight, np.float32), self._observation)


class TransitionBuffer:
    """Collects transitions and hands them out as batches (a `Transition` of [N, ...] fields) for `Table.insert`.

    With a `signature`, columns are cast to its dtypes and checked against its shapes, so a batch is
    exactly what the table expects.
    """

    def __init__(self, batch_size: int, signature: Signature | None = None):
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.batch_size = int(batch_size)
        if signature is not None and set(signature) != set(TRANSITION_KEYS):
            raise ValueError(f"signature columns {sorted(signature)} are not a transition's {sorted(TRANSITION_KEYS)}")
        self._signature = None if signature is None else [
            (tuple(signature[k][0]), np.dtype(signature[k][1])) for k in TRANSITION_KEYS]
        self._items: list[Transition] = []

    def __len__(self) -> int:
        return len(self._items)

    def add(self, transition: Transition) -> Transition | None:
        """Adds one transition; returns a full batch when one is ready."""
        if not isinstance(transition, Transition):
            raise ValueError(f"a TransitionBuffer takes Transitions, got {type(transition).__name__}")
        self._items.append(transition)
        if len(self._items) >= self.batch_size:
            return self._stack(self.batch_size)
        return None

    def extend(self, transitions: list[Transition]) -> list[Transition]:
        """Adds several transitions; returns every batch that became full."""
        batches = []
        for t in transitions:
            batch = self.add(t)
            if batch is not None:
                batches.append(batch)
        return batches

    def flush(self) -> Transition | None:
        """Returns what is left as a (smaller) batch, or None if empty."""
        return self._stack(len(self._items)) if self._items else None

    def _stack(self, n: int) -> Transition:
        batch = stack_items(self._items[:n])
        self._items = self._items[n:]
        if self._signature is None:
            return batch
        columns = []
        for key, column, (shape, dtype) in zip(TRANSITION_KEYS, batch, self._signature):
            column = column.astype(dtype, copy=False)
            if column.shape[1:] != shape:
                raise ValueError(f"transition field {key!r} has shape {column.shape[1:]}, expected {shape}")
            columns.append(column)
        return Transition(*columns)


def _observation(obs: npt.ArrayLike) -> np.ndarray:
    """A copy of the observation: float32, or its own integer dtype (uint8 images stay one byte a value)."""
    arr = np.array(obs, copy=True)
    if arr.dtype.kind in "iub":
        return arr
    arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all():  # the method, not np.all: this runs once per env step
        raise ValueError("non-finite observation given to the adder")
    return arr


def _scalar(value: object, what: str) -> float:
    if isinstance(value, (float, np.floating)):  # the common case (rewards, discounts), without array round trips
        x = float(value)
        if not math.isfinite(x):
            raise ValueError(f"non-finite {what}: {x}")
        return x
    if value is None:
        raise ValueError(f"{what} is None on a non-FIRST timestep")
    arr = np.asarray(value, dtype=np.float64)
    if arr.size != 1:
        raise ValueError(f"{what} must be a scalar, got shape {arr.shape}")
    x = float(arr.reshape(()))
    if not math.isfinite(x):
        raise ValueError(f"non-finite {what}: {x}")
    return x
