"""What every agent's fp32 learner shares, so each agent's `learning.py` holds only its training state, losses and
`make_update_fn` (issue 23's "one learner base"):

- the step counter (a host copy: reading the device counter would make the host wait for every update);
- batch coercion from the agent's column table, with one non-finite rule for every agent (a NaN or inf in any
  float column is a ValueError on the host, before the batch reaches the device);
- one SGD step per call (`step`), or K SGD steps in one jitted `lax.scan` over K stacked batches
  (`prepare` + `run_block`; Acme's `process_multiple_batches`; unrolled instead with `agents.loops`), which removes
  K - 1 host round trips and dispatches per K steps: what a GPU learner needs to run at device speed;
- state save/restore with structure, shape and finiteness checks; policy params for actors, as a NumPy copy or
  as a device snapshot the publisher quantizes where it lives.

`prepare` (host work and the host-to-device copy) and `run_block` (device work) are separate so that a prefetch
thread can prepare the next block while the current one trains (`launch.distributed.nodes.learner`).
"""
from __future__ import annotations

import abc
from typing import Callable, ClassVar, Mapping, NamedTuple, Protocol, Self, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from chex import ArrayTree
from numpy.typing import DTypeLike

from agents.loops import sgd_loop
from quarl.replay.items import Rollout, Sample, StackedSample, item_columns

# column -> (dtype, shape of one item); None = any shape (checked only for a common batch size). Items of shape
# () may arrive as [B, 1] and are flattened to [B].
Columns = Mapping[str, tuple[DTypeLike, tuple[int, ...] | None]]
# What a learner trains on: a replay `Sample`, an on-policy `Rollout`, or a plain mapping of columns ([B, ...] each).
Batch = Sample | Rollout[np.ndarray] | Mapping[str, np.ndarray]
# Metrics of an update: 0-d (or [B]) device arrays, stacked to [K, ...] by `run_block`; host arrays where a learner
# brings some back itself (DQN's |TD| priorities for a prioritized table).
Metrics = dict[str, jax.Array | np.ndarray]


class TrainingState(Protocol):
    """An agent's training state: a NamedTuple of device trees (parameters, optimizer states) with a `steps` counter.
    The scaffold reads and replaces its fields by name, so the Protocol names the NamedTuple methods it uses."""

    steps: jax.Array
    _fields: ClassVar[tuple[str, ...]]

    def _replace(self, **fields: ArrayTree | None) -> Self: ...

    def _asdict(self) -> dict[str, ArrayTree]: ...


UpdateFn = Callable[[TrainingState, Mapping[str, jax.Array]], tuple[TrainingState, Mapping[str, jax.Array]]]


class Block(NamedTuple):
    """K sampled batches, checked and stacked ([K, B, ...] per column), already copied to the learner's device."""

    batches: Mapping[str, jax.Array]
    keys: np.ndarray | None  # int64 [K, B] replay keys (for priority updates); None for plain mappings
    size: int  # K


def to_numpy(tree: ArrayTree) -> ArrayTree:
    """Host copies of a device tree. Real copies: on CPU `device_get` may alias the device buffers, which a donating
    update reuses."""
    return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), jax.device_get(tree))


class JaxLearner(abc.ABC):
    """The scaffold; an agent subclass builds its initial `TrainingState` (a NamedTuple with a `steps` field) and
    its pure update `(state, batch) -> (state, metrics)`, then calls `super().__init__`.

    Metrics are 0-d device arrays (stacked to [K] by `run_block`): reading them back would make the host wait for
    the device, so callers convert them only when they log."""

    agent_name: ClassVar[str] = "agent"
    columns: Columns  # set by the subclass before super().__init__

    # State fields the update never donates: the policy trees actors run. Their arrays stay valid after later
    # updates, so a snapshot for the publisher is a reference (no device copy on the training thread).
    kept_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, state: TrainingState, update: UpdateFn, *, donate: bool):
        self._state = state
        self._steps = int(state.steps)
        self._donate = donate
        kept = self.kept_fields if donate else ()
        unknown = [f for f in kept if f not in state._fields]
        if unknown:
            raise ValueError(f"{self.agent_name}: kept_fields {unknown} are not training state fields")
        self._kept = kept

        def join(donated: TrainingState, kept_values: tuple[ArrayTree, ...]) -> TrainingState:
            return donated._replace(**dict(zip(kept, kept_values)))

        def update_split(donated: TrainingState, kept_values: tuple[ArrayTree, ...],
                         batch: Mapping[str, jax.Array]) -> tuple[TrainingState, Mapping[str, jax.Array]]:
            return update(join(donated, kept_values), batch)

        def scan_split(donated: TrainingState, kept_values: tuple[ArrayTree, ...],
                       batches: Mapping[str, jax.Array]) -> tuple[TrainingState, Mapping[str, jax.Array]]:
            return sgd_loop(update, join(donated, kept_values), batches)

        # Only the first argument (the state without the kept fields) is donated.
        donate_args = (0,) if donate else ()
        self._update = jax.jit(update_split, donate_argnums=donate_args)
        self._scan = jax.jit(scan_split, donate_argnums=donate_args)
        # A snapshot of a donated policy tree must be a device copy (the donating update frees its buffers).
        self._copy = jax.jit(lambda t: jax.tree_util.tree_map(jnp.copy, t))
        if donate and not kept:  # compiled now: the first hand-over to the publisher costs a dispatch, not a compile
            jax.block_until_ready(self._copy(self._policy_tree()))

    def _split(self) -> tuple[TrainingState, tuple[ArrayTree, ...]]:
        """(the state with the kept fields set to None, their values): the donated and the kept arguments."""
        if not self._kept:
            return self._state, ()
        return self._state._replace(**{f: None for f in self._kept}), tuple(getattr(self._state, f) for f in self._kept)

    # ------------------------------------------------------------------ hooks

    @abc.abstractmethod
    def _policy_tree(self) -> ArrayTree:
        """The device tree of the policy actors run."""

    def _extra_columns(self, sample: Batch | StackedSample, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Columns the update needs beyond the sampled data (DQN: the PER sampling probabilities)."""
        del sample, batch
        return {}

    def _host_outputs(self, metrics: Metrics) -> Metrics:
        """The metrics a caller gets (DQN: |TD| priorities brought to the host for a prioritized table)."""
        return metrics

    # ------------------------------------------------------------------ training

    @property
    def steps(self) -> int:
        """Number of SGD steps taken."""
        return self._steps

    def compile(self, sample: Batch) -> None:
        """Compiles `step` for `sample`'s shapes ahead of time (nothing runs, the state is untouched), so the first
        real update of a run does not pay for compilation: a distributed learner does it before its first version."""
        self._update.lower(*self._split(), self._coerce(sample)).compile()

    def step(self, sample: Batch) -> Metrics:
        """One SGD step on a `quarl.replay.items.Sample` (or a plain mapping of columns)."""
        batch = self._coerce(sample)
        self._state, metrics = self._update(*self._split(), batch)
        self._steps += 1
        return self._host_outputs(dict(metrics))

    def wait(self) -> None:
        """Blocks until every dispatched update has run on the device (updates are asynchronous)."""
        jax.block_until_ready(self._state)

    def prepare(self, samples: Sequence[Batch] | StackedSample) -> Block:
        """K samples checked, stacked and copied to the device (thread-safe: touches no learner state).

        A `quarl.replay.items.StackedSample` (the replay's `sample_stacked`) is already stacked, and its float columns
        were checked finite by the table at insert: only dtypes and shapes are checked, no pass over the data."""
        if isinstance(samples, StackedSample):
            columns = self._coerce(samples, lead=2, check_finite=False)
            k = int(np.shape(samples.keys)[0])
            if k == 1:  # one batch: `run_block` runs the single-step update on it, `step`'s exact computation
                columns = {c: v[0] for c, v in columns.items()}
            return Block(jax.device_put(columns), np.asarray(samples.keys, np.int64), k)
        if not samples:
            raise ValueError("a block needs at least one sampled batch")
        batches = [self._coerce(s) for s in samples]
        sizes = {b[next(iter(b))].shape[0] for b in batches}
        if len(sizes) != 1:
            raise ValueError(f"{self.agent_name} block: batches of different sizes {sorted(sizes)}")
        # One batch stays unstacked: `run_block` then runs the single-step update, `step`'s exact computation.
        columns = batches[0] if len(batches) == 1 else {k: np.stack([b[k] for b in batches]) for k in batches[0]}
        keys = [s.keys if isinstance(s, Sample) else None for s in samples]  # Samples only
        keys_arr = None if any(k is None for k in keys) else np.stack([np.asarray(k, np.int64) for k in keys])
        return Block(jax.device_put(columns), keys_arr, len(samples))

    def run_block(self, block: Block) -> Metrics:
        """`block.size` SGD steps in one jitted `lax.scan`; the same arithmetic as that many `step` calls.
        Metrics come back stacked ([K]; per-item ones [K, B]), except for a one-batch block (as `step`)."""
        if block.size == 1:
            self._state, metrics = self._update(*self._split(), block.batches)
        else:
            self._state, metrics = self._scan(*self._split(), block.batches)
        self._steps += block.size
        return self._host_outputs(dict(metrics))

    def _coerce(self, sample: Batch | StackedSample, lead: int = 1, check_finite: bool = True) -> dict[str, np.ndarray]:
        """Columns as the dtypes and item shapes the update was compiled for (else ValueError). `lead` leading axes
        index items ([B] or [K, B]); `check_finite=False` only for data a replay table checked at insert."""
        data = sample.data if isinstance(sample, (Sample, StackedSample)) else item_columns(sample)
        name = self.agent_name
        missing = [k for k in self.columns if k not in data]
        if missing:
            raise ValueError(f"{name} batch is missing column(s) {missing}; it needs {list(self.columns)}")
        batch = {}
        for key, (dtype, shape) in self.columns.items():
            arr = np.asarray(data[key], dtype)
            if shape == ():  # [B, 1] items arrive too
                arr = arr.reshape(*arr.shape[:lead - 1], -1) if arr.ndim >= lead else arr.reshape(-1)
            batch[key] = arr
        first = batch[next(iter(batch))]
        n = first.shape[:lead] if first.ndim >= lead else (-1,)
        for key, (dtype, shape) in self.columns.items():
            arr = batch[key]
            expected = (*n, *shape) if shape is not None else None
            if arr.ndim < lead or arr.shape[:lead] != n or (expected is not None and arr.shape != expected):
                raise ValueError(f"{name} batch column {key!r} has shape {arr.shape}, expected "
                                 f"{expected if expected is not None else (*n, '...')}")
            if check_finite and arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise ValueError(f"{name} batch column {key!r} contains NaN or inf")
        batch.update(self._extra_columns(sample, batch))
        return batch

    # ------------------------------------------------------------------ weights

    def policy_params(self) -> ArrayTree:
        """The fp32 haiku tree of the policy actors run (NumPy copies), for `quarl.quant.quantization.quantize_params`."""
        return to_numpy(self._policy_tree())

    def policy_snapshot(self) -> ArrayTree:
        """The same tree as device arrays that stay valid after later updates: a reference when the tree is one of
        `kept_fields` (never donated) or the update donates nothing, else a device-side copy (one asynchronous
        dispatch). No device-to-host copy either way: what the training thread hands to the publisher."""
        tree = self._policy_tree()
        if not self._donate or any(tree is getattr(self._state, f) for f in self._kept):
            return tree  # never donated: the reference stays valid
        return self._copy(tree)

    # ------------------------------------------------------------------ checkpoints

    def get_state(self) -> dict[str, ArrayTree]:
        """Everything needed to resume, as nested dicts/lists of NumPy arrays (orbax-checkpointable). Optimizer
        states are namedtuples; their leaves are stored as a list, so checkpoints hold only plain containers."""
        out: dict[str, ArrayTree] = {}
        for name, value in self._state._asdict().items():
            if name == "steps":
                continue
            out[name] = to_numpy(jax.tree_util.tree_leaves(value) if name.endswith("opt_state") else value)
        out["steps"] = np.asarray(self._steps, np.int64)
        return out

    @property
    def state(self) -> dict[str, ArrayTree]:
        """Alias of `get_state()` (the short contract name)."""
        return self.get_state()

    def restore(self, state: Mapping[str, ArrayTree]) -> None:
        """Load a `get_state()` tree; ValueError if it does not match this learner's networks or is non-finite."""
        name = self.agent_name
        try:
            fields = {}
            for field, template in self._state._asdict().items():
                if field == "steps":
                    continue
                value = state[field]
                if field.endswith("opt_state"):
                    if isinstance(value, Mapping):  # some checkpointers turn lists into {"0": ..., "1": ...}
                        value = [value[k] for k in sorted(value, key=int)]
                    value = list(value)
                    n = len(jax.tree_util.tree_leaves(template))
                    if len(value) != n:
                        raise ValueError(f"{name} learner state: {field} has {len(value)} leaves, expected {n}")
                    value = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), value)
                fields[field] = self._match(template, value, field)
            steps = int(np.asarray(state["steps"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed {name} learner state: {e!r}") from None
        if steps < 0:
            raise ValueError(f"{name} learner state: steps must be >= 0, got {steps}")
        self._state = type(self._state)(**fields, steps=jnp.asarray(steps, jnp.int32))
        self._steps = steps

    def _match(self, template: ArrayTree, value: ArrayTree, field: str) -> ArrayTree:
        """`value` as device arrays with `template`'s structure, shapes and dtypes (else ValueError)."""
        name = self.agent_name
        t_leaves, t_def = jax.tree_util.tree_flatten(template)
        v_leaves, v_def = jax.tree_util.tree_flatten(value)
        if t_def != v_def:
            raise ValueError(f"{name} learner state: {field} has structure {v_def}, expected {t_def}")
        out = []
        for t, v in zip(t_leaves, v_leaves):
            v = np.asarray(v)
            if v.shape != t.shape:
                raise ValueError(f"{name} learner state: {field} leaf shape {v.shape}, expected {t.shape}")
            if v.dtype.kind == "f" and not np.isfinite(v).all():
                raise ValueError(f"{name} learner state {field}: non-finite values")
            out.append(jnp.asarray(v, dtype=t.dtype))
        return jax.tree_util.tree_unflatten(t_def, out)
