"""The figures say what they show: a title naming the budget/runner/machine and the spread's meaning, no empty
cells, readable runtime labels, PTQ bars said to be ± std over N episodes."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import plots, report
from tests.launch.test_reproduce import make_synthetic_results

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
