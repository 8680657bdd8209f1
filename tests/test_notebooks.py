"""The notebooks run headless (nbclient) against tiny results folders made here, and show what they read.

The kernel is this interpreter (a kernelspec written to a temp dir and put first on JUPYTER_PATH), so the
tests do not depend on a kernel registered on the machine, or on `python` on PATH being the venv's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
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


def run_notebook(name: str, kernel: str) -> nbformat.NotebookNode:
    path = NOTEBOOKS / name
    book = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in book.cells if c.cell_type == "code"), f"{name} is stored with outputs"
    NotebookClient(book, kernel_name=kernel, timeout=180, resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return book


def texts(book: nbformat.NotebookNode) -> str:
    out = []
    for cell in book.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out.append(o.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


def images(book: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for c in book.cells for o in c.get("outputs", []))


def test_reproduction_and_runtime_notebooks(tmp_path: Path, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    results = make_synthetic_results(tmp_path / "results")
    monkeypatch.setenv("QUARL_RESULTS", str(results))

    book = run_notebook("01_reproduction.ipynb", kernel)
    out = texts(book)
    assert "6 finished runs of 6" in out
    assert "2.2" in out  # CartPole int8 reaches 90% of fp32 at 25 s vs 55 s
    assert images(book) >= 2

    book = run_notebook("02_runtime_breakdown.ipynb", kernel)
    out = texts(book)
    assert "500.0" in out  # int8 inference: 0.5 s over 1000 steps
    assert "4.0" in out  # payload compression 400 / 100 bytes
    assert images(book) >= 2


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

    book = run_notebook("03_ptq_weights.ipynb", kernel)
    out = texts(book)
    assert str(ptq_dir) in out and "0.123" in out and "linear_1/w" in out
    assert images(book) >= 2
