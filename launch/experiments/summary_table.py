"""The table printed when a run ends (`launch.actorq` and `launch.train` alike): outcome, which policy the final
figure is, throughput, weight traffic and the actors' runtime breakdown (the paper's table)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from quarl.ops.io import JSONValue


# The one clock the table shows: the run's own (summary.json's run_wall_clock_s), the clock of evaluator.csv and of
# the target rows; the launcher's wall_clock_s adds start-up and shutdown.
RUN_CLOCK_LABEL = "run clock (s)"
RUN_CLOCK_CAPTION = ("run clock: the run's own, from its start to its stop (start-up and shutdown excluded), as in "
                     "evaluator.csv; the target rows' seconds are on it")


def _solved(summary: Mapping[str, JSONValue], key: str = "solved") -> str | None:
    """"949.5 >= 950 at 22,500 actor / 5,100 learner steps, 61.0 s" (on the run clock) for the evaluation `key`
    names (`solved`, or `first_at_target`), "no" for a run with a target it missed, and says so when the run had no
    target (nothing to solve: not a missing value)."""
    if summary.get("target_return") is None:
        return "no target set (--target-return)"
    solved = summary.get(key)
    if not solved:
        return f"no (target {summary['target_return']:g})"
    learner = "" if solved.get("learner_steps") is None else f" / {solved['learner_steps']:,} learner"
    return (f"{solved['return']:.1f} >= {solved['target_return']:g} at {solved['actor_steps']:,} actor{learner} "
            f"steps, {solved['wall_clock_s']:.1f} s")


def _final_policy(summary: Mapping[str, JSONValue]) -> str | None:
    """"weights version 20,020: the version whose evaluations solved the run (...)": what the final figure and
    policy_fp32.qrlp are."""
    final = summary.get("final_policy")
    if not isinstance(final, dict) or final.get("weights_version") is None:
        return None
    return f"weights version {final['weights_version']:,}: {final.get('why') or ''}".rstrip(": ")


def _streak(summary: Mapping[str, JSONValue]) -> int:
    experiment = summary.get("experiment")
    return (summary.get("solved") or {}).get("streak", experiment.get("target_streak", 1)
                                             if isinstance(experiment, dict) else 1)


def _solved_label(summary: Mapping[str, JSONValue]) -> str:
    if summary.get("target_return") is None:
        return "solved"
    streak = _streak(summary)
    return "solved (first eval >= target)" if streak == 1 else f"solved ({streak} evals in a row >= target)"


def _target_rows(summary: Mapping[str, JSONValue]) -> list[tuple[str, JSONValue]]:
    """The stable solve, preceded by the first evaluation at the target where a streak of several is asked for."""
    rows: list[tuple[str, JSONValue]] = [(_solved_label(summary), _solved(summary))]
    if summary.get("target_return") is not None and _streak(summary) > 1:
        rows.insert(0, ("first eval >= target", _solved(summary, "first_at_target")))
    return rows


def _fmt(value: JSONValue, spec: str = ",.1f") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return format(value, spec)
    return f"{value:,}" if isinstance(value, int) else str(value)


def insert_split(summary: Mapping[str, JSONValue]) -> tuple[float | None, float | None]:
    """(seconds inserting, seconds held by the replay table's rate limiter), summed over the actors. An actor's
    `insert_s` includes the time the limiter held it; the table counts that time (`replay.insert_blocked_s`)."""
    times = [a.get("times") or {} for a in summary.get("actors") or []]
    if not times:
        return None, None
    insert = sum(float(t.get("insert_s") or 0.0) for t in times)
    held = float((summary.get("replay") or {}).get("insert_blocked_s") or 0.0)
    held = min(held, insert)
    return insert - held, held


def actor_tables(summary: Mapping[str, JSONValue]) -> list["Table"]:
    """The paper's runtime breakdown: where each actor's time went (seconds), then what one weight update cost
    it (ms). With replay, an actor's insert includes any time the replay's rate limiter held it back, and the
    "all actors" row splits that out (the table's own count of it); a run without replay (on-policy: PPO, A2C)
    has no limiter, its actors' third stage is filling the rollout buffer, and the time each stood still for the
    learner (`actors[i].learner_wait_s`) is a column of its own."""
    replay = bool(summary.get("replay"))
    if replay:
        times = Table(title="actor time (s)", caption="insert: adders + replay insert; per actor it includes the "
                                                      "rate limiter's hold, which the all-actors row splits out")
        columns: tuple[str, ...] = ("actor", "steps/s", "env", "policy", "insert", "held by the rate limiter")
    else:
        times = Table(title="actor time (s)", caption="rollout: filling the rollout buffer (no replay); waiting "
                                                      "for the learner: for its update after a rollout (newer weights,"
                                                      " room in the outbox)")
        columns = ("actor", "steps/s", "env", "policy", "rollout", "waiting for the learner")
    for col in columns:
        times.add_column(col, justify="right")
    updates = Table(title="weight updates (ms per update)")
    for col in ("actor", "updates", "pull", "deserialize", "load"):
        updates.add_column(col, justify="right")
    for a in summary.get("actors") or []:
        tm = a.get("times") or {}  # None for an actor that never reported (lost)
        name = f"{a.get('actor_id')} ({a.get('backend') or '?'})"
        cells = [name, _fmt(a.get("steps_per_s"), ",.0f"), _fmt(tm.get("env_step_s"), ".1f"),
                 _fmt(tm.get("policy_s"), ".1f"), _fmt(tm.get("insert_s"), ".1f")]
        times.add_row(*cells, "in insert" if replay else _fmt(a.get("learner_wait_s"), ".1f"))
        updates.add_row(name, _fmt(tm.get("updates")), _fmt(tm.get("pull_ms_per_update"), ".2f"),
                        _fmt(tm.get("deserialize_ms_per_update"), ".2f"), _fmt(tm.get("load_ms_per_update"), ".2f"))
    insert, held = insert_split(summary)
    if insert is not None and replay:
        summed = (summary.get("runtime") or {}).get("summed_s") or {}
        times.add_row("all actors", _fmt(summary.get("actor_steps_per_s"), ",.0f"),
                      _fmt(summed.get("env_step_s"), ".1f"), _fmt(summed.get("policy_s"), ".1f"), _fmt(insert, ".1f"),
                      _fmt(held, ".1f"))
    return [times, updates]


def on_policy_rows(summary: Mapping[str, JSONValue]) -> list[tuple[str, JSONValue]]:
    """The distributed on-policy learner's rows (`learner.on_policy` of summary.json; none for other runs): how
    it took rollouts, how it corrected for the behaviour policy, and the mismatch it saw."""
    learner = summary.get("learner")
    info = learner.get("on_policy") if isinstance(learner, Mapping) else None
    if not isinstance(info, Mapping):
        return []
    mismatch = info.get("mismatch") or {}
    lag, kl = info.get("lag_mean"), mismatch.get("kl_learner_behaviour")
    return [("rollouts (mode, correction)", f"{info.get('rollouts_trained')} ({info.get('mode')}, "
                                            f"{info.get('correction')})"),
            ("stale rollouts dropped", info.get("stale_dropped")),
            ("rollout lag (versions, mean / max)", None if lag is None else f"{lag:.2f} / {info.get('lag_max')}"),
            ("learner waiting for rollouts", None if info.get("wait_frac") is None
             else f"{100 * float(info['wait_frac']):.0f}%"),
            ("KL(learner || behaviour), mean", None if kl is None else f"{kl:.2e}")]


def print_summary(summary: Mapping[str, JSONValue]) -> None:
    """The end-of-run table: outcome, throughput, weight traffic and the per-actor time breakdown."""
    console = Console(soft_wrap=False)
    executed = summary.get("executed") or f"{summary.get('precision')} (execution not recorded)"
    head = Table(title=f"ActorQ {summary.get('agent')} on {summary.get('task')} — actors ran {executed}",
                 show_header=False, caption=RUN_CLOCK_CAPTION)
    head.add_column(style="bold")
    head.add_column(justify="right")
    payload = summary.get("payload", {})
    rows = [
        ("status", summary.get("status")),
        ("actors executed", executed),
        ("executor (CPU class)", f"{summary.get('executor') or '?'} ({summary.get('cpu_class') or '?'})"),
        ("final eval return", summary.get("final_eval_return")),
        ("final policy", _final_policy(summary)),
        ("best eval return", summary.get("best_eval_return")),
        *_target_rows(summary),
        (RUN_CLOCK_LABEL, summary.get("run_wall_clock_s")),
        ("actor steps", summary.get("actor_steps")),
        ("learner steps", summary.get("learner_steps")),
        ("actor steps/s (all actors)", summary.get("actor_steps_per_s")),
        ("learner steps/s", summary.get("learner_steps_per_s")),
        (f"payload bytes ({summary.get('precision')})", payload.get("bytes")),
        ("payload bytes (fp32)", payload.get("fp32_bytes")),
        ("weight versions published", payload.get("versions")),
        ("quantize+encode ms/version (learner)", payload.get("quantize_encode_ms_per_version")),
    ]
    rows += on_policy_rows(summary)
    energy = summary.get("energy", {}) or {}
    if energy.get("total_kwh") is not None:
        rows.append(("energy (Wh, all nodes)", 1e3 * float(energy["total_kwh"])))
    for label, value in rows:
        head.add_row(label, _fmt(value))
    console.print(head)
    actors = summary.get("actors", [])
    if actors:
        for table in actor_tables(summary):
            console.print(table)
    if summary.get("logdir"):
        console.print(f"run folder: {summary['logdir']}", soft_wrap=True)  # one line, however long: logs grep it
