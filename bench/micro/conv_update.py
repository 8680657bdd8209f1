"""Each conv learner's update as the program runs it, against the same arithmetic unrolled in one jit, side by side.

    python -m bench.micro.conv_update [--repeats 5] [--rounds 3] [--quick] [--out DIR] [--allow-busy]

Why: XLA:CPU's `ConvCanonicalization` pass walks the entry computation only, so the gradient convolutions JAX
writes for an NHWC conv ran through XLA's naive loop inside a `lax.scan` (what the program's learners use), not
through its conv library. `quarl.nets.conv` writes them in the canonical form; `agents.loops` picks the scan.
This bench shows both facts per learner:

- `program`: the update as `launch.train` / `launch.actorq` run it now (the scan, canonical conv gradients);
- `unrolled`: the same arithmetic unrolled in one jit (`agents.loops` form "unroll");
- `before`: the scan with JAX's own conv gradient (`hk.Conv2D`), the program before the fix;
- DQN only, `alone`: one jitted SGD step per call, waited for (the update "jitted alone"; the per-call form).

Learners (the agents' pixel presets): PPO and A2C on MinAtar Breakout (one update = one rollout: PPO's 4 epochs x
4 minibatches over 8 x 128 steps, A2C's one step over 16 x 5), DQN's MinAtar torso and its Nature torso (84x84x4)
at batch 32 in blocks of K=4 SGD steps per call (the distributed learner's CPU default). Targets: program <=
1.2x unrolled; DQN program <= 1.3x alone. Rounds alternate the variants so load drift hits all of them; the
table gives the median ms per update (per SGD step for DQN) and the compile time of each variant's first call.
Writes DIR/conv_update.{json,md} (default results/bench) with the machine record. Run it alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench.harness.learner_variants import VARIANTS, variant
from bench.harness.machine import add_allow_busy, bench_machine, describe_cpu, describe_load, finish, refuse_if_busy
from bench.harness.results_io import write_and_print

MINATAR, NATURE, ACTIONS, K = (10, 10, 4), (84, 84, 4), 6, 4


def _rollout(rng: np.random.Generator, t: int, n: int) -> dict[str, np.ndarray]:
    obs = rng.integers(0, 2, (t, n, int(np.prod(MINATAR)))).astype(np.float32)
    return {"observation": obs, "next_observation": np.roll(obs, 1, axis=0),
            "action": rng.integers(0, ACTIONS, (t, n)).astype(np.int32),
            "reward": rng.normal(size=(t, n)).astype(np.float32), "discount": np.full((t, n), 0.99, np.float32),
            "last": np.zeros((t, n), np.float32), "behaviour_logp": np.full((t, n), -1.8, np.float32)}


def _on_policy(agent: str) -> tuple[Callable[[], Any], Callable[[Any], None], int]:
    """(make a learner, run one update, env steps per update) for PPO or A2C on MinAtar Breakout."""
    import agents  # pylint: disable=import-outside-toplevel
    from agents.ppo.config import task_overrides  # pylint: disable=import-outside-toplevel
    from agents.ppo.learning import PPOLearner  # pylint: disable=import-outside-toplevel
    from agents.ppo.networks import make_networks  # pylint: disable=import-outside-toplevel

    config = agents.make_config(agent)
    config = dataclasses.replace(config, **task_overrides("MinAtar/Breakout", type(config).__name__))
    rollout = _rollout(np.random.default_rng(0), config.num_steps, config.num_envs)

    def make() -> Any:
        return PPOLearner(make_networks(config, int(np.prod(MINATAR)), ACTIONS, MINATAR), config, 0, 10_000)

    def update(learner: Any) -> None:
        learner.step(rollout)

    return make, update, config.num_steps * config.num_envs


def _dqn(shape: tuple[int, ...], per_call: bool = False) -> tuple[Callable[[], Any], Callable[[Any], None], int]:
    """(make a learner, run K SGD steps, K) for DQN's torso on `shape` at its preset's batch 32."""
    from agents.dqn.config import (  # pylint: disable=import-outside-toplevel
        ATARI_OVERRIDES, MINATAR_OVERRIDES, DQNConfig)
    from agents.dqn.learning import DQNLearner  # pylint: disable=import-outside-toplevel
    from agents.dqn.networks import make_q_spec  # pylint: disable=import-outside-toplevel

    config = DQNConfig(**(ATARI_OVERRIDES if shape == NATURE else MINATAR_OVERRIDES))
    rng = np.random.default_rng(0)
    dtype, high = (np.uint8, 255) if shape == NATURE else (np.float32, 2)
    batches = [{"observation": rng.integers(0, high, (config.batch_size, int(np.prod(shape)))).astype(dtype),
                "next_observation": rng.integers(0, high, (config.batch_size, int(np.prod(shape)))).astype(dtype),
                "action": rng.integers(0, ACTIONS, config.batch_size).astype(np.int32),
                "reward": rng.normal(size=config.batch_size).astype(np.float32),
                "discount": np.full(config.batch_size, 0.99, np.float32)} for _ in range(K)]

    blocks: dict[int, Any] = {}  # per learner: its K batches on the device once, as the prefetch thread leaves them

    def make() -> Any:
        learner = DQNLearner(make_q_spec(int(np.prod(shape)), ACTIONS, config.hidden_sizes, shape), config, seed=0)
        blocks[id(learner)] = learner.prepare(batches)
        return learner

    def update(learner: Any) -> None:
        if per_call:
            for batch in batches:
                learner.step(batch)
                learner.wait()  # "alone": each step waited for, as a step jitted on its own
        else:
            learner.run_block(blocks[id(learner)])

    return make, update, K


def cases(quick: bool) -> list[tuple[str, str, Callable[..., tuple[Callable[[], Any], Callable[[Any], None], int]]]]:
    """(name, what one unit is, factory) per learner."""
    out = [("PPO MinAtar Breakout", "env step", lambda **kw: _on_policy("ppo")),
           ("A2C MinAtar Breakout", "env step", lambda **kw: _on_policy("a2c")),
           ("DQN MinAtar torso, K=4", "SGD step", lambda per_call=False: _dqn(MINATAR, per_call))]
    if not quick:
        out.append(("DQN Nature torso, K=4", "SGD step", lambda per_call=False: _dqn(NATURE, per_call)))
    return out


def measure(factory: Callable[..., tuple[Callable[[], Any], Callable[[Any], None], int]], dqn: bool, repeats: int,
            rounds: int) -> dict[str, dict[str, float]]:
    """Per variant: median ms per update and per unit, and the first call's seconds (compile included)."""
    names = [*VARIANTS, "alone"] if dqn else list(VARIANTS)
    learners, updates, compile_s, units = {}, {}, {}, 1
    for name in names:
        with variant("program" if name == "alone" else name):
            make, update, units = factory(per_call=True) if name == "alone" else factory()
            learners[name], updates[name] = make(), update
            t = time.perf_counter()
            update(learners[name])
            learners[name].wait()
            compile_s[name] = time.perf_counter() - t
    samples: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        for name in names:
            t = time.perf_counter()
            for _ in range(repeats):
                updates[name](learners[name])
            learners[name].wait()
            samples[name].append((time.perf_counter() - t) / repeats * 1e3)
    return {n: {"ms_per_update": statistics.median(v), "ms_per_unit": statistics.median(v) / units,
                "spread_ms": [min(v), max(v)], "first_call_s": compile_s[n], "units_per_update": units}
            for n, v in samples.items()}


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = ["# Conv learner updates: the program against the same arithmetic unrolled", "",
             f"Command: `{result['command']}`", "",
             f"Machine: {describe_cpu(m, flags=True)}; {describe_load(m)}.", "",
             "ms per unit (env step for PPO/A2C, SGD step for DQN); first call = compile + one update.", "",
             "| learner | program | unrolled | program / unrolled | before (JAX's conv grad) | before / program "
             "| alone | program / alone | first call: program / unrolled / before (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        v = r["variants"]
        p, u, b = (v[n]["ms_per_unit"] for n in VARIANTS)
        alone = v.get("alone", {}).get("ms_per_unit")
        lines.append(f"| {r['learner']} | {p:.3f} | {u:.3f} | {p / u:.2f}x | {b:.3f} | {b / p:.1f}x | "
                     + (f"{alone:.3f} | {p / alone:.2f}x" if alone else "- | -")
                     + " | " + " / ".join(f"{v[n]['first_call_s']:.1f}" for n in VARIANTS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.micro.conv_update", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="updates per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (the median is reported)")
    parser.add_argument("--quick", action="store_true", help="without the Nature torso (the slowest 'before')")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "results" / "bench")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1:
        parser.exit(2, f"{parser.prog}: error: --repeats and --rounds must be positive\n")
    refuse_if_busy(parser, args.allow_busy)
    machine = bench_machine(args.allow_busy)
    rows = []
    for name, unit, factory in cases(args.quick):
        variants = measure(factory, name.startswith("DQN"), args.repeats, args.rounds)
        rows.append({"learner": name, "unit": unit, "variants": variants})
        print(name, {n: round(v["ms_per_unit"], 3) for n, v in variants.items()}, flush=True)
    return write_and_print(args.out, "bench.micro.conv_update", argv, {"rows": rows, "machine": finish(machine)},
                           markdown)


if __name__ == "__main__":
    sys.exit(main())
