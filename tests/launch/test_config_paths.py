"""One config per run: `--set` addresses any field of `ExperimentConfig` by its dotted path (agent, experiment,
distributed), --help lists them, and the whole config (the resolved agent config and the task preset included)
goes into summary.json's `experiment` and is read back exactly by `--config`."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import agents
from launch import actorq, train
from launch.cli import UsageError
from launch.config_file import load_config
from launch.experiments.config import DISTRIBUTED_FIELDS, ExperimentConfig
from launch.overrides import parse_settings, section_fields
from tests.launch.tiny import assert_one_line_exit_2, tiny_config

REPO = Path(__file__).resolve().parents[2]


def _train(tmp_path: Path, *flags: str) -> ExperimentConfig:
    return train.validate(train.build_parser().parse_args(["--logdir", str(tmp_path / "run"), *flags]))


def _actorq(tmp_path: Path, *flags: str) -> ExperimentConfig:
    return actorq.validate(actorq.build_parser().parse_args(["--logdir", str(tmp_path / "run"), *flags])).config


def test_set_addresses_each_section_by_its_dotted_path(tmp_path: Path) -> None:
    """agent.FIELD or a bare agent field, experiment.FIELD or a bare experiment field, distributed.FIELD (or a bare
    one): each value parsed by its field's type, over the task preset and the flags' defaults."""
    config = _actorq(tmp_path, "--agent", "dqn", "--set", "agent.batch_size=64", "--set", "n_step=5",
                     "--set", "eval_every=5000", "--set", "experiment.target_return=400.5",
                     "--set", "precision=int4", "--set", "distributed.num_actors=3", "--set", "prefetch=4",
                     "--set", "distributed.actor_resources=slot:1,big:0.5", "--set", "hidden_sizes=32,16")
    assert (config.agent_config.batch_size, config.agent_config.n_step, config.agent_config.hidden_sizes) == \
        (64, 5, (32, 16))
    assert (config.eval_every, config.target_return, config.precision.name) == (5000, 400.5, "int4")
    assert (config.distributed.num_actors, config.distributed.prefetch) == (3, 4)
    assert config.distributed.actor_resources == {"slot": 1.0, "big": 0.5}
    # The task preset is recorded apart and still applies under the --set values.
    preset = agents.task_defaults("dqn", "CartPole-v1")
    assert preset and config.task_preset == preset
    assert all(getattr(config.agent_config, k) == v for k, v in preset.items())
    single = _train(tmp_path, "--agent", "dqn", "--set", "agent.batch_size=48", "--set", "seed=3",
                    "--set", "experiment.eval_episodes=2", "--set", "target_return=none")
    assert (single.agent_config.batch_size, single.seed, single.eval_episodes, single.target_return) == \
        (48, 3, 2, None)


@pytest.mark.parametrize("main,flags,needle", [
    (train.main, ["--set", "batch_sise=64"], "did you mean batch_size"),
    (actorq.main, ["--set", "distributed.num_actor=2"], "did you mean distributed.num_actors"),
    (actorq.main, ["--set", "agent.eval_every=5"], "did you mean eval_every"),
    (train.main, ["--set", "distributed.num_actors=2"], "takes no distributed settings"),
    (actorq.main, ["--set", "eval_fp32=true"], "no such field"),  # the distributed runner does not read it
    (train.main, ["--set", "agent=ppo"], "chosen with --agent"),
    (train.main, ["--set", "agent.batch_size=abc"], "--set agent.batch_size: expected an integer, got 'abc'"),
    (actorq.main, ["--set", "distributed.num_actors=0"], "--set distributed.num_actors must be a positive integer"),
    (train.main, ["--set", "eval_every=1.5"], "--set eval_every: expected an integer"),
    (train.main, ["--set", "experiment.precision=int9"], "precision"),
    (actorq.main, ["--set", "distributed.learner_resources=gpu"], "name:value pairs"),
    (actorq.main, ["--agent", "dqn", "--set", "distributed.rollout_mode=async"], "only for on-policy agents"),
    (actorq.main, ["--eval-every", "100", "--set", "eval_every=200"], "--eval-every and --set eval_every both"),
    (train.main, ["--actor-update-period", "5", "--set", "agent.actor_update_period=3"], "both set"),
])
def test_a_bad_set_path_or_value_is_one_line_exit_2(tmp_path: Path, capsys, main, flags, needle) -> None:
    logdir = tmp_path / "run"
    assert_one_line_exit_2(capsys, main, ["--agent", "dqn", "--logdir", str(logdir), *flags]
                           if "--agent" not in flags else ["--logdir", str(logdir), *flags], needle)
    assert not logdir.exists()


@pytest.mark.parametrize("module,sections", [(train, ("agent", "experiment")),
                                             (actorq, ("agent", "experiment", "distributed"))])
def test_help_lists_every_field_set_addresses(module, sections, capsys) -> None:
    """One line per section at the end of --help (agents with the same fields share one), every field in it."""
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    rows: dict[str, set[str]] = {}
    title = ""
    for line in text[text.index("--set PATH=VALUE addresses"):].splitlines():
        if not line.startswith("  "):  # the header
            continue
        if not line.startswith("   "):
            title, _, line = line.strip().partition(": ")
        rows.setdefault(title, set()).update(n.strip() for n in line.split(",") if n.strip())
    expected = {f"agent ({', '.join(a for a in agents.AGENT_NAMES if set(section_fields('agent', a)) == set(names))})":
                set(names) for names in (section_fields("agent", a) for a in agents.AGENT_NAMES)}
    expected["experiment"] = set(section_fields("experiment", "")) - ({"eval_fp32"} if module is actorq else set())
    if "distributed" in sections:
        expected["distributed"] = set(DISTRIBUTED_FIELDS)
    assert rows == expected
    assert {"agent (ppo, a2c)", "agent (dqn)", "agent (d4pg)"} <= set(rows)


def test_parse_settings_types_and_sections() -> None:
    got = parse_settings("ppo", ["update_epochs=2", "agent.clip_coef=none", "learner_loop=unroll",
                                 "distributed.max_staleness=3", "distributed.pin_actors=yes"])
    assert got.agent == {"update_epochs": 2, "clip_coef": None}
    assert got.experiment == {"learner_loop": "unroll"}
    assert got.distributed == {"max_staleness": 3, "pin_actors": True}
    assert got.flags() == {"learner_loop": "--set learner_loop", "max_staleness": "--set distributed.max_staleness",
                           "pin_actors": "--set distributed.pin_actors"}
    with pytest.raises(UsageError, match="bad --set value"):
        parse_settings("ppo", ["agent.correction=bogus"])


def test_the_whole_config_is_written_and_read_back_exactly(tmp_path: Path) -> None:
    """A config from the flags (task preset, quick preset, --set in every section) writes its resolved agent config
    whole; a summary.json holding it reads back equal through --config. A recorded agent config value that today's
    defaults would resolve otherwise is pinned, so the rerun runs the recorded values."""
    config = _actorq(tmp_path, "--agent", "d4pg", "--task", "cartpole:balance", "--set", "batch_size=64",
                     "--set", "distributed.publish_period=3", "--set", "target_streak=2")
    data = config.to_dict()
    assert data["agent_config"] == {f.name: json.loads(json.dumps(getattr(config.agent_config, f.name)))
                                    for f in dataclasses.fields(config.agent_config)}
    assert data["agent_config"]["batch_size"] == 64 and data["distributed"]["publish_period"] == 3
    path = tmp_path / "old" / "summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"status": "completed", "runner": "distributed", "experiment": data}))
    assert load_config(str(path)) == config
    assert ExperimentConfig.from_dict(json.loads(json.dumps(data))) == config
    default_sigma = agents.make_config("d4pg").sigma
    recorded = {**data, "agent_config": {**data["agent_config"], "sigma": default_sigma * 2}}
    rerun = ExperimentConfig.from_dict(json.loads(json.dumps(recorded)))
    assert rerun.agent_config.sigma == default_sigma * 2 and rerun.overrides["sigma"] == default_sigma * 2
    assert rerun.to_dict()["agent_config"] == recorded["agent_config"]
    with pytest.raises(ValueError, match="agent_config.*no_such_field"):
        ExperimentConfig.from_dict({**data, "agent_config": {"no_such_field": 1}})


def test_every_committed_summary_loads_through_config_and_round_trips() -> None:
    """results/ holds summaries written before the agent config and the task preset were recorded (and a legacy
    one with flat distributed fields): each still loads through --config, and what it loads writes and reads back
    equal."""
    paths = sorted(REPO.glob("results/**/summary.json"))
    assert len(paths) >= 10 and any("legacy" in str(p) for p in paths)
    for path in paths:
        config = load_config(str(path))
        assert ExperimentConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config, path
        assert config.builder().config == config.agent_config


def test_tiny_config_builder_is_its_agent_config(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, overrides={"batch_size": 16}, task_preset={"batch_size": 8, "n_step": 2})
    assert config.overrides["n_step"] == 2 and config.agent_config.batch_size == 16  # overrides over the preset
    assert config.builder().config is config.agent_config
    assert config.replace(seed=4).agent_config == config.agent_config


RUN_STEP_MODULES = ("launch/experiments/run_experiment.py", "launch/experiments/run_parts.py",
                    "launch/experiments/run_end.py", "launch/experiments/summary.py",
                    "launch/distributed/supervisor.py", "launch/distributed/actorq_graph.py")


def test_the_runners_steps_reach_one_level_into_the_config() -> None:
    """run_experiment's and run_program's steps take the parts of the config they need: no function there reaches
    two levels into an ExperimentConfig parameter (`config.distributed.num_actors`); it is passed the part."""
    import ast

    climbs = []
    for path in RUN_STEP_MODULES:
        for fn in ast.walk(ast.parse((REPO / path).read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            names = {a.arg for a in fn.args.args + fn.args.kwonlyargs
                     if a.annotation is not None and "ExperimentConfig" in ast.unparse(a.annotation)}
            for node in ast.walk(fn):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                        and isinstance(node.value.value, ast.Name) and node.value.value.id in names):
                    climbs.append(f"{path}:{node.lineno} {fn.name}: {ast.unparse(node)}")
    assert climbs == []
