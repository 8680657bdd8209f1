"""The PTQ study's rows on disk: OUT/ptq_study.csv read and written with typed columns, and other folders' cells
merged in. Kept apart from bench.learning.ptq_study (which runs the grid) so the store is one small module that the
study, its report and its tests share."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

from bench.harness.results_io import write_csv, write_json
from bench.learning.ptq_study_grid import recorded_rule
from bench.learning.ptq_study_report import CSV_FILE, QAT_PREFIX, SESSIONS_FILE
from launch.cli import UsageError
from quarl.ops.io import read_json_list

CSV_FIELDS = ("algo", "task", "seed", "train_steps", "precision", "bits", "granularity", "execution", "backend",
              "episodes", "mean_return", "std_return", "policy_bytes", "train_final_eval", "reference", "cpu",
              "train_eval_episodes", "train_target_streak", "trainer")


def group(r: dict[str, Any]) -> tuple[str, str, int, int | None, str]:
    """The run a study row comes from: the cell's fp32 run (None) or its QAT run at one width, and its trainer."""
    bits = r["bits"] if r["precision"].startswith(QAT_PREFIX) else None
    return r["algo"], r["task"], r["seed"], bits, r.get("trainer") or "train"


def replace_train_rows(rows: Sequence[dict[str, Any]], algo: str, task: str) -> list[dict[str, Any]]:
    """`rows` without the cell's launch.train rows of each arm (fp32 sweep, QAT width) whose every seed has
    launch.anakin rows of that arm now: the 3-seed runs stay in the CSV, marked by trainer, until replaced."""
    def arms(trainer: str) -> dict[int | None, set[int]]:
        out: dict[int | None, set[int]] = {}
        for r in rows:
            if (r["algo"], r["task"], group(r)[4]) == (algo, task, trainer):
                out.setdefault(group(r)[3], set()).add(r["seed"])
        return out
    jitted = arms("anakin")
    replaced = {bits for bits, seeds in arms("train").items() if seeds <= jitted.get(bits, set())}
    return [r for r in rows if not ((r["algo"], r["task"], group(r)[4]) == (algo, task, "train")
                                    and group(r)[3] in replaced)]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """OUT/ptq_study.csv back as typed rows (none when absent)."""
    if not path.is_file():
        return []
    ints, floats = {"seed", "train_steps", "bits", "episodes", "policy_bytes"}, {"mean_return", "std_return"}
    with open(path, newline="", encoding="utf-8") as f:
        rows = []
        for r in csv.DictReader(f):
            row: dict[str, Any] = dict(r)
            for k in ints:
                row[k] = int(r[k])
            for k in floats:
                row[k] = float(r[k])
            for k in ("train_final_eval", "reference"):  # empty (or a file from before references): None
                row[k] = float(r[k]) if r.get(k) else None
            # Files from before these columns: every study run then stopped by the default rule.
            row["train_eval_episodes"], row["train_target_streak"] = recorded_rule(r.get("train_eval_episodes"),
                                                                                   r.get("train_target_streak"))
            row["trainer"] = r.get("trainer") or "train"  # files from before the column: every run was launch.train
            rows.append(row)
    return rows


def write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """The rows as OUT/ptq_study.csv, in cell and precision order, replacing the file whole (atomically). One row
    per (cell, precision): a row given twice is written once, and two different rows for one precision are an error
    (a table that averaged them would count a seed twice)."""
    unique: dict[tuple[str, str, int, str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["algo"], r["task"], r["seed"], r["precision"], group(r)[4])
        if key in unique and {k: unique[key].get(k) for k in CSV_FIELDS} != {k: r.get(k) for k in CSV_FIELDS}:
            raise ValueError(f"two different study rows for {' '.join(map(str, key))}")
        unique.setdefault(key, r)
    order = lambda r: (r["algo"], r["task"], group(r)[4], r["seed"], -r["bits"], r["precision"])  # noqa: E731
    write_csv(path, ({k: ("" if r.get(k) is None else r[k]) for k in CSV_FIELDS} | {"trainer": group(r)[4]}
                     for r in sorted(unique.values(), key=order)), CSV_FIELDS, atomic=True)


def merge_folders(out: Path, folders: Sequence[str], replace: bool = False) -> list[str]:
    """Adds each folder's runs that OUT does not hold yet and its sessions to OUT: parts of the grid run in separate
    sessions, processes or machines become one table. The unit is a run (`group`): a cell's fp32 run with its
    sweep, or one of its QAT runs, taken whole from one folder, so a folder that adds a QAT run to a cell OUT holds
    adds it. With `replace`, a folder's run replaces OUT's (runs trained or evaluated again elsewhere, e.g. by a
    second study process on a copy of the rows while another wrote OUT). Returns one line per folder saying what
    it added and what it left."""
    rows = read_rows(out / CSV_FILE)
    sessions = read_json_list(out / SESSIONS_FILE)
    lines = []
    for folder in map(Path, folders):
        if not (folder / CSV_FILE).is_file():
            raise UsageError(f"{folder} holds no {CSV_FILE}")
        theirs = read_rows(folder / CSV_FILE)
        runs = {group(t) for t in theirs}
        if replace:
            rows = [r for r in rows if group(r) not in runs]
        have = {group(r) for r in rows}
        rows += [r for r in theirs if group(r) not in have]
        kept = len(runs & have)
        lines.append(f"{folder}: {len(runs) - kept} run(s) added" + (
            f", {kept} already in {out} kept (--replace takes the folder's)" if kept else ""))
        sessions += [m for m in read_json_list(folder / SESSIONS_FILE) if m not in sessions]
    for algo, task in {(r["algo"], r["task"]) for r in rows if group(r)[4] == "anakin"}:
        rows = replace_train_rows(rows, algo, task)  # a folder's jitted arms replace the 3-seed ones they cover
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / CSV_FILE, rows)
    write_json(out / SESSIONS_FILE, sessions)
    return lines
