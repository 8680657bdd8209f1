"""The notebooks run headless (nbclient) against tiny results folders made here, and show what they read.

The kernel is this interpreter (a kernelspec written to a temp dir and put first on JUPYTER_PATH), so the
tests do not depend on a kernel registered on the machine, or on `python` on PATH being the venv's.
"""
from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient

from launch.ptq import CSV_FIELDS, write_csv
from tests.launch.test_reproduce import make_synthetic_results

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
KERNEL = "quarl-test-python"


@pytest.fixture()
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "quarl test", "language": "python"}), encoding="utf-8")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


# Appended to each notebook before it runs: every DataFrame a cell displayed (IPython's `Out`, keyed by the
# cell's execution count), as JSON on one marked line, so the test reads the values the notebook computed.
PROBE = """import json as _json, pandas as _pd
print("QUARL_PROBE " + _json.dumps({str(k): v.reset_index().to_json(orient="records")
                                    for k, v in Out.items() if isinstance(v, _pd.DataFrame)}))"""
MARK = "QUARL_PROBE "


def run_notebook(name: str, kernel: str) -> tuple[nbformat.NotebookNode, dict[str, pd.DataFrame]]:
    """Executes notebook `name` (an error in any cell fails the test); returns it with outputs, and each
    displayed DataFrame by the first line of the cell that displayed it."""
    path = NOTEBOOKS / name
    book = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in book.cells if c.cell_type == "code"), f"{name} is stored with outputs"
    book.cells.append(nbformat.v4.new_code_cell(PROBE))
    NotebookClient(book, kernel_name=kernel, timeout=180, resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    probe = book.cells.pop()
    line = next(ln for o in probe.outputs for ln in o.get("text", "").splitlines() if ln.startswith(MARK))
    by_count = json.loads(line[len(MARK):])
    frames = {}
    for cell in book.cells:
        if cell.cell_type == "code" and str(cell.execution_count) in by_count:
            frames[cell.source.splitlines()[-1]] = pd.read_json(io.StringIO(by_count[str(cell.execution_count)]),
                                                               orient="records")
    return book, frames


def texts(book: nbformat.NotebookNode) -> str:
    out = []
    for cell in book.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out.append(o.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


def images_by_cell(book: nbformat.NotebookNode) -> dict[str, int]:
    """PNG outputs of each plotting cell (keyed by its source), each checked to be a real PNG."""
    out = {}
    for cell in book.cells:
        pngs = [base64.b64decode(o["data"]["image/png"]) for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        assert all(p.startswith(b"\x89PNG") and len(p) > 1000 for p in pngs)
        if pngs:
            out[cell.source] = len(pngs)
    return out


def row(frame: pd.DataFrame, **match: Any) -> pd.Series:
    hits = frame
    for key, value in match.items():
        hits = hits[hits[key] == value]
    assert len(hits) == 1, f"{match}: {len(hits)} rows"
    return hits.iloc[0]


def test_reproduction_and_runtime_notebooks(tmp_path: Path, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    results = make_synthetic_results(tmp_path / "results")
    monkeypatch.setenv("QUARL_RESULTS", str(results))

    book, frames = run_notebook("01_reproduction.ipynb", kernel)
    assert "6 finished runs of 6" in texts(book)
    speedup = frames["report.speedup_table(runs, FRACTION)"]
    # CartPole: int8 reaches 90% of fp32's return at 25 s vs fp32's 55 s; Acrobot: 30 s vs 50 s.
    assert row(speedup, panel="CartPole", precision="int8")["speedup_vs_fp32"] == pytest.approx(55 / 25)
    assert row(speedup, panel="Acrobot", precision="int8")["speedup_vs_fp32"] == pytest.approx(50 / 30)
    assert row(speedup, panel="CartPole", precision="fp32")["speedup_vs_fp32"] == pytest.approx(1.0)
    grid = frames[next(k for k in frames if k.startswith("report.grid_table"))]
    assert len(grid) == 6 and set(grid["state"]) == {"finished"}
    plots = images_by_cell(book)
    assert sum(n for src, n in plots.items() if "plot_figure" in src) == 2  # time and actor-steps figures

    book, frames = run_notebook("02_runtime_breakdown.ipynb", kernel)
    table = frames["table"]
    assert set(table["precision"]) == {"fp32", "int8"}
    # int8 inference: 0.5 s of policy time over 1000 steps; fp32: 2 s.
    assert row(table, panel="CartPole", precision="int8")["policy_ms_per_1k_steps"] == pytest.approx(500.0)
    assert row(table, panel="CartPole", precision="fp32")["policy_ms_per_1k_steps"] == pytest.approx(2000.0)
    payload = frames["payload"]
    assert list(payload["compression"]) == pytest.approx([4.0] * len(payload))  # 400 / 100 bytes
    assert sum(n for src, n in images_by_cell(book).items() if "plot_runtime_breakdown" in src) == 2


def test_ptq_notebook(tmp_path: Path, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ptq_dir = tmp_path / "run" / "ptq"
    ptq_dir.mkdir(parents=True)
    base = {"backend": "jax", "episodes": 3, "min_return": 0.0, "max_return": 1.0, "weight_max_rel_err": 0.01,
            "weight_min_layer_sqnr_db": 40.0}
    rows = [{**base, "precision": "fp32", "bits": 32, "granularity": "n/a", "execution": "native",
             "mean_return": 100.0, "std_return": 1.0, "error_mean": 0.0, "error_std": 0.0,
             "weight_sqnr_db": float("inf")},
            {**base, "precision": "fp16", "bits": 16, "granularity": "n/a", "execution": "native",
             "mean_return": 100.0, "std_return": 1.0, "error_mean": 0.0, "error_std": 0.0, "weight_sqnr_db": 80.0}]
    for bits, err in ((8, 0.01), (4, 0.123)):
        for granularity in ("per-tensor", "per-channel"):
            rows.append({**base, "precision": f"int{bits}", "bits": bits, "granularity": granularity,
                         "execution": "int-kernel", "mean_return": 100.0 * (1 - err), "std_return": 2.0,
                         "error_mean": err, "error_std": 0.01, "weight_sqnr_db": 6.0 * bits})
    write_csv(ptq_dir / "ptq.csv", rows, CSV_FIELDS)
    weights = [{"layer": "linear_0/w", "shape": "4x16", "min": -1.0, "max": 2.0, "mean": 0.0, "std": 0.5,
                "absmax_over_std": 4.0},
               {"layer": "linear_1/w", "shape": "16x2", "min": -0.5, "max": 0.5, "mean": 0.0, "std": 0.25,
                "absmax_over_std": 2.0}]
    write_csv(ptq_dir / "weights.csv", weights, list(weights[0]))
    monkeypatch.setenv("QUARL_PTQ_DIR", str(ptq_dir))

    book, frames = run_notebook("03_ptq_weights.ipynb", kernel)
    assert str(ptq_dir) in texts(book)
    shown = frames[next(k for k in frames if k.startswith('ptq[["precision"'))]
    assert row(shown, precision="int4", granularity="per-channel")["error_mean"] == pytest.approx(0.123)
    assert row(shown, precision="int8", granularity="per-tensor")["mean_return"] == pytest.approx(99.0)
    assert len(shown) == len(rows)
    assert list(frames["weights"]["layer"]) == ["linear_0/w", "linear_1/w"]
    assert list(frames["weights"]["absmax_over_std"]) == [4.0, 2.0]
    plots = images_by_cell(book)
    assert sum(n for src, n in plots.items() if "plot_ptq" in src or "plot_weight_stats" in src) == 2
