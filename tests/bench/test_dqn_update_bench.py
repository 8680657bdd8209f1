"""bench.micro.dqn_update at its smallest: both loss forms build, train on the same batch and are timed; the baseline
form gives the same loss as the current one (it differs in cost only)."""
from __future__ import annotations

import json

import numpy as np

from bench.micro import dqn_update


def test_quick_run_times_both_forms_and_writes_the_table(tmp_path):
    assert dqn_update.main(["--quick", "--repeats", "2", "--allow-busy", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "dqn_update.json").read_text())
    assert [r["net"] for r in result["rows"]] == ["mlp 64x64", "mlp 256x256"]
    assert all(r["current_ms"] > 0 and r["one_pass_ms"] > 0 for r in result["rows"])
    assert "cpu_flags" in result["machine"] and "| mlp 64x64 | 128 |" in (tmp_path / "dqn_update.md").read_text()


def test_the_baseline_form_computes_the_same_loss_and_td_errors():
    from agents.dqn import learning

    _, spec, cfg, batch = dqn_update.cases(quick=True)[0]
    learner = learning.DQNLearner(spec, cfg, seed=0)
    params = learner._state.params  # pylint: disable=protected-access
    args = (params, params, batch, np.ones(128, np.float32))
    current = learning.make_loss(spec, cfg.huber_loss_parameter)(*args)
    baseline = dqn_update.one_pass_loss(spec, cfg.huber_loss_parameter)(*args)
    np.testing.assert_allclose(np.asarray(current[0]), np.asarray(baseline[0]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(current[1][0]), np.asarray(baseline[1][0]), rtol=1e-5, atol=1e-6)
