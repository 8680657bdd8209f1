"""bench.micro.kernel_forms and bench.micro.update at tiny sizes: they run, report what they claim, and refuse bad flags."""
from __future__ import annotations

import json
import os

import pytest

from bench.micro import kernel_forms
from bench.micro import update


def test_kernel_forms_reports_every_form_and_the_one_used(capsys):
    assert kernel_forms.main(["--width", "64", "--bits", "8,4"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| this CPU")]
    for bits in ("int8", "int4"):
        rows = [ln for ln in lines if f"| {bits} |" in ln]
        assert {"u8s8", "u8u8", "fp32"} <= {ln.split("|")[3].strip() for ln in rows}
        used = [ln for ln in rows if ln.rstrip().endswith("| yes |")]
        assert len(used) == 1 and "| pass |" in used[0]  # exactly one form is used, and it passed


def test_kernel_forms_page_explains_itself(tmp_path):
    out = tmp_path / "forms.md"
    assert kernel_forms.main(["--width", "64", "--bits", "8", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# int8/int4 kernel forms") and "--width 64 --bits 8" in text and "Host:" in text
    assert "| this CPU (" in text and "qemu-user" not in text  # no emulated rows, no emulation paragraph


@pytest.mark.parametrize("argv", [["--bits", "9"], ["--bits", "x"], ["--width", "1"],
                                  ["--qemu-arm-cpus", "pentium"]])
def test_kernel_forms_bad_flags_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        kernel_forms.main(argv)
    assert info.value.code == 2 and "error" in capsys.readouterr().err


def test_update_bench_measures_every_strategy(tmp_path, capsys):
    out = tmp_path / "update.json"
    assert update.main(["--hidden", "32", "--repeats", "2", "--allow-busy", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    for key in ("rewrite_ms", "initializers_ms", "background_block_ms", "background_build_ms", "jax_fp32_ms",
                "call_us_after_updates", "call_us_fresh_executor"):
        assert result[key] > 0, key
    assert result["kernel_form"] in ("u8s8", "u8u8", "fp32")
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result


def test_update_bench_refuses_a_busy_machine_and_bad_flags(monkeypatch, capsys):
    monkeypatch.setattr(os, "getloadavg", lambda: (1000.0, 1000.0, 1000.0))
    with pytest.raises(SystemExit) as info:
        update.main([])
    assert info.value.code == 2 and "--allow-busy" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        update.main(["--precision", "int99", "--allow-busy"])
    assert info.value.code == 2
