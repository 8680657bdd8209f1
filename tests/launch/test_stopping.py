"""Every runner stops the same way (`launch.experiments.stopping`): SIGINT or SIGTERM mid-run ends `launch.train`
(any agent) and `launch.actorq` with its logs flushed, the final policy and summary.json (status "interrupted")
written, and exit code 128 + the signal; no episode or update already made is missing from the files."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from launch.experiments.stopping import StopSignals, exit_code
from quarl.quant.policy_io import load_policy

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240  # a subprocess's imports and compiles on a loaded 2-core machine


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _signal_mid_run(cmd: list[str], ready: Callable[[], bool], signum: int) -> tuple[int, str, str]:
    """Starts `cmd`, waits until `ready()` (the run is under way), sends `signum`; (exit code, stdout, stderr)."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert ready(), "the run never got under way"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def _check_stopped_run(logdir: Path, code: int, err: str, signum: int) -> dict:
    """What every stopped run leaves: its exit code, an interrupted summary, and the final policy of the
    learner's last step."""
    assert code == 128 + signum, err[-2000:]
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary["status"]
    assert 0 < summary["actor_steps"] < 10_000_000
    assert load_policy(logdir).steps == summary["learner_steps"]
    return summary


@pytest.mark.parametrize("agent,signum", [("dqn", signal.SIGTERM), ("ppo", signal.SIGINT)])
def test_train_stops_on_a_signal_with_summary_and_final_policy(tmp_path, agent, signum):
    """Replay (DQN, SIGTERM) and on-policy (PPO, SIGINT): signalled once acting and learning are under way."""
    logdir = tmp_path / "run"
    tiny = (["--set", "hidden_sizes=16", "--set", "min_replay_size=100", "--set", "batch_size=16"] if agent == "dqn"
            else ["--set", "policy_hidden_sizes=16", "--set", "value_hidden_sizes=8", "--set", "num_envs=2",
                  "--set", "num_steps=16", "--set", "update_epochs=2"])
    cmd = [sys.executable, "-m", "launch.train", "--agent", agent, "--task", "CartPole-v1", "--precision", "fp32",
           "--backend", "onnx", "--steps", "10000000", "--eval-every", "5000000", "--logdir", str(logdir),
           "--no-progress", *tiny]
    # Under way: episodes logged and (DQN) past the replay's minimum size, (PPO) an update made. The loop and
    # the stop are every agent's (D4PG's replay side is DQN's).
    if agent == "dqn":
        ready = lambda: sum(int(r["length"]) for r in _rows(logdir / "actor.csv")) > 300  # noqa: E731
    else:
        ready = lambda: bool(_rows(logdir / "learner.csv"))  # noqa: E731
    code, out, err = _signal_mid_run(cmd, ready, signum)
    summary = _check_stopped_run(logdir, code, err, signum)
    assert summary["learner_steps"] > 0 and "status" in out  # the end-of-run table was printed
    # Nothing made before the stop is missing: one actor.csv row per counted episode, one learner.csv row per
    # PPO update.
    assert len(_rows(logdir / "actor.csv")) == summary["episodes"] > 0
    if agent == "ppo":
        assert len(_rows(logdir / "learner.csv")) == summary["learner_steps"]
        assert summary["learner_steps"] == summary["actor_steps"] // (2 * 16)  # every whole rollout was learnt
    assert summary["evaluations"] == 0 and summary["final_eval_return"] is None  # no evaluation was due


def test_actorq_stops_on_sigterm_as_on_sigint(tmp_path):
    """The local runner keeps it short; Ray's SIGINT is tests/launch/test_actorq.py's."""
    logdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch.actorq", "--runner", "local", "--agent", "dqn", "--num-actors", "1",
           "--max-actor-steps", "10000000", "--precision", "fp32", "--backend", "onnx", "--logdir", str(logdir),
           "--no-progress", "--set", "hidden_sizes=16,16", "--set", "min_replay_size=100"]
    code, _, err = _signal_mid_run(cmd, lambda: bool(_rows(logdir / "learner.csv")), signal.SIGTERM)
    summary = _check_stopped_run(logdir, code, err, signal.SIGTERM)
    assert summary["learner_steps"] >= int(_rows(logdir / "learner.csv")[0]["learner_steps"]) > 0
    assert "driver: interrupted by SIGTERM" in (logdir / "events.log").read_text()


def test_stop_signals_record_in_the_main_thread_and_restore_the_previous_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        assert signals.active and not signals.requested()
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not signals.requested() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert signals.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
    assert exit_code("interrupted", signal.SIGTERM) == 143 and exit_code("interrupted", None) == 130
    assert exit_code("completed", None) == 0 and exit_code("failed", None) == 1
