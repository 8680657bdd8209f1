"""launch.train end to end on a tiny budget, and its flag validation (one stderr line, exit 2, nothing written)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launch import train
from launch.cli import UsageError
from launch.overrides import parse_overrides
from tests.agents.executed import assert_integer_kernel_ran
from tests.launch.tiny import assert_one_line_exit_2

REPO = Path(__file__).resolve().parents[2]
TINY = ["--set", "min_replay_size=300", "--set", "hidden_sizes=32,32", "--set", "epsilon_decay_steps=500"]


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_train_cli_end_to_end_writes_logs_and_summary(tmp_path):
    logdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch.train", "--agent", "dqn", "--task", "CartPole-v1", "--precision", "int8",
           "--backend", "onnx", "--steps", "1200", "--seed", "3", "--logdir", str(logdir), "--eval-every", "600",
           "--eval-episodes", "2", "--actor-update-period", "50", "--eval-fp32", "--no-progress", *TINY]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((logdir / "summary.json").read_text())
    # The same end-of-run table as launch.actorq, saying what the actors executed, and the run folder.
    assert f"actors ran {summary['executed']}" in proc.stdout.replace("\n", " ")
    assert proc.stdout.strip().splitlines()[-1] == f"run folder: {logdir.absolute()}"

    assert summary["agent"] == "dqn" and summary["task"] == "CartPole-v1"
    assert summary["precision"] == "int8" and summary["backend"] == ["onnx"] and summary["seed"] == 3
    assert summary["actor_steps"] == 1200 and summary["config"]["hidden_sizes"] == [32, 32]
    assert summary["learner"]["loop_form"]["form"] == "scan"  # agents.loops' auto: the scan, with its reason
    # The int8 kernel form the CPU settled on, and the self-check that confirmed it.
    kernel = summary["actors"][0]["kernel"]
    assert summary["kernel_form"] == [kernel["form"]]
    assert kernel["form"] in ("u8s8", "u8u8", "fp32") and kernel["checks"][-1] == {**kernel["checks"][-1], "ok": True}
    assert kernel["checks"][-1]["form"] == kernel["form"] and kernel["cpu_class"] and "fallback" in kernel
    assert_integer_kernel_ran(summary)  # whichever form this CPU takes, an integer one: not fp32 compute
    # 900 inserts after the 300-item warm-up at one update per insert (64 samples per insert, batch 64).
    assert 850 <= summary["learner_steps"] <= 1000
    assert summary["weight_updates"] == 1200 // 50
    # int8 weights + fp32 scales/biases: well under the fp32 payload, above a quarter of it.
    assert summary["payload_bytes_fp32"] / 4 < summary["payload_bytes"] < summary["payload_bytes_fp32"] / 2
    runtime = summary["runtime"]
    for key in ("env_step_s", "policy_s", "quantize_encode_s", "deserialize_s", "load_s"):
        assert runtime["summed_s"][key] > 0, key
    for key in ("quantize_encode_ms", "deserialize_ms", "load_ms"):
        assert runtime["per_update"][key] > 0, key
    assert runtime["summed_s"]["pull_s"] == 0.0  # one process: no weight server to fetch from
    assert summary["status"] == "completed" and summary["runner"] == "single" and summary["num_actors"] == 1
    assert set(summary["energy"]["nodes"]) == {"run"}

    evals = _read_csv(logdir / "evaluator.csv")
    assert [int(r["actor_steps"]) for r in evals] == [600, 1200]
    assert float(evals[-1]["return"]) == pytest.approx(summary["final_eval_return"])
    assert summary["best_eval_return"] == pytest.approx(max(float(r["return"]) for r in evals))
    # --eval-fp32: every evaluation also ran the fp32 policy over as many whole episodes (CartPole pays 1 a step, so
    # the sum of its returns is a whole number of steps), and the summary reports the last one.
    assert all((float(r["return_fp32"]) * int(r["episodes"])).is_integer() and int(r["episodes"]) == 2 for r in evals)
    assert summary["final_eval_return_fp32"] == pytest.approx(float(evals[-1]["return_fp32"]))
    episodes = _read_csv(logdir / "actor.csv")
    assert len(episodes) == summary["episodes"] > 0
    assert sum(int(r["length"]) for r in episodes) <= 1200
    learner_rows = _read_csv(logdir / "learner.csv")
    assert int(learner_rows[-1]["learner_steps"]) == summary["learner_steps"]  # a final row, whatever the period
    assert all(float(r["loss"]) >= 0 for r in learner_rows)
    assert {r["exploration"] for r in episodes} and float(episodes[-1]["exploration"]) < 1.0  # epsilon decayed

    # The final fp32 policy is saved for offline analysis and reads back as the learner's last weights.
    from quarl.quant.policy_io import load_policy
    assert summary["policy_file"] == "policy_fp32.qrlp"
    policy = load_policy(logdir)
    assert policy.task == "CartPole-v1" and policy.agent == "dqn" and policy.steps == summary["learner_steps"]


def _argv(logdir: Path, flags: list[str]) -> list[str]:
    """A valid command line with `flags` (flag, value pairs or a lone flag) replacing or adding to it."""
    base = {"--agent": "dqn", "--task": "CartPole-v1", "--steps": "100", "--logdir": str(logdir)}
    extra: list[str] = []
    i = 0
    while i < len(flags):
        flag, value = flags[i], flags[i + 1] if i + 1 < len(flags) else None
        if flag in base and value is not None:
            base[flag] = value
        else:
            extra += [flag] if value is None else [flag, value]
        i += 2
    return [x for kv in base.items() for x in kv] + extra


@pytest.mark.parametrize("flags,needle", [
    (["--agent", "sac"], "unknown agent"),
    (["--task", "NoSuchTask-v0"], "unknown task"),
    (["--precision", "int99"], "unknown precision"),
    (["--backend", "tpu"], "unknown backend"),
    (["--steps", "0"], "--steps"),
    (["--steps", "-5"], "--steps"),
    (["--steps", "ten"], "--steps"),
    (["--eval-episodes", "0"], "--eval-episodes"),
    (["--eval-every", "-3"], "--eval-every"),
    (["--seed", "-1"], "--seed"),
    (["--set", "no_such_key=1"], "no_such_key"),
    (["--set", "batch_size=abc"], "batch_size"),
    (["--set", "learning_rate=-1"], "learning_rate"),
    (["--set", "batch_size"], "PATH=VALUE"),
    (["--task", "cartpole:balance"], "cannot run"),
    (["--agent", "d4pg"], "cannot run"),
    (["--no-such-flag", "1"], "unrecognized"),
    (["--qat-bits", "9"], "--qat-bits"),
    (["--qat-bits", "1"], "--qat-bits"),
    (["--qat-bits", "4"], "--precision int4"),  # default precision int8: QAT must train for what is deployed
    (["--qat-bits", "4", "--precision", "int3"], "--precision int4"),
    (["--learner-loop", "fast"], "--learner-loop"),
])
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, flags, needle):
    logdir = tmp_path / "run"
    assert_one_line_exit_2(capsys, train.main, _argv(logdir, flags), needle)
    assert not logdir.exists()


def test_an_unknown_precision_lists_only_what_actors_run(tmp_path, capsys):
    """`--precision int1` lists the actor precisions, not int9..int15, which `--precision int9` then refuses."""
    from launch import actorq
    for main, argv in ((train.main, _argv(tmp_path / "run", [])),
                       (actorq.main, ["--agent", "dqn", "--task", "CartPole-v1", "--logdir", str(tmp_path / "run")])):
        assert_one_line_exit_2(capsys, main, [*argv, "--precision", "int1"], "unknown precision")
        assert_one_line_exit_2(capsys, main, [*argv, "--precision", "int9"], "not an actor precision")
    with pytest.raises(SystemExit):
        train.main(_argv(tmp_path / "run", ["--precision", "int1"]))
    err = capsys.readouterr().err
    assert "int2..int8, int16" in err and not any(f"int{b}" in err for b in range(9, 16)), err
    assert not (tmp_path / "run").exists()


def test_a_budget_that_ends_before_learning_or_the_first_evaluation_is_warned_about(tmp_path, capsys, monkeypatch):
    """`--steps 3000` with learning from 10k transitions trains nothing: said before the run, which still runs."""
    from launch.experiments.budget import budget_warnings
    from launch.experiments.config import ExperimentConfig

    def config(**kw: object) -> ExperimentConfig:
        base = {"agent": "dqn", "task": "CartPole-v1", "max_actor_steps": 3000, "logdir": str(tmp_path / "r"),
                "overrides": {"min_replay_size": 10_000}}
        return ExperimentConfig.create(**{**base, **kw})

    (learning,) = budget_warnings(config(), "--steps", distributed=False)
    assert learning.startswith("--steps 3,000 ends before learning starts") and "min_replay_size=10,000" in learning
    assert budget_warnings(config(overrides={}), "--steps", distributed=False) == []  # learns from 1,000
    (evaluation,) = budget_warnings(config(overrides={}, eval_every=5000), "--steps", distributed=False)
    assert "before the first evaluation (every 5,000 actor steps" in evaluation
    # On-policy: one process rounds the budget up to whole rollouts; distributed, every actor must finish one.
    ppo = {"agent": "ppo", "overrides": {"num_envs": 4, "num_steps": 128}}  # 512 steps a rollout
    assert budget_warnings(config(max_actor_steps=256, **ppo), "--steps", distributed=False) == []
    (spread,) = budget_warnings(config(max_actor_steps=800, num_actors=2, **ppo), "--max-actor-steps",
                                distributed=True)
    assert "each of the 2 actors must finish a rollout first (1,024 actor steps in all)" in spread
    # launch.train prints it on stderr before the run, and runs.
    ran = []
    monkeypatch.setattr("launch.experiments.run_experiment.run_experiment",
                        lambda config, **kw: ran.append(config) or {"status": "completed"})
    monkeypatch.setattr("launch.experiments.summary_table.print_summary", lambda summary: None)
    assert train.main(_argv(tmp_path / "run", ["--steps", "300", "--set", "min_replay_size=1000"])) == 0
    err = capsys.readouterr().err
    assert ran and err.startswith("launch.train: warning: --steps 300 ends before learning starts"), err


def test_unusable_logdirs_are_refused_before_anything_is_written(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    existing = tmp_path / "old_run"
    existing.mkdir()
    (existing / "summary.json").write_text("{}")
    for logdir, needle in ((blocker / "run", "cannot be created"), (blocker, "not a directory"),
                           (existing, "already holds a run")):
        assert_one_line_exit_2(capsys, train.main,
                               ["--agent", "dqn", "--task", "CartPole-v1", "--steps", "10", "--logdir", str(logdir)],
                               needle)
    assert sorted(p.name for p in existing.iterdir()) == ["summary.json"]


def test_every_flag_has_launch_actorqs_default(tmp_path, monkeypatch):
    """No flag is required: the agent, task, step budget, seed and run folder default as launch.actorq's do."""
    monkeypatch.chdir(tmp_path)
    config = train.validate(train.build_parser().parse_args([]))
    assert (config.agent, config.task, config.max_actor_steps, config.seed) == ("d4pg", "cartpole:balance", 60_000, 0)
    assert config.logdir.startswith("runs/train/d4pg-cartpole-balance-int8-")
    dqn = train.validate(train.build_parser().parse_args(["--agent", "dqn"]))
    assert (dqn.task, dqn.max_actor_steps) == ("CartPole-v1", 25_000)
    assert not (tmp_path / "runs").exists()  # nothing written by validation


def test_runs_start_from_the_agents_tuned_task_settings_and_set_wins(tmp_path, monkeypatch):
    """A plain `launch.train --agent dqn --task CartPole-v1` runs CartPole's tuned DQN settings (Huber 5, what
    keeps it solved), PPO on a DM Control task its control settings, A2C its own defaults; `--set` overrides a key."""
    monkeypatch.chdir(tmp_path)
    parse = lambda *flags: train.validate(train.build_parser().parse_args(list(flags)))
    assert parse("--agent", "dqn", "--task", "CartPole-v1").overrides["huber_loss_parameter"] == 5.0
    assert "huber_loss_parameter" not in parse("--agent", "dqn", "--task", "Acrobot-v1").overrides
    assert parse("--agent", "dqn", "--task", "CartPole-v1", "--set",
                 "huber_loss_parameter=2").overrides["huber_loss_parameter"] == 2.0
    assert parse("--agent", "ppo", "--task", "cartpole:balance").overrides["update_epochs"] == 10
    assert "update_epochs" not in parse("--agent", "a2c", "--task", "cartpole:balance").overrides
    assert "update_epochs" not in parse("--agent", "ppo", "--task", "CartPole-v1").overrides
    assert not (tmp_path / "runs").exists()


def test_overrides_are_parsed_by_field_type():
    got = parse_overrides("dqn", ["hidden_sizes=64,32", "prioritized_replay=true", "learning_rate=3e-4",
                                  "n_step=5"])
    assert got == {"hidden_sizes": (64, 32), "prioritized_replay": True, "learning_rate": 3e-4, "n_step": 5}
    with pytest.raises(UsageError, match="prioritized_replay"):
        parse_overrides("dqn", ["prioritized_replay=maybe"])
    bounds = ((-2.4, -3.0), (2.4, 3.0))
    for raw in ("-2.4,-3;2.4,3", "[[-2.4, -3], [2.4, 3]]", "((-2.4, -3), (2.4, 3))"):  # tuples of tuples
        assert parse_overrides("dqn", [f"observation_bounds={raw}"]) == {"observation_bounds": bounds}
    assert parse_overrides("dqn", ["observation_bounds=none"]) == {"observation_bounds": None}
    for bad in ("-2.4,-3,2.4,3", "[-2.4, 2.4]", "1;2;3", "[[1, 2], [0, 3]]"):
        with pytest.raises(UsageError, match="observation_bounds"):
            parse_overrides("dqn", [f"observation_bounds={bad}"])


@pytest.mark.parametrize("country", ["XX", "ZZZ"])
def test_unknown_carbon_country_is_one_line_exit_2(tmp_path, capsys, monkeypatch, country):
    monkeypatch.setenv("QUARL_CARBON_COUNTRY", country)
    logdir = tmp_path / "run"
    assert_one_line_exit_2(capsys, train.main, _argv(logdir, []), "QUARL_CARBON_COUNTRY")
    assert not logdir.exists()


def test_qat_bits_flag_trains_through_fake_quantization(tmp_path):
    logdir = tmp_path / "run"
    code = train.main(_argv(logdir, ["--qat-bits", "4", "--precision", "int4", "--steps", "400", "--backend",
                                     "onnx-nbits", "--eval-episodes", "1", "--no-progress", *TINY]))
    assert code in (0, None)
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["config"]["qat_bits"] == 4 and summary["precision"] == "int4"
    assert summary["backend"] == ["onnx-nbits"]  # the actors acted through MatMulNBits on packed int4 weights
    assert summary["learner_steps"] > 0


D4PG_TINY = ["--set", "policy_layer_sizes=16,16", "--set", "critic_layer_sizes=16,16", "--set", "num_atoms=11",
             "--set", "batch_size=16", "--set", "min_replay_size=64", "--set", "samples_per_insert=4"]


@pytest.mark.parametrize("agent,task,tiny", [("dqn", "CartPole-v1", TINY),  # D4PG's every precision: slow
                                             pytest.param("d4pg", "cartpole:balance", D4PG_TINY, marks=pytest.mark.slow)])
def test_both_agents_train_through_the_cli_at_every_precision(tmp_path, agent, task, tiny):
    """A few hundred steps each: the learner updates and the actors pull and run payloads at each precision."""
    fp32_bytes = None
    for precision in ("fp32", "bf16", "fp16", "int8", "int4", "int2"):
        logdir = tmp_path / precision
        code = train.main(["--agent", agent, "--task", task, "--precision", precision, "--steps", "400",
                           "--eval-every", "400", "--eval-episodes", "1", "--actor-update-period", "50",
                           "--logdir", str(logdir), "--no-progress", *tiny])
        assert code in (0, None), precision
        summary = json.loads((logdir / "summary.json").read_text())
        assert summary["precision"] == precision and summary["learner_steps"] > 0, summary
        assert summary["weight_updates"] == 400 // 50 and np.isfinite(summary["final_eval_return"])
        fp32_bytes = fp32_bytes or summary["payload_bytes"]
        if precision.startswith("int"):
            # Integer weights, fp32 biases/LayerNorm and headers: smaller, by how much depends on the net's size
            # (the >= 3.9x of large policies is tested in tests/quarl/test_payload.py).
            assert summary["payload_bytes"] < fp32_bytes, (precision, summary["payload_bytes"], fp32_bytes)
