"""Learning benchmark: full-size single-process runs, fp32 actors vs int8 actors, same seeds, side by side.

    python -m bench.learning.int8_vs_fp32 [--rows dqn|d4pg|all] [--tasks CartPole-v1,...] [--seeds 0,1,2]
                             [--precisions fp32,int8] [--full-curves] [--quick] [--out DIR]

Every run is `launch.experiments.run_experiment.run_experiment` (the learner is fp32 either way; only the actors' weights
and arithmetic change with the precision). A run stops at its first evaluation that reaches the row's target
(unless --full-curves), so "steps/seconds to target" are comparable across precisions; seeds and precisions
are interleaved so that load from other processes on a shared machine hits both alike.

Writes DIR/learning_<rows>.csv (one line per run), DIR/learning_<rows>_curves.csv (every evaluation),
DIR/learning_<rows>.md (summary table) and DIR/learning_<rows>.png (curves); per-run logs go under
runs/bench/learning/. The full run writes to results/bench; --quick (CartPole only, one seed, small budget)
writes to runs/bench/learning-quick so it never overwrites committed results.

Other agents add their rows with `register_rows(name, rows)` (or a module `bench.learning.<name>_rows` that
defines `ROWS`, imported on demand for `--rows <name>`: bench.learning.d4pg_rows), then `main(["--rows", name])`
or `run_rows(...)`. A run is `bench.harness.learning_runs.run_one`; the rows are `bench.harness.rows`' and the
report (table and figure) is `bench.learning.int8_vs_fp32_report`'s.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Sequence

from bench.harness.learning_runs import RESULTS, RUNS, run_one
from bench.harness.machine import add_allow_busy, bench_machine, describe_cpu, describe_load, finish, refuse_if_busy
from bench.harness.results_io import write_csv, write_text
from bench.harness.rows import DQN_ROWS, QUICK_ROWS, LearningRow
from bench.learning.int8_vs_fp32_report import markdown_table, plot_curves, read_curves
from quarl.quant.precision import precision_list_arg

_ROW_SETS: dict[str, tuple[LearningRow, ...]] = {"dqn": DQN_ROWS}


def register_rows(name: str, rows: Sequence[LearningRow]) -> None:
    """Makes `rows` runnable as `--rows <name>` (and part of `--rows all`)."""
    if not name.isidentifier():
        raise ValueError(f"row set name must be an identifier, got {name!r}")
    if not rows or not all(isinstance(r, LearningRow) for r in rows):
        raise ValueError("rows must be a non-empty sequence of LearningRow")
    _ROW_SETS[name] = tuple(rows)


def row_set(name: str) -> tuple[LearningRow, ...]:
    """Registered rows, or `bench.learning.<name>_rows.ROWS` imported on demand."""
    if name not in _ROW_SETS:
        try:
            module = importlib.import_module(f"bench.learning.{name}_rows")
        except ModuleNotFoundError:
            raise ValueError(f"unknown row set {name!r}; known: {', '.join(sorted(_ROW_SETS))}") from None
        register_rows(name, module.ROWS)
    return _ROW_SETS[name]


def run_rows(rows: Sequence[LearningRow], *, name: str, seeds: Sequence[int], precisions: Sequence[str],
             outdir: Path, runs_dir: Path, stop_at_target: bool = True, backend: str = "auto",
             command: str = "") -> list[dict]:
    """Runs every (row, seed, precision), interleaved, and writes the CSVs, the table and the plot."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    machine = bench_machine(allow_busy=True)  # the CLI refused a busy machine already; the load is recorded
    results, curves = [], []
    for seed in seeds:
        for row in rows:
            for precision in precisions:
                logdir = runs_dir / f"{stamp}-{name}" / f"{row.agent}_{row.task.replace(':', '-')}_{precision}_s{seed}"
                result, curve = run_one(row, precision, seed, logdir=logdir, stop_at_target=stop_at_target,
                                        backend=backend)
                results.append(result)
                curves.extend(curve)
                print(f"{row.task:16s} {precision:5s} seed {seed}: solved={result['solved']!s:5s} "
                      f"steps={result['steps_to_target']} train_s={result['train_s_to_target']} "
                      f"best={result['best_return']:.1f} ({result['env_steps_per_s']:.0f} env steps/s)",
                      flush=True)
    outdir.mkdir(parents=True, exist_ok=True)
    write_csv(outdir / f"learning_{name}.csv", results)
    write_csv(outdir / f"learning_{name}_curves.csv", curves)
    finish(machine)
    words = f"{describe_cpu(machine)}; {describe_load(machine)}"
    write_text(outdir / f"learning_{name}.md", markdown_table(results, rows, name, command, words))
    plot_curves(curves, rows, outdir / f"learning_{name}.png", machine=describe_cpu(machine))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.learning.int8_vs_fp32", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="dqn", help="row set: dqn, d4pg, ... or all")
    p.add_argument("--tasks", default=None, help="comma-separated subset of the row set's tasks")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--precisions", default="fp32,int8", type=precision_list_arg("actor"))
    p.add_argument("--backend", default="auto")
    p.add_argument("--full-curves", action="store_true", help="run every budget to the end (no stop at target)")
    p.add_argument("--quick", action="store_true", help="CartPole only, seed 0, small budget (a smoke run)")
    p.add_argument("--out", default=None)
    p.add_argument("--report-only", action="store_true",
                   help="redraw OUT/learning_<rows>.png from its _curves.csv (training nothing); --machine names it")
    p.add_argument("--machine", default="", help="with --report-only: the machine the runs ran on")
    add_allow_busy(p)
    args = p.parse_args(argv)
    if args.report_only:
        outdir = Path(args.out) if args.out else RESULTS
        curves = read_curves(outdir / f"learning_{args.rows}_curves.csv")
        tasks = {(c["agent"], c["task"]) for c in curves}
        rows = tuple(r for r in row_set(args.rows) if (r.agent, r.task) in tasks)
        plot_curves(curves, rows, outdir / f"learning_{args.rows}.png", machine=args.machine)
        print(f"redrew {outdir}/learning_{args.rows}.png")
        return 0
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        precisions = args.precisions
        if args.quick:
            name, rows, seeds = "quick", QUICK_ROWS, seeds[:1]
        elif args.rows == "all":
            name = "all"
            rows = tuple(r for n in sorted(set(_ROW_SETS) | {"d4pg"}) for r in _try_row_set(n))
        else:
            name, rows = args.rows, row_set(args.rows)
        if args.tasks:
            wanted = {t.strip() for t in args.tasks.split(",")}
            unknown = wanted - {r.task for r in rows}
            if unknown:
                raise ValueError(f"tasks {sorted(unknown)} are not in row set {name!r}")
            rows = tuple(r for r in rows if r.task in wanted)
        if not seeds or min(seeds) < 0 or not precisions:
            raise ValueError("need at least one non-negative seed and one precision")
    except ValueError as e:
        sys.stderr.write(f"bench.learning.int8_vs_fp32: error: {e}\n")
        return 2
    refuse_if_busy(p, args.allow_busy)
    outdir = Path(args.out) if args.out else (RUNS / "learning-quick" if args.quick else RESULTS)
    run_rows(rows, name=name, seeds=seeds, precisions=precisions, outdir=outdir, runs_dir=RUNS / "learning",
             stop_at_target=not args.full_curves, backend=args.backend,
             command=" ".join(["python -m bench.learning.int8_vs_fp32", *(argv if argv is not None else sys.argv[1:])]))
    print(f"wrote {outdir}/learning_{name}.{{csv,md,png}}")
    return 0


def _try_row_set(name: str) -> tuple[LearningRow, ...]:
    try:
        return row_set(name)
    except ValueError:
        return ()


if __name__ == "__main__":
    # Run the importable `bench.learning.int8_vs_fp32`, not this `__main__` copy of it, so that rows registered by
    # importing it (tests, other agents) and the ones `--rows` loads share one registry.
    from bench.learning.int8_vs_fp32 import main as _main  # pylint: disable=import-self
    sys.exit(_main())
