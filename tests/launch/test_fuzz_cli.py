"""Fuzzing the distributed CLI's flag parser and the agent config parser (`--set key=value`), issue #6.

Whatever the arguments, the outcome must be either a valid parse or a usage error (exit 2, one line on
stderr): never a traceback, and nothing written. Slow: a few thousand generated command lines.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agents
from launch.actorq import build_parser, validate
from launch.cli import UsageError
from launch.overrides import parse_overrides

pytestmark = pytest.mark.slow

_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_NUMBERS = st.one_of(st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=True).map(repr),
                     st.sampled_from(["0", "-1", "1", "nan", "inf", "-inf", "1e400", "0x10", "", " ", "1_000"]))
_VALUES = {
    "--agent": st.one_of(st.sampled_from(["dqn", "d4pg", "DQN", "", "ppo", "a2c", "sac"]), _TEXT),
    "--task": st.one_of(st.sampled_from(["CartPole-v1", "Acrobot-v1", "cartpole:balance", "cartpole:",
                                         ":", "NoSuch-v0"]), _TEXT),
    "--precision": st.one_of(st.sampled_from(["int8", "fp32", "8", "16", "32", "int1", "int17", "fp64",
                                              "bf16", "int", "int-8", "int08"]), _TEXT),
    "--backend": st.one_of(st.sampled_from(["auto", "onnx", "jax", "tpu"]), _TEXT),
    "--runner": st.sampled_from(["ray", "local", "slurm", ""]),
    "--ray-address": st.one_of(st.sampled_from(["", " ", "127.0.0.1:6379", "auto"]), _TEXT),
    "--set": st.one_of(
        st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["batch_size", "hidden_sizes", "learning_rate",
                                                            "n_step", "discount", "prioritized_replay",
                                                            "samples_per_insert", "min_replay_size",
                                                            "policy_layer_sizes", "vmin", "nope"]),
                  st.one_of(_NUMBERS, _TEXT, st.sampled_from(["1,2", "(8,8)", "[4]", ",", "true", "none"]))),
        _TEXT),
    "--resume": st.one_of(st.sampled_from(["nonexistent", ".", "/", "/proc", "~", "~nouser/x", "a\x00b"]),
                          _TEXT),
    "--logdir": st.one_of(st.sampled_from(["run", "/proc/x/run", "a\x00b", "~nouser/x", "", ".", "/"]), _TEXT),
}
for _flag in ("--num-actors", "--actor-update-period", "--max-actor-steps", "--seed", "--checkpoint-every",
              "--eval-every", "--eval-episodes", "--target-return", "--publish-period", "--insert-batch"):
    _VALUES[_flag] = _NUMBERS
_SWITCHES = ["--full-size", "--no-progress", "--help-me", "-x", "--", "--agent"]


@st.composite
def _argv(draw) -> list[str]:
    argv: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 9)) == 0:
            argv.append(draw(st.one_of(st.sampled_from(_SWITCHES), _TEXT)))
        else:
            flag = draw(st.sampled_from(sorted(_VALUES)))
            argv += [flag, draw(_VALUES[flag])]
    return argv


def _parse(argv: list[str]) -> tuple[str, str]:
    """("ok" | "usage", stderr). Anything but a parse or a usage error propagates and fails the test."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            validate(build_parser().parse_args(argv))
        except SystemExit as e:
            assert e.code == 2, (argv, e.code, err.getvalue())
            return "usage", err.getvalue()
        except UsageError as e:
            message = " ".join(str(e).split())  # what launch.cli.fail prints
            assert message and "Traceback" not in message, argv
            return "usage", message + "\n"
    return "ok", err.getvalue()


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(argv=_argv())
def test_cli_flags_parse_or_fail_with_one_usage_line(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative --logdir/--resume values land here, and must not be created
    before = sorted(p.name for p in tmp_path.iterdir())
    outcome, stderr = _parse(argv + ["--no-progress"])
    if outcome == "usage":
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0], (argv, stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, f"{argv} wrote to the working directory"


def _field_names(agent: str) -> list[str]:
    return [f.name for f in dataclasses.fields(agents.config_class(agent)) if f.init]


@settings(max_examples=2000, deadline=None)
@given(agent=st.sampled_from(["dqn", "d4pg", "ppo", "a2c"]), data=st.data())
def test_config_overrides_parse_or_raise_usage_error(agent, data):
    keys = st.one_of(st.sampled_from(_field_names(agent)), _TEXT)
    values = st.one_of(_NUMBERS, _TEXT, st.lists(st.integers(-3, 300).map(str), max_size=4).map(",".join),
                       st.sampled_from(["true", "false", "yes", "none", "null", "()", "[,]", "1,,2"]))
    items = data.draw(st.lists(st.one_of(st.builds(lambda k, v: f"{k}={v}", keys, values), _TEXT), max_size=4))
    try:
        overrides = parse_overrides(agent, items)
    except UsageError as e:
        assert str(e).strip(), items
        return
    config = agents.make_config(agent, **overrides)  # a valid parse builds a valid config
    for key, value in overrides.items():
        assert getattr(config, key) == value or (isinstance(value, float) and math.isnan(value))
