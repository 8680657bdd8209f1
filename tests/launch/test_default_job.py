"""The README's main job, `python -m launch.actorq --logdir DIR` with nothing else (distributed int8 D4PG on
cartpole:balance, 2 actors, Ray): it learns, stops on its rule, and ends on the policy that solved it.

Run in-process on the module's Ray (the CLI's own process boundary is covered by the SIGINT tests). One run serves
every assertion; it takes ~40-90 s on 2 cores.
"""
from __future__ import annotations

import csv
import json

import pytest

from analysis.schema import solved_at
from launch import actorq
from quarl.quant.policy_io import load_policy


@pytest.fixture(scope="module")
def default_run(ray_session, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("default") / "run"
    code = actorq.main(["--logdir", str(logdir), "--no-progress"])
    return code, logdir, json.loads((logdir / "summary.json").read_text())


def test_the_default_job_solves_cartpole_balance_and_ends_on_the_solving_policy(default_run):
    """Final evaluation >= 900, where an untrained policy scores ~0-200 on cartpole:balance; the stopping rule (950
    twice in a row) fired, and the final policy file and the final evaluation are the version that solved it, not
    the weights the learner trained on to while the stop went round."""
    code, logdir, summary = default_run
    assert code == 0 and summary["status"] == "completed", summary["error"]
    assert (summary["agent"], summary["task"], summary["precision"], summary["num_actors"]) == (
        "d4pg", "cartpole:balance", "int8", 2)
    assert summary["final_eval_return"] >= 900.0, summary["final_eval_return"]
    assert summary["solved"] is not None and summary["actor_steps"] < 60_000, summary["solved"]
    with open(logdir / "evaluator.csv", newline="", encoding="utf-8") as f:
        evals = [{**r, "return": float(r["return"]), "actor_steps": int(r["actor_steps"])} for r in csv.DictReader(f)]
    hit = solved_at(evals, 950.0, 2)
    assert hit is not None and summary["solved"]["actor_steps"] == hit["actor_steps"]
    version = int(hit["weights_version"])
    final = summary["final_policy"]
    assert final["weights_version"] == version and "solved" in final["why"], final
    assert final["learner_steps"] >= version  # the learner trained on; the final policy is still the solving one
    # The final evaluation (the last row) evaluated the solving version again; the saved fp32 policy is that version.
    assert int(evals[-1]["weights_version"]) == version and evals[-1]["return"] == summary["final_eval_return"]
    assert load_policy(logdir).meta["steps"] == version
    assert "the one that solved the run" in (logdir / "events.log").read_text()


def test_the_default_job_records_what_its_int8_actors_executed(default_run):
    """`auto` picks per CPU and network size (docs/runtimes.md); whatever it picked is what every actor and the
    summary say, in the words the tables use, never an integer-kernel claim for a dequantized graph."""
    from analysis.execution import describe, executor_name

    _, _, summary = default_run
    said = {describe("int8", a["backend"], a["kernel"]["form"]) for a in summary["actors"]}
    assert said == {summary["executed"]}, (said, summary["executed"])
    names = {executor_name("int8", a["backend"], a["kernel"]["form"]) for a in summary["actors"]}
    assert names == {summary["executor"]} and summary["cpu_class"], (names, summary["executor"])
    for actor in summary["actors"]:
        if actor["backend"] == "onnx":  # the form in use is the one this CPU's self-check confirmed exact
            last_check = actor["kernel"]["checks"][-1]
            assert last_check["ok"] and last_check["form"] == actor["kernel"]["form"], last_check
