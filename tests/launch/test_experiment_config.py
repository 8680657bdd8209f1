"""ExperimentConfig: one description of an experiment, validated once, JSON round trip exact, and the same
`experiment` record in summary.json from either runner."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch import actorq, train
from launch.config_file import load_config
from agents import make_config
from launch.experiments.config import (
    DISTRIBUTED_FIELDS, ConfigError, DistributedConfig, ExperimentConfig, agent_config_dict,
)
from quarl.quant.precision import Precision, parse_precision
from tests.launch.tiny import TINY_DQN, assert_one_line_exit_2, tiny_config

REPO = Path(__file__).resolve().parents[2]


def _roundtrip(config: ExperimentConfig) -> ExperimentConfig:
    return ExperimentConfig.from_dict(json.loads(json.dumps(config.to_dict())))


def test_json_round_trip_is_exact_tuples_included(tmp_path: Path) -> None:
    config = ExperimentConfig.create(agent="d4pg", task="cartpole:balance", max_actor_steps=1_000, logdir=tmp_path,
                                     overrides={"policy_layer_sizes": (32, 16), "critic_layer_sizes": [8]},
                                     target_return=950, learner_resources={"gpu_box": 0.01}, resume=None)
    assert config.overrides["critic_layer_sizes"] == (8,)  # lists normalised to the agent config's tuples
    assert config.distributed == DistributedConfig(learner_resources={"gpu_box": 0.01})
    assert config.to_dict()["distributed"]["learner_resources"] == {"gpu_box": 0.01}
    back = _roundtrip(config)
    assert back == config and isinstance(back.distributed, DistributedConfig)
    assert back.overrides["policy_layer_sizes"] == (32, 16) and isinstance(back.target_return, float)
    assert back.logdir == str(tmp_path)
    assert back.builder().config.policy_layer_sizes == (32, 16)


def test_eval_every_is_resolved_so_the_saved_config_is_complete(tmp_path: Path) -> None:
    config = ExperimentConfig(agent="dqn", task="CartPole-v1", max_actor_steps=995, logdir=tmp_path)
    assert config.eval_every == 99 and config.to_dict()["eval_every"] == 99
    assert ExperimentConfig(agent="dqn", task="CartPole-v1", max_actor_steps=5, logdir=tmp_path).eval_every == 1


@pytest.mark.parametrize("change,field", [
    ({"agent": "sac"}, "agent"), ({"max_actor_steps": 0}, "max_actor_steps"), ({"seed": -1}, "seed"),
    ({"eval_every": -3}, "eval_every"), ({"num_actors": True}, "num_actors"), ({"precision": "int99"}, "precision"),
    ({"backend": "tpu"}, "backend"), ({"target_return": float("nan")}, "target_return"),
    ({"checkpoint_every": -1}, "checkpoint_every"), ({"overrides": {"no_such_key": 1}}, "overrides"),
    ({"overrides": {"batch_size": 0}}, "overrides"), ({"actor_resources": {"x": 0}}, "actor_resources"),
    ({"task": ""}, "task"), ({"learner_steps_per_call": 0}, "learner_steps_per_call"),
    ({"publish_min_interval_s": -0.5}, "publish_min_interval_s"),
    ({"publish_min_interval_s": float("inf")}, "publish_min_interval_s"),
])
def test_every_bad_value_is_one_line_naming_its_field(tmp_path: Path, change: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        tiny_config(tmp_path, **change)
    assert info.value.field == field and str(info.value).startswith(field)
    assert len(str(info.value).splitlines()) == 1
    assert info.value.message({field: "--flag"}).startswith("--flag ")


def test_distributed_fields_are_nested_once_and_old_flat_summaries_still_read(tmp_path: Path) -> None:
    """The distributed-only fields live in one frozen sub-config; a summary.json written when they were flat
    (results/legacy/flat_experiment, a real run of that code) reads into the same nested config."""
    old = json.loads((REPO / "results" / "legacy" / "flat_experiment" / "summary.json").read_text())["experiment"]
    # The flat layout, as written; the on-policy fields and the learner loop came later and take their defaults.
    legacy = [k for k in DISTRIBUTED_FIELDS if k in old]
    assert set(DISTRIBUTED_FIELDS) - set(legacy) == {"rollout_mode", "max_staleness"} and "distributed" not in old
    config = ExperimentConfig.from_dict(old)
    assert config.distributed == DistributedConfig(**{k: old[k] for k in legacy})
    # Later fields take their defaults: the task preset (none recorded), the learner loop and the agent config
    # the overrides resolve to.
    assert config.to_dict() == {**{k: v for k, v in old.items() if k not in DISTRIBUTED_FIELDS},
                                "distributed": {**{k: old[k] for k in legacy}, "rollout_mode": "sync",
                                                "max_staleness": None}, "learner_loop": "auto", "task_preset": {},
                                "agent_config": agent_config_dict(make_config("dqn", **old["overrides"]))}
    assert _roundtrip(config) == config
    assert config.replace(num_actors=3).distributed.num_actors == 3 and config.distributed.num_actors == 1
    with pytest.raises(ConfigError, match="distributed is given twice"):
        ExperimentConfig.from_dict({**config.to_dict(), "num_actors": 2})
    with pytest.raises(ConfigError, match="distributed has unknown field.*actors"):
        ExperimentConfig.from_dict({**config.to_dict(), "distributed": {"actors": 2}})
    with pytest.raises(TypeError):  # the constructor itself takes only the nested form
        ExperimentConfig(agent="dqn", task="CartPole-v1", max_actor_steps=10, logdir=tmp_path, num_actors=2)


def test_from_dict_refuses_unknown_and_missing_fields(tmp_path: Path) -> None:
    good = tiny_config(tmp_path).to_dict()
    with pytest.raises(ConfigError, match="unknown field.*steps"):
        ExperimentConfig.from_dict({**good, "steps": 5})
    with pytest.raises(ConfigError, match="lacks required field.*task"):
        ExperimentConfig.from_dict({k: v for k, v in good.items() if k != "task"})


@pytest.mark.parametrize("argv,needle", [
    (["--max-actor-steps", "0"], "--max-actor-steps must be a positive integer"),
    (["--num-actors", "-2"], "--num-actors must be a positive integer"),
    (["--target-return", "inf"], "--target-return must be a finite number"),
    (["--checkpoint-every", "-1"], "--checkpoint-every must be a non-negative integer"),
    (["--backend", "tpu"], "unknown backend"),
    (["--learner-steps-per-call", "0"], "--learner-steps-per-call must be a positive integer"),
    (["--publish-min-interval-s", "-1"], "--publish-min-interval-s must be a finite number >= 0"),
])
def test_actorq_flags_are_checked_by_the_config_one_line_exit_2(tmp_path, capsys, argv, needle) -> None:
    logdir = tmp_path / "run"
    assert_one_line_exit_2(capsys, actorq.main, ["--agent", "dqn", "--logdir", str(logdir), *argv], needle)
    assert not logdir.exists()


def test_train_steps_flag_is_named_in_the_config_error(tmp_path, capsys) -> None:
    assert_one_line_exit_2(capsys, train.main, ["--agent", "dqn", "--task", "CartPole-v1", "--steps", "0",
                                                "--logdir", str(tmp_path / "r")], "--steps must be")


def test_actorq_config_file_is_run_as_written_and_bad_files_exit_2(tmp_path, capsys) -> None:
    config = tiny_config(tmp_path / "run")
    good = tmp_path / "experiment.json"
    good.write_text(json.dumps(config.to_dict()))
    inv = actorq.validate(actorq.build_parser().parse_args(["--config", str(good), "--runner", "local"]))
    assert inv.config == config and inv.runner == "local"
    bad_value = tmp_path / "bad_value.json"
    bad_value.write_text(json.dumps({**config.to_dict(), "distributed": {**config.distributed.to_dict(), "num_actors": 0}}))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**config.to_dict(), "steps": 3}))
    not_json = tmp_path / "not.json"
    not_json.write_text("{agent: dqn")
    cases = [(["--config", str(bad_value)], "num_actors must be a positive integer"),
             (["--config", str(unknown)], "unknown field(s) steps"),
             (["--config", str(not_json)], "--config"),
             (["--config", str(tmp_path / "missing.json")], "--config"),
             (["--config", str(good), "--num-actors", "4"], "drop --num-actors")]
    for argv, needle in cases:
        assert_one_line_exit_2(capsys, actorq.main, argv, needle)
    assert not (tmp_path / "run").exists()


def test_quick_preset_is_what_the_default_actorq_job_runs(tmp_path: Path) -> None:
    preset = actorq.quick_preset("d4pg", "cartpole:balance")
    inv = actorq.validate(actorq.build_parser().parse_args(["--logdir", str(tmp_path / "r")]))
    assert inv.config.target_return == preset["target_return"] and inv.config.eval_every == preset["eval_every"]
    assert inv.config.target_streak == preset["target_streak"] == 2
    assert dict(inv.config.overrides) == preset["overrides"]
    full = actorq.validate(actorq.build_parser().parse_args(["--logdir", str(tmp_path / "f"), "--full-size"]))
    assert full.config.overrides == {} and full.config.target_return is None
    assert actorq.quick_preset("dqn", "CartPole-v1") == {"overrides": {}}


def test_both_runners_record_the_same_experiment_in_summary_json(tmp_path: Path) -> None:
    """The same tiny config run in one process and by `launch.actorq --runner local` (from a --config file):
    both summary.json files hold it whole, under "experiment", equal but for the log directory."""
    from launch.experiments.run_experiment import run_experiment

    single_cfg = tiny_config(tmp_path / "single", num_actors=1, max_actor_steps=300, eval_every=300,
                             overrides={**TINY_DQN, "actor_update_period": 50})
    run_experiment(single_cfg, progress=False, energy=False)
    dist_cfg = single_cfg.replace(logdir=str(tmp_path / "dist"))
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(dist_cfg.to_dict()))
    assert actorq.main(["--config", str(path), "--runner", "local", "--no-progress"]) == 0
    single = json.loads((tmp_path / "single" / "summary.json").read_text())["experiment"]
    dist = json.loads((tmp_path / "dist" / "summary.json").read_text())["experiment"]
    assert single == single_cfg.to_dict() and ExperimentConfig.from_dict(single) == single_cfg
    assert {**dist, "logdir": None} == {**single, "logdir": None}
    assert Path(dist["logdir"]).resolve() == (tmp_path / "dist").resolve()
    # Each summary.json, read back through --config, is the config that ran (the agent config whole in it).
    assert single["agent_config"]["actor_update_period"] == 50
    assert load_config(str(tmp_path / "single" / "summary.json")) == single_cfg
    assert load_config(str(tmp_path / "dist" / "summary.json")) == dist_cfg.replace(logdir=dist["logdir"])


@pytest.mark.parametrize("name, canonical", [("int2", "int2"), ("int8", "int8"), ("8", "int8"), ("4", "int4"),
                                             ("int16", "int16"), ("fp16", "fp16"), ("16", "fp16"),
                                             ("bf16", "bf16"), ("32", "fp32"), ("FP32", "fp32")])
def test_actor_precisions_are_int2_to_int8_int16_and_the_floats(tmp_path: Path, name: str, canonical: str) -> None:
    """Parsed once, at construction: the config carries a `Precision`, its JSON the canonical name."""
    config = tiny_config(tmp_path / "run").replace(precision=name)
    assert isinstance(config.precision, Precision) and config.precision == parse_precision(canonical)
    assert str(config.precision) == canonical and config.to_dict()["precision"] == canonical
    assert _roundtrip(config) == config and config.replace(precision=config.precision) == config


@pytest.mark.parametrize("name", ["int9", "int12", "int15", "9", "15", "int1", "int17", "fp8", "int"])
def test_other_precisions_are_refused_by_the_config_and_every_cli(tmp_path, capsys, name: str) -> None:
    """int9..int15 parse in quarl.quant.quantization (PTQ sweeps use them) but no actor runs them: a typo for int8."""
    with pytest.raises(ConfigError, match="precision"):
        tiny_config(tmp_path / "run").replace(precision=name)
    from launch import reproduce
    for main, argv in ((actorq.main, ["--agent", "dqn", "--logdir", str(tmp_path / "run")]),
                       (train.main, ["--agent", "dqn", "--task", "CartPole-v1", "--steps", "10",
                                     "--logdir", str(tmp_path / "run")]),
                       (reproduce.main, ["--out", str(tmp_path / "out"), "--precisions", f"32,{name}"])):
        flag = "--precisions" if main is reproduce.main else "--precision"
        with pytest.raises(SystemExit) as info:
            main([*argv, flag, name] if flag == "--precision" else argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and len(err.strip().splitlines()) == 1 and "precision" in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()
