"""bench.system.replay_server: a tiny in-process run writes rates from the table's counters, and bad flags exit 2."""
from __future__ import annotations

import json

import pytest

from bench.system import replay_server as rs


def test_a_tiny_in_process_run_measures_both_sides_and_both_calls(tmp_path):
    assert rs.main(["--quick", "--allow-busy", "--modes", "table", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "replay_server.json").read_text())
    assert result["settings"]["capacity"] >= result["settings"]["prefill"] and "load_end" in result["machine"]
    (backend,) = result["backends"]
    assert backend["backend"] == "table" and backend["inserts_alone"]["inserts_per_s"] > 0
    assert [r["call"] for r in backend["per_k"]] == list(rs.CALLS)
    for row in backend["per_k"]:
        assert row["samples_alone"]["samples_per_s"] > 0 and row["samples_alone"]["inserts_per_s"] == 0
        both = row["both"]
        assert both["inserts_per_s"] > 0 and both["samples_per_s"] > 0
        assert both["samples_vs_required"] == pytest.approx(both["samples_per_s"] / rs.REQUIRED_SAMPLES_PER_S)
    assert "| table | 2 | `sample_stacked` |" in (tmp_path / "replay_server.md").read_text()


@pytest.mark.parametrize("flags", [["--ks", "0"], ["--modes", "reverb"], ["--window-s", "-1"]])
def test_bad_flags_exit_with_code_2(flags, capsys):
    with pytest.raises(SystemExit) as caught:
        rs.main(["--allow-busy", *flags])
    assert caught.value.code == 2 and "error:" in capsys.readouterr().err
