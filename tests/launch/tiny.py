"""Tiny distributed-run settings shared by the launch tests (a few hundred steps, networks of a few units), the
check every CLI test of a refused flag makes, the check of a CartPole run's evaluator.csv, the hook fault tests
put in a learner's training blocks, and `wait_until` for tests that wait on another thread's progress."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest

from launch.experiments.config import ExperimentConfig
from launch.program.graph import Launch

TINY_DQN = {"hidden_sizes": (16, 16), "min_replay_size": 100, "batch_size": 32, "samples_per_insert": 8.0}
TINY_D4PG = {"policy_layer_sizes": (32, 32), "critic_layer_sizes": (32, 32), "num_atoms": 11, "batch_size": 32,
             "min_replay_size": 200, "samples_per_insert": 4.0, "n_step": 3}


def assert_one_line_exit_2(capsys: Any, main: Callable[[Sequence[str]], Any], argv: Sequence[str],
                           needle: str) -> None:
    """`main(argv)` is refused: exit code 2 and one line on stderr, naming `needle` (a CLI's usage errors are
    one line a user can act on, not a traceback)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and needle in err, (list(argv), err)


# Every CartPole-v1 episode lasts 8 to 500 steps at 1 a step: no sequence of 7 actions ends one from any start state
# (checked exhaustively on 300 seeds; pushing one way ends it in 8-11), and 500 is the time limit.
CARTPOLE_RETURNS = (8, 500)


def assert_cartpole_evaluations(rows: Sequence[Mapping[str, str]], episodes: int) -> None:
    """Every evaluator.csv row of a CartPole-v1 run sums up `episodes` whole episodes: the min, max and first returns
    are integers in `CARTPOLE_RETURNS`, the mean is a multiple of 1/episodes between min and max, and the std fits
    their range. A run whose evaluations are cut short, non-finite or mis-recorded fails, whatever it learned."""
    low_bound, high_bound = CARTPOLE_RETURNS
    assert rows, "no evaluation"
    for row in rows:
        n, mean, std = int(row["episodes"]), float(row["return"]), float(row["return_std"])
        low, high, first = (float(row[k]) for k in ("return_min", "return_max", "return_first"))
        assert n == episodes, row
        assert all(v == int(v) and low_bound <= v <= high_bound for v in (low, high, first)), row
        assert low <= first <= high and low <= mean <= high, row
        assert abs(mean * n - round(mean * n)) < 1e-6, row  # the mean of n integer returns
        assert std <= (high - low) / 2 + 1e-9 and (std == 0) == (low == high), row


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Polls `condition` until it holds or `timeout` seconds pass; whether it holds. Tests wait for a thread's
    progress this way rather than sleeping a fixed time a loaded machine may not honour."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


class BlockHook:
    """A learner that runs `before(learner, block)` ahead of each training block (to fail or slow it) and is
    otherwise the learner it wraps: a LearnerNode subclass sets `self._learner = BlockHook(self._learner, f)`."""

    def __init__(self, inner: Any, before: Callable[[Any, Any], None]):
        self._inner, self._before = inner, before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def run_block(self, block: Any) -> Any:
        self._before(self._inner, block)
        return self._inner.run_block(block)


def tiny_config(logdir: Path, **kw) -> ExperimentConfig:
    """int8 DQN on CartPole, 2 ONNX actors, 600 actor steps, an evaluation every 300; `kw` overrides fields."""
    base = dict(agent="dqn", task="CartPole-v1", precision="int8", num_actors=2, max_actor_steps=600, seed=0,
                logdir=str(logdir), overrides=dict(TINY_DQN), backend="onnx", eval_every=300, eval_episodes=1,
                publish_period=5, insert_batch=32)
    base.update(kw)
    return ExperimentConfig.create(**base)


def kill_actor_at(actor: str, min_steps: int, killed: dict[str, int], min_version: int = 0
                  ) -> Callable[[Launch], None]:
    """An `on_launch` hook for `run_program`: a thread that SIGKILLs `actor`'s process once the counter has seen
    `min_steps` of its steps and the weight server has version `min_version` or later (on a loaded machine the
    learner's first publication can come after any fixed step count), recording the latest weights version then
    and the pid in `killed` (nothing if the actor never got there within 120 s)."""
    def on_launch(launch: Launch) -> None:
        def killer() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                version = launch.handles["weights"].call("latest_version")
                if (launch.handles["counter"].call("get").get(f"{actor}_steps", 0) >= min_steps
                        and version >= min_version):
                    pid = launch.pid(actor)
                    killed["version"] = version
                    os.kill(pid, signal.SIGKILL)
                    killed["pid"] = pid
                    return
                time.sleep(0.1)

        threading.Thread(target=killer, daemon=True).start()
    return on_launch
