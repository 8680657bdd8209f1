"""The DQN update's time: the loss as `agents.dqn.learning.make_loss` writes it (s' through the online net as a
constant) against one online pass over [s; s'], whose backward also runs over the s' rows, side by side.

    python -m bench.micro.dqn_update [--repeats 30] [--quick] [--out DIR] [--allow-busy]

Nets: the Nature torso on ALE frames (batch 32, `agents.dqn.config.ATARI_OVERRIDES`: bench.learning.ale_dqn's
settings) and MLPs 64x64, 256x256 and 2048x3 on 4-dim observations (batch 128). Each form is one `DQNLearner`
whose loss is swapped in before it is built; both take the same batch, and the two forms alternate in rounds so that load drift hits both. Writes
DIR/dqn_update.json and .md (default results/bench) with the machine record. Run it alone.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bench.harness.machine import add_allow_busy, bench_machine, describe_cpu, describe_load, finish, refuse_if_busy
from bench.harness.results_io import write_and_print


def one_pass_loss(spec, huber_loss_parameter: float, qat_bits: int | None = None):
    """The earlier loss: the online net once over [s; s'] (the baseline the current form is timed against)."""
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    import rlax  # pylint: disable=import-outside-toplevel
    from agents.dqn import learning  # pylint: disable=import-outside-toplevel

    online_apply, apply = learning.q_apply_fn(spec, qat_bits), learning.q_apply_fn(spec)

    def loss_fn(params, target_params, batch, weights):
        obs, next_obs = batch["observation"], batch["next_observation"]
        q = online_apply(params, jnp.concatenate([obs, next_obs], axis=0))
        q_tm1, q_t_selector = q[:obs.shape[0]], jax.lax.stop_gradient(q[obs.shape[0]:])
        target = learning.double_q_targets(apply(target_params, next_obs), q_t_selector, batch["reward"],
                                           batch["discount"])
        q_taken = jnp.take_along_axis(q_tm1, batch["action"][:, None], axis=-1)[:, 0]
        td_error = jax.lax.stop_gradient(target) - q_taken
        return jnp.mean(weights * rlax.huber_loss(td_error, huber_loss_parameter)), (td_error, q_taken)

    return loss_fn


def cases(quick: bool) -> list[tuple[str, Any, Any, dict[str, np.ndarray]]]:
    """(name, spec, config, batch) per net."""
    from agents.dqn import Builder, DQNConfig  # pylint: disable=import-outside-toplevel
    from agents.dqn.networks import make_q_spec  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)

    def batch(b: int, shape: tuple[int, ...], dtype, actions: int) -> dict[str, np.ndarray]:
        obs = (lambda: rng.integers(0, 255, (b, *shape), dtype=np.uint8)) if dtype == np.uint8 else (
            lambda: rng.standard_normal((b, *shape)).astype(np.float32))
        return {"observation": obs(), "next_observation": obs(), "action": rng.integers(0, actions, b).astype(np.int32),
                "reward": rng.standard_normal(b).astype(np.float32), "discount": np.full(b, 0.99, np.float32)}

    out = []
    for hidden in ((64, 64), (256, 256)) if quick else ((64, 64), (256, 256), (2048, 2048, 2048)):
        cfg = DQNConfig(hidden_sizes=hidden)
        out.append(("mlp " + "x".join(map(str, hidden)), make_q_spec(4, 2, hidden), cfg, batch(128, (4,), np.float32, 2)))
    if not quick:
        from agents.dqn.config import ATARI_OVERRIDES  # pylint: disable=import-outside-toplevel
        from quarl.envs.spec import environment_spec
        from quarl.envs.factory import make_environment  # pylint: disable=import-outside-toplevel

        cfg = DQNConfig(**ATARI_OVERRIDES)
        spec = Builder(cfg).policy_spec(environment_spec(make_environment("ALE/Pong", 0)))
        out.append(("nature torso", spec, cfg, batch(32, (84, 84, 4), np.uint8, 6)))
    return out


def time_forms(spec, cfg, batch, repeats: int, rounds: int = 3) -> dict[str, float]:
    """Median ms per update of each form over `rounds` alternating rounds of `repeats` updates."""
    from agents.dqn import learning  # pylint: disable=import-outside-toplevel

    current = learning.make_loss
    learners = {}
    for form, loss in (("current", current), ("one pass over [s; s']", one_pass_loss)):
        learning.make_loss = loss
        try:
            learners[form] = learning.DQNLearner(spec, cfg, seed=0)
        finally:
            learning.make_loss = current
        learners[form].step(batch)
        learners[form].wait()
    samples: dict[str, list[float]] = {f: [] for f in learners}
    for _ in range(rounds):
        for form, learner in learners.items():
            t = time.perf_counter()
            for _ in range(repeats):
                learner.step(batch)
            learner.wait()
            samples[form].append((time.perf_counter() - t) / repeats * 1e3)
    return {f: statistics.median(v) for f, v in samples.items()}


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = ["# DQN update time: s' as a constant against one online pass over [s; s']", "",
             f"Command: `{result['command']}`", "",
             f"Machine: {describe_cpu(m, flags=True)}; {describe_load(m)}.", "",
             "| net | batch | current (ms) | one pass over [s; s'] (ms) | speed-up |", "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['net']} | {r['batch']} | {r['current_ms']:.2f} | {r['one_pass_ms']:.2f} | "
                     f"{r['one_pass_ms'] / r['current_ms']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.micro.dqn_update", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="updates per timed round (the 2048x3 MLP: a third)")
    parser.add_argument("--quick", action="store_true", help="the two small MLPs only")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "results" / "bench")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.exit(2, f"{parser.prog}: error: --repeats must be positive\n")
    refuse_if_busy(parser, args.allow_busy)
    machine = bench_machine(args.allow_busy)
    rows = []
    for name, spec, cfg, batch in cases(args.quick):
        repeats = max(1, args.repeats // 3) if "2048" in name else args.repeats
        ms = time_forms(spec, cfg, batch, repeats)
        rows.append({"net": name, "batch": int(batch["reward"].shape[0]), "current_ms": ms["current"],
                     "one_pass_ms": ms["one pass over [s; s']"]})
        print(f"{name}: {ms}", flush=True)
    return write_and_print(args.out, "bench.micro.dqn_update", argv, {"rows": rows, "machine": finish(machine)},
                           markdown)


if __name__ == "__main__":
    sys.exit(main())
