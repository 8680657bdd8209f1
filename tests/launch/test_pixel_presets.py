"""Task ids and pixel presets as a user types them: gymnasium's `ALE/<Game>-v5`, a bad id's closest matches,
--list-tasks, and the agents' MinAtar and ALE presets and evaluation defaults that both CLIs start from."""
from __future__ import annotations

import pytest

from agents.dqn.config import ATARI_OVERRIDES, MINATAR_OVERRIDES
from agents.ppo.config import PIXEL_A2C_OVERRIDES, PIXEL_PPO_OVERRIDES
from launch import actorq, train
from launch.experiments.config import ALE_EVAL_EPISODES, ALE_MIN_EVAL_EVERY, ExperimentConfig, default_evaluation
from quarl.envs.factory import canonical_task, closest_tasks, list_tasks, make_environment, task_family
from tests.launch.tiny import assert_one_line_exit_2


def test_gymnasium_ale_ids_name_the_same_v5_game():
    assert canonical_task("ALE/Pong-v5") == "ALE/Pong"
    assert canonical_task("ALE/Pong") == "ALE/Pong"
    assert canonical_task("ALE/Pong-v4") == "ALE/Pong-v4"  # v4 has no sticky actions: another environment
    assert canonical_task("ALE/NoGame-v5") == "ALE/NoGame-v5"
    assert task_family("ALE/Pong-v5") == "ale" and task_family("MinAtar/Breakout") == "minatar"
    assert task_family("CartPole-v1") == "gym" and task_family("walker:stand") == "control"
    env = make_environment("ALE/Pong-v5", 0)
    try:
        assert env.observation_spec().shape == (84, 84, 4)
    finally:
        env.close()


@pytest.mark.parametrize("typed,closest", [
    ("ALE/Pong-v4", "ALE/Pong"), ("Pong", "ALE/Pong"), ("cartpole-v1", "CartPole-v1"),
    ("MinAtar/breakout", "MinAtar/Breakout"), ("walker", "walker:stand"),
])
def test_closest_tasks_names_what_the_user_meant(typed, closest):
    assert closest in closest_tasks(typed)
    assert all(name in list_tasks() for name in closest_tasks(typed))


@pytest.mark.parametrize("main", [train.main, actorq.main])
def test_a_bad_task_id_gets_one_line_with_the_closest_ids(tmp_path, capsys, main):
    argv = ["--agent", "dqn", "--task", "ALE/Pong-v4", "--logdir", str(tmp_path / "run")]
    assert_one_line_exit_2(capsys, main, argv, "closest valid ids: ALE/Pong")
    assert_one_line_exit_2(capsys, main, ["--task", "NoSuchTask-v0", "--logdir", str(tmp_path / "run")],
                           "--list-tasks")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("main", [train.main, actorq.main])
def test_list_tasks_prints_every_task_and_exits_0(capsys, main):
    with pytest.raises(SystemExit) as exit_info:
        main(["--list-tasks"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.split() == list(list_tasks())


@pytest.mark.parametrize("agent,task,preset", [
    ("dqn", "ALE/Pong-v5", ATARI_OVERRIDES), ("dqn", "MinAtar/Breakout", MINATAR_OVERRIDES),
    ("ppo", "MinAtar/SpaceInvaders", PIXEL_PPO_OVERRIDES), ("ppo", "ALE/Breakout", PIXEL_PPO_OVERRIDES),
    ("a2c", "MinAtar/Freeway", PIXEL_A2C_OVERRIDES), ("a2c", "ALE/Pong", PIXEL_A2C_OVERRIDES),
])
def test_both_clis_start_pixel_tasks_from_the_agents_preset(tmp_path, agent, task, preset):
    flags = ["--agent", agent, "--task", task, "--logdir", str(tmp_path / "run")]
    single = train.validate(train.build_parser().parse_args(flags))
    # launch.actorq runs the off-policy agents; its flags build the same config for every agent.
    args = actorq.build_parser().parse_args(flags)
    distributed = actorq.validate(args).config if agent == "dqn" else actorq._config_from_flags(args)
    for config in (single, distributed):
        assert config.task == canonical_task(task)
        assert dict(config.overrides) == preset
        config.builder()  # the preset is a valid agent config
    # A --set value wins over the preset's.
    key = "learning_rate"
    config = train.validate(train.build_parser().parse_args([*flags, "--set", f"{key}=0.0003"]))
    assert config.overrides[key] == 0.0003 and len(config.overrides) == len(preset) + (key not in preset)


def test_ale_evaluations_are_fewer_and_shorter_unless_the_user_sets_them(tmp_path):
    assert default_evaluation("CartPole-v1", 20_000) == (2_000, 10)
    assert default_evaluation("MinAtar/Breakout", 500_000) == (50_000, 10)
    assert default_evaluation("ALE/Pong-v5", 5_000) == (ALE_MIN_EVAL_EVERY, ALE_EVAL_EPISODES)
    assert default_evaluation("ALE/Pong", 1_000_000) == (100_000, ALE_EVAL_EPISODES)
    flags = ["--agent", "dqn", "--task", "ALE/Pong-v5", "--steps", "5000", "--logdir", str(tmp_path / "run")]
    config = train.validate(train.build_parser().parse_args(flags))
    assert (config.eval_every, config.eval_episodes) == (ALE_MIN_EVAL_EVERY, ALE_EVAL_EPISODES)
    config = train.validate(train.build_parser().parse_args([*flags, "--eval-every", "500", "--eval-episodes", "7"]))
    assert (config.eval_every, config.eval_episodes) == (500, 7)
    # A saved config is complete: the resolved defaults round-trip.
    again = ExperimentConfig.from_dict(config.to_dict())
    assert (again.eval_every, again.eval_episodes) == (500, 7)
