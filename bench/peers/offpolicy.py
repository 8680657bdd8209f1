"""This project beside the systems its users would otherwise pick, measured in the same benchmark run.

    python -m bench.peers.offpolicy [--quick] [--out DIR] [--seeds 0,1,2] [--dqn-tasks CartPole-v1,...] [--skip-acme]
        [--skip-sb3] [--merge] [--allow-busy]
        [--acme-python VENV/bin/python] [--sb3-python VENV/bin/python] [--anchors DIR]

Peers run as subprocesses of their own interpreters (built by the anchors' setup in `../shared/anchors/`:
`acme_legacy/setup.sh` for Acme 0.4.0 + Launchpad + Reverb on Python 3.10, `sb3_dqn/README.md` for SB3 + rl-zoo3),
one job at a time, alternating with ours, so every figure in the result was measured here in this run:

1. D4PG, cartpole:balance, 2 actors: legacy Acme `DistributedD4PG` (`run_d4pg.py`, wall-clock budget) and this
   project's distributed program (int8 and fp32 actors) at the same network sizes, batch size and samples per
   insert. Ours runs the number of actor steps Acme reached, so both did the same work; reported: wall clock,
   learner steps/s, env steps/s per actor, last evaluation return (Acme's figures parsed from its own log lines).
2. DQN on CartPole-v1, Acrobot-v1 and MountainCar-v0: Stable-Baselines3 with rl-zoo3's tuned hyperparameters
   for each task (`sb3_dqn/run.py`) and this project (`bench.learning.int8_vs_fp32`'s rows with their per-task settings, int8
   and fp32 actors), same task, step budget, evaluation cadence (10 greedy episodes every 2,500 env steps) and
   target, each run to its full budget, per seed: env steps and wall clock (evaluation included, for both) to
   the first evaluation at or above the target, whether it stayed solved (the mean of the last 3 evaluations,
   the last evaluation, the fraction of evaluations after the first solve still at or above the target), and env
   steps/s. Step budgets are rl-zoo3's for each task (50k, 100k, 120k env steps; bench.learning.int8_vs_fp32.DQN_ROWS).

Interpreters come from the flags or $QUARL_ACME_PYTHON / $QUARL_SB3_PYTHON; a missing one is an error (exit 2)
unless its part is skipped. The full run writes results/bench/peers.{json,md}; --quick writes to
runs/bench/peers-quick.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bench.harness.machine import add_allow_busy, describe_load, finish, machine_info, refuse_if_busy
from bench.harness.results_io import write_results

REPO = Path(__file__).resolve().parents[2]
D4PG_TASK = "cartpole:balance"
# Settings both systems run: (name, policy sizes, critic sizes, batch, samples per insert).
D4PG_SETTINGS = {
    "small": ((64, 64), (64, 64), 32, 8.0),
    "acme_defaults": ((256, 256, 256), (512, 512, 256), 256, 32.0),
}
_ACME_LINE = re.compile(r"\[(Learner|Actor|Evaluator)\] (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Launchpad colours each process's lines
_ABSL_TIME = re.compile(r"\b[IWEF]\d{4} (\d\d):(\d\d):(\d\d(?:\.\d+)?)")  # absl: I1203 12:54:34.111971


# ------------------------------------------------------------------------------------------------ parsing


def parse_acme_log(text: str, actors: int = 2) -> dict[str, Any]:
    """Acme's TerminalLogger lines ("[Learner] Key = value | ...") -> rates, counts and the last eval return.

    Legacy Acme's evaluator lines carry the shared counters too (Actor Steps, Learner Steps, Learner Walltime).
    Learner rate: learner steps over learner wall time between the first and last lines that have both.
    Actor rate: the median of [Actor] lines' episode rates where actors log; else the counter's actor steps over
    the log-line clock (absl's timestamp), divided by the number of actors."""
    rows: list[tuple[str, float | None, dict[str, float]]] = []
    for line in _ANSI.sub("", text).splitlines():
        match = _ACME_LINE.search(line)
        if not match:
            continue
        values = {}
        for pair in match.group(2).split(" | "):
            key, _, value = pair.partition(" = ")
            try:
                values[key.strip()] = float(value)
            except ValueError:
                continue
        stamp = _ABSL_TIME.search(line)
        clock = (3600 * int(stamp.group(1)) + 60 * int(stamp.group(2)) + float(stamp.group(3))) if stamp else None
        rows.append((match.group(1), clock, values))
    timed = [v for _, _, v in rows if "Learner Steps" in v and "Learner Walltime" in v]
    learner_rate = None
    if len(timed) >= 2 and timed[-1]["Learner Walltime"] > timed[0]["Learner Walltime"]:
        learner_rate = ((timed[-1]["Learner Steps"] - timed[0]["Learner Steps"])
                        / (timed[-1]["Learner Walltime"] - timed[0]["Learner Walltime"]))
    episode_rates = [v["Steps Per Second"] for label, _, v in rows if label == "Actor" and "Steps Per Second" in v]
    counted = [(t, v["Actor Steps"]) for _, t, v in rows if "Actor Steps" in v and t is not None]
    actor_rate = statistics.median(episode_rates) if episode_rates else None
    if actor_rate is None and len(counted) >= 2 and counted[-1][0] > counted[0][0]:
        actor_rate = (counted[-1][1] - counted[0][1]) / (counted[-1][0] - counted[0][0]) / actors
    returns = [v["Episode Return"] for label, _, v in rows if label == "Evaluator" and "Episode Return" in v]
    return {
        "learner_steps": int(max((v.get("Learner Steps", 0) for _, _, v in rows), default=0)),
        "learner_steps_per_s": learner_rate,
        "actor_steps": int(max((v.get("Actor Steps", 0) for _, _, v in rows), default=0)),
        "actor_steps_per_s_each": actor_rate,
        "eval_returns": returns,
        "last_eval_return": returns[-1] if returns else None,
    }


def eval_metrics(evals: Sequence[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """What the report shows of one run's evaluations ({"env_steps", "wall_clock_s", "return"} rows, in order).

    Beside the first evaluation at or above `threshold` (time to solve), whether the policy STAYS solved: the
    mean of the last 3 evaluations (what a user keeps is the final policy) and the fraction of the evaluations
    after the first solve that are still >= `threshold` (None when the solve was the last evaluation)."""
    hit = next((i for i, e in enumerate(evals) if e["return"] >= threshold), None)
    after = evals[hit + 1:] if hit is not None else []
    last = [e["return"] for e in evals[-3:]]
    return {"solved": hit is not None,
            "steps_to_target": None if hit is None else evals[hit]["env_steps"],
            "wall_s_to_target": None if hit is None else evals[hit]["wall_clock_s"],
            "final_return": last[-1] if last else None,
            "last3_mean": statistics.fmean(last) if last else None,
            "stay_fraction": sum(e["return"] >= threshold for e in after) / len(after) if after else None,
            "eval_returns": [e["return"] for e in evals]}


def parse_sb3_log(text: str, threshold: float) -> dict[str, Any]:
    """sb3_dqn/run.py's output: eval rows "env_steps wall mean std updates" and the closing throughput line."""
    evals = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and not line.startswith("#"):
            try:
                steps, wall, mean, std, updates = (float(x) for x in parts)
            except ValueError:
                continue
            evals.append({"env_steps": int(steps), "wall_clock_s": wall, "return": mean, "updates": int(updates)})
    # Step 0 is SB3's untrained policy: our evaluator starts at the first eval period, so it is left out of the
    # figures both report (it could only count as a solve, never as one of the last 3 evaluations of a run).
    trained = [e for e in evals if e["env_steps"] > 0]
    rate = re.search(r"-> (\d+) env steps/s", text)
    return {"evals": evals, **eval_metrics(trained, threshold),
            "env_steps_per_s": float(rate.group(1)) if rate else None,
            "version": next((ln[2:] for ln in text.splitlines() if ln.startswith("# sb3 ")), None)}


def read_our_evals(evaluator_csv: Path) -> list[dict[str, Any]]:
    """Our evaluator.csv as `eval_metrics` rows (wall clock with evaluation included, as SB3's)."""
    import csv  # pylint: disable=import-outside-toplevel

    with open(evaluator_csv, newline="", encoding="utf-8") as f:
        return [{"env_steps": int(r["actor_steps"]), "wall_clock_s": float(r["wall_clock_s"]),
                 "return": float(r["return"])} for r in csv.DictReader(f)]


# ------------------------------------------------------------------------------------------------ running


def first_wall_at(evaluator_csv: Path, target: float) -> float | None:
    """Wall clock (evaluation included) of the first evaluation at or above `target` in our evaluator.csv."""
    return eval_metrics(read_our_evals(evaluator_csv), target)["wall_s_to_target"]


def _peer_env() -> dict[str, str]:
    """The peer's environment: ours minus what would make its interpreter import this project's packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def run_subprocess(cmd: Sequence[str], log: Path, timeout_s: float, cwd: Path) -> tuple[int | None, str, float]:
    """Runs a peer in its own process group (Launchpad starts several); kills the group at the timeout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=_peer_env(),
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:  # also ends stragglers of a process that exited on its own
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return code, log.read_text(encoding="utf-8", errors="replace"), time.perf_counter() - t0


def acme_d4pg(python: str, anchors: Path, setting: str, seconds: float, logdir: Path) -> dict[str, Any]:
    policy, critic, batch, spi = D4PG_SETTINGS[setting]
    cmd = [python, str(anchors / "acme_legacy" / "run_d4pg.py"), "--policy", ",".join(map(str, policy)),
           "--critic", ",".join(map(str, critic)), "--batch", str(batch), "--spi", str(spi), "--actors", "2",
           "--seconds", str(int(seconds))]
    code, text, wall = run_subprocess(cmd, logdir / f"acme-{setting}.log", seconds + 180, logdir)
    return {"exit_code": code, "wall_clock_s": round(wall, 1), "budget_s": seconds, **parse_acme_log(text),
            "log": str(logdir / f"acme-{setting}.log")}


def ours_d4pg(setting: str, precision: str, actor_steps: int, seed: int, logdir: Path) -> dict[str, Any]:
    from launch.experiments.config import ExperimentConfig  # pylint: disable=import-outside-toplevel
    from launch.distributed.supervisor import run_program  # pylint: disable=import-outside-toplevel
    from launch.program.ray_runner import RayRunner  # pylint: disable=import-outside-toplevel

    policy, critic, batch, spi = D4PG_SETTINGS[setting]
    overrides = {"policy_layer_sizes": policy, "critic_layer_sizes": critic, "batch_size": batch,
                 "samples_per_insert": spi, "min_replay_size": 1000}
    config = ExperimentConfig.create(agent="d4pg", task=D4PG_TASK, precision=precision, num_actors=2,
                              max_actor_steps=actor_steps, seed=seed, logdir=str(logdir), overrides=overrides,
                              backend="auto", eval_every=max(1000, actor_steps // 4), eval_episodes=1)
    t0 = time.perf_counter()
    summary, code = run_program(config, RayRunner())
    return {"exit_code": code, "wall_clock_s": round(time.perf_counter() - t0, 1),
            "learner_steps": summary["learner_steps"], "learner_steps_per_s": summary["learner_steps_per_s"],
            "actor_steps": summary["actor_steps"],
            "actor_steps_per_s_each": statistics.median(float(a.get("steps_per_s", 0.0)) for a in summary["actors"])
            if summary["actors"] else None,
            "last_eval_return": summary["final_eval_return"], "logdir": str(logdir)}


def bench_d4pg(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    from launch.program.ray_runner import init_ray  # pylint: disable=import-outside-toplevel

    rows = []
    settings = ["small"] if args.quick else list(D4PG_SETTINGS)
    seconds = 150 if args.quick else 240
    for setting in settings:
        print(f"[bench.peers.offpolicy] Acme D4PG {setting}, {seconds:.0f} s ...", flush=True)
        acme = acme_d4pg(args.acme_python, args.anchors, setting, seconds, out / "logs")
        row = {"setting": setting, "acme": acme, "ours": {}}
        print(f"  Acme: {json.dumps({k: v for k, v in acme.items() if k != 'eval_returns'})}", flush=True)
        steps = acme["actor_steps"]
        if steps <= 0:
            row["note"] = "Acme logged no actor steps (see its log); ours not run"
            rows.append(row)
            continue
        init_ray(None, num_cpus=8)
        import ray  # pylint: disable=import-outside-toplevel
        try:
            for precision in ("int8", "fp32"):
                ours = ours_d4pg(setting, precision, steps, 0, out / "runs" / f"d4pg-{setting}-{precision}")
                row["ours"][precision] = ours
                print(f"  ours {precision}: {json.dumps(ours)}", flush=True)
        finally:
            ray.shutdown()
        rows.append(row)
    return rows


def sb3_command(python: str, anchors: Path, row: Any, seed: int) -> list[str]:
    """SB3's run for `row` (a bench.learning.int8_vs_fp32 LearningRow): rl-zoo3's tuned settings for the task, our budget,
    evaluation cadence, episodes and target."""
    return [python, str(anchors / "sb3_dqn" / "run.py"), "--env", row.task, "--seed", str(seed),
            "--steps", str(row.max_actor_steps), "--eval_every", str(row.eval_every),
            "--eval_episodes", str(row.eval_episodes), "--threshold", str(row.target), "--max_seconds", "3600"]


def bench_dqn(args: argparse.Namespace, out: Path, seeds: Sequence[int], rows: Sequence[Any] | None = None
              ) -> list[dict[str, Any]]:
    """Every (row, seed): SB3, then ours with int8 and fp32 actors (order reversed on odd seeds), each run to its
    full budget so that the final evaluations say whether the policy stayed solved."""
    from bench.learning.int8_vs_fp32 import DQN_ROWS, QUICK_ROWS, run_one  # pylint: disable=import-outside-toplevel

    if rows is None:
        rows = list(QUICK_ROWS) if args.quick else [r for r in DQN_ROWS if r.task in args.dqn_tasks]
    results = []
    for row in rows:
        for i, seed in enumerate(seeds):
            order = ["sb3", "int8", "fp32"] if i % 2 == 0 else ["fp32", "int8", "sb3"]
            for system in order:
                if system == "sb3":
                    log = out / "logs" / f"sb3-{row.task}-seed{seed}.log"
                    code, text, wall = run_subprocess(sb3_command(args.sb3_python, args.anchors, row, seed), log,
                                                      4000, out)
                    res = {"system": "sb3", **parse_sb3_log(text, row.target), "exit_code": code,
                           "wall_clock_s": round(wall, 1), "log": str(log)}
                    res.pop("evals")
                else:
                    logdir = out / "runs" / f"dqn-{row.task}-{system}-s{seed}"
                    r, _ = run_one(row, system, seed, logdir=logdir, stop_at_target=False)
                    res = {"system": f"ours {system}", **eval_metrics(read_our_evals(logdir / "evaluator.csv"),
                                                                      row.target),
                           "env_steps_per_s": r["env_steps_per_s"], "overrides": dict(row.overrides)}
                results.append({"task": row.task, "seed": seed, "target": row.target, **res})
                print(f"[bench.peers.offpolicy] {row.task} seed {seed} {res['system']}: steps {res['steps_to_target']}, "
                      f"{res['wall_s_to_target']} s to {row.target}; last 3 evals {res['last3_mean']}, "
                      f"stayed solved {res['stay_fraction']}", flush=True)
    return results


# ------------------------------------------------------------------------------------------------ report


def _num(v: Any, fmt: str = "{:,.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def _spread(values: Sequence[float]) -> str:
    """"min / median" of per-seed figures (the worst seed is what "on every seed" targets are judged by)."""
    return f"{_num(min(values))} / {_num(statistics.median(values))}" if values else "— / —"


def markdown(result: dict[str, Any]) -> str:
    lines = ["# This project beside its peers, measured in one run", "",
             f"`{result['command']}` ({describe_load(result['machine'])}; {result['machine']['cpu']}). Peers ran "
             "as subprocesses one at a time, alternating with ours; nothing here is copied from elsewhere.", ""]
    for sitting in result.get("earlier_sittings", []):
        lines += [f"Merged with an earlier sitting on the same output: `{sitting['command']}` "
                  f"({describe_load(sitting['machine'])}; {sitting['machine']['cpu']}); its rows are those of the "
                  "tasks this command did not run.", ""]
    if result.get("d4pg"):
        lines += [f"## D4PG, {D4PG_TASK}, 2 actors: legacy Acme (Launchpad + Reverb) vs this project", "",
                  "Ours ran the actor steps Acme reached in its budget (same work). Acme's rates are parsed from its "
                  "own log lines (learner: steps over learner wall time; actors: the shared actor-step counter over "
                  "the log clock, per actor).", "",
                  "| setting | system | wall clock s | actor steps | learner steps/s | env steps/s per actor | "
                  "last eval return |", "|---|---|---:|---:|---:|---:|---:|"]
        for row in result["d4pg"]:
            systems = [("Acme 0.4.0", row["acme"])] + [(f"ours {p}", v) for p, v in row["ours"].items()]
            for name, v in systems:
                lines.append(f"| {row['setting']} | {name} | {_num(v.get('wall_clock_s'))} | "
                             f"{_num(v.get('actor_steps'), '{:,}')} | {_num(v.get('learner_steps_per_s'))} | "
                             f"{_num(v.get('actor_steps_per_s_each'))} | {_num(v.get('last_eval_return'))} |")
        lines += ["", "Settings: " + "; ".join(f"{k}: policy {p}, critic {c}, batch {b}, {s:g} samples per insert"
                                               for k, (p, c, b, s) in D4PG_SETTINGS.items()) + ".", ""]
    if result.get("dqn"):
        lines += dqn_markdown(result["dqn"])
    return "\n".join(lines) + "\n"


def dqn_markdown(rows: Sequence[dict[str, Any]],
                 title: str = "DQN: Stable-Baselines3 (rl-zoo3 tuned) vs this project") -> list[str]:
    """The DQN section (bench.peers.onpolicy's too, titled for PPO): per task and system, time to the first solve and
    whether the policy stayed solved."""
    lines = [f"## {title}", "",
             "Same task, step budget, evaluation cadence, episodes and target; every run goes to its full budget. "
             "Wall clock to target includes evaluation for both (SB3's clock starts when training starts, after "
             "its model is built; ours when the run starts, so ours also counts building the agent and "
             "compiling). Time medians are over the seeds that reached the target (count shown). \"last 3\" is "
             "the mean of a run's last 3 evaluations and \"final\" its last evaluation (min over seeds and median "
             "shown); \"stayed\" is the "
             "fraction of evaluations after the first solve still at or above the target (mean over seeds). Env "
             "steps/s exclude evaluation for SB3, and are ours' training-clock rate.", "",
             "| task | system | seeds reaching target | median env steps to target | median s to target | "
             "last 3: min / median | final: min / median | stayed | median env steps/s | "
             "per seed (steps / s to target; last 3) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]

    def med(key: str, xs: Sequence[dict[str, Any]]) -> float | None:
        vals = [r[key] for r in xs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    for task, system in dict.fromkeys((r["task"], r["system"]) for r in rows):
        rs = [r for r in rows if r["task"] == task and r["system"] == system]
        ok = [r for r in rs if r["solved"]]
        last3 = [r["last3_mean"] for r in rs if r.get("last3_mean") is not None]
        final = [r["final_return"] for r in rs if r.get("final_return") is not None]
        stayed = [r["stay_fraction"] for r in rs if r.get("stay_fraction") is not None]
        per_seed = ", ".join(
            f"s{r['seed']}: " + (f"{r['steps_to_target']:,} / {r['wall_s_to_target']:.0f}" if r["solved"]
                                 else "not reached") + f"; {_num(r.get('last3_mean'), '{:.0f}')}" for r in rs)
        lines.append(f"| {task} | {system} | {len(ok)}/{len(rs)} | {_num(med('steps_to_target', ok), '{:,.0f}')} "
                     f"| {_num(med('wall_s_to_target', ok))} | "
                     f"{_spread(last3)} | {_spread(final)} "
                     f"| {_num(statistics.fmean(stayed) if stayed else None, '{:.2f}')} "
                     f"| {_num(med('env_steps_per_s', rs), '{:,.0f}')} | {per_seed} |")
    sb3 = next((r.get("version") for r in rows if r["system"] == "sb3" and r.get("version")), None)
    return lines + ["", f"SB3 run: {sb3}." if sb3 else "", ""]


DEFAULT_DQN_TASKS = "CartPole-v1,Acrobot-v1,MountainCar-v0"


def merge_results(earlier: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """`now` plus what `earlier` measured that `now` did not: DQN rows of other tasks (placed first, tasks in
    their order) and the D4PG part when `now` skipped it. Each sitting's command and machine stay on record."""
    tasks = {r["task"] for r in now.get("dqn", [])}
    kept = [r for r in earlier.get("dqn", []) if r["task"] not in tasks]
    d4pg = earlier.get("d4pg") if not now.get("d4pg") else None
    if not kept and not d4pg:  # nothing of the earlier sitting survives: nothing to credit it with
        return now
    merged = dict(now, dqn=kept + list(now.get("dqn", [])))
    if d4pg:
        merged["d4pg"] = d4pg
    sittings = [*earlier.get("earlier_sittings", []),
                {"command": earlier.get("command"), "machine": earlier.get("machine")}]
    merged["earlier_sittings"] = _surviving_sittings(sittings, tasks, bool(now.get("d4pg")))
    return merged


def _sitting_tasks(sitting: dict[str, Any]) -> set[str]:
    """The DQN tasks a sitting measured: recorded, or read from its command's --dqn-tasks (all by default)."""
    if "tasks" in sitting:
        return set(sitting["tasks"])
    words = str(sitting.get("command") or "").split()
    given = words[words.index("--dqn-tasks") + 1] if "--dqn-tasks" in words[:-1] else DEFAULT_DQN_TASKS
    return set(given.split(","))


def _surviving_sittings(sittings: list[dict[str, Any]], now_tasks: set[str], now_d4pg: bool) -> list[dict[str, Any]]:
    """The earlier sittings (oldest first) that still own a row: a later sitting's rows replace an earlier one's
    for the same task, so a sitting whose every task was measured again since is no longer credited."""
    claimed, kept = set(now_tasks), []
    d4pg_claimed = now_d4pg
    for sitting in reversed(sittings):
        own = _sitting_tasks(sitting) - claimed
        has_d4pg = not d4pg_claimed and "--skip-acme" not in str(sitting.get("command") or "")
        if own or has_d4pg:
            kept.append({**sitting, "tasks": sorted(own)})
        claimed |= own
        d4pg_claimed = d4pg_claimed or has_d4pg
    return kept[::-1]


# ------------------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.offpolicy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small settings only, short budgets (a smoke run)")
    parser.add_argument("--out", default=None, help="output directory (default results/bench, or "
                                                    "runs/bench/peers-quick with --quick)")
    parser.add_argument("--seeds", default=None, help="DQN seeds (default 0,1,2; 0 with --quick)")
    parser.add_argument("--dqn-tasks", default=DEFAULT_DQN_TASKS,
                        help="comma-separated bench.learning.int8_vs_fp32 DQN tasks")
    parser.add_argument("--skip-acme", action="store_true", help="no D4PG comparison")
    parser.add_argument("--skip-sb3", action="store_true", help="no DQN comparison")
    parser.add_argument("--acme-python", default=os.environ.get("QUARL_ACME_PYTHON"),
                        help="interpreter of the legacy Acme venv (acme_legacy/setup.sh); $QUARL_ACME_PYTHON")
    parser.add_argument("--sb3-python", default=os.environ.get("QUARL_SB3_PYTHON"),
                        help="interpreter of the SB3 venv (sb3_dqn/README.md); $QUARL_SB3_PYTHON")
    parser.add_argument("--anchors", type=Path, default=REPO.parent / "shared" / "anchors",
                        help="folder holding acme_legacy/ and sb3_dqn/ (default ../shared/anchors)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the DQN rows of other tasks (and the D4PG part, if skipped now) from OUT's "
                             "peers.json: the tasks can be measured in separate sittings into one table")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds or min(seeds) < 0:
        parser.error("--seeds needs at least one non-negative integer")
    args.dqn_tasks = [t.strip() for t in args.dqn_tasks.split(",") if t.strip()]
    from bench.learning.int8_vs_fp32 import DQN_ROWS  # pylint: disable=import-outside-toplevel
    unknown = sorted(set(args.dqn_tasks) - {r.task for r in DQN_ROWS})
    if unknown:
        parser.error(f"--dqn-tasks: no bench.learning.int8_vs_fp32 DQN row for {', '.join(unknown)} "
                     f"(rows: {', '.join(r.task for r in DQN_ROWS)})")
    for skip, flag, python, script in ((args.skip_acme, "--acme-python", args.acme_python, "acme_legacy/run_d4pg.py"),
                                       (args.skip_sb3, "--sb3-python", args.sb3_python, "sb3_dqn/run.py")):
        if skip:
            continue
        if not python or not os.access(python, os.X_OK):
            parser.exit(2, f"{parser.prog}: error: {flag} must name the peer's venv python (got {python!r}); build "
                           f"it with {args.anchors}/{script.split('/')[0]}/, or pass --skip-{flag[2:6]}\n")
        if not (args.anchors / script).is_file():
            parser.exit(2, f"{parser.prog}: error: {args.anchors / script} not found; pass --anchors DIR\n")
    refuse_if_busy(parser, args.allow_busy)
    out = Path(args.out) if args.out else REPO / ("runs/bench/peers-quick" if args.quick else "results/bench")
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m bench.peers.offpolicy", *(argv if argv is not None else sys.argv[1:])])
    result: dict[str, Any] = {"command": command, "machine": machine_info(args.allow_busy), "quick": args.quick}
    work = out if args.quick else REPO / "runs" / "bench" / "peers"
    if not args.skip_acme:
        result["d4pg"] = bench_d4pg(args, work)
    if not args.skip_sb3:
        result["dqn"] = bench_dqn(args, work, seeds)
    finish(result["machine"])
    if args.merge and (out / "peers.json").is_file():
        result = merge_results(json.loads((out / "peers.json").read_text(encoding="utf-8")), result)
    json_path, md_path = write_results(out, "peers", result, markdown(result), default=str)
    print(f"[bench.peers.offpolicy] wrote {json_path} and {md_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
