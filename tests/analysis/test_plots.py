"""The figures say what they show: a title naming the budget/runner/machine and the spread's meaning, no empty
cells, readable runtime labels, PTQ bars said to be ± std over N episodes."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis import plots, report
from tests.launch.test_reproduce import make_synthetic_results, write_run

MACHINE = {"cpu_model": "AMD EPYC", "logical_cpus": 2}


def test_return_figure_has_a_title_a_band_meaning_and_no_empty_cell(tmp_path: Path) -> None:
    runs = report.load_runs(make_synthetic_results(tmp_path) / "runs")
    fig = plots.plot_figure(runs, title="budget small, runner single, " + plots.machine_label(MACHINE))
    title = fig._suptitle.get_text()  # pylint: disable=protected-access
    assert "budget small, runner single, AMD EPYC, 2 logical CPUs" in title
    assert "± standard error of the mean over seeds" in title
    visible = [ax for ax in fig.axes if ax.get_visible()]
    for ax in visible:  # each cell is a panel with curves or the legend cell, never blank
        assert ax.lines or ax.get_legend() is not None
    legend_cells = [ax for ax in visible if not ax.lines]
    assert len(legend_cells) == 1 and "fp32 (n=2 seeds)" in [t.get_text() for t in legend_cells[0].get_legend().texts]
    assert {ax.get_title() for ax in visible if ax.lines} == {"CartPole", "Acrobot"}


def test_a_seed_that_ended_early_is_not_drawn_on_to_the_slowest_seeds_end(tmp_path: Path) -> None:
    """Seed 1 stops at 30 s, seed 0 runs to 60 s: the solid mean over both stops at 30 s, past it a dashed curve is
    seed 0 alone (never seed 1's last return carried on), and a cross marks seed 1's last evaluation."""
    t = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    write_run(tmp_path, "CartPole", "fp32", 0, t, [0, 10, 20, 30, 40, 50])
    write_run(tmp_path, "CartPole", "fp32", 1, t[:3], [0, 100, 200])
    ax = plots.plot_figure(report.load_runs(tmp_path / "runs"), fraction=None).axes[0]
    solid = [line for line in ax.lines if line.get_linestyle() == "-"]
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    crosses = [line for line in ax.lines if line.get_marker() == "x"]
    assert len(solid) == 1 and max(solid[0].get_xdata()) <= 30.0
    assert len(dashed) == 1 and min(dashed[0].get_xdata()) >= 30.0 and max(dashed[0].get_xdata()) == 60.0
    assert list(dashed[0].get_ydata()) == pytest.approx([x - 10.0 for x in dashed[0].get_xdata()])  # seed 0's
    assert len(crosses) == 1 and (list(crosses[0].get_xdata()), list(crosses[0].get_ydata())) == ([30.0], [200.0])
    legend = [t.get_text() for t in ax.get_legend().texts]  # one panel: the legend sits in it
    assert legend == ["fp32 (n=2 seeds)", plots.LIVE_LABEL, plots.ENDED_LABEL]


def test_runtime_figure_labels_precisions_under_bars_and_panels_under_groups(tmp_path: Path) -> None:
    runs = report.load_runs(make_synthetic_results(tmp_path) / "runs")
    table = report.runtime_breakdown_table(runs)
    table["pull_ms_per_1k_steps"] = 0.0  # one process: nothing to fetch
    fig = plots.plot_runtime_breakdown(table, title="AMD EPYC, 2 logical CPUs")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == list(table["precision"])
    assert {t.get_text() for t in ax.texts} == {"CartPole", "Acrobot"}
    labels = [t.get_text() for t in ax.get_legend().texts]
    assert any(label.startswith("pull") and "0 here" in label for label in labels)  # zero, said so
    assert "AMD EPYC" in ax.get_title()


def test_ptq_figure_says_its_bars_are_std_over_the_episodes(tmp_path: Path) -> None:
    rows = [{"precision": "fp32", "bits": 32, "granularity": "n/a", "episodes": 4, "mean_return": 10.0,
             "std_return": 1.0},
            *({"precision": f"int{b}", "bits": b, "granularity": g, "episodes": 4, "mean_return": 9.0,
               "std_return": 2.0} for b in (4, 8) for g in ("per-tensor", "per-channel"))]
    pd.DataFrame(rows).to_csv(tmp_path / "ptq.csv", index=False)
    pd.DataFrame([{"layer": "l", "shape": "2x2", "min": 0, "max": 1, "mean": 0, "std": 1,
                   "absmax_over_std": 1}]).to_csv(tmp_path / "weights.csv", index=False)
    (tmp_path / "ptq.md").write_text("# Post-training quantization: dqn on CartPole-v1\n")
    fig = plots.plot_ptq_returns(rows, "PTQ: dqn on CartPole-v1", machine=MACHINE)
    title = fig.axes[0].get_title()
    assert "± std of the return over 4 episodes" in title and "AMD EPYC" in title
    path = plots.redraw_ptq_returns(tmp_path)  # from ptq.csv alone, both granularities drawn
    assert path.stat().st_size > 0
    fig = plots.plot_ptq_returns(rows, "t")
    assert {t.get_text() for t in fig.axes[0].get_legend().texts} >= {"int, per-tensor", "int, per-channel"}


def _bar_extents(ax) -> list[tuple[float, float]]:
    """(lowest, highest) y of every error bar drawn on `ax`."""
    out = []
    for container in ax.containers:
        for collection in container.lines[2]:
            out += [(min(y0, y1), max(y0, y1)) for (_, y0), (_, y1) in collection.get_segments()]
    return out


def test_spread_bars_stop_at_the_tasks_possible_returns() -> None:
    below_above = plots.clipped_spread([450.0, 20.0, 250.0], [200.0, 50.0, 10.0], (0.0, 500.0))
    assert below_above.tolist() == [[200.0, 20.0, 10.0], [50.0, 50.0, 10.0]]
    assert plots.clipped_spread([450.0], [200.0], None).tolist() == [[200.0], [200.0]]  # unbounded: as given
    rows = [{"precision": "fp32", "bits": 32, "granularity": "n/a", "episodes": 5, "mean_return": 480.0,
             "std_return": 40.0},
            *({"precision": f"int{b}", "bits": b, "granularity": "per-channel", "episodes": 5, "mean_return": m,
               "std_return": s} for b, m, s in ((8, 470.0, 90.0), (2, 30.0, 80.0)))]
    extents = _bar_extents(plots.plot_ptq_returns(rows, "t", task="CartPole-v1").axes[0])
    assert extents and all(0.0 <= lo and hi <= 500.0 for lo, hi in extents)
    unclipped = _bar_extents(plots.plot_ptq_returns(rows, "t").axes[0])
    assert max(hi for _, hi in unclipped) == 560.0  # no task: the plain mean ± std
    fig = plots.plot_ptq_returns(rows, "t", task="CartPole-v1")
    legend = fig.axes[0].get_legend()  # right of the axes, over no bar
    assert legend.get_bbox_to_anchor().x0 >= fig.axes[0].get_window_extent().x1
