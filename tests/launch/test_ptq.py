"""launch.ptq end to end on a small CartPole DQN policy, plus its flag validation."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launch import ptq
from quarl.envs.factory import make_environment
from quarl.policy.reference import reference_apply
from quarl.quant.policy_io import load_policy, save_policy
from quarl.quant.quantization import fake_quantize_params
from tests.quarl.test_evaluation import cartpole_q_network

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run")
    spec, params = cartpole_q_network()
    save_policy(run, spec, params, task="CartPole-v1", agent="dqn", steps=5000)
    return run


@pytest.fixture(scope="module")
def sweep(checkpoint) -> Path:
    assert ptq.main(["--checkpoint", str(checkpoint), "--bits", "2,4,8", "--include", "fp16", "--episodes", "2",
                     "--no-progress"]) == 0
    return checkpoint / "ptq"


def test_ptq_rows_cover_the_grid(sweep):
    rows = _read_csv(sweep / "ptq.csv")
    assert [(r["precision"], r["granularity"]) for r in rows] == [
        ("fp32", "n/a"), ("fp16", "n/a"),
        ("int8", "per-tensor"), ("int8", "per-channel"), ("int4", "per-tensor"), ("int4", "per-channel"),
        ("int2", "per-tensor"), ("int2", "per-channel")]
    for r in rows:
        assert r["episodes"] == "2" and r["backend"] == "jax"
        lo, mean, hi = float(r["min_return"]), float(r["mean_return"]), float(r["max_return"])
        assert lo <= mean <= hi and np.isfinite(mean) and float(r["std_return"]) >= 0
        expected = {"fp32": "native", "fp16": "native"}.get(r["precision"], "int-kernel")
        assert r["execution"] == expected
        bits = {"fp32": 32, "fp16": 16}.get(r["precision"]) or int(r["precision"].removeprefix("int"))
        assert int(r["bits"]) == bits
    fp32 = rows[0]
    assert float(fp32["error_mean"]) == 0.0 and float(fp32["error_std"]) == 0.0
    assert float(fp32["mean_return"]) == 500.0  # the hand-made controller balances at fp32
    assert float(fp32["weight_sqnr_db"]) == np.inf


def test_errors_are_paired_against_fp32(sweep):
    rows = _read_csv(sweep / "ptq.csv")
    episodes = _read_csv(sweep / "ptq_episodes.csv")
    returns: dict[tuple[str, str], list[float]] = {}
    for e in episodes:
        returns.setdefault((e["precision"], e["granularity"]), []).append(float(e["return"]))
        assert int(e["seed"]) == int(e["episode"])  # --seed 0: episode i is env seed i everywhere
    base = np.array(returns[("fp32", "n/a")])
    for r in rows:
        got = np.array(returns[(r["precision"], r["granularity"])])
        assert float(r["mean_return"]) == pytest.approx(got.mean())
        per_episode = (base - got) / abs(base.mean())
        assert float(r["error_mean"]) == pytest.approx(per_episode.mean())
        assert float(r["error_std"]) == pytest.approx(per_episode.std())


def test_weight_error_grows_as_bits_shrink(sweep):
    rows = {(r["precision"], r["granularity"]): r for r in _read_csv(sweep / "ptq.csv")}
    for granularity in ("per-tensor", "per-channel"):
        sqnr = [float(rows[(f"int{b}", granularity)]["weight_sqnr_db"]) for b in (2, 4, 8)]
        assert sqnr[0] < sqnr[1] < sqnr[2]
        rel = [float(rows[(f"int{b}", granularity)]["weight_max_rel_err"]) for b in (2, 4, 8)]
        assert rel[0] > rel[1] > rel[2] > 0
    assert float(rows[("fp16", "n/a")]["weight_sqnr_db"]) > float(rows[("int8", "per-channel")]["weight_sqnr_db"])


def test_plots_tables_and_weight_stats_are_written(sweep, checkpoint):
    for name in ("ptq_returns.png", "weights.png"):
        data = (sweep / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5_000
    md = (sweep / "ptq.md").read_text()
    assert "| Policy | Granularity | fp32 return | E fp16 | E int8 | E int4 | E int2 |" in md
    assert md.count("| dqn / CartPole-v1 |") == 2
    params = load_policy(checkpoint).params
    stats = {r["layer"]: r for r in _read_csv(sweep / "weights.csv")}
    assert sorted(stats) == ["linear_0/w", "linear_1/w"]
    for layer, row in stats.items():
        w = params[layer.split("/")[0]]["w"]
        assert float(row["min"]) == pytest.approx(w.min()) and float(row["max"]) == pytest.approx(w.max())
        assert float(row["absmax_over_std"]) == pytest.approx(np.abs(w).max() / w.std(), rel=1e-5)


def test_wide_integers_run_simulated_with_fake_quantized_weights(checkpoint):
    policy = load_policy(checkpoint)
    action_spec = make_environment("CartPole-v1", 0).action_spec()
    for granularity, per_channel in ptq.GRANULARITIES:
        greedy, execution = ptq.make_row_policy(ptq.GridPoint("int12", granularity), policy, action_spec, "onnx")
        assert execution == "simulated" and greedy.backend == "jax" and greedy.precision == "fp32"
        obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
        expected = reference_apply(policy.spec, fake_quantize_params(policy.params, "int12", per_channel), obs)
        np.testing.assert_allclose(greedy.executor(obs), expected, rtol=1e-5, atol=1e-5)


def test_sweep_grid_order():
    grid = ptq.sweep_grid([8, 2, 16], ["bf16"])
    assert [(p.precision, p.granularity) for p in grid] == [
        ("fp32", "n/a"), ("bf16", "n/a"), ("int16", "per-tensor"), ("int16", "per-channel"),
        ("int8", "per-tensor"), ("int8", "per-channel"), ("int2", "per-tensor"), ("int2", "per-channel")]


@pytest.mark.parametrize("flags, message", [
    (["--bits", "1"], "outside 2..16"),
    (["--bits", "4,17"], "outside 2..16"),
    (["--bits", "four"], "not an integer"),
    (["--bits", ""], "at least one"),
    (["--include", "fp64"], "unknown precision"),
    (["--include", "int8"], "not one of bf16, fp16"),
    (["--episodes", "0"], "--episodes must be a positive integer"),
    (["--episodes", "-3"], "--episodes must be a positive integer"),
    (["--seed", "-1"], "--seed"),
    (["--backend", "tpu"], "unknown backend"),
])
def test_bad_flags_exit_2_with_one_line_and_write_nothing(checkpoint, tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        ptq.main(["--checkpoint", str(checkpoint), "--out", str(out), "--no-progress", *flags])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not out.exists()


def test_missing_or_corrupt_checkpoint_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        ptq.main(["--checkpoint", str(tmp_path / "none"), "--episodes", "1"])
    assert exc.value.code == 2 and "no trained policy" in capsys.readouterr().err
    spec, params = cartpole_q_network()
    path = save_policy(tmp_path / "run", spec, params, task="CartPole-v1", agent="dqn")
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(SystemExit) as exc:
        ptq.main(["--checkpoint", str(tmp_path / "run"), "--episodes", "1"])
    assert exc.value.code == 2 and "corrupt policy file" in capsys.readouterr().err
    assert not (tmp_path / "run" / "ptq").exists()


def test_policy_for_another_task_exits_2(tmp_path, capsys):
    spec, params = cartpole_q_network()
    save_policy(tmp_path, spec, params, task="Acrobot-v1", agent="dqn")  # Acrobot has 6-d observations
    with pytest.raises(SystemExit) as exc:
        ptq.main(["--checkpoint", str(tmp_path), "--episodes", "1"])
    assert exc.value.code == 2 and "does not fit task Acrobot-v1" in capsys.readouterr().err
    assert not (tmp_path / "ptq").exists()


def test_command_line_entry_point_rejects_bad_bits(checkpoint, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "launch.ptq", "--checkpoint", str(checkpoint), "--bits", "2,1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--bits: 1 is outside 2..16" in proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_an_earlier_sweep_is_replaced_only_with_force(sweep, checkpoint, tmp_path, capsys):
    import shutil
    out = tmp_path / "ptq"
    shutil.copytree(sweep, out)  # the module's sweep stays as the other tests read it
    argv = ["--checkpoint", str(checkpoint), "--out", str(out), "--bits", "8", "--include", "", "--episodes", "1",
            "--no-progress"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit) as exc:
        ptq.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--force" in err and "ptq.csv" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched
    assert ptq.main([*argv, "--force"]) == 0
    assert [r["precision"] for r in _read_csv(out / "ptq.csv")] == ["fp32", "int8", "int8"]


def test_progress_into_a_log_is_one_plain_line_per_precision(checkpoint, tmp_path):
    """stderr that is not a terminal (a log, CI) gets lines, never a carriage-return bar."""
    out = tmp_path / "ptq"
    proc = subprocess.run([sys.executable, "-m", "launch.ptq", "--checkpoint", str(checkpoint), "--bits", "8,4",
                           "--include", "", "--episodes", "1", "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("launch.ptq: ")]
    assert len(lines) == 5 and lines[-1].startswith("launch.ptq: 5 / 5 precisions done")  # fp32 + 2 x (int8, int4)
