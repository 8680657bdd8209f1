"""bench.micro.inference survives variants a machine does not produce (the GPU machine's CPU crashed `summarize` on a
missing int4 row) and times every backend auto can choose, so auto's choice is always judged."""
from __future__ import annotations

import json

from bench.micro import inference


def _row(variant: str, us: float, chosen: str | None = None, simulated: bool = False) -> dict:
    backend, precision, *form = variant.split()
    return {"variant": variant, "backend": backend, "precision": precision, "hidden": 64, "batch": 1,
            "us_per_call": us, "chosen": chosen or backend, "kernel_form": form[0] if form else "u8s8",
            "simulated": simulated, "update_ms": None}


def test_summarize_reports_missing_rows_as_none_instead_of_crashing():
    rows = [_row("jax fp32", 100.0), _row("onnx fp32", 80.0), _row("jax int8", 90.0), _row("onnx int8", 20.0),
            _row("auto fp32", 81.0, "onnx"), _row("auto int8", 21.0, "onnx"),
            _row("onnx-nbits int4", 15.0), _row("auto int4", 16.0, "jax")]  # no "onnx int4", no "jax int4"
    (s,) = inference.summarize(rows)
    assert s["onnx_int8_speedup"] == 4.0 and s["best_int8_vs_best_fp32"] == 4.0
    assert s["best_int4_vs_best_fp32"] == 80.0 / 15.0  # the int4 row that exists still counts
    assert s["auto_int4_choice_vs_best_int4"] is None  # auto chose jax int4, which was not timed
    lines = inference.target_lines([s])
    assert any("auto's int4 choice vs best int4 -" in line for line in lines)
    inference.print_table(rows, [s])


def test_every_backend_auto_can_pick_has_its_own_row():
    from quarl.runtimes import auto_candidates

    timed = {(b, p) for b, p, form in inference.BASE_VARIANTS if form is None}
    for precision in ("fp32", "int8", "int4"):
        for backend in auto_candidates(precision):
            if backend in ("jax", "onnx", "onnx-nbits"):
                assert (backend, precision) in timed, (backend, precision)


def test_quick_run_at_a_tiny_width_writes_its_results_without_the_onnx_int4_row(tmp_path, monkeypatch):
    """The whole --quick path at one tiny shape, with the onnx int4 variant left out as on the machine where
    it was missing: it runs to the end and writes its JSON."""
    monkeypatch.setattr(inference, "configs", lambda quick: [(16, 1)])
    monkeypatch.setattr(inference, "BASE_VARIANTS",
                        tuple(v for v in inference.BASE_VARIANTS if v != ("onnx", "int4", None)))
    monkeypatch.setattr(inference, "QUICK", inference.Budget(seconds=0.01, min_calls=2, max_calls=4, rounds=1,
                                                             warmup=1, time_updates=False))
    result = inference.run(True, tmp_path)
    written = json.loads((tmp_path / "inference.json").read_text())
    assert written["summary"] == result["summary"] and len(result["summary"]) == 1
    assert not any(r["variant"] == "onnx int4" for r in result["rows"])
    assert result["summary"][0]["best_int4_vs_best_fp32"] > 0  # from the onnx-nbits row


def test_report_only_redraws_the_figure_from_the_json_and_names_the_cpu(tmp_path, capsys):
    rows = [_row("onnx fp32", 80.0), _row("onnx int8", 20.0)]
    (tmp_path / "inference.json").write_text(json.dumps({"rows": rows, "machine": {"cpu_model": "Test CPU",
                                                                                    "cores": 2}}))
    assert inference.main(["--report-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "inference.png").stat().st_size > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert inference.main(["--report-only", "--out", str(empty)]) == 2
    assert "cannot read" in capsys.readouterr().err
