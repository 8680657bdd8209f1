"""The D4PG learner's update rate, as bench.micro.learner_throughput reports it and bench.system.learner_in_program
sets the learner in the program against: `measure` times `agents.d4pg.learning.make_update_fn` (the step
`D4PGLearner` jits) on the walker shapes (obs 24, action 6) in the modes that module's docstring describes (`scan`,
`loop`, `learner.step`, and `learner.step, all donated`), and `learner_machine` is the machine record those results
carry: bench.harness.machine's plus what JAX ran on.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np

from bench.harness.machine import bench_machine

OBS_DIM, ACT_DIM = 24, 6  # walker:stand / walker:walk


def learner_machine(allow_busy: bool = False) -> dict[str, Any]:
    """bench.harness.machine's record plus JAX's backend, devices and XLA flags (the machine and its load only:
    never other processes' command lines)."""
    import jax  # pylint: disable=import-outside-toplevel
    return {**bench_machine(allow_busy), "jax_backend": jax.default_backend(),
            # What the learner ran on: "cpu:0 cpu" here, "gpu:0 NVIDIA H200" on an accelerator.
            "jax_devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()],
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


def _batches(rng: np.random.Generator, count: int, batch_size: int) -> dict[str, np.ndarray]:
    """`count` stacked random batches with realistic magnitudes (speed does not depend on the values)."""
    obs = rng.standard_normal((count, batch_size, OBS_DIM)).astype(np.float32)
    return {"observation": obs,
            "action": rng.uniform(-1, 1, (count, batch_size, ACT_DIM)).astype(np.float32),
            "reward": rng.uniform(0, 5, (count, batch_size)).astype(np.float32),
            "discount": np.full((count, batch_size), 0.99 ** 5, np.float32),
            "next_observation": (obs + 0.1 * rng.standard_normal(obs.shape)).astype(np.float32)}


def _time_blocks(run_block: Callable[[], None], steps_per_block: int, rounds: int) -> list[float]:
    """Steps/s of `rounds` timed blocks (each `steps_per_block` SGD steps), after one untimed warm-up."""
    run_block()
    rates = []
    for _ in range(rounds):
        t = time.perf_counter()
        run_block()
        rates.append(steps_per_block / (time.perf_counter() - t))
    return rates


def measure(policy: Sequence[int], critic: Sequence[int], batch_size: int, *, steps: int, rounds: int,
            modes: Sequence[str]) -> dict[str, Any]:
    """Steps/s per mode for one network size; every mode starts from the same initial state."""
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

    # pylint: disable=import-outside-toplevel
    from agents.d4pg.config import D4PGConfig
    from agents.d4pg.learning import D4PGLearner, TrainingState, make_optimizer, make_update_fn
    from agents.d4pg.networks import make_networks

    config = D4PGConfig(policy_layer_sizes=tuple(policy), critic_layer_sizes=tuple(critic), batch_size=batch_size,
                        vmin=-10.0, vmax=110.0)
    lo, hi = [-1.0] * ACT_DIM, [1.0] * ACT_DIM
    networks = make_networks(config, OBS_DIM, lo, hi)
    optimizer = make_optimizer(config)
    update = make_update_fn(networks, config, optimizer)
    rng = np.random.default_rng(0)
    host = _batches(rng, steps, batch_size)
    device = jax.device_put(host)

    def initial_state() -> TrainingState:
        pk, ck = jax.random.split(jax.random.PRNGKey(0))
        p = networks.policy.init(pk, jnp.zeros((1, OBS_DIM)))
        c = networks.critic.init(ck, jnp.zeros((1, OBS_DIM)), jnp.zeros((1, ACT_DIM)))
        copy = lambda t: jax.tree_util.tree_map(jnp.copy, t)  # noqa: E731 - donated buffers must be distinct
        return TrainingState(p, c, copy(p), copy(c), optimizer.init(p), optimizer.init(c), jnp.zeros((), jnp.int32))

    n_params = {
        "policy": int(sum(x.size for x in jax.tree_util.tree_leaves(initial_state().policy_params))),
        "critic": int(sum(x.size for x in jax.tree_util.tree_leaves(initial_state().critic_params))),
    }
    out: dict[str, Any] = {"policy_layer_sizes": list(policy), "critic_layer_sizes": list(critic),
                           "batch_size": batch_size, "num_atoms": config.num_atoms, "n_params": n_params,
                           "steps_per_block": steps, "rounds": rounds, "modes": {}}

    if "scan" in modes:
        def scan_k(state: TrainingState, batches: dict) -> tuple[TrainingState, jax.Array]:
            state, metrics = jax.lax.scan(update, state, batches)
            return state, metrics["critic_loss"][-1]
        scan_jit = jax.jit(scan_k, donate_argnums=0)
        holder = [initial_state()]
        t = time.perf_counter()
        holder[0], loss = scan_jit(holder[0], device)
        jax.block_until_ready(loss)
        compile_s = time.perf_counter() - t

        def scan_block() -> None:
            holder[0], last = scan_jit(holder[0], device)
            jax.block_until_ready(last)
        out["modes"]["scan"] = {"rates": _time_blocks(scan_block, steps, rounds), "first_call_s": compile_s}

    if "loop" in modes:
        step_jit = jax.jit(update, donate_argnums=0)
        per_step = [jax.tree_util.tree_map(lambda x, i=i: x[i], device) for i in range(steps)]
        holder = [initial_state()]
        t = time.perf_counter()
        holder[0], m = step_jit(holder[0], per_step[0])
        jax.block_until_ready(m)
        compile_s = time.perf_counter() - t

        def loop_block() -> None:
            state = holder[0]
            for b in per_step:
                state, metrics = step_jit(state, b)
            jax.block_until_ready(metrics)
            holder[0] = state
        out["modes"]["loop"] = {"rates": _time_blocks(loop_block, steps, rounds), "first_call_s": compile_s}

    # "learner.step, all donated": the same learner with its policy trees donated too (D4PGLearner keeps them out
    # of the donation so the publisher's snapshot is a reference): what keeping them costs the step, if anything.
    all_donated = type("D4PGLearnerAllDonated", (D4PGLearner,), {"kept_fields": ()})
    for mode, cls in (("learner.step", D4PGLearner), ("learner.step, all donated", all_donated)):
        if mode not in modes:
            continue
        learner = cls(networks, config, 0)
        per_step_host = [{k: v[i] for k, v in host.items()} for i in range(steps)]
        t = time.perf_counter()
        learner.step(per_step_host[0])
        compile_s = time.perf_counter() - t

        def learner_block(learner: Any = learner, per_step_host: list = per_step_host) -> None:
            metrics = None
            for b in per_step_host:
                metrics = learner.step(b)  # device arrays: the host does not wait for each step
            # The last step's metrics depend on every earlier update, so this waits for the whole block.
            jax.block_until_ready(metrics)
        out["modes"][mode] = {"rates": _time_blocks(learner_block, steps, rounds), "first_call_s": compile_s}

    for mode in out["modes"].values():
        rates = mode["rates"]
        mode.update({"median_steps_per_s": statistics.median(rates), "min_steps_per_s": min(rates),
                     "max_steps_per_s": max(rates), "ms_per_step": 1e3 / statistics.median(rates)})
    return out
