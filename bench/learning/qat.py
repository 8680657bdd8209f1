"""Quantization-aware training vs post-training quantization at low bit widths (DQN, CartPole-v1).

    python -m bench.learning.qat [--quick] [--out DIR] [--seeds N] [--steps N] [--bits 2,3,4] [--allow-busy]

For each training seed:

* PTQ, selected at int<B> (the like-for-like baseline): train DQN in fp32 (fp32 actors) with
  `launch.experiments.run_experiment.run_experiment`; of its checkpoints, keep the one with the best int<B> selection return,
  quantize it to int<B> (`quantize_params`) and evaluate it deployed.
* QAT, for each B: train with `DQNConfig(qat_bits=B)` and int<B> actors (the learner optimises the network the
  actors run); keep the checkpoint with the best int<B> selection return; evaluate it deployed.
* PTQ, selected at fp32 (reported alongside): the fp32 run's checkpoint with the best *fp32* selection return,
  quantized, i.e. what "quantize the best fp32 policy" gives.

QAT and the like-for-like PTQ arm are picked by the same criterion (`CheckpointSelector`): mean return at the
deployed precision over `SELECT_EPISODES` greedy episodes on fixed selection seeds, at every evaluation point.
Why checkpoint selection: DQN on CartPole is famously unstable late in training (the final network of a run
can be far worse than its best), which would make the comparison mostly noise. Reported returns come from
other, disjoint test seeds (`TEST_SEED_BASE`), the same episodes for every arm and bit width
(`quarl.acting.evaluation.evaluate_seeds`), so the selection does not bias them. Every deployed evaluation runs the
jax runtime (AQT W<B>A8, the numerics QAT trains with).

Verdict per bit width, against each PTQ arm: "QAT better" / "PTQ better" when the difference of mean returns
exceeds two standard errors of the difference of per-seed means, else "no clear difference" (a crude test
with few seeds; the per-seed means are in the JSON).

Defaults: the full run (5 seeds, 30k env steps per run, bits 2,3,4; ~20 min on 2 idle cores) writes results/bench/qat.{json,md,png}
(committed); --quick (1 seed, 8k steps, bits 2 and 4) writes to runs/bench/qat-quick.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench.harness.machine import bench_machine, describe_load, finish
from bench.harness.results_io import save_figure, write_json_sorted, write_text
from quarl.ops.machine import machine_fields
from quarl.quant.precision import parse_bit_list

TASK = "CartPole-v1"
HIDDEN = (64, 64)
SELECT_SEED_BASE, SELECT_EPISODES = 50_000, 5
TEST_SEED_BASE = 100_000
DEFAULT_SEEDS = 5
DEFAULT_STEPS = 30_000  # 5 seeds x (1 fp32 + 3 QAT) runs fit ~20 min on 2 idle cores


def selection_seeds() -> range:
    """Episode seeds that pick checkpoints; disjoint from `eval_seeds` so selection cannot bias the test."""
    return range(SELECT_SEED_BASE, SELECT_SEED_BASE + SELECT_EPISODES)


def eval_seeds(episodes: int) -> range:
    """Episode seeds of the reported evaluation, the same for every arm and bit width."""
    if episodes > TEST_SEED_BASE - SELECT_SEED_BASE:  # (cannot happen with the CLI's limits; kept as a guard)
        raise ValueError("too many test episodes: test seeds would overlap the selection seeds")
    return range(TEST_SEED_BASE, TEST_SEED_BASE + episodes)


class CheckpointSelector:
    """Keeps, for each deployed precision, the checkpoint with the best selection return at that precision.

    `score(params, precision)` is the mean return of `params` deployed at `precision` on the selection
    episodes. The same selector picks QAT's and PTQ's checkpoints, so both arms face one criterion. Ties keep
    the earlier checkpoint.
    """

    def __init__(self, precisions: Sequence[str], score: Callable[[Any, str], float]):
        self.score = score
        self.best: dict[str, dict[str, Any]] = {p: {"return": -np.inf, "actor_steps": None, "params": None}
                                                 for p in precisions}

    def observe(self, actor_steps: int, params: Any) -> None:
        for precision, best in self.best.items():
            value = float(self.score(params, precision))
            if value > best["return"]:
                self.best[precision] = {"return": value, "actor_steps": int(actor_steps), "params": params}


@dataclasses.dataclass(frozen=True)
class Plan:
    seeds: int
    steps: int
    eval_every: int
    test_episodes: int
    bits: tuple[int, ...]
    out: Path
    quick: bool
    allow_busy: bool = False


def parse_args(argv: Sequence[str] | None) -> Plan:
    from bench.harness.machine import add_allow_busy, refuse_if_busy  # pylint: disable=import-outside-toplevel
    from launch.cli import OneLineArgumentParser  # pylint: disable=import-outside-toplevel

    parser = OneLineArgumentParser(prog="python -m bench.learning.qat", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 8k steps, bits 2,4 (a smoke run)")
    parser.add_argument("--out", default=None, help="output directory (default results/bench, or "
                        "runs/bench/qat-quick with --quick)")
    parser.add_argument("--seeds", type=int, default=None, help=f"training seeds per arm (default {DEFAULT_SEEDS})")
    parser.add_argument("--steps", type=int, default=None, help="env steps per training run")
    parser.add_argument("--episodes", type=int, default=None, help="test episodes per policy")
    parser.add_argument("--bits", default=None, help="comma-separated weight bit widths in [2, 8]")
    parser.add_argument("--report-only", action="store_true", help="redraw OUT/qat.png from OUT/qat.json, no training")
    add_allow_busy(parser)
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    seeds = args.seeds if args.seeds is not None else (1 if quick else DEFAULT_SEEDS)
    steps = args.steps if args.steps is not None else (8_000 if quick else DEFAULT_STEPS)
    episodes = args.episodes if args.episodes is not None else (5 if quick else 20)
    for flag, value in (("--seeds", seeds), ("--steps", steps), ("--episodes", episodes)):
        if value <= 0:
            parser.error(f"{flag} must be a positive integer, got {value}")
    if episodes > 10_000:
        parser.error(f"--episodes must be at most 10000, got {episodes}")
    try:
        bits = parse_bit_list(args.bits or ("2,4" if quick else "2,3,4"), "kernel")
    except ValueError as e:
        parser.error(f"--bits: {e}")
    out = Path(args.out) if args.out else Path("runs/bench/qat-quick" if quick else "results/bench")
    refuse_if_busy(parser, args.allow_busy)
    return Plan(seeds, steps, max(1000, steps // 16), episodes, bits, out, quick, args.allow_busy)


def _capture_learner(builder: Any, holder: dict[str, Any]) -> None:
    """run_experiment builds the learner inside (its `on_builder` hook calls this): keep a handle in `holder` so
    evaluations can snapshot its params."""
    make = builder.make_learner

    def make_learner(env_spec: Any, seed: int, **run: Any) -> Any:
        holder["learner"] = make(env_spec, seed, **run)
        return holder["learner"]

    builder.make_learner = make_learner


_POLICIES: dict[tuple[Any, str], Any] = {}  # one compiled greedy policy per (spec, precision); weights swap


def _returns(spec: Any, params: dict, precision: str, seeds: Sequence[int]) -> np.ndarray:
    """Greedy undiscounted returns of `params` deployed at `precision` (jax runtime), one episode per seed."""
    from quarl.envs.spec import environment_spec
    from quarl.envs.factory import make_environment  # pylint: disable=import-outside-toplevel
    from quarl.acting.evaluation import evaluate_seeds, make_greedy_policy  # pylint: disable=import-outside-toplevel
    from quarl.quant.quantization import quantize_params  # pylint: disable=import-outside-toplevel

    qparams = quantize_params(params, precision)
    policy = _POLICIES.get((spec, precision))
    if policy is None:
        action_spec = environment_spec(make_environment(TASK, 0)).action_spec
        policy = _POLICIES[(spec, precision)] = make_greedy_policy(spec, qparams, action_spec, backend="jax")
    else:
        policy.executor.update(qparams)
    return evaluate_seeds(TASK, policy, list(seeds)).returns


def train(plan: Plan, seed: int, qat_bits: int | None, select_precisions: Sequence[str]) -> dict[str, Any]:
    """One training run; returns the best checkpoint (by selection return) for each of `select_precisions`."""
    from launch.experiments.run_experiment import run_experiment  # pylint: disable=import-outside-toplevel
    from launch.experiments.config import ExperimentConfig  # pylint: disable=import-outside-toplevel

    holder: dict[str, Any] = {}
    spec_box: dict[str, Any] = {}
    selector = CheckpointSelector(select_precisions, lambda params, precision: float(np.mean(
        _returns(spec_box["spec"], params, precision, selection_seeds()))))

    def on_eval(row: dict[str, Any]) -> None:
        learner = holder["learner"]
        spec_box.setdefault("spec", learner.spec)
        selector.observe(int(row["actor_steps"]), learner.policy_params())

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as logdir:
        config = ExperimentConfig(agent="dqn", task=TASK, precision="fp32" if qat_bits is None else f"int{qat_bits}",
                                  backend="jax", max_actor_steps=plan.steps, seed=seed, logdir=logdir,
                                  eval_every=plan.eval_every, eval_episodes=1,
                                  overrides={"hidden_sizes": HIDDEN, "qat_bits": qat_bits})
        summary = run_experiment(config, progress=False, energy=False, on_eval=on_eval,
                                 on_builder=lambda builder: _capture_learner(builder, holder))
    return {"spec": spec_box["spec"], "best": selector.best, "wall_s": time.perf_counter() - t0,
            "learner_steps": summary["learner_steps"], "actor_steps": summary["actor_steps"]}


def _stats(returns_by_seed: list[np.ndarray]) -> dict[str, Any]:
    flat = np.concatenate(returns_by_seed)
    seed_means = [float(np.mean(r)) for r in returns_by_seed]
    return {"mean": float(np.mean(flat)), "std": float(np.std(flat)), "seed_means": seed_means,
            "episodes": int(flat.size)}


def verdict(qat: dict[str, Any], ptq: dict[str, Any]) -> dict[str, Any]:
    """QAT minus PTQ mean return, its standard error over seeds, and which arm is ahead by more than 2 SE."""
    diff = qat["mean"] - ptq["mean"]
    n = len(qat["seed_means"])
    se = float(np.sqrt(np.var(qat["seed_means"], ddof=1) / n + np.var(ptq["seed_means"], ddof=1) / n)) \
        if n > 1 else float("nan")
    if n < 2:
        better = None  # one seed: no spread to judge against
    else:
        better = "qat" if diff > 2 * se else "ptq" if -diff > 2 * se else "neither"
    return {"qat_minus_ptq": diff, "se": se, "better": better}


def run(plan: Plan) -> dict[str, Any]:
    tests = eval_seeds(plan.test_episodes)
    int_precisions = [f"int{b}" for b in plan.bits]
    ptq: dict[str, list[np.ndarray]] = {p: [] for p in int_precisions}
    ptq_best: dict[str, list[np.ndarray]] = {p: [] for p in int_precisions}
    qat: dict[str, list[np.ndarray]] = {p: [] for p in int_precisions}
    fp32_returns: list[np.ndarray] = []
    runs: list[dict[str, Any]] = []
    machine = bench_machine(plan.allow_busy)  # its versions include jax and aqtp
    start = time.perf_counter()
    for seed in range(plan.seeds):
        res = train(plan, seed, None, ["fp32", *int_precisions])
        best_fp32 = res["best"]["fp32"]
        fp32_returns.append(_returns(res["spec"], best_fp32["params"], "fp32", tests))
        row = {"arm": "fp32", "seed": seed, "wall_s": round(res["wall_s"], 1),
               "selected_at_step": best_fp32["actor_steps"], "fp32_test_mean": float(fp32_returns[-1].mean())}
        for p in int_precisions:
            ptq[p].append(_returns(res["spec"], best_fp32["params"], p, tests))
            cand = res["best"][p]
            ptq_best[p].append(_returns(res["spec"], cand["params"], p, tests))
            row[f"ptq_fp32_selected_{p}_test_mean"] = float(ptq[p][-1].mean())
            row[f"ptq_{p}_selected_at_step"] = cand["actor_steps"]
            row[f"ptq_{p}_test_mean"] = float(ptq_best[p][-1].mean())
        runs.append(row)
        print(f"[bench.learning.qat] fp32 seed {seed}: {json.dumps(row)}", flush=True)
        for b, p in zip(plan.bits, int_precisions):
            res = train(plan, seed, b, [p])
            qat[p].append(_returns(res["spec"], res["best"][p]["params"], p, tests))
            row = {"arm": f"qat{b}", "seed": seed, "wall_s": round(res["wall_s"], 1),
                   "selected_at_step": res["best"][p]["actor_steps"], f"{p}_test_mean": float(qat[p][-1].mean())}
            runs.append(row)
            print(f"[bench.learning.qat] qat int{b} seed {seed}: {json.dumps(row)}", flush=True)
    table = []
    for b, p in zip(plan.bits, int_precisions):
        q, pt, pb = _stats(qat[p]), _stats(ptq[p]), _stats(ptq_best[p])
        table.append({"bits": b, "ptq_selected_at_intB": pb, "ptq_selected_at_fp32": pt, "qat": q,
                      "vs_ptq_selected_at_intB": verdict(q, pb), "vs_ptq_selected_at_fp32": verdict(q, pt)})
    return {
        "task": TASK, "agent": "dqn", "hidden": list(HIDDEN), "quick": plan.quick, "seeds": plan.seeds,
        "steps_per_run": plan.steps, "eval_every": plan.eval_every, "select_episodes": SELECT_EPISODES,
        "select_seeds": [selection_seeds().start, selection_seeds().stop],
        "test_episodes": plan.test_episodes, "test_seeds": [tests.start, tests.stop],
        "backend": "jax", "fp32": _stats(fp32_returns), "table": table, "runs": runs,
        "wall_clock_s": round(time.perf_counter() - start, 1), "machine": finish(machine),
    }


_VERDICT = {"qat": "**QAT**", "ptq": "**PTQ**", "neither": "neither", None: "n/a (1 seed)"}


def _fmt(s: dict[str, Any]) -> str:
    return f"{s['mean']:.1f} ± {s['std']:.1f}"


def _diff(v: dict[str, Any]) -> str:
    return f"{v['qat_minus_ptq']:+.1f} (± {2 * v['se']:.1f})"


def outcome(table: Sequence[dict[str, Any]], key: str) -> dict[str, list[str]]:
    """Bit widths grouped by which arm is ahead by more than 2 SE (`key`: which PTQ arm QAT is compared with)."""
    groups: dict[str, list[str]] = {"qat": [], "ptq": [], "neither": []}
    for row in table:
        better = row[key]["better"]
        if better is not None:
            groups[better].append(f"int{row['bits']}")
    return groups


def write_markdown(path: Path, result: dict[str, Any]) -> str:
    seeds = result["seeds"]
    lines = [
        "# QAT vs PTQ: DQN on CartPole-v1",
        "",
        f"`python -m bench.learning.qat{' --quick' if result['quick'] else ''}`: {seeds} training seed(s) per arm "
        f"(seeds 0-{seeds - 1}), {result['steps_per_run']} env steps per run, Q-network {result['hidden']} "
        f"(ReLU). Returns are mean ± std over {seeds} seeds x {result['test_episodes']} seeded test episodes "
        f"(max 500), deployed on the jax runtime (AQT, W<B>A8). fp32 policy (PTQ source, checkpoint picked at "
        f"fp32): {_fmt(result['fp32'])}.",
        "",
        "Checkpoints are picked by the return at the deployed precision on "
        f"{result['select_episodes']} held-out selection episodes (seeds {result['select_seeds'][0]}.."
        f"{result['select_seeds'][1] - 1}, disjoint from the test seeds): QAT's from its int-B run, PTQ's "
        "from the fp32 run (**PTQ @int-B**, the like-for-like baseline). **PTQ @fp32** quantizes the fp32 run's "
        "checkpoint with the best fp32 selection return (plain PTQ of the best fp32 policy).",
        "",
        "| bits | QAT | PTQ @int-B | QAT - PTQ @int-B (± 2 SE) | ahead | PTQ @fp32 | QAT - PTQ @fp32 (± 2 SE) "
        "| ahead |",
        "|---:|---:|---:|---:|:---:|---:|---:|:---:|",
    ]
    for row in result["table"]:
        m, f = row["vs_ptq_selected_at_intB"], row["vs_ptq_selected_at_fp32"]
        lines.append(f"| {row['bits']} | {_fmt(row['qat'])} | {_fmt(row['ptq_selected_at_intB'])} | {_diff(m)} | "
                     f"{_VERDICT[m['better']]} | {_fmt(row['ptq_selected_at_fp32'])} | {_diff(f)} | "
                     f"{_VERDICT[f['better']]} |")
    matched = outcome(result["table"], "vs_ptq_selected_at_intB")
    plain = outcome(result["table"], "vs_ptq_selected_at_fp32")
    say = lambda xs: ", ".join(xs) or "no bit width"  # noqa: E731
    verdicts = [
        f"**Outcome over {seeds} seeds** (\"ahead\": mean return higher by more than 2 standard errors of the "
        f"difference of per-seed means). Against PTQ @int-B: QAT ahead at {say(matched['qat'])}; "
        f"**PTQ ahead at {say(matched['ptq'])}**; no clear difference at {say(matched['neither'])}. "
        f"Against PTQ @fp32: QAT ahead at {say(plain['qat'])}; PTQ ahead at {say(plain['ptq'])}; no clear "
        f"difference at {say(plain['neither'])}.",
    ] if seeds > 1 else ["**Outcome:** none with 1 seed (no spread to judge a difference against)."]
    lines += [
        "",
        *verdicts,
        "",
        f"Per-seed means and run times: [`qat.json`](qat.json). Total wall clock {result['wall_clock_s']:.0f} s "
        f"({describe_load(result['machine'])}); per-run learner/actor speed is not a QAT cost measurement.",
        "",
    ]
    text = "\n".join(lines)
    write_text(path, text)
    return text


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean of `values` (sample std / sqrt(n)); 0 for fewer than two."""
    v = np.asarray(values, dtype=float)
    return float(np.std(v, ddof=1) / np.sqrt(v.size)) if v.size > 1 else 0.0


def plot(path: Path, result: dict[str, Any]) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    rows = result["table"]
    x = np.arange(len(rows))
    width = 0.27
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for i, (key, label) in enumerate((("ptq_selected_at_fp32", "PTQ @fp32 (ckpt picked at fp32)"),
                                      ("ptq_selected_at_intB", "PTQ @int-B (ckpt picked at int-B)"),
                                      ("qat", "QAT (ckpt picked at int-B)"))):
        means = np.array([r[key]["mean"] for r in rows])
        se = np.array([standard_error(r[key]["seed_means"]) for r in rows])
        # Returns are >= 0: the lower bar stops at 0 rather than claiming negative returns.
        ax.bar(x + (i - 1) * width, means, width, yerr=[np.minimum(se, means), se], capsize=3, label=label)
    ax.axhline(result["fp32"]["mean"], color="k", ls="--", lw=1, label="fp32 policy")
    ax.set_xticks(x, [f"int{r['bits']}" for r in rows])
    ax.set_ylabel("test return (CartPole-v1, max 500)")
    machine = machine_fields(result.get("machine"))
    ax.set_title(f"DQN: QAT vs PTQ on {machine.get('cpu_model', 'an unrecorded CPU')} "
                 f"({machine.get('cores', '?')} cores)\n"
                 f"bars: mean over {result['seeds']} seeds x {result['test_episodes']} episodes; error bars: "
                 f"± standard error over the {result['seeds']} seed means", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--report-only" in args:  # redraw qat.png from OUT/qat.json (default results/bench): no training
        out = Path(args[args.index("--out") + 1]) if "--out" in args else Path("results/bench")
        plot(out / "qat.png", json.loads((out / "qat.json").read_text()))
        print(f"[bench.learning.qat] redrew {out}/qat.png", flush=True)
        return 0
    plan = parse_args(argv)
    plan.out.mkdir(parents=True, exist_ok=True)
    result = run(plan)
    write_json_sorted(plan.out / "qat.json", result)
    print(write_markdown(plan.out / "qat.md", result))
    plot(plan.out / "qat.png", result)
    print(f"[bench.learning.qat] wrote {plan.out}/qat.json, qat.md, qat.png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
