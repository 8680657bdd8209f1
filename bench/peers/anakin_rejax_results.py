"""`bench.peers.anakin_rejax`'s page and targets: per case the env steps/s of each system at each seed count, ours
over rejax's, the compile seconds, the final returns, and whether issue 47's speed targets hold."""
from __future__ import annotations

import statistics
from typing import Any, Sequence

from bench.harness.machine import describe_cpu, describe_load
from bench.peers.anakin_rejax_settings import set_value

MINATAR_PPO_TARGET = 12_000.0  # env steps/s, PPO on MinAtar Breakout, int8 actors, 1 seed
# The rejax row a case's ratio is taken against: its own, or for our conv torso the MLP peer of the same algorithm.
PEER_CASE = {"ppo-breakout-conv": "ppo-breakout", "dqn-breakout-conv": "dqn-breakout"}


def _ok(row: dict[str, Any] | None) -> bool:
    return row is not None and "failed" not in row and row.get("env_steps_per_s") is not None


def peer_row(rows: Sequence[dict[str, Any]], case: str, seeds: int) -> dict[str, Any] | None:
    """The rejax row `case` at `seeds` seeds is measured against (None: none ran, or it failed)."""
    name = PEER_CASE.get(case, case)
    found = next((r for r in rows if r["case"] == name and r["seeds"] == seeds and r["system"] == "rejax"), None)
    return found if _ok(found) else None


def ratio(rows: Sequence[dict[str, Any]], row: dict[str, Any]) -> float | None:
    """Ours over rejax's env steps/s (None for rejax's own row, or where either is missing)."""
    peer = peer_row(rows, row["case"], row["seeds"])
    if row["system"] == "rejax" or not _ok(row) or peer is None:
        return None
    return row["env_steps_per_s"] / peer["env_steps_per_s"]


def target_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 47's targets, one row per measurement they apply to: at least rejax's env steps/s with the same network
    (each of our precisions, every seed count), and PPO on MinAtar Breakout at >= 12k env steps/s with int8 actors
    at 1 seed (on both our networks)."""
    out = []
    for row in rows:
        if row["system"] == "rejax":
            continue
        rate = row.get("env_steps_per_s") if _ok(row) else None
        if row["case"] not in PEER_CASE:
            peer = peer_row(rows, row["case"], row["seeds"])
            if peer is not None:
                need = peer["env_steps_per_s"]
                out.append({"target": "at least rejax's env steps/s", "case": row["case"], "seeds": row["seeds"],
                            "system": row["system"], "env_steps_per_s": rate, "needed": need,
                            "holds": rate is not None and rate >= need})
        if row["case"].startswith("ppo-breakout") and row["seeds"] == 1 and row["system"] == "ours int8":
            out.append({"target": "PPO Breakout >= 12k env steps/s, int8, 1 seed", "case": row["case"], "seeds": 1,
                        "system": row["system"], "env_steps_per_s": rate, "needed": MINATAR_PPO_TARGET,
                        "holds": rate is not None and rate >= MINATAR_PPO_TARGET})
    return out


def _num(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _finals(values: Sequence[float | None] | None) -> str:
    vals = [v for v in values or [] if v is not None]
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:.1f}"
    return f"{statistics.fmean(vals):.1f} [{min(vals):.1f}, {max(vals):.1f}]"


def _clock(row: dict[str, Any]) -> str:
    if "failed" in row:
        return "—"
    if row["system"] == "rejax":
        return f"compile {row['compile_s']:.1f}; train {row['train_s']:.1f}"
    return f"init {row['init_s']:.1f}; first chunk {row['first_chunk_s']:.1f}"


def results_table(result: dict[str, Any]) -> list[str]:
    rows = result["rows"]
    lines = ["| case | seeds | system | env steps/s (all seeds) | ours / rejax | seconds outside the rate | "
             "final return per seed: mean [min, max] | process s |", "|---|---:|---|---:|---:|---|---:|---:|"]
    for row in rows:
        r = ratio(rows, row)
        peer_note = " (rejax's MLP)" if r is not None and row["case"] in PEER_CASE else ""
        rate = "FAILED" if "failed" in row else _num(row.get("env_steps_per_s"))
        lines.append(f"| {row['case']} | {row['seeds']} | {row['system']} | {rate} | "
                     f"{'—' if r is None else f'{r:.2f}x{peer_note}'} | {_clock(row)} | "
                     f"{_finals(row.get('final_returns'))} | {_num(row.get('process_wall_s'), 1)} |")
    return lines


def targets_table(targets: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| target | case | seeds | ours | ours env steps/s | needed | holds |", "|---|---|---:|---|---:|---:|---|"]
    for t in targets:
        lines.append(f"| {t['target']} | {t['case']} | {t['seeds']} | {t['system']} | {_num(t['env_steps_per_s'])} | "
                     f"{_num(t['needed'])} | {'yes' if t['holds'] else 'NO'} |")
    return lines


def settings_section(result: dict[str, Any]) -> list[str]:
    lines = ["## Settings per case", ""]
    for name, s in result["settings"].items():
        lines += [f"### {name}: {s['algo'].upper()} on {s['task']} ({s['torso']} network), "
                  f"{s['steps_per_seed']:,} env steps per seed", ""]
        if s["rejax"] is not None:
            lines.append("rejax (`run.py --set`, over its preset): `" + ", ".join(
                f"{k}={v}" for k, v in s["rejax"].items()) + "`")
        else:
            lines.append("rejax: no row of its own (its MLP row of the same algorithm is the reference).")
        ours = [f"{k} {v}" for k, v in s["ours"]["flags"].items()] + [f"--set {k}={set_value(v)}"
                                                                       for k, v in s["ours"]["sets"].items()]
        lines += ["", "ours (`launch.anakin`, over its task preset): `" + " ".join(ours) + "`", "",
                  "What differs:", ""] + [f"- {d}" for d in s["differences"]] + [""]
    return lines


def markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    quick = " A --quick smoke run: its timings mean nothing." if result.get("quick") else ""
    lines = ["# The jitted trainer (launch.anakin) beside rejax 0.1.3, measured in one run", "",
             f"`{result['command']}` on {describe_cpu(machine)}, {describe_load(machine)}.{quick}", "",
             "Each system in a process of its own, one at a time, alternating which goes first. rejax's rate is its "
             "budget over all seeds divided by its timed, compiled run (`train`; its compile is timed apart), whose "
             "one evaluation (128 episodes at the end) is inside it. Ours is the rate launch.anakin records "
             f"(env_steps_per_s_all_seeds): the env steps of the chunks after the first of {result['chunks']}, which "
             "holds the compiles, over those chunks' own time; the evaluations (greedy, "
             f"{result['eval_episodes']} episodes after each chunk) are left out. The final return is each system's "
             "last evaluation per seed (rejax: acting as in training; ours: greedy), so a fast run that learned "
             "nothing shows; Breakout's returns differ in their environments too (see the settings).", "",
             *results_table(result), "", "## Targets (project issue 47, item 3)", ""]
    lines += targets_table(result["targets"]) if result["targets"] else ["No target applies to the cases run."]
    failed = [r for r in result["rows"] if "failed" in r]
    if failed:
        lines += ["", "Failed runs:", ""] + [f"- {r['case']} x{r['seeds']} {r['system']}: {r['failed'][:300]} "
                                              f"(log {r['log']})" for r in failed]
    return "\n".join(lines + [""] + settings_section(result))
