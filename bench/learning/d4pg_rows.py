"""D4PG rows of the learning benchmark (`python -m bench.learning.int8_vs_fp32 --rows d4pg`), imported on demand.

Control-suite rewards lie in [0, 1] per step, so with discount 0.99 returns-to-go lie in [0, 100]; both rows
put the 51-atom categorical support on [-10, 110] (Acme's [-150, 150] would spend two thirds of the atoms on
values that never occur). Episodes are 1000 steps, so a score of 1000 is the maximum.

- cartpole:balance: the small, fast setting of tests/agents/test_d4pg.py (64x64 policy, 128x128 critic,
  lr 1e-3, batch 128, one SGD step per 4 env steps). The untrained policy already scores ~735 on this task,
  so the target is 950 (of 1000), the near-perfect plateau.
- walker:stand: 256x256 policy and critic (Acme's LayerNorm torso), 5-step returns, lr 1e-3, batch 128 and
  one SGD step per 2 env steps, sized so that a run fits a shared 2-core machine; target 900.

The rows can run in separate invocations (e.g. one per task, each with its own `--out`, so that a later
invocation does not overwrite an earlier one's files); `python -m bench.learning.d4pg_rows merge DIR... ` then
writes the combined results/bench/learning_d4pg.{csv,md,png} and learning_d4pg_curves.csv with
`bench.learning.int8_vs_fp32`'s table and plot.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from bench.harness.learning_runs import RESULTS
from bench.harness.results_io import write_csv, write_text
from bench.harness.rows import LearningRow
from bench.learning.int8_vs_fp32_report import markdown_table, plot_curves

_SUPPORT = {"num_atoms": 51, "vmin": -10.0, "vmax": 110.0}
CARTPOLE_OVERRIDES = {"policy_layer_sizes": (64, 64), "critic_layer_sizes": (128, 128), **_SUPPORT,
                      "batch_size": 128, "learning_rate": 1e-3, "min_replay_size": 1000,
                      "max_replay_size": 100_000, "samples_per_insert": 32.0}
WALKER_OVERRIDES = {"policy_layer_sizes": (256, 256), "critic_layer_sizes": (256, 256), **_SUPPORT,
                    "n_step": 5, "batch_size": 128, "learning_rate": 1e-3, "min_replay_size": 2000,
                    "max_replay_size": 1_000_000, "samples_per_insert": 64.0}

ROWS: tuple[LearningRow, ...] = (
    LearningRow("d4pg", "cartpole:balance", 950.0, 60_000, 2_500, 5, overrides=CARTPOLE_OVERRIDES,
                note="tests/agents/test_d4pg.py's small setting"),
    LearningRow("d4pg", "walker:stand", 900.0, 150_000, 5_000, 3, overrides=WALKER_OVERRIDES,
                note="256x256 nets, sized for a shared 2-core machine"),
)


_INTS = {"seed", "steps_to_target", "actor_steps", "learner_steps", "payload_bytes", "payload_bytes_fp32"}
_FLOATS = {"target", "train_s_to_target", "final_return", "best_return", "train_s", "env_steps_per_s",
           "pull_ms_per_update", "load_ms_per_update", "inference_us_per_step", "train_clock_s", "return"}


def _typed(row: dict[str, str]) -> dict[str, Any]:
    """A CSV line back as the types `bench.learning.int8_vs_fp32` wrote (empty cells were None)."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if v == "" and (k in _INTS or k in _FLOATS):
            out[k] = None
        elif k in _INTS:
            out[k] = int(float(v))
        elif k in _FLOATS:
            out[k] = float(v)
        elif k == "solved":
            out[k] = v == "True"
        else:
            out[k] = v
    return out


def _read(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [_typed(r) for r in csv.DictReader(f)]


def merge(dirs: Sequence[Path], outdir: Path, commands: Sequence[str], machine: str = "",
          notes: str = "") -> list[dict]:
    """Combines the learning_d4pg CSVs of several invocations into one set of result files; `notes`
    (markdown) is appended to the table (what the numbers mean, what is missing)."""
    results: list[dict] = []
    curves: list[dict] = []
    for d in dirs:
        if not (d / "learning_d4pg.csv").is_file():
            raise ValueError(f"{d} holds no learning_d4pg.csv")
        results += _read(d / "learning_d4pg.csv")
        curves += _read(d / "learning_d4pg_curves.csv")
    rows = tuple(r for r in ROWS if any(x["task"] == r.task for x in results))
    order = {(r.task, p): i for i, (r, p) in enumerate((r, p) for r in rows for p in ("fp32", "int8"))}
    results.sort(key=lambda x: (order.get((x["task"], x["precision"]), 99), x["seed"]))
    outdir.mkdir(parents=True, exist_ok=True)
    write_csv(outdir / "learning_d4pg.csv", results)
    write_csv(outdir / "learning_d4pg_curves.csv", curves)
    table = markdown_table(results, rows, "d4pg", "`; `".join(commands), machine)
    write_text(outdir / "learning_d4pg.md", table + ("\n" + notes.strip() + "\n" if notes.strip() else ""))
    plot_curves(curves, rows, outdir / "learning_d4pg.png")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.learning.d4pg_rows", description="merge D4PG learning results")
    p.add_argument("action", choices=["merge"])
    p.add_argument("dirs", nargs="+", help="output folders of `bench.learning.int8_vs_fp32 --rows d4pg --out DIR` runs")
    p.add_argument("--command", action="append", default=[], help="the command each folder came from")
    p.add_argument("--machine", default="", help="machine and load, for the table's preamble")
    p.add_argument("--notes", default=None, help="a markdown file appended to the table")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    try:
        notes = Path(args.notes).read_text(encoding="utf-8") if args.notes else ""
        merge([Path(d) for d in args.dirs], Path(args.out), args.command or ["python -m bench.learning.int8_vs_fp32 --rows d4pg"],
              args.machine or f"{os.cpu_count()} logical cores", notes)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"bench.learning.d4pg_rows: error: {e}\n")
        return 2
    print(f"wrote {args.out}/learning_d4pg.{{csv,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
