"""bench.peers.offpolicy's results: the peers' own log lines read into result rows (`parse_acme_log`,
`parse_sb3_log`), the sittings of a comparison measured in parts merged into one result (`merge_results`), and
the page (`markdown`; `dqn_markdown` is bench.peers.onpolicy's table too). Also the comparison's fixed settings
(`D4PG_TASK`, `D4PG_SETTINGS`, `DEFAULT_DQN_TASKS`), which both the runs and the page name.
"""
from __future__ import annotations

import re
import statistics
from typing import Any, Sequence

from bench.harness.learning_runs import eval_metrics
from bench.harness.machine import describe_load

D4PG_TASK = "cartpole:balance"
# Settings both systems run: (name, policy sizes, critic sizes, batch, samples per insert).
D4PG_SETTINGS = {
    "small": ((64, 64), (64, 64), 32, 8.0),
    "acme_defaults": ((256, 256, 256), (512, 512, 256), 256, 32.0),
}
_ACME_LINE = re.compile(r"\[(Learner|Actor|Evaluator)\] (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Launchpad colours each process's lines
_ABSL_TIME = re.compile(r"\b[IWEF]\d{4} (\d\d):(\d\d):(\d\d(?:\.\d+)?)")  # absl: I1203 12:54:34.111971
DEFAULT_DQN_TASKS = "CartPole-v1,Acrobot-v1,MountainCar-v0"


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
