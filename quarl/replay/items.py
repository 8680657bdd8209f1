"""The data actors hand to learners, typed: an n-step `Transition` (the adders' item, a replay table's row) and an
on-policy `Rollout` (the rollout sink's item, one PPO update's input); and what a replay table stores and hands
out: the column signature, its state, sampled batches, and their checks.

Why NamedTuples of arrays: the field names are the columns, so a table's signature, a learner's column table and
the items agree by construction; a NamedTuple is a JAX pytree (a `Rollout` goes into a jitted update as is) and
crosses a Ray process boundary without a custom serializer. A batch of items is the same type with a leading
axis on every field (`stack_items`).
"""
from __future__ import annotations

from typing import Generic, Mapping, NamedTuple, NotRequired, Sequence, TypeAlias, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt

# A Rollout's leaves: NumPy arrays on the host, jax.Array inside a jitted update.
ArrayT = TypeVar("ArrayT")


class Transition(NamedTuple):
    """One n-step transition (`quarl.replay.adders.NStepTransitionAdder`), or a batch of them (every field with a
    leading [N] axis). `discount` already holds gamma^k times the environment's discounts (0 after a termination),
    so the learner's target is `reward + discount * Q(next_observation)`."""

    observation: np.ndarray
    action: np.ndarray
    reward: np.ndarray  # float32
    discount: np.ndarray  # float32
    next_observation: np.ndarray


class Rollout(NamedTuple, Generic[ArrayT]):
    """One on-policy rollout (`quarl.acting.loop.RolloutSink`): [T steps, K environments, ...] per field.
    `discount` is the environment's (0 at a termination, 1 otherwise), `last` 1.0 where the step ended an episode,
    `next_observation` the observation that followed (an episode's final one on its LAST step, so a time limit
    still bootstraps), `behaviour_logp` the log-probability of the action under the (quantized) policy that
    chose it."""

    observation: ArrayT
    action: ArrayT
    reward: ArrayT  # float32
    discount: ArrayT  # float32
    last: ArrayT  # float32
    next_observation: ArrayT
    behaviour_logp: ArrayT  # float32


TRANSITION_KEYS: tuple[str, ...] = Transition._fields
ROLLOUT_KEYS: tuple[str, ...] = Rollout._fields
ItemT = TypeVar("ItemT", Transition, Rollout)


def stack_items(items: Sequence[ItemT]) -> ItemT:
    """Items of one type as one batch of it: each field stacked along a new leading axis (one item: a view)."""
    if not items:
        raise ValueError("nothing to stack")
    kind = type(items[0])
    if len(items) == 1:
        return kind(*(np.asarray(v)[None] for v in items[0]))
    return kind(*(np.stack([np.asarray(item[i]) for item in items]) for i in range(len(kind._fields))))


def concat_rollouts(rollouts: Sequence[Rollout[np.ndarray]]) -> Rollout[np.ndarray]:
    """Rollouts of the same T joined along the environment axis ([T, sum K, ...]), in the order given."""
    if len(rollouts) == 1:
        return rollouts[0]
    return Rollout(*(np.concatenate([np.asarray(r[i]) for r in rollouts], axis=1) for i in range(len(ROLLOUT_KEYS))))


def item_columns(batch: Transition | Rollout | Mapping[str, npt.ArrayLike]) -> Mapping[str, npt.ArrayLike]:
    """A typed item's fields as {column: array}; a mapping of columns as it is."""
    return batch._asdict() if isinstance(batch, (Transition, Rollout)) else batch


class Sample(NamedTuple):
    """A sampled batch: item keys (for `update_priorities`), sampling probabilities, and the columns."""

    keys: np.ndarray  # int64 [B]
    probabilities: np.ndarray  # float64 [B]
    data: dict[str, np.ndarray]  # each [B, ...]


class StackedSample(NamedTuple):
    """K batches from one `Table.sample_stacked` call, stacked: what a learner running K SGD steps per call feeds
    to its device as is (no per-batch objects to build, ship across a process boundary, or stack again).

    Its float columns are finite: the table refuses NaN and inf at insert (and at `load_state_dict`), so a
    consumer need not scan them again."""

    keys: np.ndarray  # int64 [K, B]
    probabilities: np.ndarray  # float64 [K, B]
    data: dict[str, np.ndarray]  # each [K, B, ...], C-contiguous


# A table's columns: {name: (per-item shape, dtype)}, the dtype as anything np.dtype accepts.
Signature: TypeAlias = Mapping[str, tuple[tuple[int, ...], npt.DTypeLike]]


class TableState(TypedDict):
    """A table's contents and counters as arrays and ints (`Table.state_dict`; orbax- and npz-storable, no
    pickle): the live items oldest first. A `quarl.replay.frames.FrameTable` stores its image columns compact:
    `frames` [F, H, W] and, in `data`, those columns as [N, K] indices into it (`frame_columns` names them)."""

    format_version: int
    inserts: int
    samples: int
    deletes: int
    keys: np.ndarray  # int64 [N]
    priorities: np.ndarray  # float64 [N]
    data: dict[str, np.ndarray]
    frames: NotRequired[np.ndarray]
    frame_columns: NotRequired[np.ndarray]


class SamplerSettings(TypedDict):
    """How a replay agent's table samples: "uniform" or "prioritized", and the priority exponent."""

    sampler: str
    priority_exponent: float


class TableConfig(SamplerSettings):
    """An agent's table and rate limiter as plain data (`agents.base.ReplayBuilder.table_config`;
    `quarl.replay.table_from_config` builds the table from it, in the runner's process or the replay server's)."""

    capacity: int
    samples_per_insert: float
    min_size_to_sample: int
    error_buffer: float | tuple[float, float]


class TableInfo(TypedDict):
    """`Table.info()`: what a run records of its replay (summary.json's `replay` section, replay.csv)."""

    name: str
    sampler: str
    capacity: int
    size: int
    inserts: int
    samples: int
    deletes: int
    samples_per_insert: float
    rate_limiter_diff: float
    insert_blocked_calls: int
    insert_blocked_s: float
    sample_blocked_calls: int
    sample_blocked_s: float
    closed: bool


def check_counts(batch_size: int, num_batches: int) -> tuple[int, int]:
    for name, value in (("num_batches", num_batches), ("batch_size", batch_size)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(batch_size), int(num_batches)


def check_priorities(priorities: npt.ArrayLike, n: int, what: str) -> np.ndarray:
    p = np.asarray(priorities, dtype=np.float64)
    if p.shape != (n,):
        raise ValueError(f"{what} must have shape ({n},), got {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{what} must be finite and >= 0")
    return p


def check_signature(signature: Signature) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    if not isinstance(signature, Mapping) or not signature:
        raise ValueError("signature must be a non-empty dict {column: (shape, dtype)}")
    checked = {}
    for name, spec in signature.items():
        try:
            shape, dtype = spec
            shape = tuple(int(d) for d in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError):
            raise ValueError(f"signature column {name!r} must be (shape, dtype), got {spec!r}") from None
        if not isinstance(name, str) or any(d < 0 for d in shape):
            raise ValueError(f"bad signature column {name!r}: {spec!r}")
        checked[name] = (shape, dtype)
    return checked

