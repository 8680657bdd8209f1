"""Tiny distributed-run settings shared by the launch tests (a few hundred steps, networks of a few units), the
check every CLI test of a refused flag makes, and the hook fault tests put in a learner's training blocks."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

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
