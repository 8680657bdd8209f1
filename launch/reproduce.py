r"""One command for the ActorQ paper's figure: a grid of runs (panel x precision x seed), then the report.

    python -m launch.reproduce --panels cartpole_balance,CartPole --precisions 32,16,8 --seeds 0,1,2 \
        --budget small [--name NAME] [--runner single|actorq] [--out results] [--fraction 0.9] [--report-only]
        [--force]

Every run goes to OUT/NAME/runs/<panel>/<precision>/seed<k>/. A run whose summary.json reports success is
skipped, so an interrupted grid resumes where it stopped; a run folder without one (interrupted, failed) is
cleared and run again. When the grid is done (or with --report-only, without running anything) OUT/NAME/
gets figure.png, speedup.csv, carbon.csv, runtime.csv/png, grid.csv and report.md (see analysis.report).

Nothing is overwritten silently (`launch.report_guard`): a grid invocation merges into the folder, and its report
covers every run there (those of earlier invocations too), not only the ones it asked for; when nothing ran and
the report already lists every finished run, it is left as it is. --report-only narrowed by --panels/
--precisions/--seeds writes to OUT/NAME/subsets/<selection>/. A report that would drop a finished run it lists
is refused (exit 2) unless --force, the one way to replace a report by a smaller one.

On one machine runs are sequential on purpose: their wall clocks are what the figure compares, so two runs
must never share the machine. With --ray-address ADDR (single-process runner) the grid's runs are Ray tasks on
that cluster, --cpus-per-run CPUs each, as many at once as fit (`launch.grid.cluster`); results land in the
same folder, and the grid resumes the same way. machine.json records the machine, its SIMD flags and CPU class,
and the load average as the runs start and stop. Bad flags print one line on stderr and exit 2 before anything is
written; a grid with a failed run exits 1 after drawing the report of the runs that finished; Ctrl-C exits 130.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pandas as pd

from analysis import report
from analysis.runs import PANELS, is_finished, read_summary
from analysis.upgrade_summaries import is_old_single_process
from launch.cli import OneLineArgumentParser, UsageError, check_backend, check_precision, fail
from launch.experiments.progress import ItemProgress
from launch.grid.cluster import run_on_cluster
from launch.grid.runs import BUDGETS, DEFAULT_RUNNER, PUBLIC_BUDGETS, RUNNERS, PlannedRun, run_actorq, run_single
from launch.report_guard import describe, finished_in_report, finished_on_disk, lost_runs, subset_dir
from launch.grid.runs import actorq_command  # noqa: F401 - part of this CLI's API (what a grid run executes)
from quarl.ops.io import jsonable, read_json_object, write_json_atomic
from quarl.ops.machine import load_average, machine_info

if TYPE_CHECKING:
    from analysis.report import ReportFiles

PROG = "launch.reproduce"
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
DEFAULT_PRECISIONS = ("fp32", "fp16", "int8")
DEFAULT_SEEDS = (0, 1, 2)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


# ------------------------------------------------------------------------------------------------ plan


@dataclasses.dataclass(frozen=True)
class Invocation:
    panels: tuple[str, ...]
    precisions: tuple[str, ...]
    seeds: tuple[int, ...]
    budget: str
    runner: str
    backend: str
    root: Path
    fraction: float
    report_only: bool
    progress: bool
    ray_address: str | None = None  # run the grid as Ray tasks on this cluster
    cpus_per_run: float = 1.0
    force: bool = False  # replace a report even when it would drop finished runs it lists
    narrowed: bool = False  # --report-only with --panels/--precisions/--seeds: a report over that selection only
    report_dir: Path | None = None  # where the report goes (root, or root/subsets/<selection> when narrowed)

    @property
    def report_root(self) -> Path:
        return self.report_dir if self.report_dir is not None else self.root

    def selected(self, key: tuple[str, str, int]) -> bool:
        return key[0] in self.panels and key[1] in self.precisions and key[2] in self.seeds

    def plan(self) -> list[PlannedRun]:
        """Seed-major order: after each seed every panel has all its precisions, so a grid stopped halfway
        still gives comparable curves."""
        return [PlannedRun(p, q, s, BUDGETS[self.budget][p])
                for s in self.seeds for p in self.panels for q in self.precisions]


def build_parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--panels", default=None,
                   help=f"comma-separated, from: {', '.join(PANELS)} (default: all; with --report-only: "
                        "whatever the results hold)")
    p.add_argument("--precisions", default=None, help="comma-separated, e.g. 32,16,8 or fp32,int8 (default 32,16,8)")
    p.add_argument("--seeds", default=None, help="comma-separated non-negative ints (default 0,1,2)")
    p.add_argument("--budget", default="small", help="small (a 2-core laptop) or paper")
    p.add_argument("--name", default=None, help="results sub-folder (default: the budget's name)")
    p.add_argument("--runner", default=None,
                   help="single (one process) or actorq (distributed on Ray); default: single for small, "
                        "actorq for paper")
    p.add_argument("--backend", default="auto", help="actor policy runtime: auto, jax, onnx or onnx-nbits")
    p.add_argument("--out", default="results", help="results root folder (default: results)")
    p.add_argument("--fraction", type=float, default=0.9,
                   help="target = this fraction of the fp32 final return, for time-to-target (default 0.9)")
    p.add_argument("--report-only", action="store_true", help="redraw the report from existing runs only")
    p.add_argument("--force", action="store_true",
                   help="replace the report even if it then lists fewer finished runs than the one there, and "
                        "narrow it in place with --report-only (without --force a narrowed report goes to "
                        "OUT/NAME/subsets/)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--ray-address", default=None,
                   help="run the grid's runs as Ray tasks on this cluster, as many at once as fit (single runner)")
    p.add_argument("--cpus-per-run", type=float, default=1.0,
                   help="CPUs each run reserves on the cluster (with --ray-address; default 1)")
    return p


def _split(text: str, flag: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise UsageError(f"{flag} expects a comma-separated list without empty items, got {text!r}")
    return list(dict.fromkeys(items))


def parse_panels(text: str) -> tuple[str, ...]:
    panels = _split(text, "--panels")
    unknown = [p for p in panels if p not in PANELS]
    if unknown:
        raise UsageError(f"unknown panel(s) {', '.join(unknown)}: valid panels are {', '.join(PANELS)}")
    return tuple(panels)


def parse_precisions(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(check_precision(p) for p in _split(text, "--precisions")))


def parse_seeds(text: str) -> tuple[int, ...]:
    seeds = []
    for item in _split(text, "--seeds"):
        if not re.fullmatch(r"\d{1,9}", item):
            raise UsageError(f"--seeds expects non-negative integers, got {item!r}")
        seeds.append(int(item))
    return tuple(dict.fromkeys(seeds))


def validate(args: argparse.Namespace) -> Invocation:
    """Every check that can fail, before anything is written (UsageError on a bad flag)."""
    if args.budget not in BUDGETS:
        raise UsageError(f"unknown budget {args.budget!r}: valid budgets are {', '.join(PUBLIC_BUDGETS)}")
    runner = args.runner or DEFAULT_RUNNER[args.budget]
    if runner not in RUNNERS:
        raise UsageError(f"unknown runner {runner!r}: valid runners are {', '.join(RUNNERS)}")
    backend = check_backend(args.backend)
    name = args.name if args.name is not None else args.budget
    if not _NAME_RE.match(name) or name in (".", ".."):
        raise UsageError(f"--name must be 1-64 characters of letters, digits, '_', '-', '.', got {name!r}")
    if not 0.0 < args.fraction <= 1.0:
        raise UsageError(f"--fraction must be in (0, 1], got {args.fraction}")
    panels = parse_panels(args.panels) if args.panels is not None else tuple(PANELS)
    precisions = parse_precisions(args.precisions) if args.precisions is not None else DEFAULT_PRECISIONS
    seeds = parse_seeds(args.seeds) if args.seeds is not None else DEFAULT_SEEDS
    root = Path(args.out).expanduser() / name
    if args.report_only:
        if not (root / "runs").is_dir():
            raise UsageError(f"--report-only: no runs under {str(root / 'runs')!r}")
    else:
        _check_writable(root)
        _check_same_grid(root, args.budget, runner)
    _check_current_summaries(root)
    address = args.ray_address
    if address is not None:
        if not address.strip():
            raise UsageError("--ray-address must not be empty")
        if runner != "single":
            raise UsageError("--ray-address runs the single-process runner's runs as Ray tasks; "
                             "use --runner single")
    if not (args.cpus_per_run > 0 and args.cpus_per_run < float("inf")):
        raise UsageError(f"--cpus-per-run must be a positive number, got {args.cpus_per_run}")
    narrowed = bool(args.report_only) and any(v is not None for v in (args.panels, args.precisions, args.seeds))
    inv = Invocation(panels, precisions, seeds, args.budget, runner, backend, root, float(args.fraction),
                     bool(args.report_only), not args.no_progress, address, float(args.cpus_per_run),
                     force=bool(args.force), narrowed=narrowed)
    if narrowed and not inv.force:
        inv = dataclasses.replace(inv, report_dir=subset_dir(
            root, *(parsed if given is not None else None for parsed, given in
                    ((panels, args.panels), (precisions, args.precisions), (seeds, args.seeds)))))
    _check_nothing_lost(inv)
    return inv


def _will_cover(inv: Invocation) -> set[tuple[str, str, int]]:
    """The finished runs the report this invocation draws will list (at least: a planned run may fail)."""
    on_disk = finished_on_disk(inv.root)
    if inv.narrowed:
        return {k for k in on_disk if inv.selected(k)}
    return on_disk if inv.report_only else on_disk | {(r.panel, r.precision, r.seed) for r in inv.plan()}


def _check_nothing_lost(inv: Invocation) -> None:
    """Refuses (before anything runs) a report that would drop finished runs the one in its folder lists."""
    if inv.force:
        return
    lost = lost_runs(inv.report_root, _will_cover(inv))
    if lost:
        raise UsageError(f"the report in {str(inv.report_root)!r} lists {len(lost)} finished run(s) this one "
                         f"would drop ({describe(lost)}): their folders are gone or outside the selection; "
                         "pass --force to replace it, or --name/--out for a new report")


def _check_writable(root: Path) -> None:
    p = root.absolute()
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        raise UsageError(f"cannot create {str(root)!r}: {str(p)!r} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write under {str(p)!r}")


def _check_same_grid(root: Path, budget: str, runner: str) -> None:
    """A results folder holds one budget and one runner: resuming it with another would put runs of other
    lengths, or wall clocks of another runner, into one figure."""
    meta = read_json_object(root / "grid.json")
    if meta is None:
        return
    for flag, have, want in (("--budget", meta.get("budget"), budget), ("--runner", meta.get("runner"), runner)):
        if have not in (None, want):
            raise UsageError(f"{str(root)!r} holds a grid made with {flag} {have}; pass {flag} {have} to resume "
                             "it or choose another --name")


def _check_current_summaries(root: Path) -> None:
    """Refuses a results folder holding summaries of the earlier single-process layout: they would count as
    unfinished, and the grid would clear and redo those runs."""
    old = next((p for p in sorted((root / "runs").rglob("summary.json"))
                if is_old_single_process(read_json_object(p) or {})), None) if (root / "runs").is_dir() else None
    if old is not None:
        raise UsageError(f"{str(old)!r} has the earlier summary.json layout; run `python -m "
                         f"analysis.upgrade_summaries {str(root)}` first")


# ------------------------------------------------------------------------------------------------ running


def _clear(run_dir: Path) -> None:
    """Removes a run folder that has no successful summary (an interrupted or failed run) before redoing it."""
    if run_dir.exists():
        shutil.rmtree(run_dir)


def run_grid(inv: Invocation) -> tuple[int, list[str]]:
    """Runs every planned run that is not finished yet; returns (runs started, failure lines)."""
    plan = inv.plan()
    inv.root.mkdir(parents=True, exist_ok=True)
    todo = [r for r in plan if not is_finished(read_summary(r.run_dir(inv.root)))]
    meta = read_json_object(inv.root / "grid.json")
    if todo or meta is None:  # a grid that runs nothing leaves its record as it is
        budgets = dict((meta or {}).get("budgets") or {})  # panels that do not run now keep their entry
        budgets.update({r.panel: jsonable(dataclasses.asdict(r.budget)) for r in todo or plan})
        write_json_atomic(inv.root / "grid.json", {
            "budget": inv.budget, "runner": inv.runner, "backend": inv.backend, "budgets": budgets,
            "cluster": inv.ray_address is not None, "cpus_per_run": inv.cpus_per_run if inv.ray_address else None})
    machine = grid_machine() if todo else None  # a grid that runs nothing keeps the machine.json its runs wrote
    if machine is not None:
        write_json_atomic(inv.root / "machine.json", machine)
    try:
        return _run_todo(inv, plan, todo)
    finally:
        if machine is not None:  # the load the last run left, beside the load the first one met
            write_json_atomic(inv.root / "machine.json", {**machine, "load_end": load_average()})


def grid_machine() -> dict[str, object]:
    """machine.json of a grid: `quarl.ops.machine`'s record (the machine, the SIMD flags and CPU class that decide
    which int8 kernels exist, the load average as the runs start; `load_end` is added as they stop). Wall clocks
    compare only on one machine at one load, so the report shows both."""
    return machine_info().to_json()


def _run_todo(inv: Invocation, plan: Sequence[PlannedRun], todo: Sequence[PlannedRun]) -> tuple[int, list[str]]:
    """Runs `todo` one at a time here (or as Ray tasks on --ray-address), with a progress bar over `plan`."""
    runner = run_single if inv.runner == "single" else run_actorq
    failures: list[str] = []
    with ItemProgress(len(plan), inv.progress, prog=PROG, unit="run", initial=len(plan) - len(todo)) as bar:
        if inv.ray_address is not None:
            _run_grid_on_cluster(inv, todo, bar, failures)
            return len(todo), failures
        for run in todo:
            run_dir = run.run_dir(inv.root)
            bar.set_postfix_str(f"{run.panel} {run.precision} seed{run.seed}", refresh=True)
            _clear(run_dir)
            t0 = time.monotonic()
            try:
                summary = runner(run, run_dir, inv.backend)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # pylint: disable=broad-except
                failures.append(f"{run.panel} {run.precision} seed{run.seed}: {type(e).__name__}: "
                                + " ".join(str(e).split())[:300])
                bar.write(f"{PROG}: run failed: {failures[-1]}", file=sys.stderr)
            else:
                bar.write(f"{run.panel:>16} {run.precision:>5} seed{run.seed}: final return "
                          f"{summary.get('final_eval_return')} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
            bar.update(1)
    return len(todo), failures


def _run_grid_on_cluster(inv: Invocation, todo: Sequence[PlannedRun], bar: "ItemProgress",
                         failures: list[str]) -> None:
    """`todo` as Ray tasks on the cluster (`launch.grid.cluster`), reported as they finish."""
    for run in todo:
        _clear(run.run_dir(inv.root))

    def on_done(run: PlannedRun, summary: dict | None, error: str | None, seconds: float) -> None:
        if error is not None:
            failures.append(f"{run.panel} {run.precision} seed{run.seed}: {' '.join(error.split())[:300]}")
            bar.write(f"{PROG}: run failed: {failures[-1]}", file=sys.stderr)
        else:
            bar.write(f"{run.panel:>16} {run.precision:>5} seed{run.seed}: final return "
                      f"{(summary or {}).get('final_eval_return')} at {seconds:.0f} s", file=sys.stderr)
        bar.update(1)

    assert inv.ray_address is not None
    run_on_cluster(todo, inv.root, inv.backend, inv.ray_address, inv.cpus_per_run, on_done)


def report_is_current(inv: Invocation) -> bool:
    """Whether the grid's report already lists exactly the finished runs on disk (then a grid invocation that
    ran nothing leaves it untouched: rerunning a finished grid changes no file)."""
    return (inv.report_root / "report.md").exists() and finished_in_report(inv.report_root) == \
        finished_on_disk(inv.root)


def draw(inv: Invocation) -> ReportFiles:
    """The report over every run of the grid (only the requested panels/precisions/seeds when narrowed)."""
    meta = read_json_object(inv.root / "grid.json") or {}
    notes = [f"Budget `{meta.get('budget', inv.budget)}`, runner `{meta.get('runner', inv.runner)}`, "
             f"backend `{meta.get('backend', inv.backend)}`. Redraw with "
             f"`python -m launch.reproduce --out {inv.root.parent} --name {inv.root.name} --report-only`."]
    plan = None if inv.report_only else pd.DataFrame(
        [{"panel": r.panel, "precision": r.precision, "seed": r.seed} for r in inv.plan()])

    def keep(df: pd.DataFrame) -> pd.DataFrame:
        return df[df["panel"].isin(inv.panels) & df["precision"].isin(inv.precisions) & df["seed"].isin(inv.seeds)]

    budget, runner = meta.get("budget", inv.budget), meta.get("runner", inv.runner)
    return report.write_report(inv.report_root, runs_dir=inv.root / "runs", fraction=inv.fraction, plan=plan,
                                notes=notes, figure_title=f"budget {budget}, runner {runner}",
                                machine=read_json_object(inv.root / "machine.json"),
                                run_filter=keep if inv.narrowed else None)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        inv = validate(args)
    except UsageError as e:
        fail(f"{PROG}: error: {e}")
    code = EXIT_OK
    if not inv.report_only:
        try:
            started, failures = run_grid(inv)
        except KeyboardInterrupt:
            sys.stderr.write(f"{PROG}: interrupted; run the same command again to resume\n")
            return EXIT_INTERRUPTED
        if failures:
            code = EXIT_FAILED
            sys.stderr.write(f"{PROG}: {len(failures)} run(s) failed (they are redone on the next call)\n")
        sys.stderr.write(f"{PROG}: {started} run(s) ran, {len(inv.plan()) - started} were already done\n")
        if not started and not inv.force and report_is_current(inv):
            sys.stderr.write(f"{PROG}: the report already covers every finished run; left as it is "
                             "(--report-only redraws it)\n")
            print(inv.report_root / "report.md")
            return code
    # The report covers every run of the folder (a grid merges into it); a narrowed --report-only goes to subsets/.
    files = draw(inv)
    print(files.report)
    return code


if __name__ == "__main__":
    sys.exit(main())
