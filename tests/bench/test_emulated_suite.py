"""bench.harness.emulated_suite: its page reports what pytest said, failures included, and bad flags exit 2."""
from __future__ import annotations

import pytest

from bench.harness import emulated_suite


def test_page_names_the_model_the_tests_and_the_outcome():
    text = emulated_suite.page(["--cpu", "Haswell"], "Haswell", ["tests/x.py"],
                               {"returncode": 1, "summary": "1 failed, 2 passed in 3.0s",
                                "failed": ["FAILED tests/x.py::t - boom"], "seconds": 3.0})
    assert "`qemu-x86_64 -cpu Haswell`" in text and "`tests/x.py`" in text
    assert "**1 failed, 2 passed in 3.0s** (exit code 1" in text and "- `FAILED tests/x.py::t - boom`" in text


def test_bad_cpu_model_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        emulated_suite.main(["--cpu", "Haswell; rm -rf /", "--out", str(tmp_path / "p.md")])
    assert info.value.code == 2 and "--cpu" in capsys.readouterr().err
    assert not (tmp_path / "p.md").exists()
