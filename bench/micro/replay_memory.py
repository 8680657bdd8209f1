"""Replay memory for ALE transitions (84x84 frames, stack 4): the frame-deduplicated table against a plain one.

    python -m bench.micro.replay_memory [--source ale|synthetic] [--transitions N] [--capacity C] [--out DIR]

Fills a `quarl.replay.frames.FrameTable` (what `table_from_config` builds for ALE) with N n-step transitions and
reports the bytes it holds (`FrameTable.memory()`: the allocated frame store, frame references, other columns,
the digest index) and the process's resident memory growth, next to what a plain `quarl.replay.table.Table` allocates
for the same capacity (two [84, 84, 4] uint8 stacks an item). `--source ale` plays ALE/Pong with random actions
(real frames, episode ends, sticky actions); `--source synthetic` makes one distinct frame per env step without
an emulator, so a real 1M-transition table can be filled in minutes. A figure at N < 1M is also extrapolated to
1M transitions (frames per transition x 1M), and says so. Memory only: no times are reported.

Writes DIR/replay_memory.json and appends nothing: DIR/replay_memory.md is written by hand from the JSON rows.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import dm_env
import numpy as np

from bench.harness.machine import bench_machine, finish
from bench.harness.results_io import write_json
from launch.experiments.progress import StepProgress
from quarl.replay.adders import NStepTransitionAdder
from quarl.replay.frames import FrameTable
from quarl.replay.items import Transition, stack_items

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "bench"
STACK, SIZE, N_STEP = 4, 84, 3
OBS = ((SIZE, SIZE, STACK), np.dtype(np.uint8))
SIGNATURE = {"observation": OBS, "action": ((), np.dtype(np.int32)), "reward": ((), np.dtype(np.float32)),
             "discount": ((), np.dtype(np.float32)), "next_observation": OBS}
GIB = 1 << 30


def _ale_steps(seed: int) -> Iterator[dm_env.TimeStep]:
    from quarl.envs.ale import AtariEnvironment  # pylint: disable=import-outside-toplevel

    env = AtariEnvironment("ALE/Pong", seed, clip_rewards=True)
    rng = np.random.default_rng(seed)
    ts = env.reset()
    while True:
        yield ts
        ts = env.reset() if ts.last() else env.step(np.int32(rng.integers(env.action_spec().num_values)))


def _synthetic_steps(seed: int) -> Iterator[dm_env.TimeStep]:
    """Frame-stacked timesteps, one distinct frame per step (the step number written into a fixed noise frame),
    episodes of 400-2,000 steps; the first stack of an episode repeats its frame, as ALE's does."""
    rng = np.random.default_rng(seed)
    background = rng.integers(0, 256, (SIZE, SIZE), dtype=np.uint8)
    step = 0
    while True:
        length = int(rng.integers(400, 2000))
        frames = []
        for t in range(length + 1):
            frame = background.copy()
            frame.reshape(-1)[:8] = np.frombuffer(np.int64(step).tobytes(), np.uint8)
            step += 1
            frames = (frames + [frame])[-STACK:] if t else [frame] * STACK
            obs = np.stack(frames, -1)
            if t == 0:
                yield dm_env.restart(obs)
            elif t < length:
                yield dm_env.transition(np.float32(0.0), obs, np.float32(1.0))
            else:
                yield dm_env.termination(np.float32(1.0), obs)


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def fill(source: str, transitions: int, capacity: int, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """Fills a FrameTable with `transitions` n-step transitions from `source`; its memory and the plain table's."""
    rss0 = _rss_bytes()
    table = FrameTable("replay", capacity, SIGNATURE, seed=seed)
    adder = NStepTransitionAdder(N_STEP, 0.99)
    steps = (_ale_steps if source == "ale" else _synthetic_steps)(seed)
    batch: list[Transition] = []
    inserted = env_steps = episodes = 0
    # A bar on a terminal, a line every few seconds in a log: a 1M fill takes ~10 minutes.
    bar = StepProgress(transitions, progress, prog="bench.micro.replay_memory")
    for ts in steps:
        if ts.first():
            adder.add_first(ts)
            continue
        env_steps += 1
        episodes += int(ts.last())
        batch.extend(adder.add(np.int32(0), ts))
        if len(batch) >= 256 or inserted + len(batch) >= transitions:
            batch = batch[:transitions - inserted]
            table.insert(stack_items(batch))
            inserted += len(batch)
            bar.update(len(batch))
            batch = []
            if inserted >= transitions:
                break
    bar.close()
    mem = table.memory()
    item_bytes = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in SIGNATURE.values())
    row = {"source": source, "transitions": inserted, "capacity": capacity, "env_steps": env_steps,
           "episodes_ended": episodes, "size": table.size, "memory": mem,
           "frames_per_item": mem["frames_live"] / max(table.size, 1),
           "rss_growth_bytes": _rss_bytes() - rss0,
           "plain_table_bytes": capacity * (item_bytes + 8 + 8),  # columns + priorities + keys
           "plain_item_bytes": item_bytes}
    if table.size < 1_000_000:
        frame = SIZE * SIZE
        per_item = (mem["total"] - mem["frame_store"]) / capacity  # refs, other columns, index: per slot
        row["extrapolated_1m"] = {
            "note": f"extrapolated from {table.size:,} items: frames per item x 1M x {frame} B + per-item overheads",
            "frames_bytes": row["frames_per_item"] * 1_000_000 * frame,
            "total_bytes": row["frames_per_item"] * 1_000_000 * frame + per_item * 1_000_000,
            "plain_table_bytes": 1_000_000 * (item_bytes + 16)}
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.micro.replay_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=("ale", "synthetic"), default="synthetic")
    parser.add_argument("--transitions", type=int, default=1_000_000)
    parser.add_argument("--capacity", type=int, default=None, help="table capacity (default: --transitions)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    capacity = args.capacity or args.transitions
    if args.transitions < 1 or capacity < 1:
        parser.exit(2, f"{parser.prog}: error: --transitions and --capacity must be positive\n")
    machine = bench_machine(allow_busy=True)
    row = fill(args.source, args.transitions, capacity)
    row["machine"] = finish(machine)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "replay_memory.json"
    rows = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
    rows = [r for r in rows if (r["source"], r["transitions"]) != (row["source"], row["transitions"])] + [row]
    write_json(path, rows, newline=False)
    mem = row["memory"]
    print(f"{row['source']}: {row['size']:,} items, {mem['frames_live']:,} frames ({row['frames_per_item']:.3f} an "
          f"item): frame store {mem['frame_store'] / GIB:.2f} GiB, total {mem['total'] / GIB:.2f} GiB, RSS growth "
          f"{row['rss_growth_bytes'] / GIB:.2f} GiB; a plain table: {row['plain_table_bytes'] / GIB:.2f} GiB")
    if "extrapolated_1m" in row:
        ex = row["extrapolated_1m"]
        print(f"  extrapolated to 1M: frames {ex['frames_bytes'] / GIB:.2f} GiB, total {ex['total_bytes'] / GIB:.2f} "
              f"GiB (plain {ex['plain_table_bytes'] / GIB:.2f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
