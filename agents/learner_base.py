"""What every agent's fp32 learner shares, so each agent's `learning.py` holds only its training state, losses and
`make_update_fn` (issue 23's "one learner base"):

- the step counter (a host copy: reading the device counter would make the host wait for every update);
- batch coercion from the agent's column table, with one non-finite rule for every agent (a NaN or inf in any
  float column is a ValueError on the host, before the batch reaches the device);
- one SGD step per call (`step`), or K SGD steps in one jitted `lax.scan` over K stacked batches
  (`prepare` + `run_block`; Acme's `process_multiple_batches`), which removes K - 1 host round trips and
  dispatches per K steps: what a GPU learner needs to run at device speed;
- state save/restore with structure, shape and finiteness checks; policy params for actors, as a NumPy copy or
  as a device snapshot the publisher quantizes where it lives.

`prepare` (host work and the host-to-device copy) and `run_block` (device work) are separate so that a prefetch
thread can prepare the next block while the current one trains (`launch.nodes.learner`).
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# column -> (dtype, shape of one item); None = any shape (checked only for a common batch size). Items of shape
# () may arrive as [B, 1] and are flattened to [B].
Columns = Mapping[str, tuple[Any, tuple[int, ...] | None]]
UpdateFn = Callable[[Any, Mapping[str, jax.Array]], tuple[Any, Mapping[str, jax.Array]]]


class Block(NamedTuple):
    """K sampled batches, checked and stacked ([K, B, ...] per column), already copied to the learner's device."""

    batches: Mapping[str, jax.Array]
    keys: np.ndarray | None  # int64 [K, B] replay keys (for priority updates); None for plain mappings
    size: int  # K


def to_numpy(tree: Any) -> Any:
    """Host copies of a device tree. Real copies: on CPU `device_get` may alias the device buffers, which a donating
    update reuses."""
    return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), jax.device_get(tree))


class JaxLearner:
    """The scaffold; an agent subclass builds its initial `TrainingState` (a NamedTuple with a `steps` field) and
    its pure update `(state, batch) -> (state, metrics)`, then calls `super().__init__`.

    Metrics are 0-d device arrays (stacked to [K] by `run_block`): reading them back would make the host wait for
    the device, so callers convert them only when they log."""

    agent_name: ClassVar[str] = "agent"
    columns: Columns  # set by the subclass before super().__init__

    def __init__(self, state: Any, update: UpdateFn, *, donate: bool):
        self._state = state
        self._steps = int(state.steps)
        self._donate = donate
        donate_args = (0,) if donate else ()
        self._update = jax.jit(update, donate_argnums=donate_args)
        self._scan = jax.jit(lambda s, b: jax.lax.scan(update, s, b), donate_argnums=donate_args)
        # A donating update frees the state's buffers: a snapshot handed to another thread must be a copy.
        self._copy = jax.jit(lambda t: jax.tree_util.tree_map(jnp.copy, t))
        if donate:  # compiled now, so that the first hand-over to the publisher costs a dispatch, not a compile
            jax.block_until_ready(self._copy(self._policy_tree()))

    # ------------------------------------------------------------------ hooks

    def _policy_tree(self) -> Any:
        """The device tree of the policy actors run."""
        raise NotImplementedError

    def _extra_columns(self, sample: Any, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Columns the update needs beyond the sampled data (DQN: the PER sampling probabilities)."""
        del sample, batch
        return {}

    def _host_outputs(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The metrics a caller gets (DQN: |TD| priorities brought to the host for a prioritized table)."""
        return metrics

    # ------------------------------------------------------------------ training

    @property
    def steps(self) -> int:
        """Number of SGD steps taken."""
        return self._steps

    def step(self, sample: Any) -> dict[str, Any]:
        """One SGD step on a `quarl.replay.Sample` (or a plain mapping of columns)."""
        batch = self._coerce(sample)
        self._state, metrics = self._update(self._state, batch)
        self._steps += 1
        return self._host_outputs(dict(metrics))

    def wait(self) -> None:
        """Blocks until every dispatched update has run on the device (updates are asynchronous)."""
        jax.block_until_ready(self._state)

    def prepare(self, samples: Sequence[Any]) -> Block:
        """K samples checked, stacked and copied to the device (thread-safe: touches no learner state)."""
        if not samples:
            raise ValueError("a block needs at least one sampled batch")
        batches = [self._coerce(s) for s in samples]
        sizes = {b[next(iter(b))].shape[0] for b in batches}
        if len(sizes) != 1:
            raise ValueError(f"{self.agent_name} block: batches of different sizes {sorted(sizes)}")
        # One batch stays unstacked: `run_block` then runs the single-step update, `step`'s exact computation.
        columns = batches[0] if len(batches) == 1 else {k: np.stack([b[k] for b in batches]) for k in batches[0]}
        keys = [getattr(s, "keys", None) if hasattr(s, "data") else None for s in samples]  # Samples only
        keys_arr = None if any(k is None for k in keys) else np.stack([np.asarray(k, np.int64) for k in keys])
        return Block(jax.device_put(columns), keys_arr, len(samples))

    def run_block(self, block: Block) -> dict[str, Any]:
        """`block.size` SGD steps in one jitted `lax.scan`; the same arithmetic as that many `step` calls.
        Metrics come back stacked ([K]; per-item ones [K, B]), except for a one-batch block (as `step`)."""
        if block.size == 1:
            self._state, metrics = self._update(self._state, block.batches)
        else:
            self._state, metrics = self._scan(self._state, block.batches)
        self._steps += block.size
        return self._host_outputs(dict(metrics))

    def _coerce(self, sample: Any) -> dict[str, np.ndarray]:
        """Columns as the dtypes and item shapes the update was compiled for (else ValueError)."""
        data = getattr(sample, "data", sample)
        name = self.agent_name
        missing = [k for k in self.columns if k not in data]
        if missing:
            raise ValueError(f"{name} batch is missing column(s) {missing}; it needs {list(self.columns)}")
        batch = {}
        for key, (dtype, shape) in self.columns.items():
            arr = np.asarray(data[key], dtype)
            if shape == ():
                arr = arr.reshape(-1)
            batch[key] = arr
        n = batch[next(iter(batch))].shape[0] if batch[next(iter(batch))].ndim else -1
        for key, (dtype, shape) in self.columns.items():
            arr = batch[key]
            expected = (n, *shape) if shape is not None else None
            if arr.ndim == 0 or arr.shape[0] != n or (expected is not None and arr.shape != expected):
                raise ValueError(f"{name} batch column {key!r} has shape {arr.shape}, expected "
                                 f"{expected if expected is not None else (n, '...')}")
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise ValueError(f"{name} batch column {key!r} contains NaN or inf")
        batch.update(self._extra_columns(sample, batch))
        return batch

    # ------------------------------------------------------------------ weights

    def policy_params(self) -> dict:
        """The fp32 haiku tree of the policy actors run (NumPy copies), for `quarl.quantization.quantize_params`."""
        return to_numpy(self._policy_tree())

    def policy_snapshot(self) -> Any:
        """The same tree as device arrays that stay valid after later updates (a device-side copy when the update
        donates its state). Costs the caller one asynchronous dispatch, not a device-to-host copy: what the
        training thread hands to the publisher."""
        tree = self._policy_tree()
        return self._copy(tree) if self._donate else tree

    # ------------------------------------------------------------------ checkpoints

    def get_state(self) -> dict:
        """Everything needed to resume, as nested dicts/lists of NumPy arrays (orbax-checkpointable). Optimizer
        states are namedtuples; their leaves are stored as a list, so checkpoints hold only plain containers."""
        out: dict[str, Any] = {}
        for name, value in self._state._asdict().items():
            if name == "steps":
                continue
            out[name] = to_numpy(jax.tree_util.tree_leaves(value) if name.endswith("opt_state") else value)
        out["steps"] = np.asarray(self._steps, np.int64)
        return out

    @property
    def state(self) -> dict:
        """Alias of `get_state()` (the short contract name)."""
        return self.get_state()

    def restore(self, state: Mapping[str, Any]) -> None:
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

    def _match(self, template: Any, value: Any, field: str) -> Any:
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
