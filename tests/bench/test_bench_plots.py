"""The benchmark figures redrawn from the committed results say what they show: the machine, what the spread is,
column titles that differ, the p-values the README quotes, and error bars that do not go below 0."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "bench"


@pytest.fixture()
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure a plot function saves, kept open for inspection (nothing written)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    import matplotlib.pyplot as plt
    saved: list[Any] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: saved.append(self))
    monkeypatch.setattr(plt, "close", lambda *a, **k: None)
    return saved


def test_qat_figure_error_bars_are_standard_errors_and_stop_at_zero(figures, tmp_path) -> None:
    from bench.learning import qat
    result = json.loads((RESULTS / "qat.json").read_text())
    qat.plot(tmp_path / "qat.png", result)
    ax = figures[0].axes[0]
    assert "± standard error over the 5 seed means" in ax.get_title() and "Xeon" in ax.get_title()
    lows = [min(seg[0][1], seg[1][1]) for c in ax.containers if getattr(c, "errorbar", None) is not None
            for seg in c.errorbar.lines[2][0].get_segments()]
    assert len(lows) == 9 and min(lows) >= 0.0  # 3 bit widths x 3 arms (± std bars took int2 PTQ@fp32 to -12.7)
    assert qat.standard_error([1.0, 3.0]) == pytest.approx(1.0)  # std (ddof 1) sqrt(2) / sqrt(2)
    assert qat.standard_error([5.0]) == 0.0


def test_fidelity_figure_titles_differ_and_carry_the_readmes_p_values(figures, tmp_path) -> None:
    from bench.peers import fidelity
    curves = fidelity.read_curves_csv(RESULTS / "fidelity_curves.csv")
    fidelity.plot(curves, tmp_path / "fidelity.png")
    fig = figures[0]
    titles = [ax.get_title() for ax in fig.axes]
    assert len(set(titles)) == len(titles)
    text = " ".join(titles)
    for quoted in ("fp32 p=0.47, int8 p=0.80", "fp32 p=0.55, int8 p=0.05"):  # README's fidelity paragraph
        assert quoted in text
    assert "Xeon" in fig._suptitle.get_text() and "standard error" in fig._suptitle.get_text()  # noqa: SLF001


def test_actorq_figure_names_the_cpu_and_shows_the_spread_of_its_blocks(figures, tmp_path) -> None:
    from bench.system import actorq
    result = json.loads((RESULTS / "actorq.json").read_text())
    actorq.plot(result, tmp_path / "actorq.png")
    fig = figures[0]
    assert "AMD EPYC" in fig._suptitle.get_text()  # noqa: SLF001
    ax = fig.axes[0]
    assert "min..max over 8 interleaved blocks" in ax.get_title()
    bars = [c for c in ax.containers if hasattr(c, "errorbar") and c.errorbar is not None]
    assert bars and np.all(np.asarray([p.get_height() for p in bars[0].patches]) > 0)


def test_learning_figure_is_redrawn_from_its_curves_with_the_machine_and_the_seeds(figures, tmp_path) -> None:
    import shutil
    from bench.learning import int8_vs_fp32 as learning
    shutil.copy(RESULTS / "learning_dqn_curves.csv", tmp_path / "learning_dqn_curves.csv")
    assert learning.main(["--rows", "dqn", "--report-only", "--out", str(tmp_path), "--machine", "test CPU"]) == 0
    title = figures[0]._suptitle.get_text()  # noqa: SLF001
    assert "test CPU" in title and "one line per seed (3 seeds)" in title
    assert len(figures[0].axes) == 3 and all(ax.lines for ax in figures[0].axes)
