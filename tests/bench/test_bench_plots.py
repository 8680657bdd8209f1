"""The benchmark figures, drawn from results the tests write themselves in each benchmark's format, say what they
show: the machine, what the spread is, column titles that differ, the paired p-values docs/results.md quotes, and error
bars that do not go below 0."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest



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


def _arm(mean: float, seed_means: list[float]) -> dict[str, Any]:
    return {"mean": mean, "seed_means": seed_means}


def test_qat_figure_error_bars_are_standard_errors_and_stop_at_zero(figures, tmp_path) -> None:
    from bench.learning import qat
    seeds = [[480.0, 500.0, 490.0, 470.0, 500.0], [300.0, 350.0, 250.0, 400.0, 320.0]]
    # int2 PTQ @fp32: one seed of five scored, so mean - standard error (5 - 12) would claim a negative return.
    table = [{"bits": 2, "ptq_selected_at_fp32": _arm(5.0, [0.0, 0.0, 0.0, 0.0, 60.0]),
              "ptq_selected_at_intB": _arm(20.0, [10.0, 30.0, 20.0, 15.0, 25.0]), "qat": _arm(200.0, seeds[1])},
             *({"bits": b, "ptq_selected_at_fp32": _arm(330.0, seeds[1]), "ptq_selected_at_intB": _arm(490.0, seeds[0]),
                "qat": _arm(488.0, seeds[0])} for b in (3, 4))]
    result = {"table": table, "fp32": {"mean": 480.0}, "seeds": 5, "test_episodes": 20,
              "machine": {"cpu": "Intel Xeon Test", "cores": 2}}
    qat.plot(tmp_path / "qat.png", result)
    ax = figures[0].axes[0]
    assert "± standard error over the 5 seed means" in ax.get_title() and "Xeon" in ax.get_title()
    bars = [c for c in ax.containers if getattr(c, "errorbar", None) is not None]
    lows = [min(seg[0][1], seg[1][1]) for c in bars for seg in c.errorbar.lines[2][0].get_segments()]
    highs = [max(seg[0][1], seg[1][1]) for c in bars for seg in c.errorbar.lines[2][0].get_segments()]
    assert len(lows) == 9 and min(lows) >= 0.0  # 3 bit widths x 3 arms (± std bars took int2 PTQ@fp32 below 0)
    assert min(lows) == pytest.approx(0.0) and highs[0] == pytest.approx(5.0 + qat.standard_error([0, 0, 0, 0, 60]))
    assert qat.standard_error([1.0, 3.0]) == pytest.approx(1.0)  # std (ddof 1) sqrt(2) / sqrt(2)
    assert qat.standard_error([5.0]) == 0.0


def test_fidelity_figure_titles_differ_and_carry_the_readmes_p_values(figures, tmp_path) -> None:
    from scipy import stats

    from bench.harness.results_io import write_csv
    from bench.peers import fidelity, fidelity_report
    rng = np.random.default_rng(0)
    steps, seeds, shift = (5_000, 10_000, 15_000), range(5), {"acme": 0.0, "fp32": -20.0, "int8": 5.0}
    rows = [{"task": task, "arm": arm, "seed": seed, "actor_steps": st, "learner_steps": st // 8,
             "wall_clock_s": st / 50, "train_clock_s": st / 60,
             "return": 100.0 * (i + 1) + shift[arm] + rng.normal(0.0, 30.0),
             "return_first": 100.0 * (i + 1) + shift[arm] + rng.normal(0.0, 60.0), "cpu": "Intel Xeon Test",
             "load": "0.1-0.2"}
            for task in ("cartpole:balance", "walker:stand") for arm in fidelity.ARMS for seed in seeds
            for i, st in enumerate(steps)]
    write_csv(tmp_path / "fidelity_curves.csv", rows)
    curves = fidelity.read_curves_csv(tmp_path / "fidelity_curves.csv")
    fidelity.plot(curves, tmp_path / "fidelity.png")
    fig = figures[0]
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 6 and len(set(titles)) == len(titles)
    text = " ".join(titles)

    def auc_p(task: str, arm: str, protocol: str) -> float:
        """The paired t-test of the per-seed mean return over the checkpoints, ours against Acme, worked out here."""
        mean = lambda a: [np.mean([r[protocol] for r in rows if (r["task"], r["arm"], r["seed"]) == (task, a, s)])
                          for s in seeds]  # noqa: E731
        return stats.ttest_rel(mean(arm), mean("acme")).pvalue

    for task in ("cartpole:balance", "walker:stand"):
        for protocol in fidelity_report.PROTOCOLS:  # docs/results.md quotes these for each protocol's panel
            quoted = f"fp32 p={auc_p(task, 'fp32', protocol):.2f}, int8 p={auc_p(task, 'int8', protocol):.2f}"
            assert quoted in text
    assert "Xeon" in fig._suptitle.get_text() and "standard error" in fig._suptitle.get_text()  # noqa: SLF001


def test_actorq_figure_names_the_cpu_and_shows_the_spread_of_its_blocks(figures, tmp_path) -> None:
    from bench.system import actorq, actorq_probe
    rng = np.random.default_rng(0)
    policy_us = {"fp32": 1800.0, "int8": 500.0, "int4": 300.0}
    blocks = {p: [{"policy_us": us * f, "env_us": 200.0} for f in rng.uniform(0.8, 1.3, 8)]
              for p, us in policy_us.items()}
    for rows in blocks.values():
        for row in rows:
            row["steps_per_s"] = 1e6 / (row["policy_us"] + row["env_us"])
    ratios = actorq_probe.throughput_ratios(blocks)
    update = {p: {"pull_ms": 1.0, "deserialize_ms": 0.5, "load_ms": ms} for p, ms in (("fp32", 9.0), ("int8", 2.0),
                                                                                        ("int4", 1.5))}
    result = {"machine": {"cpu": "AMD EPYC 7B13", "cores": 2, "load_start": [0.4], "load_end": [0.6]},
              "actor": {"throughput": {p: {"steps_per_s": float(np.median([b["steps_per_s"] for b in rows]))}
                                       for p, rows in blocks.items()},
                        "throughput_blocks": blocks, "update": update, **ratios,
                        "update_ratio_fp32_vs": {p: 10.5 / (1.5 + update[p]["load_ms"]) for p in ("int8", "int4")}}}
    actorq.plot(result, tmp_path / "actorq.png")
    fig = figures[0]
    assert "AMD EPYC" in fig._suptitle.get_text()  # noqa: SLF001
    ax = fig.axes[0]
    assert "min..max over 8 interleaved blocks" in ax.get_title()
    bars = [c for c in ax.containers if hasattr(c, "errorbar") and c.errorbar is not None]
    assert bars and np.all(np.asarray([p.get_height() for p in bars[0].patches]) > 0)
    spans = [sorted((seg[0][1], seg[1][1])) for seg in bars[0].errorbar.lines[2][0].get_segments()]
    for span, precision in zip(spans, actorq_probe.PRECISIONS, strict=True):  # each bar's error bar: its blocks' range
        rates = [b["steps_per_s"] for b in blocks[precision]]
        assert span == pytest.approx([min(rates), max(rates)])
    assert all(ax.get_ylabel() for ax in fig.axes)  # every panel says what its bars measure


def test_learning_figure_is_redrawn_from_its_curves_with_the_machine_and_the_seeds(figures, tmp_path) -> None:
    from bench.harness.results_io import write_csv
    from bench.harness.rows import DQN_ROWS
    from bench.learning import int8_vs_fp32 as learning
    curves = [{"agent": row.agent, "task": row.task, "precision": precision, "seed": seed, "actor_steps": step,
               "train_clock_s": step / 1000, "return": row.target * step / row.max_actor_steps - seed}
              for row in DQN_ROWS for precision in ("fp32", "int8") for seed in range(3)
              for step in range(row.eval_every, row.max_actor_steps + 1, 10 * row.eval_every)]
    write_csv(tmp_path / "learning_dqn_curves.csv", curves)  # as bench.learning.int8_vs_fp32 writes it
    assert learning.main(["--rows", "dqn", "--report-only", "--out", str(tmp_path), "--machine", "test CPU"]) == 0
    title = figures[0]._suptitle.get_text()  # noqa: SLF001
    assert "test CPU" in title and "one line per seed (3 seeds)" in title
    assert len(figures[0].axes) == 3 and all(ax.lines for ax in figures[0].axes)
    assert [len(ax.lines) for ax in figures[0].axes] == [7, 7, 7]  # 3 seeds x 2 precisions, and the target
