"""Can the replay server keep up with the paper's load? Insert and sample rates of the replay, in process and as
the program runs it (a Ray actor called from other processes).

    python -m bench.system.replay_server [--quick] [--ks 8,32] [--inserters 12] [--window-s 4] [--modes table,ray]
                                  [--out DIR] [--allow-busy]

The load issue 20 sets (one H200 machine, 16 cores): 12 int8 actors make ~11,000 env steps/s, each inserting
batches of `--insert-batch` transitions (the actors' default 64); a learner at ~1,400 SGD steps/s x batch 256
samples ~358,400 transitions/s, K batches per call. D4PG walker:stand transitions (obs 24, action 6, reward,
discount, next obs), the agent's own table (capacity, uniform sampler), pre-filled to `--prefill` items.

Per backend (`table`: one `quarl.replay.table.Table` shared by threads; `ray`: `launch.distributed.nodes.services.ReplayServer` as a Ray
actor with the program's concurrency, inserted into by `--inserters` Ray actor processes and sampled by
`--samplers` threads of this process, as the learner's prefetch threads do) and per K, with the rate limiter
opened wide so that each side runs as fast as it can:
- inserts alone; samples alone; both at once (the sustained rates the program needs side by side);
- samples through `sample_stacked` (one [K, B, ...] array per column, what the learner's feed calls) and
  through `sample_batches` (a list of K samples, the call it replaced), for comparison.
Rates are the table's own counters (items inserted / sampled) over a timed window after a warm-up; the ratio to
the required rate is printed beside each. Writes DIR/replay_server.{json,md} with the machine record; DIR
defaults to results/bench (--quick: runs/bench/replay-server-quick). Run it alone.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench.harness.machine import add_allow_busy, bench_machine, describe_load, finish, refuse_if_busy
from bench.harness.results_io import write_report
from quarl.ops.machine import machine_fields

REPO = Path(__file__).resolve().parents[2]
REQUIRED_INSERTS_PER_S = 11_000  # 12 int8 actors on the H200 machine (issue 20)
REQUIRED_SGD_STEPS_PER_S = 1_400
BATCH = 256
REQUIRED_SAMPLES_PER_S = REQUIRED_SGD_STEPS_PER_S * BATCH
CALLS = ("sample_stacked", "sample_batches")


def walker_table() -> dict[str, Any]:
    """D4PG's replay table for walker:stand (signature and config as the program builds them), its rate limiter
    opened wide: each side of the benchmark runs unthrottled."""
    # pylint: disable=import-outside-toplevel
    from launch.experiments.agent_spec import AgentSpec, table_spec

    spec = AgentSpec("d4pg", "walker:stand", {})
    table = table_spec(spec.builder(), spec.env_spec())
    table["config"] = {**table["config"], "error_buffer": 1e15}
    return table


def transitions(signature: dict[str, Any], n: int, seed: int) -> dict[str, np.ndarray]:
    """`n` random transitions of the signature (the rates do not depend on the values)."""
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(-1, 1, (n, *shape)).astype(np.dtype(dtype)) for name, (shape, dtype) in signature.items()}


class Inserter:
    """Inserts batches of `insert_batch` transitions in a loop, as an actor does (timeout and force as it passes
    them), until `stop`. A plain class: the `table` backend runs it in a thread, the `ray` one as a Ray actor."""

    def __init__(self, signature: dict[str, Any], insert_batch: int, seed: int):
        # A few distinct batches, cycled: no generation cost inside the timed loop.
        self._batches = [transitions(signature, insert_batch, seed * 8 + i) for i in range(4)]
        self._stopped = threading.Event()

    def run(self, insert: Callable[..., Any]) -> int:
        calls = 0
        while not self._stopped.is_set():
            insert(self._batches[calls % len(self._batches)], None, 0.1, False)
            calls += 1
        return calls

    def run_remote(self, server: Any) -> int:
        import ray  # pylint: disable=import-outside-toplevel

        return self.run(lambda *a: ray.get(server.insert.remote(*a)))

    def stop(self) -> None:
        self._stopped.set()

    def reset(self) -> None:
        """Ready for the next `run` (the previous phase set the stop flag)."""
        self._stopped.clear()


class Sampler:
    """`threads` threads each calling `call(batch_size, k)` in a loop (the learner's prefetch threads)."""

    def __init__(self, sample: Callable[[], Any], threads: int):
        self._sample = sample
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._sample()
        except BaseException as e:  # pylint: disable=broad-except  (raised by stop)
            if not self._stop.is_set():
                self._errors.append(e)

    def start(self) -> "Sampler":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        if self._errors:
            raise self._errors[0]


def window(info: Callable[[], dict[str, Any]], warmup_s: float, window_s: float) -> dict[str, float]:
    """Items inserted and sampled per second, by the table's counters, over `window_s` after `warmup_s`."""
    time.sleep(warmup_s)
    a, t0 = info(), time.perf_counter()
    time.sleep(window_s)
    b, t1 = info(), time.perf_counter()
    dt = t1 - t0
    inserts, samples = (b["inserts"] - a["inserts"]) / dt, (b["samples"] - a["samples"]) / dt
    return {"inserts_per_s": inserts, "samples_per_s": samples,
            "inserts_vs_required": inserts / REQUIRED_INSERTS_PER_S,
            "samples_vs_required": samples / REQUIRED_SAMPLES_PER_S}


def wait_for(info: Callable[[], dict[str, Any]], counter: str, timeout_s: float = 300.0) -> None:
    """Returns once `counter` moves (the inserters or samplers are running), so that start-up is never timed."""
    first, deadline = info()[counter], time.monotonic() + timeout_s
    while info()[counter] == first:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replay's {counter} counter did not move in {timeout_s:.0f} s")
        time.sleep(0.01)


class TableBackend:
    """One in-process `Table`; inserters are threads."""

    name = "table"

    def __init__(self, table: dict[str, Any], inserters: int, insert_batch: int, prefill: int):
        # pylint: disable=import-outside-toplevel
        from launch.distributed.nodes.services import ReplayServer

        self.signature = {k: (tuple(s), d) for k, (s, d) in table["signature"].items()}
        self.server = ReplayServer(table, seed=0)
        _prefill(self.server.insert, self.signature, prefill)
        self._inserters = [Inserter(self.signature, insert_batch, i) for i in range(inserters)]
        self._threads: list[threading.Thread] = []

    def info(self) -> dict[str, Any]:
        return self.server.info()

    def sampler(self, call: str, k: int, threads: int) -> Sampler:
        method = getattr(self.server, call)
        return Sampler(lambda: method(BATCH, k), threads)

    def start_inserts(self) -> None:
        for i in self._inserters:
            i.reset()
        self._threads = [threading.Thread(target=i.run, args=(self.server.insert,), daemon=True)
                         for i in self._inserters]
        for t in self._threads:
            t.start()

    def stop_inserts(self) -> None:
        for i in self._inserters:
            i.stop()
        for t in self._threads:
            t.join(30)

    def close(self) -> None:
        self.server.close()


class RayBackend:
    """`ReplayServer` as a Ray actor with the program's concurrency; inserters are Ray actor processes."""

    name = "ray"

    def __init__(self, table: dict[str, Any], inserters: int, insert_batch: int, prefill: int):
        # pylint: disable=import-outside-toplevel
        import ray

        from launch.distributed.nodes.services import ReplayServer

        self.signature = {k: (tuple(s), d) for k, (s, d) in table["signature"].items()}
        concurrency = max(8, 2 * inserters + 2 + 4)  # as launch.distributed.actorq_graph sizes the replay node
        self.server = ray.remote(ReplayServer).options(num_cpus=0, max_concurrency=concurrency).remote(table, seed=0)
        _prefill(lambda *a: ray.get(self.server.insert.remote(*a)), self.signature, prefill)
        remote_inserter = ray.remote(Inserter).options(num_cpus=0, max_concurrency=2)
        self._inserters = [remote_inserter.remote(self.signature, insert_batch, i) for i in range(inserters)]
        ray.get([i.stop.remote() for i in self._inserters])  # up and imported before any timing
        self._runs: list[Any] = []

    def info(self) -> dict[str, Any]:
        import ray  # pylint: disable=import-outside-toplevel

        return ray.get(self.server.info.remote())

    def sampler(self, call: str, k: int, threads: int) -> Sampler:
        import ray  # pylint: disable=import-outside-toplevel

        method = getattr(self.server, call)
        return Sampler(lambda: ray.get(method.remote(BATCH, k)), threads)

    def start_inserts(self) -> None:
        import ray  # pylint: disable=import-outside-toplevel

        ray.get([i.reset.remote() for i in self._inserters])
        self._runs = [i.run_remote.remote(self.server) for i in self._inserters]

    def stop_inserts(self) -> None:
        import ray  # pylint: disable=import-outside-toplevel

        ray.get([i.stop.remote() for i in self._inserters])
        ray.get(self._runs)

    def close(self) -> None:
        import ray  # pylint: disable=import-outside-toplevel

        for actor in [self.server, *self._inserters]:
            ray.kill(actor)


def _prefill(insert: Callable[..., Any], signature: dict[str, Any], items: int, chunk: int = 50_000) -> None:
    for start in range(0, items, chunk):
        insert(transitions(signature, min(chunk, items - start), start), None, None, True)


def _window_inserting(backend: Any, warmup_s: float, window_s: float) -> dict:
    """One timed window with the inserters running: started here, and stopped even when the window fails."""
    backend.start_inserts()
    try:
        wait_for(backend.info, "inserts")
        return window(backend.info, warmup_s, window_s)
    finally:
        backend.stop_inserts()


def measure_backend(backend: Any, ks: Sequence[int], samplers: int, warmup_s: float, window_s: float) -> dict:
    """Inserts alone, then per K and sample call: samples alone and both at once."""
    out: dict[str, Any] = {"backend": backend.name, "inserts_alone": _window_inserting(backend, warmup_s, window_s)}
    out["per_k"] = []
    for k in ks:
        for call in CALLS:
            row: dict[str, Any] = {"k": k, "call": call}
            sampler = backend.sampler(call, k, samplers).start()
            try:
                wait_for(backend.info, "samples")
                row["samples_alone"] = window(backend.info, warmup_s, window_s)
                row["both"] = _window_inserting(backend, warmup_s, window_s)
            finally:
                sampler.stop()
            out["per_k"].append(row)
            print(f"{backend.name} K={k} {call}: samples alone {row['samples_alone']['samples_per_s']:,.0f}/s; "
                  f"both: inserts {row['both']['inserts_per_s']:,.0f}/s "
                  f"({row['both']['inserts_vs_required']:.2f}x required), samples "
                  f"{row['both']['samples_per_s']:,.0f}/s ({row['both']['samples_vs_required']:.2f}x)", flush=True)
    return out


def markdown(result: dict[str, Any], command: str) -> str:
    m = machine_fields(result["machine"])
    s = result["settings"]
    lines = ["# Replay server at the paper's load", "",
             f"`{command}`. {m['cpu_model']}, {m['cores']} logical cores, Python {m['python']}; {describe_load(m)}. "
             f"D4PG walker:stand transitions, capacity {s['capacity']:,}, pre-filled {s['prefill']:,}; "
             f"{s['inserters']} inserters x batches of {s['insert_batch']}; {s['samplers']} sampler threads x "
             f"K batches of {BATCH}. Required: {REQUIRED_INSERTS_PER_S:,} inserts/s and "
             f"{REQUIRED_SAMPLES_PER_S:,} sampled transitions/s ({REQUIRED_SGD_STEPS_PER_S:,} SGD steps/s x {BATCH}).",
             "", "| backend | K | sample call | inserts/s alone | samples/s alone | both: inserts/s | x required "
             "| both: samples/s | x required |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for b in result["backends"]:
        alone = b["inserts_alone"]["inserts_per_s"]
        for r in b["per_k"]:
            both = r["both"]
            lines.append(f"| {b['backend']} | {r['k']} | `{r['call']}` | {alone:,.0f} | "
                         f"{r['samples_alone']['samples_per_s']:,.0f} | {both['inserts_per_s']:,.0f} | "
                         f"{both['inserts_vs_required']:.2f} | {both['samples_per_s']:,.0f} | "
                         f"{both['samples_vs_required']:.2f} |")
    lines += ["", "Rates are the table's counters over the timed window (rate limiter opened wide). Raw data: "
              "`replay_server.json`.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.system.replay_server", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 inserters, K=2, short windows")
    p.add_argument("--ks", default="8,32", help="batches per sample call, comma-separated")
    p.add_argument("--inserters", type=int, default=12)
    p.add_argument("--insert-batch", type=int, default=64)
    p.add_argument("--samplers", type=int, default=2, help="sampling threads (the learner's --prefetch)")
    p.add_argument("--prefill", type=int, default=200_000)
    p.add_argument("--window-s", type=float, default=4.0)
    p.add_argument("--modes", default="table,ray")
    p.add_argument("--out", default=None)
    add_allow_busy(p)
    args = p.parse_args(argv)
    try:
        ks = [int(k) for k in args.ks.split(",")]
        modes = args.modes.split(",")
        if (min(ks) < 1 or args.inserters < 1 or args.insert_batch < 1 or args.samplers < 1 or args.prefill < BATCH
                or not args.window_s > 0 or not set(modes) <= {"table", "ray"}):
            raise ValueError
    except ValueError:
        p.exit(2, f"{p.prog}: error: --ks and the counts must be positive ints (--prefill >= {BATCH}), --window-s > 0, "
                  "--modes from table,ray\n")
    if args.quick:
        ks, args.inserters, args.prefill, args.window_s = [2], 2, 5_000, 0.5
    machine = bench_machine(args.allow_busy)
    machine["load_start"] = refuse_if_busy(p, args.allow_busy)
    table = walker_table()
    settings = {"capacity": int(table["config"]["capacity"]), "prefill": args.prefill, "inserters": args.inserters,
                "insert_batch": args.insert_batch, "samplers": args.samplers, "ks": ks, "window_s": args.window_s}
    result: dict[str, Any] = {"machine": machine, "settings": settings, "backends": []}
    warmup = 0.2 if args.quick else 1.0
    for mode in modes:
        if mode == "ray":
            # pylint: disable=import-outside-toplevel
            import ray

            from launch.program.ray_runner import init_ray

            started = init_ray(None, num_cpus=args.inserters + 2)
        backend = (TableBackend if mode == "table" else RayBackend)(table, args.inserters, args.insert_batch,
                                                                    args.prefill)
        try:
            result["backends"].append(measure_backend(backend, ks, args.samplers, warmup, args.window_s))
        finally:
            backend.close()
            if mode == "ray" and started:
                ray.shutdown()
    finish(machine)
    default = "runs/bench/replay-server-quick" if args.quick else "results/bench"
    outdir = Path(args.out) if args.out else REPO / default
    write_report(outdir, "bench.system.replay_server", argv, result, markdown, newline=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
