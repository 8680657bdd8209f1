"""Keeps a results folder's report from losing runs: `launch.reproduce` asks here whether a report may be
(re)written, and where a narrowed report goes.

A report (report.md, grid.csv, figure.png ...) lists the finished runs it was drawn from in grid.csv. Drawing it
again is refused when a run it lists as finished would no longer be in it (its folder removed, or a narrower
selection drawn over it): only `--force` replaces a report by one that covers fewer runs. A report narrowed by
--panels/--precisions/--seeds goes to its own folder (`subset_dir`), so the grid's report stays whole.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterable

from analysis.runs import is_finished, read_summary

SUBSETS = "subsets"  # OUT/NAME/subsets/<selection>/: reports over part of a grid
RunKey = tuple[str, str, int]  # (panel, precision, seed)


def finished_on_disk(root: Path) -> set[RunKey]:
    """Every finished run under root/runs/<panel>/<precision>/seed<k>/ (the grid's layout)."""
    keys: set[RunKey] = set()
    runs = root / "runs"
    if not runs.is_dir():
        return keys
    for summary in runs.glob("*/*/seed*/summary.json"):
        run_dir = summary.parent
        seed = run_dir.name[len("seed"):]
        if seed.isdigit() and is_finished(read_summary(run_dir)):
            keys.add((run_dir.parent.parent.name, run_dir.parent.name, int(seed)))
    return keys


def finished_in_report(report_dir: Path) -> set[RunKey]:
    """The runs a report's grid.csv lists as finished (empty when there is no report)."""
    path = report_dir / "grid.csv"
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return set()
    keys = set()
    for row in rows:
        seed = str(row.get("seed") or "").split(".")[0]
        if row.get("state") == "finished" and seed.isdigit():
            keys.add((str(row.get("panel")), str(row.get("precision")), int(seed)))
    return keys


def lost_runs(report_dir: Path, will_cover: Iterable[RunKey]) -> list[RunKey]:
    """The finished runs the report in `report_dir` lists that a report over `will_cover` would drop."""
    return sorted(finished_in_report(report_dir) - set(will_cover))


def describe(keys: Iterable[RunKey], limit: int = 3) -> str:
    """'CartPole fp32 seed0, ... (+N more)' for a one-line message."""
    keys = sorted(keys)
    text = ", ".join(f"{p} {q} seed{s}" for p, q, s in keys[:limit])
    return text + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def subset_dir(root: Path, panels: Iterable[str] | None, precisions: Iterable[str] | None,
               seeds: Iterable[int] | None) -> Path:
    """root/subsets/<panels>_<precisions>_<seeds>: where a report narrowed to that selection goes."""
    def part(values: Iterable[object] | None, prefix: str = "") -> str:
        return "all" if values is None else "-".join(f"{prefix}{v}" for v in values)
    name = "_".join((part(panels), part(precisions), part(seeds, "seed")))
    return root / SUBSETS / name[:120]
