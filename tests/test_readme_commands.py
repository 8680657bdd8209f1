"""The README's "Using it" commands, run in order in a fresh clone, change no committed file (`git status` stays
clean): runs go to runs/ (gitignored), and `launch.reproduce`'s example reuses results/small's runs and leaves
its report as it is. The reproduce example runs in the default suite; the whole list (training at the smallest
size) is slow-marked."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMALL_STEPS = "600"  # every training command shrunk to this many actor steps


def readme_commands() -> list[list[str]]:
    """The `python -m launch.*` commands of README's "Using it" section (before "On a cluster"), in order,
    continuation lines joined, comments dropped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Using it"):text.index("### On a cluster")]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("python -m launch."):
                commands.append(shlex.split(line))
    return commands


def shrink(argv: list[str]) -> list[str]:
    """The command at the smallest size: step budgets cut to SMALL_STEPS (added where the command leaves the
    default), evaluations to one episode, no live view."""
    out = list(argv)
    for flag, value in (("--max-actor-steps", SMALL_STEPS), ("--steps", SMALL_STEPS), ("--episodes", "1"),
                        ("--seeds", "0-1"), ("--eval-episodes", "1")):
        if flag in out:
            out[out.index(flag) + 1] = value
    module = out[2]
    if module == "launch.actorq" and "--max-actor-steps" not in out:
        out += ["--max-actor-steps", SMALL_STEPS]
    if module in ("launch.actorq", "launch.train") and "--eval-episodes" not in out:
        out += ["--eval-episodes", "1"]
    if module == "launch.actorq":
        out += ["--runner", "local"]  # the same nodes as threads: no Ray start-up in a test
    return out


def fresh_clone(tmp_path: Path) -> Path:
    """A clone of this checkout's HEAD (what a new user gets), sharing its objects."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(REPO), str(clone)], check=True, timeout=300)
    return clone


def run_in(clone: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(clone)}
    return subprocess.run([sys.executable, *argv[1:]], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=1800, stdin=subprocess.DEVNULL)


def git_status(clone: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True,
                          check=True).stdout


def test_readme_lists_the_commands_this_test_runs() -> None:
    modules = [c[2] for c in readme_commands()]
    assert modules[:6] == ["launch.actorq", "launch.actorq", "launch.train", "launch.anakin", "launch.ptq",
                           "launch.reproduce"]
    assert shrink(["python", "-m", "launch.train", "--steps", "20000"]) == [
        "python", "-m", "launch.train", "--steps", SMALL_STEPS, "--eval-episodes", "1"]


def test_readme_reproduce_example_in_a_fresh_clone_changes_no_committed_file(tmp_path: Path) -> None:
    if subprocess.run(["git", "status", "--porcelain", "--", "results"], cwd=REPO, capture_output=True,
                      text=True).stdout:
        pytest.skip("results/ has uncommitted changes: the clone would not hold them")
    clone = fresh_clone(tmp_path)
    reproduce = next(c for c in readme_commands() if c[2] == "launch.reproduce")
    proc = run_in(clone, [*reproduce, "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "0 run(s) ran" in proc.stderr and "left as it is" in proc.stderr
    assert git_status(clone) == ""


@pytest.mark.slow
def test_every_readme_command_in_order_at_the_smallest_size_leaves_git_status_clean(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    for argv in readme_commands():
        proc = run_in(clone, shrink(argv))
        assert proc.returncode == 0, (argv, proc.stderr[-2000:])
    assert (clone / "runs" / "dqn" / "summary.json").exists() and (clone / "runs" / "dqn" / "ptq" / "ptq.md").exists()
    assert git_status(clone) == ""
