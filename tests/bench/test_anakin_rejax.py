"""bench.peers.anakin_rejax: rejax's closing line becomes figures, each rejax preset becomes the launch.anakin settings
that mean the same, and a --quick run against a stub rejax (and, in the default suite, a stand-in for launch.anakin's
summaries) writes a page with every case, ratio, target and difference. The slow variant runs launch.anakin itself."""
from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import agents
from bench.harness.learning_runs import REPO
from bench.peers import anakin_rejax as bench
from bench.peers.anakin_rejax_results import markdown, target_rows
from bench.peers.anakin_rejax_settings import CASES, REJAX_PRESETS, translate

RUN_PY = REPO.parent / "shared" / "anchors" / "rejax" / "run.py"
LINE = ("# rejax ppo CartPole-v1 100000 steps x 10 seed(s), jax 0.10.2 cpu: compile 7.8 s, train 10.1 s (99,010 env "
        "steps/s over all seeds); final greedy return per seed [464.6, 373.8, nan, 495.4]")
# A stand-in for rejax's run.py: its closing line, and run.py's failure on a Q-network rejax 0.1.3 lacks.
STUB = '''import sys
a = sys.argv[1:]
opt = {a[i]: a[i + 1] for i in range(0, a.index("--set"), 2)}
sets = dict(kv.split("=", 1) for kv in a[a.index("--set") + 1:])
if opt["--algo"] == "dqn" and opt["--env"] == "Breakout-MinAtar" and sets.get("agent") != "QNetwork":
    sys.exit("KeyError: 'ConvQNetwork'")
assert sets["eval_freq"] == opt["--steps"] and sets["skip_initial_evaluation"] == "True"
n, s = int(opt["--steps"]), int(opt["--seeds"])
print("compiling...")
print(f"# rejax {opt['--algo']} {opt['--env']} {n} steps x {s} seed(s), jax 0.10.2 cpu: compile 5.0 s, train "
      f"{n * s / 20000:.1f} s ({20000:,.0f} env steps/s over all seeds); final greedy return per seed "
      f"{[round(10.0 + i, 1) for i in range(s)]}")
'''


def test_rejax_line_becomes_its_figures():
    got = bench.parse_rejax_line("noise\n" + LINE + "\n")
    assert (got["algo"], got["env"], got["steps"], got["seeds"]) == ("ppo", "CartPole-v1", 100_000, 10)
    assert (got["compile_s"], got["train_s"], got["env_steps_per_s"]) == (7.8, 10.1, 99_010.0)
    assert got["final_returns"][:2] == [464.6, 373.8] and math.isnan(got["final_returns"][2])
    with pytest.raises(ValueError, match="no '# rejax"):
        bench.parse_rejax_line("Traceback (most recent call last):\nKeyError: 'ConvQNetwork'\n")


def _run_py_presets() -> dict:
    tree = ast.parse(RUN_PY.read_text(encoding="utf-8"))
    node = next(n.value for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PRESETS")
    return {ast.literal_eval(k): {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
            for k, v in zip(node.keys, node.values)}


@pytest.mark.skipif(not RUN_PY.is_file(), reason="the rejax anchor is not checked out beside the repository")
def test_presets_are_run_pys():
    assert REJAX_PRESETS == _run_py_presets()


def _config(case, steps, tmp_path):
    """What launch.anakin resolves from the benchmark's command for `case`: its run and the agent's config."""
    from launch.anakin import build_parser, validate  # pylint: disable=import-outside-toplevel

    cmd = bench.our_command(SimpleNamespace(quick=False, eval_episodes=128), case, 10, steps, "int8", tmp_path)
    run = validate(build_parser().parse_args(cmd[3:]))
    return run, agents.make_config(case.algo, **run.overrides)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_preset_is_translated_into_the_same_settings(name, tmp_path):
    case = CASES[name]
    steps = case.budget(case.steps)
    run, c = _config(case, steps, tmp_path)
    p = case.preset
    assert run.seeds == tuple(range(10)) and run.max_actor_steps == steps and steps % case.unit == 0
    assert c.learning_rate == pytest.approx(p["learning_rate"]) and c.discount == p["gamma"]
    assert c.max_gradient_norm == p["max_grad_norm"] and c.adam_eps == 1e-8
    if case.task.startswith("MinAtar/"):
        assert c.image_torso == case.torso
    if case.algo == "ppo":
        assert (c.num_envs, c.num_steps, c.update_epochs, c.num_minibatches) == (
            p["num_envs"], p["num_steps"], p["num_epochs"], p["num_minibatches"])
        assert (c.gae_lambda, c.clip_coef, c.entropy_coef, c.value_coef) == (
            p["gae_lambda"], p["clip_eps"], p["ent_coef"], p["vf_coef"])
        assert c.policy_hidden_sizes == c.value_hidden_sizes == (64, 64) and c.activation == "tanh"
        assert not c.anneal_lr and c.clip_value_loss and c.normalize_advantages
        return
    envs, epochs = p["num_envs"], p.get("num_epochs", 1)
    assert run.envs_per_actor == envs and c.actor_update_period == envs
    assert round(envs * c.samples_per_insert / c.batch_size) == epochs  # the trainer's updates per iteration
    assert (c.batch_size, c.min_replay_size, c.max_replay_size) == (p["batch_size"], p["fill_buffer"],
                                                                   p["buffer_size"])
    assert c.n_step == 1 and c.learning_rate_end is None and c.observation_bounds is None
    assert c.hidden_sizes == (64, 64) and c.activation == {"swish": "relu"}.get(p["agent_kwargs"]["activation"],
                                                                               p["agent_kwargs"]["activation"])
    assert c.epsilon_decay_steps == int(p["exploration_fraction"] * steps) and c.epsilon_end == p["eps_end"]
    between = epochs * max(1, p.get("target_update_freq", 1) // envs)  # updates between rejax's target moves
    assert (1 - c.target_update_tau) ** between == pytest.approx(p.get("polyak", 0.99))


def test_what_cannot_be_matched_is_listed():
    diffs = {n: " ".join(translate(c, c.budget(c.steps)).differences) for n, c in CASES.items()}
    assert "swish" in diffs["dqn-cartpole"] and "Dueling" in diffs["dqn-cartpole"]
    assert "ConvQNetwork" in diffs["dqn-breakout"] and "double DQN" in diffs["dqn-breakout"]
    assert "conv torso" in diffs["ppo-breakout-conv"] and "3 actions" in diffs["ppo-breakout"]
    assert all("clips each gradient element" in d for d in diffs.values())


def test_bad_command_lines_are_one_line_exit_2(tmp_path, capsys):
    for argv, words in ((["--cases", "ppo-pong"], "unknown ppo-pong"), (["--seeds", "1,x"], "seed counts"),
                        (["--rejax-python", str(tmp_path / "nope")], "--rejax-python must name")):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args([*argv, "--allow-busy"] + ([] if "--rejax-python" in argv
                                                         else ["--rejax-python", sys.executable]))
        assert exc.value.code == 2 and words in capsys.readouterr().err


def _fake_anakin(cmd, log, timeout_s, cwd):
    """launch.anakin's summaries for the seeds and steps the command names, and a rate by precision."""
    flag = {cmd[i]: cmd[i + 1] for i in range(3, len(cmd) - 1) if cmd[i].startswith("--")}
    low, _, high = flag["--seeds"].partition("-")
    out = Path(flag["--out"])
    for seed in range(int(low), int(high or low) + 1):
        (out / f"seed{seed}").mkdir(parents=True)
        summary = {"actor_steps": int(flag["--steps"]), "final_eval_return": 20.0 + seed, "status": "completed",
                   "executed": "int8 weights, integer kernel (aqt_s8s8)",
                   "learner": {"anakin": {"env_steps_per_s_all_seeds": 30_000.0 if flag["--precision"] == "int8"
                                          else 15_000.0, "first_chunk_s": 9.0, "init_s": 2.0}}}
        (out / f"seed{seed}" / "summary.json").write_text(json.dumps(summary))
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    return 0, "", 0.5


def _stub_rejax(tmp_path):
    anchors = tmp_path / "anchors"
    (anchors / "rejax").mkdir(parents=True)
    (anchors / "rejax" / "run.py").write_text(STUB)
    stub = tmp_path / "rejax_python"
    stub.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    stub.chmod(0o755)
    return anchors, stub


def test_quick_run_with_a_stub_rejax_writes_every_case(tmp_path, monkeypatch):
    anchors, stub = _stub_rejax(tmp_path)
    real = bench.run_subprocess
    monkeypatch.setattr(bench, "run_subprocess",
                        lambda cmd, *a: _fake_anakin(cmd, *a) if cmd[1:3] == ["-m", "launch.anakin"] else real(cmd, *a))
    out = tmp_path / "out"
    assert bench.main(["--quick", "--allow-busy", "--rejax-python", str(stub), "--anchors", str(anchors),
                       "--out", str(out), "--seeds", "1,2"]) == 0
    result = json.loads((out / "anakin_rejax.json").read_text())
    rows = result["rows"]
    assert len(rows) == 2 * (4 * 3 + 2 * 2) and not [r for r in rows if "failed" in r]
    rejax = next(r for r in rows if r["system"] == "rejax" and r["case"] == "dqn-breakout" and r["seeds"] == 2)
    assert rejax["env_steps_per_s"] == 20_000.0 and rejax["final_returns"] == [10.0, 11.0]
    ours = next(r for r in rows if r["system"] == "ours fp32" and r["case"] == "ppo-cartpole" and r["seeds"] == 2)
    assert ours["final_returns"] == [20.0, 21.0] and ours["steps_per_seed"] == CASES["ppo-cartpole"].quick_steps
    # Alternating order: rejax first on the first case's 1 seed, last on its 2 seeds.
    assert [r["system"] for r in rows[:6]] == ["rejax", "ours int8", "ours fp32", "ours fp32", "ours int8", "rejax"]
    targets = result["targets"]
    assert len([t for t in targets if t["target"].startswith("at least")]) == 4 * 2 * 2
    assert all(t["holds"] for t in targets if t["system"] == "ours int8")  # 30k against 20k and 12k
    assert not any(t["holds"] for t in targets if t["system"] == "ours fp32" and "rejax" in t["target"])
    page = (out / "anakin_rejax.md").read_text()
    assert "| ppo-cartpole | 2 | ours int8 | 30,000 | 1.50x |" in page
    assert "| ppo-breakout-conv | 1 | ours int8 | 30,000 | 1.50x (rejax's MLP) |" in page
    assert ("| PPO Breakout >= 12k env steps/s, int8, 1 seed | ppo-breakout-conv | 1 | ours int8 | 30,000 | 12,000 | "
            "yes |") in page
    assert "ConvQNetwork" in page and "load average" in page and "--quick smoke run" in page


def test_a_failed_run_is_on_the_page_and_holds_no_target():
    rows = [{"case": "ppo-cartpole", "seeds": 1, "system": "rejax", "failed": "exited 1; log tail: KeyError",
             "log": "x.log"},
            {"case": "ppo-cartpole", "seeds": 1, "system": "ours int8", "env_steps_per_s": 5.0, "init_s": 1.0,
             "first_chunk_s": 2.0, "final_returns": [9.0], "process_wall_s": 3.0}]
    assert target_rows(rows) == []  # no rejax figure: nothing to hold against
    result = {"command": "python -m bench.peers.anakin_rejax", "machine": {"load_start": [0.1], "load_end": [0.2]},
              "chunks": 5, "eval_episodes": 128, "rows": rows, "targets": [], "settings": {}}
    page = markdown(result)
    assert "| ppo-cartpole | 1 | rejax | FAILED | — |" in page and "KeyError (log x.log)" in page
    assert "No target applies" in page


def test_our_rate_is_the_later_chunks_over_their_own_time():
    """What the benchmark reads of ours: env steps after the first chunk over the later chunks' time, whatever the
    initialisation, the compiling first chunk and the evaluations took."""
    from launch.experiments.anakin_run import Plan, _rate  # pylint: disable=import-outside-toplevel

    run, plan = SimpleNamespace(seeds=(0, 1)), Plan(period_steps=100, chunk_periods=10, chunks=5)
    clock = {"init_s": 9.0, "first_chunk_s": 30.0, "later_chunks_s": 2.0, "evaluation_s": 40.0}
    assert _rate(run, plan, 5_000, clock) == 2 * 4_000 / 2.0
    assert _rate(run, plan, 1_000, clock) is None  # one chunk: nothing measured after the compile


@pytest.mark.slow
def test_quick_run_trains_with_launch_anakin(tmp_path):
    """One case for real (launch.anakin compiles and trains a few thousand steps), rejax stubbed."""
    anchors, stub = _stub_rejax(tmp_path)
    out = tmp_path / "out"
    assert bench.main(["--quick", "--allow-busy", "--rejax-python", str(stub), "--anchors", str(anchors),
                       "--out", str(out), "--cases", "ppo-breakout", "--precisions", "int8"]) == 0
    ours = next(r for r in json.loads((out / "anakin_rejax.json").read_text())["rows"] if r["system"] == "ours int8")
    assert ours["env_steps_per_s"] > 0 and ours["env_steps"] == CASES["ppo-breakout"].quick_steps
    assert len(ours["final_returns"]) == 1 and ours["final_returns"][0] >= 0 and ours["statuses"] == ["completed"]
