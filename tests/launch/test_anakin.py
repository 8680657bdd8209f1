"""`launch.anakin`, the jitted trainer: PPO with int8 actors inside the jit learns CartPole-v1 (gymnax) to 475; the
policy deployed through the ONNX int8 executor on gymnasium's CartPole-v1 scores what it scores inside the jit; its
seed folders are run folders `launch.ptq` and `analysis` read unchanged; a vmapped run's seed k is a single run of
seed k; a stop keeps what was written; bad flags exit 2 with one line, writing nothing."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from analysis.runs import load_runs
from agents.anakin.common import InJitActor, evaluate
from launch import anakin, ptq
from launch.experiments.anakin_run import AnakinRun, run_anakin
from launch.ptq_policy import calibration_observations, load_trained_policy
from quarl.acting.evaluation import evaluate_seeds, make_greedy_policy
from quarl.envs.factory import make_environment
from quarl.envs.gymnax_env import GymnaxEnv
from quarl.quant.calibration import quantize_for_actors
from quarl.quant.policy_io import load_policy
from quarl.quant.precision import parse_precision

REPO = Path(__file__).resolve().parents[2]
DEPLOY_SEED = 50_000  # the deployed episodes' environment seeds: apart from training and evaluation
# A small PPO (4 envs x 16 steps, one epoch): what the seed-equality and stop test runs.
SMALL = {"num_envs": 4, "num_steps": 16, "update_epochs": 1}


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    """PPO, int8 actors, CartPole-v1, seed 0: stops once an evaluation reaches 475 (at most 100k env steps)."""
    out = tmp_path_factory.mktemp("anakin") / "ppo"
    code = anakin.main(["--agent", "ppo", "--task", "CartPole-v1", "--seeds", "0", "--precision", "int8",
                        "--steps", "100000", "--eval-every", "10000", "--target-return", "475", "--out", str(out),
                        "--no-progress"])
    assert code == 0
    return out / "seed0"


def test_ppo_with_int8_actors_in_the_jit_learns_cartpole(cartpole_run):
    summary = json.loads((cartpole_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["runner"] == "anakin"
    assert summary["solved"] is not None and summary["best_eval_return"] >= 475  # an untrained policy scores ~10-30
    assert summary["executed"] == "int8 weights, integer kernel (aqt_s8s8)"
    assert summary["actor_steps"] <= 100_000 and summary["learner"]["anakin"]["seeds"] == [0]


def deployed_and_in_jit_returns(folder: Path, episodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The int8 policy of a run folder, (returns deployed as an actor runs it elsewhere: the ONNX int8 executor,
    calibrated for conv policies, on the project's environment; returns inside the jit: the in-jit JAX runtime on
    the gymnax port), `episodes` greedy episodes each."""
    policy, int8 = load_trained_policy(folder), parse_precision("int8")
    qparams = quantize_for_actors(policy.spec, policy.params, int8, calibration_observations(policy))
    env = make_environment(policy.task, 0)
    greedy = make_greedy_policy(policy.spec, qparams, env.action_spec(), backend="onnx")
    env.close()
    assert greedy.backend == "onnx" and not greedy.simulated
    deployed = evaluate_seeds(policy.task, greedy, range(DEPLOY_SEED, DEPLOY_SEED + episodes)).returns
    actor, port = InJitActor(policy.spec, int8), GymnaxEnv(policy.task)
    run = jax.jit(lambda params, key: evaluate(port, lambda obs, _: actor.greedy(actor.weights(params), obs), key,
                                               episodes)[0])
    in_jit = np.asarray(run(jax.tree.map(jnp.asarray, policy.params), jax.random.PRNGKey(DEPLOY_SEED)), np.float64)
    return deployed, in_jit


def same_within_noise(a: np.ndarray, b: np.ndarray, z: float = 4.0) -> bool:
    """Whether two sets of episode returns have means within `z` standard errors of their difference."""
    se = float(np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)))
    return abs(a.mean() - b.mean()) <= z * se if se > 0 else a.mean() == b.mean()


def test_deployed_through_onnx_int8_on_gymnasium_it_scores_as_inside_the_jit(cartpole_run):
    deployed, in_jit = deployed_and_in_jit_returns(cartpole_run, 30)
    print(f"\nCartPole-v1: ONNX int8 on gymnasium {deployed.mean():.1f} +- {deployed.std():.1f}, "
          f"inside the jit {in_jit.mean():.1f} +- {in_jit.std():.1f}")
    assert same_within_noise(deployed, in_jit), (deployed.mean(), in_jit.mean())
    assert deployed.mean() > 200  # the trained policy, not an untrained one that both would fail alike


def test_anakin_seed_folder_is_a_run_folder_for_ptq_and_analysis(cartpole_run):
    runs = load_runs(cartpole_run.parent)
    assert len(runs) == 1 and bool(runs["finished"].iloc[0]) and runs["seed"].iloc[0] == 0
    assert runs["final_return"].iloc[0] >= 475
    policy = load_policy(cartpole_run)
    assert (policy.task, policy.agent) == ("CartPole-v1", "ppo")
    # launch.ptq on the original gymnasium task, from the folder as it is
    assert ptq.main(["--checkpoint", str(cartpole_run), "--bits", "8", "--include", "", "--episodes", "3",
                     "--no-progress"]) == 0
    with open(cartpole_run / "ptq" / "ptq.csv", newline="", encoding="utf-8") as f:
        rows = {(r["precision"], r["granularity"]): r for r in csv.DictReader(f)}
    assert float(rows[("int8", "per-channel")]["mean_return"]) > 200  # a trained policy on the original task


def _stopped_run(out: Path, seeds: tuple[int, ...], chunks: int = 2) -> list[dict]:
    """A small PPO run of `seeds` (2 evaluation episodes every 64 env steps) stopped after `chunks` chunks, as a
    Ctrl-C between chunks stops it."""
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > chunks

    run = AnakinRun(agent="ppo", task="CartPole-v1", precision=parse_precision("int8"), seeds=seeds,
                    max_actor_steps=64 * 10, out=out, overrides=SMALL, eval_every=64, eval_episodes=2)
    return run_anakin(run, progress=False, energy=False, should_stop=stop)


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_vmapped_seed_equals_a_single_run_and_a_stop_keeps_what_was_written(tmp_path):
    many = _stopped_run(tmp_path / "many", (0, 1, 2))
    one = _stopped_run(tmp_path / "one", (1,))
    for summary in (*many, *one):  # the stop: rows, policy and summary of every seed written, status interrupted
        folder = Path(summary["logdir"])
        assert summary["status"] == "interrupted" and summary["actor_steps"] == 128
        assert json.loads((folder / "summary.json").read_text())["status"] == "interrupted"
        assert [int(r["actor_steps"]) for r in _csv(folder / "evaluator.csv")] == [64, 128]
        assert load_policy(folder).steps == summary["learner_steps"] == 2
    a, b = tmp_path / "many" / "seed1", tmp_path / "one" / "seed1"
    # Seed 1 among three is seed 1 alone: the same training episodes and the same evaluation returns...
    for name, keys in (("evaluator.csv", ("return", "return_first")),
                       ("learner.csv", ("train_episodes", "train_episode_return"))):
        assert [[r[k] for k in keys] for r in _csv(a / name)] == [[r[k] for k in keys] for r in _csv(b / name)]
    # ...and the same weights to float rounding: XLA may sum a vmapped (batched) dot in another order than a single one.
    for x, y in zip(jax.tree.leaves(load_policy(a).params), jax.tree.leaves(load_policy(b).params)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    rows = [_csv(tmp_path / "many" / f"seed{s}" / "learner.csv") for s in (0, 1, 2)]
    assert len({tuple(r["train_episode_return"] for r in seed) for seed in rows}) > 1  # the seeds themselves differ


@pytest.mark.slow  # the kind's default-suite test: test_ppo_with_int8_actors_in_the_jit_learns_cartpole
def test_dqn_with_the_replay_ring_in_the_jit_learns_cartpole(tmp_path):
    out = tmp_path / "dqn"
    assert anakin.main(["--agent", "dqn", "--seeds", "0", "--steps", "25000", "--eval-every", "2500",
                        "--target-return", "475", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "seed0" / "summary.json").read_text())
    assert summary["solved"] is not None and summary["best_eval_return"] >= 475
    assert summary["replay"]["samples_per_insert"] == 64.0 and summary["learner_steps"] > 10_000


@pytest.mark.slow  # the kind's default-suite test: test_ppo_with_int8_actors_in_the_jit_learns_cartpole
@pytest.mark.parametrize("flags, least", [(["--agent", "a2c", "--precision", "int8"], 200.0),
                                          (["--agent", "ppo", "--precision", "int4", "--qat-bits", "4"], 300.0)])
def test_a2c_and_ppo_with_qat_learn_cartpole(tmp_path, flags, least):
    """A2C (PPO's one-epoch setting) and QAT (int4 actors trained through int4 arithmetic), to the thresholds
    launch.train's tests hold them to (an untrained policy scores ~10-30)."""
    out = tmp_path / "run"
    assert anakin.main([*flags, "--seeds", "0-1", "--steps", "100000", "--out", str(out), "--no-progress"]) == 0
    for seed in (0, 1):
        summary = json.loads((out / f"seed{seed}" / "summary.json").read_text())
        assert summary["best_eval_return"] >= least, summary["best_eval_return"]
        if "--qat-bits" in flags:
            assert summary["config"]["qat_bits"] == 4 and summary["executed"].startswith("int4 weights, integer")


@pytest.mark.slow  # the bad-input kind's default-suite test: test_bad_flags_exit_2_with_one_line_and_write_nothing
def test_a_diverged_learner_fails_the_run_and_writes_no_policy(tmp_path):
    """Weights that went non-finite (a learning rate no run survives) end the run with status failed, exit 1, and
    no policy file for that seed: NaN or inf weights are an error, never a policy."""
    out = tmp_path / "nan"
    code = anakin.main(["--seeds", "0", "--steps", "2048", "--eval-every", "512", "--set", "learning_rate=1e38",
                        "--set", "max_gradient_norm=1e38", "--set", "anneal_lr=false", "--out", str(out),
                        "--no-progress"])
    summary = json.loads((out / "seed0" / "summary.json").read_text())
    assert code == 1 and summary["status"] == "failed" and "non-finite" in summary["error"]
    assert summary["policy_file"] is None and not (out / "seed0" / "policy_fp32.qrlp").exists()


@pytest.mark.parametrize("flags, message", [
    (["--task", "cartpole:balance"], "gymnax ports"),
    (["--agent", "d4pg"], "runs ppo, a2c, dqn"),
    (["--precision", "int16"], "fp32 or int2..int8"),
    (["--seeds", "3-1"], "low-high"),
    (["--seeds", "0,0"], "distinct"),
    (["--set", "num_envs=0"], "num_envs"),
    (["--agent", "dqn", "--set", "prioritized_replay=true"], "replays uniformly"),
])
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exc:
        anakin.main([*flags, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # default suite: test_vmapped_seed_equals_a_single_run_and_a_stop_keeps_what_was_written
def test_sigint_mid_run_exits_130_with_everything_written(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "launch.anakin", "--seeds", "0-1", "--steps", "2000000", "--eval-every", "20000",
           "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not (
                (out / "seed1" / "evaluator.csv").exists()
                and len((out / "seed1" / "evaluator.csv").read_text().splitlines()) > 1):
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    for seed in (0, 1):
        summary = json.loads((out / f"seed{seed}" / "summary.json").read_text())
        assert summary["status"] == "interrupted" and 0 < summary["actor_steps"] < 2_000_000
        assert load_policy(out / f"seed{seed}").steps == summary["learner_steps"]
