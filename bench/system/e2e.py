"""End to end at the paper's setting: distributed D4PG with fp32 actors against int8 actors, same seeds.

    python -m bench.system.e2e [--num-actors N] [--seeds 0,1] [--task walker:stand] [--policy 2048,2048,2048]
        [--target-return 900] [--max-seconds 600] [--learner-device auto] [--out DIR] [--allow-busy] [--tiny]

Each arm (precision x seed) is one `launch.actorq` program on a private local Ray (or --ray-address): N actors
pinned to their own cores (`--pin-actors`), D4PG's full-size config with the given policy (the paper's 2048x3),
`backend=auto`, the learner on --learner-device. The arms of a seed alternate which precision goes first. Per
arm it reports, from the run's summary.json:

- time to the evaluation target (the first evaluation whose mean return reaches --target-return) and the actor
  steps it took; every evaluation (actor steps, seconds, return);
- env steps/s of all actors together and the learner's SGD steps/s in the program;
- where each process spends its time: per actor (mean over actors) the shares of its acting loop spent
  stepping environments, in the policy, inserting into replay (the rate limiter's waits included) and on
  weight updates; the learner's shares of its training time spent in SGD steps, waiting for samples and
  publishing; the stage times per env step and per weight update (`launch.experiments.stages`);
- where the learner ran (`summary.json`'s learner_device, read in the learner's process).

Then per seed the ratio fp32 time / int8 time to the target and int8 / fp32 env steps/s. Writes
OUT/e2e.json and OUT/e2e.md with the machine record (`bench.harness.machine`, CPU flags and package versions); the
default OUT is results/bench/<machine>/ (`gpu-<device kind>` when the learner ran on a GPU, else the CPU
class). An arm ends at the target, at --max-actor-steps, or after --max-seconds (stopped as Ctrl-C stops a
run: nodes flush and summary.json is written). Timings need a quiet machine: like every benchmark it refuses
to start above a load average of one per core unless --allow-busy. --tiny is a seconds-long smoke run
(cartpole:balance, tiny networks, one actor) for tests; its figures mean nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from bench.harness.machine import add_allow_busy, bench_machine, describe_load, finish, refuse_if_busy
from bench.harness.results_io import write_results
from quarl.ops.machine import machine_fields

PRECISIONS = ("fp32", "int8")  # fp32 is the baseline every ratio divides by
# --tiny: seconds per arm, for tests (a D4PG that learns nothing in that time; only the plumbing is checked).
TINY_OVERRIDES = {"policy_layer_sizes": (16, 16), "critic_layer_sizes": (16, 16), "num_atoms": 11,
                  "batch_size": 16, "min_replay_size": 100, "samples_per_insert": 4.0, "n_step": 3}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One benchmark: the arms' shared experiment settings."""

    task: str
    policy: tuple[int, ...]
    num_actors: int
    seeds: tuple[int, ...]
    target_return: float
    eval_every: int
    eval_episodes: int
    max_actor_steps: int
    max_seconds: float | None
    learner_device: str
    pin_actors: bool
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)


def default_actors() -> int:
    """N actors: every core but four (learner, evaluator, services and the driver), at least one."""
    return max(1, (os.cpu_count() or 1) - 4)


def tiny_setting() -> Setting:
    return Setting(task="cartpole:balance", policy=(16, 16), num_actors=1, seeds=(0,), target_return=1000.0,
                   eval_every=300, eval_episodes=1, max_actor_steps=600, max_seconds=None, learner_device="auto",
                   pin_actors=False, overrides=dict(TINY_OVERRIDES))


# --------------------------------------------------------------------------------------------- one arm


def run_arm(setting: Setting, precision: str, seed: int, logdir: Path, ray_address: str | None = None
            ) -> dict[str, Any]:
    """One program run; its summary.json reduced to what this benchmark reports."""
    from launch.experiments.config import ExperimentConfig  # pylint: disable=import-outside-toplevel
    from launch.distributed.supervisor import make_runner, run_program  # pylint: disable=import-outside-toplevel

    shutil.rmtree(logdir, ignore_errors=True)  # logs append: an earlier arm's rows must go
    overrides = {**setting.overrides, "policy_layer_sizes": tuple(setting.policy)}
    config = ExperimentConfig.create(agent="d4pg", task=setting.task, precision=precision, seed=seed, logdir=str(logdir),
                              num_actors=setting.num_actors, max_actor_steps=setting.max_actor_steps,
                              overrides=overrides, backend="auto", eval_every=setting.eval_every,
                              eval_episodes=setting.eval_episodes, target_return=setting.target_return,
                              pin_actors=setting.pin_actors, learner_device=setting.learner_device)
    timer: list[threading.Timer] = []
    fired = threading.Event()

    def stop_arm() -> None:
        fired.set()
        os.kill(os.getpid(), signal.SIGINT)

    def limit(_launch: Any) -> None:  # the time limit starts once every node is up
        if setting.max_seconds:
            t = threading.Timer(setting.max_seconds, stop_arm)
            t.daemon = True
            t.start()
            timer.append(t)

    try:
        summary, code = run_program(config, make_runner("ray", ray_address), on_launch=limit)
    finally:
        for t in timer:
            t.cancel()
    if summary["status"] == "interrupted" and not fired.is_set():
        raise KeyboardInterrupt  # the user's Ctrl-C (the arm's nodes are stopped and its logs written): stop here
    return arm_result(summary, code, precision, seed, str(logdir))


def arm_result(summary: dict[str, Any], code: int, precision: str, seed: int, logdir: str) -> dict[str, Any]:
    """What the benchmark keeps of one run's summary.json."""
    evals = _read_evals(Path(logdir))
    return {
        "precision": precision, "seed": seed, "status": summary["status"], "exit_code": code,
        "error": summary["error"],
        "stopped_by": {"completed": "target or step budget", "interrupted": "time limit"}.get(summary["status"],
                                                                                                summary["status"]),
        "time_to_target_s": summary["time_to_target_s"], "actor_steps_to_target": summary["actor_steps_to_target"],
        "best_eval_return": summary["best_eval_return"], "evaluations": evals,
        "run_wall_clock_s": summary["run_wall_clock_s"], "actor_steps": summary["actor_steps"],
        "learner_steps": summary["learner_steps"],
        "env_steps_per_s": summary["actor_steps_per_s"], "learner_steps_per_s": summary["learner_steps_per_s"],
        "backends": summary["backend"], "learner_device": summary.get("learner_device"),
        "time_shares": time_shares(summary), "per_step_us": summary["runtime"].get("per_step"),
        "per_update_ms": summary["runtime"].get("per_update"), "logdir": logdir,
    }


def _read_evals(logdir: Path) -> list[dict[str, float]]:
    from analysis.schema import read_evals  # pylint: disable=import-outside-toplevel

    return [{k: row[k] for k in ("actor_steps", "wall_clock_s", "return")}
            for row in read_evals(logdir / "evaluator.csv")]


def _share(part: Any, whole: Any) -> float | None:
    try:
        return round(float(part) / float(whole), 4) if part is not None and whole and float(whole) > 0 else None
    except (TypeError, ValueError):
        return None


ACTOR_SHARES = {"env": ("env_step_s",), "policy": ("policy_s",), "insert": ("insert_s",),
                "weights": ("pull_s", "deserialize_s", "load_s")}


def time_shares(summary: dict[str, Any]) -> dict[str, Any]:
    """Where each process spends its time, as shares of its own accounted time: per actor its stages over its
    acting loop (the mean over actors), for the learner its SGD steps, sample waits and publishing over its
    training time. Each denominator is the larger of the loop's clock and the stages' sum, since some stage
    time falls outside the loop's clock (the first weights pull before acting; the learner's first step, its
    compile, before its clock starts): shares never add up past 1. None where the summary has no figure."""
    actors = [a for a in summary.get("actors") or [] if a.get("times") and a.get("elapsed_s")]
    per_actor = []
    for a in actors:
        parts = {k: sum(float(a["times"].get(key) or 0.0) for key in keys) for k, keys in ACTOR_SHARES.items()}
        whole = max(float(a["elapsed_s"]), sum(parts.values()))
        per_actor.append({k: _share(v, whole) for k, v in parts.items()})
    out: dict[str, Any] = {"actors": {k: (round(sum(p[k] for p in per_actor) / len(per_actor), 4) if per_actor
                                          else None) for k in ACTOR_SHARES}, "learner": {}}
    known = [v for v in out["actors"].values() if v is not None]
    out["actors"]["other"] = round(max(0.0, 1.0 - sum(known)), 4) if known else None
    learner = summary.get("learner") or {}
    publish = learner.get("publish") or {}
    parts = {"sgd": learner.get("step_s"), "sample_wait": learner.get("sample_wait_s"),
             "publish": (float(publish.get("quantize_encode_s") or 0.0) + float(publish.get("put_s") or 0.0)
                         if publish else None)}
    training = learner.get("training_s")
    whole = max(float(training or 0.0), sum(float(v) for v in parts.values() if v is not None))
    out["learner"] = {**{k: _share(v, whole) for k, v in parts.items()}, "training_s": training}
    return out


# --------------------------------------------------------------------------------------------- benchmark


def compare(arms: Sequence[dict[str, Any]], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Per seed: fp32 / int8 time to the target (> 1: int8 sooner) and int8 / fp32 env steps/s."""
    out = []
    for seed in seeds:
        by = {a["precision"]: a for a in arms if a["seed"] == seed}
        if not all(p in by for p in PRECISIONS):
            continue
        fp32, int8 = by["fp32"], by["int8"]
        out.append({"seed": seed,
                    "time_to_target_fp32_over_int8": _share(fp32["time_to_target_s"], int8["time_to_target_s"]),
                    "env_steps_per_s_int8_over_fp32": _share(int8["env_steps_per_s"], fp32["env_steps_per_s"]),
                    "learner_steps_per_s_int8_over_fp32": _share(int8["learner_steps_per_s"],
                                                                  fp32["learner_steps_per_s"])})
    return out


def machine_dir(arms: Sequence[dict[str, Any]]) -> str:
    """results/bench' folder for this machine: `gpu-<device kind>` when the learner ran on a GPU (read back
    from it), else the CPU class (`quarl.runtimes.cpu.cpu_class`, e.g. x86-vnni)."""
    for arm in arms:
        device = arm.get("learner_device") or {}
        if device.get("platform") == "gpu":
            return "gpu-" + (re.sub(r"[^a-z0-9]+", "-", str(device.get("device_kind") or "gpu").lower()).strip("-")
                             or "gpu")
    from quarl.runtimes.cpu import cpu_class  # pylint: disable=import-outside-toplevel

    return cpu_class()


def record(allow_busy: bool) -> dict[str, Any]:
    """The machine record every result carries: bench.harness.machine's (CPU, its flags, cores, load, versions)."""
    return bench_machine(allow_busy)


def run(setting: Setting, logroot: Path, ray_address: str | None = None, allow_busy: bool = False
        ) -> dict[str, Any]:
    """Every arm, seeds in order, the precision that goes first alternating per seed."""
    machine = record(allow_busy)
    arms = []
    for i, seed in enumerate(setting.seeds):
        for precision in (PRECISIONS if i % 2 == 0 else PRECISIONS[::-1]):
            print(f"e2e: {precision} actors, seed {seed} ...", file=sys.stderr, flush=True)
            arm = run_arm(setting, precision, seed, logroot / f"{precision}-seed{seed}", ray_address)
            arms.append(arm)
            print(f"e2e: {precision} seed {seed}: {arm['status']}, target after {arm['time_to_target_s']} s, "
                  f"{_num(arm['env_steps_per_s'])} env steps/s, {_num(arm['learner_steps_per_s'])} SGD steps/s"
                  + (f"; {arm['error']}" if arm["error"] else ""), file=sys.stderr, flush=True)
    finish(machine)
    return {"setting": {**dataclasses.asdict(setting), "policy": list(setting.policy)}, "machine": machine,
            "arms": arms, "comparison": compare(arms, setting.seeds),
            "command": "python -m bench.system.e2e " + " ".join(sys.argv[1:])}


def _num(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{float(value):,.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    s, m = result["setting"], machine_fields(result["machine"])
    device = next((a["learner_device"] for a in result["arms"] if a.get("learner_device")), None) or {}
    lines = [f"# End to end: fp32 vs int8 actors, D4PG on {s['task']}", "",
             f"`{result['command']}`", "",
             f"{s['num_actors']} actor{'s' if s['num_actors'] != 1 else ''}"
             f"{' (pinned)' if s['pin_actors'] else ''}, policy "
             f"{'x'.join(map(str, s['policy']))}, target return {s['target_return']:g}, evaluation every "
             f"{s['eval_every']} actor steps ({s['eval_episodes']} episode{'s' if s['eval_episodes'] != 1 else ''}), "
             f"seeds {', '.join(map(str, s['seeds']))}."
             f" Learner device asked: {s['learner_device']}; ran on {device.get('platform', '?')} "
             f"({device.get('device_kind', '?')}).",
             f"Machine: {m.get('cpu_model')}, {m.get('cores')} cores, Python {m.get('python')}; "
             f"{describe_load(m)}.", "",
             "| precision | seed | stopped by | time to target (s) | actor steps to target | best return | "
             "env steps/s | learner SGD steps/s | actor: env / policy / insert / weights | "
             "learner: SGD / sample wait / publish |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|---|"]
    for a in result["arms"]:
        act, lrn = a["time_shares"]["actors"], a["time_shares"]["learner"]
        pct = lambda v: "-" if v is None else f"{100 * v:.0f}%"  # noqa: E731
        lines.append(f"| {a['precision']} | {a['seed']} | {a['stopped_by']} | {_num(a['time_to_target_s'], 1)} | "
                     f"{_num(a['actor_steps_to_target'])} | {_num(a['best_eval_return'], 1)} | "
                     f"{_num(a['env_steps_per_s'])} | {_num(a['learner_steps_per_s'], 1)} | "
                     f"{' / '.join(pct(act.get(k)) for k in ('env', 'policy', 'insert', 'weights'))} | "
                     f"{' / '.join(pct(lrn.get(k)) for k in ('sgd', 'sample_wait', 'publish'))} |")
    lines += ["", "| seed | time to target, fp32 / int8 | env steps/s, int8 / fp32 | SGD steps/s, int8 / fp32 |",
              "|---:|---:|---:|---:|"]
    for c in result["comparison"]:
        lines.append(f"| {c['seed']} | {_num(c['time_to_target_fp32_over_int8'], 2)} | "
                     f"{_num(c['env_steps_per_s_int8_over_fp32'], 2)} | "
                     f"{_num(c['learner_steps_per_s_int8_over_fp32'], 2)} |")
    lines += ["", "Shares are of each process's own loop (actors: mean over actors of stage time / acting time; "
                  "insert includes the rate limiter's waits). '-': not reached or not measured.", ""]
    return "\n".join(lines)


def write(result: dict[str, Any], out: Path) -> None:
    from quarl.ops.io import jsonable  # pylint: disable=import-outside-toplevel

    json_path, md_path = write_results(out, "e2e", jsonable(result), markdown(result))
    print(f"wrote {json_path} and {md_path}")


# --------------------------------------------------------------------------------------------- CLI


def _ints(parser: argparse.ArgumentParser, flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        parser.error(f"{flag} wants comma-separated integers, got {text!r}")
    if not values or any(v < 0 for v in values):
        parser.error(f"{flag} wants non-negative integers, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    from launch.program.devices import LEARNER_DEVICES  # pylint: disable=import-outside-toplevel

    p = argparse.ArgumentParser(prog="python -m bench.system.e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="walker:stand")
    p.add_argument("--policy", default="2048,2048,2048", help="policy layer sizes (the paper's 2048x3)")
    p.add_argument("--num-actors", type=int, default=None, help="actors, each pinned to a core (default: cores-4)")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--target-return", type=float, default=900.0)
    p.add_argument("--eval-every", type=int, default=10_000, help="actor steps between evaluations")
    p.add_argument("--eval-episodes", type=int, default=2)
    p.add_argument("--max-actor-steps", type=int, default=1_000_000)
    p.add_argument("--max-seconds", type=float, default=900.0, help="stop an arm after this long (0: no limit)")
    p.add_argument("--learner-device", default="auto", choices=LEARNER_DEVICES)
    p.add_argument("--no-pin", action="store_true", help="do not pin the actors to cores")
    p.add_argument("--ray-address", default=None, help="run the arms on this Ray cluster (default: local)")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default: results/bench/<machine>; runs/bench/e2e-tiny with --tiny)")
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run (figures mean nothing)")
    add_allow_busy(p)
    args = p.parse_args(argv)
    if args.tiny:
        setting = dataclasses.replace(tiny_setting(), learner_device=args.learner_device)
    else:
        for flag, value in (("--num-actors", args.num_actors), ("--eval-every", args.eval_every),
                            ("--eval-episodes", args.eval_episodes), ("--max-actor-steps", args.max_actor_steps)):
            if value is not None and value < 1:
                p.error(f"{flag} must be a positive integer, got {value}")
        if args.max_seconds < 0:
            p.error(f"--max-seconds must be >= 0, got {args.max_seconds}")
        setting = Setting(task=args.task, policy=_ints(p, "--policy", args.policy),
                          num_actors=args.num_actors or default_actors(), seeds=_ints(p, "--seeds", args.seeds),
                          target_return=args.target_return, eval_every=args.eval_every,
                          eval_episodes=args.eval_episodes, max_actor_steps=args.max_actor_steps,
                          max_seconds=args.max_seconds or None, learner_device=args.learner_device,
                          pin_actors=not args.no_pin)
    if not args.tiny:
        refuse_if_busy(p, args.allow_busy)
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out} exists and is not a directory")
    logroot = Path("runs/bench/e2e-tiny" if args.tiny else "runs/bench/e2e")
    result = run(setting, logroot / "runs", args.ray_address, allow_busy=args.allow_busy or args.tiny)
    out = args.out or (Path("runs/bench/e2e-tiny") if args.tiny
                       else Path("results/bench") / machine_dir(result["arms"]))
    write(result, out)
    return 0 if all(a["status"] != "failed" for a in result["arms"]) else 1


if __name__ == "__main__":
    sys.exit(main())
