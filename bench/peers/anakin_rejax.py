"""The jitted trainer (`launch.anakin`) beside rejax 0.1.3, on the same tasks and settings, one after the other on
this machine: env steps per second at 1 and 10 vmapped seeds (project issue 47, item 3).

    python -m bench.peers.anakin_rejax [--cases ppo-cartpole,dqn-cartpole,...] [--seeds 1,10] [--steps N]
        [--precisions int8,fp32] [--eval-episodes 128] [--rejax-python PY] [--anchors DIR] [--out DIR]
        [--quick] [--allow-busy]

Cases (`bench.peers.anakin_rejax_settings.CASES`): PPO and DQN on CartPole-v1 and MinAtar Breakout with rejax's
presets translated into `launch.anakin --set` keys (the same 64x64 networks; what has no counterpart is listed on
the page), and ours alone with the MinAtar conv torso. Per case and seed count, one job at a time, in alternating
order (rejax first, then ours at each precision; the other way round on the next), each a process of its own: rejax
through `../shared/anchors/rejax/run.py` in its venv (--rejax-python or $QUARL_REJAX_PYTHON), ours through
`launch.anakin` with seeds 0..S-1.

Clocks. rejax: run.py compiles the vmapped train apart (`compile`), then times the whole compiled run (`train`),
its one evaluation (128 episodes, at the end: eval_freq = the budget, the initial one skipped) included; its rate
is budget x seeds / train. Ours: the rate launch.anakin records (`learner.anakin.env_steps_per_s_all_seeds`: the env
steps over all seeds of the chunks after the first of CHUNKS, which holds the compiles, over those chunks' own time;
evaluations excluded), and the first chunk's and the initialisation's seconds apart.
Both report the final evaluation's mean return per seed, so a fast run that learned nothing shows.

Timings mean something only on an otherwise idle machine: like every benchmark it refuses a busy one unless
--allow-busy and records the load at start and end. The full run writes results/bench/anakin_rejax.{json,md};
--quick (1 seed, a few thousand steps per case, a quarter of the budget as DQN's replay fill) writes to
runs/bench/anakin_rejax-quick.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from bench.harness.learning_runs import REPO, empty_run_dir
from bench.harness.machine import add_allow_busy, bench_machine, finish, refuse_if_busy
from bench.harness.results_io import command_line, write_results
from bench.harness.subprocess_runs import run_subprocess
from bench.peers.anakin_rejax_results import markdown, target_rows
from bench.peers.anakin_rejax_settings import (
    CASES, CHUNKS, Case, quick_fill, rejax_overrides, rejax_settings, set_arguments, translate,
)
from quarl.quant.precision import precision_list_arg

RUN_TIMEOUT_S = 3600.0
NAME = "anakin_rejax"
# run.py's closing line (../shared/anchors/rejax/run.py).
REJAX_LINE = re.compile(
    r"^# rejax (?P<algo>\w+) (?P<env>\S+) (?P<steps>\d+) steps x (?P<seeds>\d+) seed\(s\), jax (?P<jax>\S+) "
    r"(?P<platform>\w+): compile (?P<compile>[\d.]+) s, train (?P<train>[\d.]+) s \((?P<rate>[\d,.]+) env steps/s "
    r"over all seeds\); final greedy return per seed \[(?P<finals>[^\]]*)\]\s*$", re.M)


def parse_rejax_line(text: str) -> dict[str, Any]:
    """run.py's output -> its figures; ValueError when the closing line is not there (the run failed)."""
    found = list(REJAX_LINE.finditer(text))
    if not found:
        raise ValueError("no '# rejax ... final greedy return per seed [...]' line in rejax's output")
    m = found[-1]
    finals = [float(x) for x in m["finals"].split(",") if x.strip()]
    return {"algo": m["algo"], "env": m["env"], "steps": int(m["steps"]), "seeds": int(m["seeds"]),
            "jax": m["jax"], "platform": m["platform"], "compile_s": float(m["compile"]),
            "train_s": float(m["train"]), "env_steps_per_s": float(m["rate"].replace(",", "")),
            "final_returns": finals}


def rejax_command(args: argparse.Namespace, case: Case, seeds: int, steps: int) -> list[str]:
    fill = quick_fill(case, steps) if args.quick else None
    return [args.rejax_python, str(args.anchors / "rejax" / "run.py"), "--algo", case.algo, "--env", case.rejax_env,
            "--steps", str(steps), "--seeds", str(seeds), "--set", *set_arguments(rejax_overrides(case, steps, fill))]


def our_command(args: argparse.Namespace, case: Case, seeds: int, steps: int, precision: str,
                out: Path) -> list[str]:
    fill = quick_fill(case, steps) if args.quick else None
    return [sys.executable, "-m", "launch.anakin", "--agent", case.algo, "--task", case.task,
            "--seeds", "0" if seeds == 1 else f"0-{seeds - 1}", "--precision", precision, "--steps", str(steps),
            "--eval-every", str(steps // CHUNKS), "--eval-episodes", str(args.eval_episodes), "--out", str(out),
            "--no-progress", *translate(case, steps, fill).arguments()]


def read_ours(out: Path, seeds: int) -> dict[str, Any]:
    """launch.anakin's figures from its seed folders' summary.json (each carries the run-wide `anakin` record)."""
    summaries = [json.loads((out / f"seed{s}" / "summary.json").read_text(encoding="utf-8")) for s in range(seeds)]
    facts = summaries[0]["learner"]["anakin"]
    return {"env_steps_per_s": facts["env_steps_per_s_all_seeds"], "first_chunk_s": facts["first_chunk_s"],
            "init_s": facts["init_s"], "env_steps": summaries[0]["actor_steps"],
            "final_returns": [s["final_eval_return"] for s in summaries],
            "statuses": sorted({s["status"] for s in summaries}), "executed": summaries[0].get("executed")}


def run_one(args: argparse.Namespace, case: Case, seeds: int, system: str) -> dict[str, Any]:
    """One system on one case at `seeds` seeds: a result row (with `failed` and the log's tail where it failed)."""
    steps = case.budget(args.steps or (case.quick_steps if args.quick else case.steps))
    tag = f"{case.name}-s{seeds}-{system}"
    log = args.work / "logs" / f"{tag}.log"
    row: dict[str, Any] = {"case": case.name, "seeds": seeds, "system": system, "steps_per_seed": steps,
                           "log": str(log)}
    if system == "rejax":
        cmd = rejax_command(args, case, seeds, steps)
    else:
        out = empty_run_dir(args.work / "runs" / tag)
        cmd = our_command(args, case, seeds, steps, system.split()[-1], out)
    code, text, wall = run_subprocess(cmd, log, RUN_TIMEOUT_S, REPO)
    row.update(exit_code=code, process_wall_s=round(wall, 1))
    try:
        if code != 0:
            raise ValueError(f"exited {code}")
        row.update(parse_rejax_line(text) if system == "rejax" else read_ours(out, seeds))
    except (ValueError, OSError, KeyError) as e:
        row["failed"] = f"{e}; log tail: {text[-600:]}"
    print(f"[bench.peers.anakin_rejax] {case.name} x{seeds} {system}: "
          f"{row.get('env_steps_per_s', 'FAILED')} env steps/s, finals {row.get('final_returns')}", flush=True)
    return row


def systems_for(case: Case, precisions: Sequence[str]) -> list[str]:
    return (["rejax"] if case.peer else []) + [f"ours {p}" for p in precisions]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.peers.anakin_rejax", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--seeds", default=None, help="seed counts, each vmapped in one run (default 1,10; 1 with --quick)")
    p.add_argument("--steps", type=int, default=None,
                   help="env steps per seed for every case (default per case; rounded up to whole rollouts x "
                        f"{CHUNKS} chunks)")
    p.add_argument("--precisions", default="int8,fp32", type=precision_list_arg("actor"), help="our actors'")
    p.add_argument("--eval-episodes", type=int, default=None, help="ours per evaluation (default 128, as rejax; "
                                                                   "8 with --quick)")
    p.add_argument("--rejax-python", default=os.environ.get("QUARL_REJAX_PYTHON"),
                   help="interpreter of the rejax venv (../shared/anchors/rejax/README.md); $QUARL_REJAX_PYTHON")
    p.add_argument("--anchors", type=Path, default=REPO.parent / "shared" / "anchors")
    p.add_argument("--out", type=Path, default=None, help="results folder (default results/bench; quick: "
                                                          "runs/bench/anakin_rejax-quick)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 seed, a few thousand steps per case")
    add_allow_busy(p)
    args = p.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in args.cases if c not in CASES]
    if unknown or not args.cases:
        p.error(f"--cases: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(CASES)}")
    try:
        args.seeds = [int(s) for s in (args.seeds or ("1" if args.quick else "1,10")).split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds wants comma-separated seed counts like 1,10, got {args.seeds!r}")
    if not args.seeds or min(args.seeds) < 1 or (args.steps is not None and args.steps < 1):
        p.error("--seeds counts and --steps must be positive")
    args.eval_episodes = args.eval_episodes or (8 if args.quick else 128)
    if args.eval_episodes < 1:
        p.error("--eval-episodes must be positive")
    if any(CASES[c].peer for c in args.cases):
        if not args.rejax_python or not os.access(args.rejax_python, os.X_OK):
            p.error(f"--rejax-python must name the rejax venv's python (got {args.rejax_python!r}); build it as "
                    f"{args.anchors}/rejax/README.md says")
        if not (args.anchors / "rejax" / "run.py").is_file():
            p.error(f"{args.anchors / 'rejax' / 'run.py'} not found; pass --anchors DIR")
    args.out = args.out or REPO / ("runs/bench/anakin_rejax-quick" if args.quick else "results/bench")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out} exists and is not a directory")
    args.work = args.out if args.quick else REPO / "runs" / "bench" / NAME
    refuse_if_busy(p, args.allow_busy)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    result: dict[str, Any] = {"command": command_line("bench.peers.anakin_rejax", argv),
                              "machine": bench_machine(args.allow_busy), "quick": args.quick, "chunks": CHUNKS,
                              "eval_episodes": args.eval_episodes, "settings": {}, "rows": []}
    index = 0
    for name in args.cases:
        case = CASES[name]
        steps = case.budget(args.steps or (case.quick_steps if args.quick else case.steps))
        fill = quick_fill(case, steps) if args.quick else None
        tr = translate(case, steps, fill)
        result["settings"][name] = {"task": case.task, "rejax_env": case.rejax_env, "algo": case.algo,
                                    "torso": case.torso, "steps_per_seed": steps,
                                    "rejax": rejax_settings(case, steps, fill) if case.peer else None,
                                    "ours": {"flags": tr.flags, "sets": tr.sets}, "differences": tr.differences}
        for seeds in args.seeds:
            systems = systems_for(case, args.precisions)
            for system in systems if index % 2 == 0 else systems[::-1]:
                result["rows"].append(run_one(args, case, seeds, system))
            index += 1
    finish(result["machine"])
    result["targets"] = target_rows(result["rows"])
    json_path, md_path = write_results(args.out, NAME, result, markdown(result), default=str)
    print(f"[bench.peers.anakin_rejax] wrote {json_path} and {md_path}", flush=True)
    failed = [r for r in result["rows"] if "failed" in r]
    for r in failed:
        print(f"bench.peers.anakin_rejax: {r['case']} x{r['seeds']} {r['system']} failed: {r['failed'][:200]}",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
