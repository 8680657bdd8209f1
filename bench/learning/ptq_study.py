"""The paper's PTQ study across algorithms: train each algorithm on each of its tasks over several seeds, sweep the
final fp32 policy of every run with launch.ptq's rows, and put reward against precision in one table.

    python -m bench.learning.ptq_study run [--algos dqn,d4pg,ppo,a2c] [--tasks CartPole-v1,...] [--seeds 0-9 as 0,..,9]
        [--episodes N] [--bits 8,6,4,3,2] [--include fp16,bf16] [--steps ALGO/TASK=N,...] [--backend jax]
        [--qat-bits 8,4,2|none] [--runs runs/bench/ptq_study] [--out results/bench] [--quick] [--retrain-stale]
        [--allow-busy]
    python -m bench.learning.ptq_study report [--out DIR]      # the table and plot again from OUT/ptq_study.csv
    python -m bench.learning.ptq_study merge DIR... [--out DIR] [--replace]  # add other folders' cells (another
                                                                # session or machine; --replace: theirs win)

Each (algorithm, task, seed) cell is one training run of its row's trainer (`StudyRow.trainer`): where the task has
a gymnax port (classic control, MinAtar) `launch.anakin`, which trains the row's 10 seeds together in one vmapped
call per arm (bench.learning.ptq_study_anakin); elsewhere (DM Control) a `launch.train` run per seed, 3 seeds. Either
runs fp32 actors, the task's preset plus the row's overrides, as a subprocess of this checkout, and stops once the
row's evaluations reach its reference return (`StudyRow.reference`, with its source: gymnasium's solved thresholds,
the MinAtar authors' DQN, the QuaRL paper's D4PG; 2 evaluations of 10 episodes in a row, D4PG cartpole:balance one
of 5; a vmapped call once every seed has) or at its budget, followed by a greedy
evaluation of its final fp32 policy at every precision, the row's sweep episodes (50, D4PG 10; `--episodes`) per
precision on the same environment seeds (so each precision's change from fp32 is paired within a seed), on the
project's own environments whichever trainer made the policy. Rows beside PTQ (`StudyRow.extra_rows`): int8-head16,
int8 with the output layer (DQN's Q head) kept at 16 bits and run dequantized. Integer rows
quantize the weights per channel, as actors do, and run the integer kernel (W<b>A8); fp16/bf16 run natively
(`launch.ptq_policy.make_row_policy`). Policy size is the payload an actor pulls at that precision
(`quarl.quant.payload`: codes bit-packed, scales, biases and LayerNorm in fp32, header). A seed whose fp32 policy
evaluates below the reference is not converged: the report lists it and keeps it out of the tables. Beside PTQ, rows
with QAT widths train one more run per width (`--qat-bits B`, int-B actors, the same budget and stopping rule) and
evaluate it at int-B (rows "qat-intB").

It resumes like bench.peers.fidelity: each finished cell's rows go into OUT/ptq_study.csv as soon as it is done, and a
cell whose precisions are all there is not run again (its data are kept, also when its run folder is on another
machine), so the grid can be split over sessions that each commit their part. Rows record the stopping rule their run
stopped by; after a row's rule changes, or its budget grows past a cell that did not converge, `--retrain-stale` trains
those selected cells again (their old run folders are kept beside as `sN.stale`). Every row names the CPU it was
evaluated on. No timing is reported: returns per env step do not depend on the machine's load (the busy-machine
guard still applies, as for every benchmark; pass --allow-busy on a shared machine).

Writes OUT/ptq_study.csv (one row per cell and precision), OUT/ptq_study.md (algorithm x task x precision: mean
reward over seeds, relative change from fp32 with its spread over seeds, policy bytes) and OUT/ptq_study.png
(reward vs precision per algorithm and task; table and plot: bench.learning.ptq_study_report). --quick (tiny
networks and budgets, CartPole only) writes to runs/bench/ptq_study-quick. Agents this build does not have (e.g.
PPO/A2C before they land) are left out of the default grid with a note; naming them in --algos is an error.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

import agents
from analysis.runs import is_finished, read_summary
from bench.harness.machine import add_allow_busy, bench_machine, check_load, finish, run_cli
from bench.harness.results_io import write_json, write_text
from bench.learning.ptq_study_anakin import needs_training, run_flags, seed_dir, train_arm
from bench.learning.ptq_study_grid import GRID, QUICK_TASKS, STOP_LEGACY, StudyRow
from bench.learning.ptq_study_report import CSV_FILE, MD_FILE, PNG_FILE, SESSIONS_FILE, markdown, plot
from bench.learning.ptq_study_rows import QAT_PREFIX, group, merge_folders, read_rows, replace_train_rows, write_rows
from bench.learning.ptq_study_sweep import EVAL_SEED_BASE, sweep_cell
from launch.cli import OneLineArgumentParser, UsageError
from quarl.ops.io import read_json_list
from quarl.quant.precision import MAX_KERNEL_BITS

REPO = Path(__file__).resolve().parents[2]
__all__ = ["EVAL_SEED_BASE", "sweep_cell"]  # the sweep lives in ptq_study_sweep; its users import it from here
RUN_TIMEOUT_S = 4 * 3600.0


# ------------------------------------------------------------------------------------------------ arguments


def _csv_list(text: str) -> list[str]:
    return [t.strip() for t in str(text).split(",") if t.strip()]


def select_rows(algos: str | None, tasks: str | None, steps: str, quick: bool) -> tuple[list[StudyRow], list[str]]:
    """The grid rows asked for, with --steps applied, and notes on default rows left out (agent not in this build)."""
    known = set(agents.AGENT_NAMES)
    wanted = _csv_list(algos) if algos else None
    for algo in wanted or ():
        if algo not in {r.algo for r in GRID}:
            raise UsageError(f"--algos: {algo!r} has no row in the study (algorithms: "
                             f"{', '.join(dict.fromkeys(r.algo for r in GRID))})")
        if algo not in known:
            raise UsageError(f"--algos: agent {algo!r} is not in this build (agents: {', '.join(agents.AGENT_NAMES)})")
    rows = [r for r in GRID if (r.algo in wanted if wanted else True)]
    notes = [f"{a}: not in this build, left out" for a in dict.fromkeys(r.algo for r in rows) if a not in known]
    rows = [r for r in rows if r.algo in known]
    if tasks:
        task_list = _csv_list(tasks)
        unknown = [t for t in task_list if t not in {r.task for r in rows}]
        if unknown:
            raise UsageError(f"--tasks: no selected algorithm has a row for {', '.join(unknown)} (rows: "
                             f"{', '.join(f'{r.algo}/{r.task}' for r in rows)})")
        rows = [r for r in rows if r.task in task_list]
    elif quick:
        rows = [r for r in rows if r.task in QUICK_TASKS]
    if quick:
        rows = [dataclasses.replace(r, steps=600, eval_every=300, eval_episodes=STOP_LEGACY[0], target_streak=0)
                for r in rows]  # no reference within reach: no early stop
    for item in _csv_list(steps):
        key, _, value = item.rpartition("=")
        algo, _, task = key.partition("/")
        match = [r for r in rows if (r.algo, r.task) == (algo, task)]
        if not match or not value.isdigit() or int(value) <= 0:
            raise UsageError(f"--steps expects ALGO/TASK=N for selected rows, got {item!r}")
        rows = [dataclasses.replace(r, steps=int(value), eval_every=min(r.eval_every, int(value)))
                if r is match[0] else r for r in rows]
    if not rows:
        raise UsageError("the selection has no rows")
    return rows, notes


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog="bench.learning.ptq_study", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the missing cells, then report")
    run.add_argument("--algos", default=None, help="comma-separated (default: every algorithm in this build)")
    run.add_argument("--tasks", default=None, help="comma-separated (default: every task of the algorithms)")
    run.add_argument("--seeds", default=None,
                     help="training seeds (default: each row's, 0-9 for launch.anakin rows and 0,1,2 for "
                          "launch.train rows; 0,1 with --quick)")
    run.add_argument("--episodes", type=int, default=None,
                     help="evaluation episodes per seed and precision (default: each row's, 50 or 10 for D4PG; "
                          "3 with --quick); cells swept at another count are evaluated again where their policy is")
    run.add_argument("--bits", default="8,6,4,3,2", help="integer widths (2..8: the integer kernel)")
    run.add_argument("--include", default="fp16,bf16", help="float precisions beside fp32")
    run.add_argument("--steps", default="", help="ALGO/TASK=N,... training env steps instead of the row's")
    run.add_argument("--backend", default="jax", help="runtime of the evaluated rows: jax, onnx, auto")
    run.add_argument("--runs", default=None, help="run folders (default runs/bench/ptq_study[-quick])")
    run.add_argument("--out", default=None, help="results (default results/bench; runs/bench/ptq_study-quick)")
    run.add_argument("--quick", action="store_true", help="tiny networks and budgets, CartPole tasks (smoke run)")
    run.add_argument("--qat-bits", default=None, metavar="B,...",
                     help="QAT runs beside PTQ at these widths, for rows that have QAT ('none': PTQ only; default: "
                          "each row's, none with --quick)")
    run.add_argument("--retrain-stale", action="store_true",
                     help="train the selected cells again that were recorded under a stopping rule other than their "
                          "row's, or did not converge within a budget since raised (old run folders kept as sN.stale)")
    add_allow_busy(run)
    report = sub.add_parser("report", help="table and plot from OUT/ptq_study.csv")
    report.add_argument("--out", default=str(REPO / "results" / "bench"))
    merge = sub.add_parser("merge", help="add the runs of other study folders (e.g. another machine's) to OUT")
    merge.add_argument("folders", nargs="+", help="folders holding a ptq_study.csv")
    merge.add_argument("--out", default=str(REPO / "results" / "bench"))
    merge.add_argument("--replace", action="store_true",
                       help="a folder's run replaces OUT's (default: OUT's own run is kept)")
    args = parser.parse_args(argv)
    if args.command == "run":
        from launch.ptq import parse_bits, parse_include  # pylint: disable=import-outside-toplevel
        from launch.cli import check_backend  # pylint: disable=import-outside-toplevel
        args.rows, args.notes = select_rows(args.algos, args.tasks, args.steps, args.quick)
        try:
            text = args.seeds or ("0,1" if args.quick else None)
            args.seeds = None if text is None else [int(s) for s in _csv_list(text)]
        except ValueError:
            raise UsageError(f"--seeds takes comma-separated ints, got {args.seeds!r}") from None
        if args.seeds is not None and (not args.seeds or min(args.seeds) < 0):
            raise UsageError("--seeds needs at least one non-negative int")
        args.episodes = args.episodes if args.episodes is not None else (3 if args.quick else None)
        if args.episodes is not None and args.episodes <= 0:
            raise UsageError("--episodes must be positive")
        args.bits = parse_bits(args.bits)
        if max(args.bits) > MAX_KERNEL_BITS:
            raise UsageError("--bits: the study covers the integer kernels, 2..8")
        args.include = parse_include(args.include)
        if args.qat_bits is None or args.qat_bits.strip().lower() == "none":
            args.qat_bits = None if args.qat_bits is None and not args.quick else []
        else:
            args.qat_bits = parse_bits(args.qat_bits, "--qat-bits")
            if max(args.qat_bits) > MAX_KERNEL_BITS:
                raise UsageError("--qat-bits: QAT trains for the integer kernels, 2..8")
        args.backend = check_backend(args.backend)
        quick_dir = REPO / "runs" / "bench" / "ptq_study-quick"
        args.runs = Path(args.runs or (quick_dir / "runs" if args.quick else REPO / "runs" / "bench" / "ptq_study"))
        args.out = Path(args.out or (quick_dir if args.quick else REPO / "results" / "bench"))
    return args


# ------------------------------------------------------------------------------------------------ one cell


def run_dir(runs: Path, algo: str, task: str, seed: int, qat_bits: int | None = None, trainer: str = "train") -> Path:
    """The cell's fp32 training run, or with `qat_bits` its QAT run beside it (`launch.anakin`'s: one seed of its
    arm's vmapped call, bench.learning.ptq_study_anakin)."""
    if trainer == "anakin":
        return seed_dir(runs, algo, task, seed, qat_bits)
    name = f"s{seed}" + (f"-qat{qat_bits}" if qat_bits else "")
    return runs / algo / task.replace("/", "_").replace(":", "_") / name


def train_command(row: StudyRow, seed: int, logdir: Path, quick: bool, qat_bits: int | None = None) -> list[str]:
    """`launch.train` for one cell (a subprocess of this checkout: `-m` imports from its cwd): fp32 actors, or
    int-B actors trained with `--qat-bits B`; either stops once the row's evaluations reach its reference."""
    precision, target, sets = run_flags(row, quick, qat_bits)
    return [sys.executable, "-m", "launch.train", "--agent", row.algo, "--task", row.task, *precision,
            "--steps", str(row.steps), "--seed", str(seed), "--eval-every", str(row.eval_every),
            "--eval-episodes", str(row.eval_episodes), *target, "--logdir", str(logdir), "--no-progress", *sets]


def train_cell(row: StudyRow, seed: int, logdir: Path, quick: bool, qat_bits: int | None = None) -> None:
    """Trains the cell's policy from scratch (a folder left by an interrupted run is cleared first)."""
    from bench.harness.learning_runs import empty_run_dir  # pylint: disable=import-outside-toplevel
    from bench.harness.subprocess_runs import run_subprocess  # pylint: disable=import-outside-toplevel

    empty_run_dir(logdir).parent.mkdir(parents=True, exist_ok=True)
    log = logdir.parent / f"{logdir.name}.log"
    code, _, _ = run_subprocess(train_command(row, seed, logdir, quick, qat_bits), log, RUN_TIMEOUT_S, REPO)
    if code != 0 or not (logdir / "summary.json").is_file():
        raise RuntimeError(f"{row.algo} {row.task} seed {seed}: training failed (exit {code}); see {log}")


# ------------------------------------------------------------------------------------------------ resumable grid


def run_grid(args: argparse.Namespace) -> None:
    """Every cell of the selection that is not already in OUT/ptq_study.csv, its rows saved as soon as they exist:
    the fp32 run swept at every precision, then one QAT run per bit width of the row (`--qat-bits`), each
    evaluated at its own width."""
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / CSV_FILE
    rows = read_rows(csv_path)
    machine = bench_machine(args.allow_busy)
    precisions = ["fp32", *args.include, *(f"int{b}" for b in sorted(args.bits, reverse=True))]
    cells = [(row, seed) for row in args.rows for seed in (args.seeds or row.seeds)]
    stale: list[dict[str, Any]] = []
    if args.retrain_stale:
        kept = drop_stale(rows, cells, args.runs, args.qat_bits)
        stale, rows = [r for r in rows if r not in kept], kept
    try:
        _run_cells(args, cells, rows, precisions, machine, csv_path, stale)
    finally:  # a stopped session's cells are in the CSV already: its machine and load go beside them
        sessions = read_json_list(args.out / SESSIONS_FILE)
        sessions.append(finish(machine))
        write_json(args.out / SESSIONS_FILE, sessions)


def _run_cells(args: argparse.Namespace, cells: Sequence[tuple[StudyRow, int]], rows: list[dict[str, Any]],
               precisions: Sequence[str], machine: dict[str, Any], csv_path: Path,
               stale: Sequence[dict[str, Any]] = ()) -> None:
    """Trains and sweeps each cell not in `rows`; every write keeps the `stale` rows of runs not yet retrained, so a
    session stopped part-way loses none of them. A launch.anakin row's seeds that need a run train first, one
    vmapped call per arm; once every seed of an arm is swept, its launch.train rows leave the CSV (replaced)."""
    for i, (row, seed) in enumerate(cells, 1):
        if row.trainer == "anakin" and (i == 1 or cells[i - 2][0] is not row):
            _train_anakin_arms(args, row, [s for r, s in cells if r is row], rows, precisions)
        tag = f"[{i}/{len(cells)}] {row.algo} {row.task} seed {seed}"
        widths = qat_widths(row, args.qat_bits)
        episodes = args.episodes or row.sweep_episodes
        wanted_rows = [*precisions[:1], *row.extra_rows, *precisions[1:]]  # the extra rows early: they answer a miss
        for bits in (None, *widths):  # swept at another episode count, policy at hand: evaluated again
            key = (row.algo, row.task, seed, bits, row.trainer)
            logdir = run_dir(args.runs, row.algo, row.task, seed, bits, row.trainer)
            counts = sorted({r["episodes"] for r in rows if group(r) == key})
            if counts and counts != [episodes] and has_policy(logdir):
                print(f"{tag}{f' QAT int{bits}' if bits else ''}: swept at {'/'.join(map(str, counts))} episodes; "
                      f"evaluating again at {episodes}", flush=True)
                rows[:] = [r for r in rows if group(r) != key]
        have = {r["precision"] for r in rows
                if (r["algo"], r["task"], r["seed"], r["trainer"]) == (row.algo, row.task, seed, row.trainer)}
        qat = [b for b in widths if f"{QAT_PREFIX}int{b}" not in have]
        qat_have = {p for p in have if p.startswith(QAT_PREFIX)}
        for bits, wanted in ((None, [p for p in wanted_rows if p not in have]), *((b, [f"int{b}"]) for b in qat)):
            if not wanted:
                continue
            logdir = run_dir(args.runs, row.algo, row.task, seed, bits, row.trainer)
            what = f"{tag}{f' QAT int{bits}' if bits else ''}"
            if bits is None and have - qat_have and not has_policy(logdir):
                print(f"{what}: {', '.join(wanted)} missing, but its policy is not under {args.runs}; skipped",
                      flush=True)
                continue
            # Absent, or stopped part-way (a stopped or failed run writes summary.json too; its policy is not the
            # cell's): train it.
            if not is_finished(read_summary(logdir)):
                if row.trainer == "anakin":  # its arm's call trained it, or failed saying so
                    raise RuntimeError(f"{what}: no finished launch.anakin run in {logdir}")
                print(f"{what}: training up to {row.steps:,} env steps ...", flush=True)
                train_cell(row, seed, logdir, args.quick, bits)
            print(f"{what}: evaluating {', '.join(wanted)} ...", flush=True)
            rows += sweep_cell(logdir, seed, wanted, episodes, args.backend, machine["cpu_model"], row.reference,
                               label=QAT_PREFIX if bits else "", trainer=row.trainer)
            if row.trainer == "anakin":
                rows[:] = replace_train_rows(rows, row.algo, row.task)
            retrained = {group(r) for r in rows}
            write_rows(csv_path, rows + [r for r in stale if group(r) not in retrained])
        if not qat and not [p for p in wanted_rows if p not in have]:
            print(f"{tag}: in {csv_path} already", flush=True)


def _train_anakin_arms(args: argparse.Namespace, row: StudyRow, seeds: Sequence[int], rows: Sequence[dict[str, Any]],
                       precisions: Sequence[str]) -> None:
    """One launch.anakin call per arm of `row` (fp32, each QAT width) for the `seeds` whose rows are missing and
    whose run is not finished: the seeds train together, vmapped."""
    for bits in (None, *qat_widths(row, args.qat_bits)):
        names = [*precisions, *row.extra_rows] if bits is None else [f"{QAT_PREFIX}int{bits}"]
        todo = [s for s in seeds if needs_training(args.runs, row, s, bits) and any(
            not any((r["algo"], r["task"], r["seed"], r["trainer"], r["precision"]) ==
                    (row.algo, row.task, s, "anakin", n) for r in rows) for n in names)]
        if todo:
            print(f"{row.algo} {row.task}{f' QAT int{bits}' if bits else ''}: launch.anakin training seeds "
                  f"{','.join(map(str, todo))} up to {row.steps:,} env steps ...", flush=True)
            train_arm(row, todo, args.runs, args.quick, REPO, bits)


def qat_widths(row: StudyRow, asked: Sequence[int] | None) -> list[int]:
    """The QAT widths this session trains for `row`: the row's, or those of `--qat-bits` the row has."""
    return list(row.qat_bits) if asked is None else [b for b in asked if b in row.qat_bits]


def has_policy(logdir: Path) -> bool:
    """Whether a run folder holds its finished run's policy (what a sweep evaluates)."""
    return (logdir / "policy_fp32.qrlp").is_file() and is_finished(read_summary(logdir))


def drop_stale(rows: list[dict[str, Any]], cells: Sequence[tuple[StudyRow, int]], runs: Path,
               asked_qat: Sequence[int] | None) -> list[dict[str, Any]]:
    """`rows` without those of `cells` that are stale, for the runs this session trains (the fp32 run's precisions,
    and the QAT widths asked for), each such run moved aside to `<run>.stale` so it trains again. A run is stale when
    it was recorded under a stopping rule other than its grid row's, or when it did not converge (its fp32 policy
    below the reference) within a budget the row has since raised. The CSV keeps a run's old rows until its new
    ones are written (`_run_cells`)."""
    stale: dict[tuple[str, str, int, int | None, str], str] = {}
    for row, seed in cells:
        retrained = {None, *qat_widths(row, asked_qat)}
        for r in rows:
            key = group(r)
            if key[:3] != (row.algo, row.task, seed) or key[3] not in retrained or key[4] != row.trainer:
                continue
            if (r["train_eval_episodes"], r["train_target_streak"]) != (row.eval_episodes, row.target_streak):
                stale[key] = "recorded under another stopping rule"
            elif r["precision"] == "fp32" and row.reference is not None and r["mean_return"] < row.reference \
                    and r["train_steps"] < row.steps:
                stale[(*key[:3], None, key[4])] = (f"did not converge in {r['train_steps']:,} env steps; its budget "
                                                   f"is now {row.steps:,}")
    for (algo, task, seed, bits, trainer), why in sorted(stale.items(), key=str):
        run = run_dir(runs, algo, task, seed, bits, trainer)
        print(f"{algo} {task} seed {seed}{f' QAT int{bits}' if bits else ''}: {why}; training it again", flush=True)
        if run.exists():
            aside = run.with_name(run.name + ".stale")
            shutil.rmtree(aside, ignore_errors=True)
            run.rename(aside)
    return [r for r in rows if group(r) not in stale]


def report(out: Path) -> str:
    rows = read_rows(out / CSV_FILE)
    if not rows:
        raise UsageError(f"no study rows in {out / CSV_FILE}")
    text = markdown(rows, read_json_list(out / SESSIONS_FILE), GRID)
    write_text(out / MD_FILE, text)
    plot(rows, out / PNG_FILE)
    return text


def _main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.command == "run":
        check_load(args.allow_busy)
        for note in args.notes:
            print(f"bench.learning.ptq_study: {note}", flush=True)
        run_grid(args)
    if args.command == "merge":
        for line in merge_folders(Path(args.out), args.folders, args.replace):
            print(f"bench.learning.ptq_study merge: {line}", flush=True)
    print(report(Path(args.out)))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("bench.learning.ptq_study", lambda: _main(argv))


if __name__ == "__main__":
    sys.exit(main())
