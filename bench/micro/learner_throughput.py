"""D4PG learner throughput: SGD steps per second of the fp32 learner update on whatever JAX runs on here.

    python -m bench.micro.learner_throughput [--quick] [--no-paper] [--out DIR]

The learner is the ActorQ bottleneck once int8 makes actors cheap, so its update rate bounds how fast any
fleet can learn. Times `agents.d4pg.learning.make_update_fn` (the same pure step `D4PGLearner` jits) on the
walker shapes (obs 24, action 6) three ways:

- `scan`: one `jax.jit` of `lax.scan` over K device-resident batches: K SGD steps per call, no host
  round trip between steps (the learner's compute alone; what a device-resident replay would allow);
- `loop`: the jitted step called K times on device-resident batches, waiting only after the K-th
  (asynchronous dispatch, no per-step host round trip; the per-call dispatch overhead remains);
- `learner.step`: `D4PGLearner.step` as `launch.experiments.run_experiment` drives it: a NumPy batch in (checked and copied
  to the device) and the metrics kept on device, as the learner node runs it; a block waits for its last step.

Configurations: D4PG with 256x3 policy and 256x3 critic at batch 256 (the issue's setting), and, unless
--no-paper, the ActorQ paper's 2048x3 policy with the same critic (its learner cost is dominated by the
policy's forward/backward). Each mode runs `rounds` timed blocks after a compile/warm-up call; the table
reports the median block, and the spread (min..max) shows how much the machine's load moved it.
Writes DIR/learner_throughput.json and DIR/learner_throughput.md (DIR defaults to results/bench; --quick
writes to runs/bench/learner-throughput-quick so it never overwrites committed results).
XLA keeps its default CPU threading (all cores), as the learner process has it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench.harness.machine import add_allow_busy, machine_info as base_machine_info, refuse_if_busy
from bench.harness.results_io import write_report

REPO = Path(__file__).resolve().parents[2]
OBS_DIM, ACT_DIM = 24, 6  # walker:stand / walker:walk


def machine_info(allow_busy: bool = False) -> dict[str, Any]:
    """bench.harness.machine's record plus JAX's version, backend and XLA flags (the machine and its load only: never
    other processes' command lines)."""
    import jax  # pylint: disable=import-outside-toplevel
    info = base_machine_info(allow_busy)
    info.update({"jax": jax.__version__, "jax_backend": jax.default_backend(),
                 # What the learner ran on: "cpu:0 cpu" here, "gpu:0 NVIDIA H200" on an accelerator.
                 "jax_devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()],
                 "xla_flags": os.environ.get("XLA_FLAGS", ""), "load_average_start": info.pop("load_start"),
                 "date": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return info


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


def markdown(result: dict[str, Any], command: str) -> str:
    m = result["machine"]
    lines = [
        f"# D4PG learner throughput ({m['jax_backend'].upper()})",
        "",
        f"`{command}`, {m['date'][:10]}. fp32 learner SGD steps per second: one step = critic and policy losses, "
        "both gradients, both Adam updates (global-norm clipping 40) and the periodic target copy "
        "(`agents.d4pg.learning.make_update_fn`, the step `D4PGLearner` jits). Walker shapes: obs 24, action 6; "
        f"51 atoms. Raw data: `learner_throughput.json`.",
        "",
        "## Machine",
        "",
        f"{m['cpu']}, {m['cores']} logical cores, {m['platform']}, Python {m['python']}, jax {m['jax']} "
        f"({m['jax_backend']}: {', '.join(m.get('jax_devices') or ['?'])}), XLA_FLAGS `{m['xla_flags'] or '(unset: default threading, all cores)'}`. "
        f"**Shared machine**: load average {m['load_average_start'][0]:.1f} at the start and "
        f"{m['load_average_end'][0]:.1f} at the end (1-min). "
        f"Absolute rates are therefore below what this CPU gives an idle learner; "
        "the min..max spread over timed blocks shows how much the load moved them.",
        "",
        "## Steps per second (median over timed blocks; min..max in brackets)",
        "",
        "| policy | critic | batch | params (policy / critic) | scan (K steps per jit call) | "
        "loop (jitted step, async) | learner.step (host batch in, metrics on device) | ms/step (scan) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["configs"]:
        cells = []
        for mode in ("scan", "loop", "learner.step"):
            d = r["modes"].get(mode)
            cells.append("—" if d is None else
                         f"**{d['median_steps_per_s']:.1f}** ({d['min_steps_per_s']:.1f}..{d['max_steps_per_s']:.1f})")
        scan = r["modes"].get("scan")
        lines.append(
            f"| {'x'.join(map(str, r['policy_layer_sizes']))} | {'x'.join(map(str, r['critic_layer_sizes']))} | "
            f"{r['batch_size']} | {r['n_params']['policy']:,} / {r['n_params']['critic']:,} | "
            + " | ".join(cells) + " | " + ("—" if scan is None else f"{scan['ms_per_step']:.1f}") + " |")
    lines += [
        "",
        "Modes: **scan** jits `lax.scan` over K device-resident batches (K = steps per block), so the K steps run "
        "with no host round trip between them: the learner's compute alone. **loop** calls the jitted step K "
        "times on device-resident batches and waits once at the end (asynchronous dispatch; per-call dispatch "
        "cost remains). **learner.step** is what `launch.experiments.run_experiment` runs: a NumPy batch is validated and copied "
        "in every step, the metrics stay on device and each timed block waits for its last step.",
        "",
        *[f"learner.step with the policy trees donated too, {'x'.join(map(str, r['policy_layer_sizes']))} policy: "
          f"**{r['modes']['learner.step, all donated']['median_steps_per_s']:.1f}** steps/s (kept out of the "
          f"donation, as D4PGLearner runs: {r['modes']['learner.step']['median_steps_per_s']:.1f})."
          for r in result["configs"] if "learner.step, all donated" in r["modes"]],
        "",
        "First-call seconds (compile + one step): "
        + "; ".join(f"{'x'.join(map(str, r['policy_layer_sizes']))} policy: "
                    + ", ".join(f"{k} {v['first_call_s']:.1f} s" for k, v in r["modes"].items())
                    for r in result["configs"]) + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.micro.learner_throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few steps, one round per mode (a smoke run)")
    p.add_argument("--no-paper", action="store_true", help="skip the 2048x3 policy")
    p.add_argument("--out", default=None)
    p.add_argument("--donation", action="store_true",
                   help="also time learner.step with the policy trees donated too (what keeping them costs)")
    add_allow_busy(p)
    args = p.parse_args(argv)
    refuse_if_busy(p, args.allow_busy)
    outdir = Path(args.out) if args.out else (REPO / "runs" / "bench" / "learner-throughput-quick" if args.quick
                                              else REPO / "results" / "bench")
    result: dict[str, Any] = {"machine": machine_info(args.allow_busy), "quick": args.quick, "configs": []}
    modes = ("scan", "loop", "learner.step") + (("learner.step, all donated",) if args.donation else ())
    plan = [((256, 256, 256), (256, 256, 256), 256, (10, 2) if args.quick else (50, 5))]
    if not args.no_paper:
        plan.append(((2048, 2048, 2048), (256, 256, 256), 256, (2, 1) if args.quick else (5, 3)))
    for policy, critic, batch, (steps, rounds) in plan:
        r = measure(policy, critic, batch, steps=steps, rounds=rounds, modes=modes)
        result["configs"].append(r)
        print(f"policy {policy} critic {critic} batch {batch}: "
              + ", ".join(f"{k} {v['median_steps_per_s']:.1f} steps/s" for k, v in r["modes"].items()), flush=True)
    result["machine"]["load_average_end"] = list(os.getloadavg())
    write_report(outdir, "bench.micro.learner_throughput", argv, result, markdown, newline=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
