"""quarl.ops.checks: one error type for every config check (agent configs, ExperimentConfig, the CLIs' flags), one
line naming the field."""
from __future__ import annotations

import math

import numpy as np
import pytest

from quarl.ops.checks import ConfigError, check_bool, check_int, check_number, check_sizes


@pytest.mark.parametrize("call, text", [
    (lambda: check_int("n", 0), "n must be a positive integer, got 0"),
    (lambda: check_int("n", True), "n must be a positive integer, got True"),
    (lambda: check_int("n", -1, minimum=0), "n must be a non-negative integer, got -1"),
    (lambda: check_int("n", 2.0, minimum=0), "n must be a non-negative integer, got 2.0"),
    (lambda: check_number("x", math.nan), "x must be a finite number, got nan"),
    (lambda: check_number("x", 0.0, low=0.0, low_open=True), "x must be a finite number > 0, got 0.0"),
    (lambda: check_number("x", 1.5, low=0.0, high=1.0), "x must be a number in [0, 1], got 1.5"),
    (lambda: check_number("x", "1", low=0.0), "x must be a finite number >= 0, got '1'"),
    (lambda: check_bool("b", 1), "b must be true or false, got 1"),
    (lambda: check_sizes("s", (4, 0)), "s must be a non-empty tuple of positive ints, got (4, 0)"),
])
def test_each_check_refuses_in_one_line_naming_its_field(call, text):
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value) == text and info.value.field == text.split()[0]
    assert info.value.message({info.value.field: "--flag"}) == "--flag " + text.split(" ", 1)[1]


def test_good_values_come_back_normalised():
    assert check_int("n", np.int64(3)) == 3 and type(check_int("n", np.int64(3))) is int
    assert check_number("x", 1, low=0.0, high=1.0) == 1.0 and check_sizes("s", [8, 4]) == (8, 4)


def test_agent_configs_the_experiment_and_the_flags_raise_the_one_error_type(tmp_path):
    import agents
    from launch.cli import UsageError, check_seed
    from launch.experiments.config import ExperimentConfig

    for agent, bad in (("dqn", {"discount": 2.0}), ("d4pg", {"num_atoms": 1})):
        with pytest.raises(ConfigError):
            agents.config_class(agent)(**bad)
    with pytest.raises(ConfigError, match="^num_actors must be a positive integer"):
        ExperimentConfig.create(agent="dqn", task="CartPole-v1", max_actor_steps=10, logdir=tmp_path, num_actors=0)
    with pytest.raises(UsageError, match="^--seed must be a non-negative integer, got -1$"):
        check_seed(-1)
