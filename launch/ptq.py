r"""Post-training quantization (PTQ) sweep of a trained policy: how much return is lost at each precision.

    python -m launch.ptq --checkpoint RUN_DIR [--bits 2,3,4,5,6,7,8,16] [--include fp16,bf16] [--episodes 10] [--head-bits 16]
        [--out RUN_DIR/ptq] [--seed 0] [--backend jax|onnx|auto] [--no-progress] [--force]

The fp32 policy a run saved (`quarl.quant.policy_io.save_policy`; any agent this build knows, read by
`launch.ptq_policy.load_trained_policy`) is evaluated greedily at fp32, at each --include float
precision and at each integer bit width, per-tensor and per-channel, for --episodes episodes each. Episode i
uses environment seed `seed + i` at every precision, so the comparison with fp32 is paired. The error is the
paper's `E = (R_fp32 - R_q) / |R_fp32|` on mean returns; its spread is the std over episodes of the paired
per-episode differences divided by |mean R_fp32| (whose mean is exactly E).

How each row runs (the `execution` column): int2..int8 use the backend's real integer kernel (AQT s8 dot on
jax, MatMulInteger on onnx; both quantize activations to 8 bits per call, so int<b> means W<b>A8); int9..int16
have no integer kernel, so their weights are rounded with `fake_quantize_params` and run in fp32 on the jax
backend ("simulated", weight-only); fp16/bf16 run natively on jax and simulated on onnx.

Writes to --out: ptq.csv, ptq_episodes.csv, ptq.md, ptq_returns.png, weights.csv, weights.png. A folder that
already holds a sweep is refused (exit 2) unless --force: an earlier sweep is never replaced silently.
Bad flags print one line on stderr and exit 2 before anything is written.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from pathlib import Path
from typing import Mapping, Sequence, TypedDict

import numpy as np

from analysis.plots import plot_ptq_returns, plot_weight_histograms, redraw_ptq_returns
from launch.cli import (
    OneLineArgumentParser, UsageError, check_backend, check_logdir, check_positive, check_seed, fail,
)
from launch.ptq_policy import (  # re-exported: tests and notebooks reach them as launch.ptq.<name>
    GRANULARITIES,
    NO_GRANULARITY,
    GridPoint,
    calibration_observations,
    load_trained_policy,
    make_row_policy,
    output_layer,
    sweep_grid,
)
from launch.experiments.progress import ItemProgress
from quarl.acting.evaluation import evaluate_seeds
from quarl.envs.factory import make_environment
from quarl.ops.io import write_json_atomic
from quarl.ops.machine import machine_info
from quarl.quant.metrics import layer_errors, sqnr_db
from quarl.quant.policy_io import LoadedPolicy, policy_paths
from quarl.quant.precision import FLOAT_PRECISIONS, MAX_BITS, MAX_KERNEL_BITS, MIN_BITS, parse_bit_list, parse_precision
from quarl.quant.quantization import dequantize_params, is_quantized_leaf, path_str, quantize_params, tree_items

PROG = "launch.ptq"
DEFAULT_BITS = "2,3,4,5,6,7,8,16"
INCLUDABLE = tuple(p for p in FLOAT_PRECISIONS if p != "fp32")  # what --include may name; fp32 is the baseline
OUTPUT_FILES = ("ptq.csv", "ptq_episodes.csv", "ptq.md", "ptq_returns.png", "weights.csv", "weights.png")


class PTQRow(TypedDict):
    """One row of ptq.csv: a precision and granularity, what ran it, its returns over the episodes, the paired
    reward error against fp32 (E) and its weights' SQNR and worst relative error (`weight_metrics`)."""

    precision: str
    bits: int | None
    granularity: str
    backend: str
    execution: str
    episodes: int
    mean_return: float
    std_return: float
    min_return: float
    max_return: float
    error_mean: float
    error_std: float
    weight_sqnr_db: float
    weight_max_rel_err: float
    weight_min_layer_sqnr_db: float


CSV_FIELDS = tuple(PTQRow.__annotations__)
# One row of ptq_episodes.csv (functional form: "return" is a keyword).
EpisodeRow = TypedDict("EpisodeRow", {"precision": str, "granularity": str, "episode": int, "seed": int,
                                      "return": float, "length": int})
EPISODE_FIELDS = tuple(EpisodeRow.__annotations__)


# ------------------------------------------------------------------------------------------------ arguments


@dataclasses.dataclass(frozen=True)
class PTQArgs:
    """Validated flags plus the loaded policy."""

    policy: LoadedPolicy
    bits: tuple[int, ...]
    include: tuple[str, ...]
    episodes: int
    seed: int
    backend: str
    out: Path
    progress: bool
    head_bits: int | None = None  # --head-bits: the output layer kept at this width in every narrower int row

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.episodes)]


def build_parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--checkpoint", default=None,
                        help="run directory holding policy_fp32.qrlp (or a .qrlp file); required unless --report-only")
    parser.add_argument("--bits", default=DEFAULT_BITS,
                        help=f"comma-separated integer bit widths in {MIN_BITS}..{MAX_BITS}")
    parser.add_argument("--include", default="fp16,bf16",
                        help="comma-separated float precisions to add (fp16, bf16); empty for none")
    parser.add_argument("--episodes", type=int, default=10, help="episodes per precision")
    parser.add_argument("--out", default=None, help="output directory (default: CHECKPOINT_DIR/ptq)")
    parser.add_argument("--seed", type=int, default=0, help="episode i uses environment seed SEED + i")
    parser.add_argument("--backend", default="jax", help="policy runtime for int<=8 and float rows: jax, onnx, auto")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--force", action="store_true", help="replace the sweep already in --out")
    parser.add_argument("--head-bits", default=None, metavar="B",
                        help="keep the output layer (DQN's Q head) at B bits (9..16, run dequantized in fp32) in "
                             "every narrower int row, the other layers at the row's width")
    parser.add_argument("--report-only", action="store_true",
                        help="redraw --out's ptq_returns.png from its ptq.csv, evaluating nothing")
    return parser


def parse_bits(text: str, flag: str = "--bits") -> tuple[int, ...]:
    """'2,4,8' -> (2, 4, 8): sorted, deduplicated, each in MIN_BITS..MAX_BITS (`quarl.quant.precision`)."""
    try:
        return parse_bit_list(text)
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None


def parse_include(text: str) -> tuple[str, ...]:
    """'fp16,bf16' -> ('fp16', 'bf16'); integer precisions belong in --bits, fp32 is always evaluated."""
    names = []
    for item in (t.strip() for t in str(text).split(",")):
        if not item:
            continue
        try:
            name = parse_precision(item).name
        except ValueError as e:
            raise UsageError(f"--include: {e}") from None
        if name not in INCLUDABLE:
            raise UsageError(f"--include: {item!r} is not one of {', '.join(INCLUDABLE)} "
                             "(integer widths go in --bits; fp32 is always the baseline)")
        if name not in names:
            names.append(name)
    return tuple(names)


def validate(args: argparse.Namespace) -> PTQArgs:
    """Every flag and the checkpoint itself, raising UsageError before anything is written."""
    bits = parse_bits(args.bits)
    include = parse_include(args.include)
    episodes = check_positive("--episodes", args.episodes)
    seed = check_seed(args.seed)
    backend = check_backend(args.backend)
    try:
        policy = load_trained_policy(args.checkpoint)
    except ValueError as e:
        raise UsageError(f"--checkpoint: {e}") from None
    default_out = policy_paths(args.checkpoint)[0].parent / "ptq"
    try:
        out = check_logdir(args.out if args.out is not None else str(default_out))
    except UsageError as e:
        raise UsageError(str(e).replace("--logdir", "--out")) from None
    held = [name for name in OUTPUT_FILES if (out / name).exists()]
    if held and not args.force:
        raise UsageError(f"--out {str(out)!r} already holds a PTQ sweep ({', '.join(held)}); pass --force to "
                         "replace it or --out for a new folder")
    head_bits = None
    if args.head_bits is not None:
        head_bits = parse_bits(args.head_bits, "--head-bits")
        if len(head_bits) != 1 or not MAX_KERNEL_BITS < head_bits[0] <= MAX_BITS:
            raise UsageError(f"--head-bits takes one width in {MAX_KERNEL_BITS + 1}..{MAX_BITS} (wider than the "
                             f"integer kernels), got {args.head_bits!r}")
        head_bits = head_bits[0]
    return PTQArgs(policy, bits, include, int(episodes), int(seed), backend, out, not args.no_progress, head_bits)


# ------------------------------------------------------------------------------------------------ the sweep


def weight_metrics(params: dict, point: GridPoint, head: str | None = None) -> dict[str, float]:
    """SQNR over all weight matrices together, and the worst layer's SQNR and max relative error (`head`: the
    output layer's name, kept at `point.head_bits` where the point has them)."""
    layer_bits = {head: point.head_bits} if head and point.head_bits else None
    qparams = quantize_params(params, point.precision, point.per_channel, layer_bits)
    per_layer = layer_errors(params, qparams)
    rounded = dict(tree_items(dequantize_params(qparams)))
    weights = [(path, leaf) for path, leaf in tree_items(params) if is_quantized_leaf(path, leaf)]
    ref = np.concatenate([np.asarray(leaf, np.float64).ravel() for _, leaf in weights])
    hat = np.concatenate([np.asarray(rounded[path], np.float64).ravel() for path, _ in weights])
    return {"weight_sqnr_db": sqnr_db(ref, hat),
            "weight_max_rel_err": max(e["max_rel"] for e in per_layer.values()),
            "weight_min_layer_sqnr_db": min(e["sqnr_db"] for e in per_layer.values())}


def paired_error(fp32_returns: np.ndarray, returns: np.ndarray) -> tuple[float, float]:
    """(E, spread): E = (mean R_fp32 - mean R_q) / |mean R_fp32|, spread = std of the per-episode paired
    differences over the same denominator. NaN when the fp32 mean return is 0 (E is undefined)."""
    denom = abs(float(np.mean(fp32_returns)))
    if denom == 0.0:
        return math.nan, math.nan
    per_episode = (np.asarray(fp32_returns) - np.asarray(returns)) / denom
    return float(np.mean(per_episode)), float(np.std(per_episode))


def run_sweep(run: PTQArgs) -> tuple[list[PTQRow], list[EpisodeRow]]:
    """Evaluates every grid point; returns (ptq.csv rows, ptq_episodes.csv rows)."""
    env = make_environment(run.policy.task, 0)
    action_spec = env.action_spec()
    env.close()
    seeds = run.seeds
    rows: list[PTQRow] = []
    episode_rows: list[EpisodeRow] = []
    fp32_returns: np.ndarray | None = None
    points = sweep_grid(run.bits, run.include)
    if run.head_bits:  # every int row narrower than the head keeps the output layer at --head-bits
        points = [dataclasses.replace(p, head_bits=run.head_bits) if p.granularity != NO_GRANULARITY
                  and p.bits < run.head_bits else p for p in points]
    head = output_layer(run.policy.spec)
    observations = calibration_observations(run.policy)
    with ItemProgress(len(points), run.progress, prog="launch.ptq", unit="precision") as bar:
        for point in points:
            bar.set_postfix_str(f"{point.precision} {point.granularity}", refresh=True)
            greedy, execution = make_row_policy(point, run.policy, action_spec, run.backend, observations)
            stats = evaluate_seeds(run.policy.task, greedy, seeds)
            if fp32_returns is None:  # the grid starts with fp32
                fp32_returns = stats.returns
            error_mean, error_std = paired_error(fp32_returns, stats.returns)
            rows.append({"precision": point.precision, "bits": point.bits, "granularity": point.granularity,
                         "backend": greedy.backend, "execution": execution, "episodes": len(seeds),
                         "mean_return": stats.mean, "std_return": stats.std,
                         "min_return": float(stats.returns.min()), "max_return": float(stats.returns.max()),
                         "error_mean": error_mean, "error_std": error_std,
                         **weight_metrics(run.policy.params, point, head)})
            episode_rows += [{"precision": point.precision, "granularity": point.granularity, "episode": i,
                              "seed": s, "return": float(r), "length": int(n)}
                             for i, (s, r, n) in enumerate(zip(seeds, stats.returns, stats.lengths))]
            bar.update(1)
    return rows, episode_rows


# ------------------------------------------------------------------------------------------------ outputs


def _fmt(value: object) -> object:
    return repr(float(value)) if isinstance(value, (float, np.floating)) else value


def write_csv(path: Path, rows: Sequence[Mapping[str, object]], fields: Sequence[str]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row[k]) for k in fields})


def weight_stats(params: dict) -> list[dict[str, str | float]]:
    """Per weight matrix: range and spread. abs-max/std is what per-tensor scaling pays for: the step is
    set by the largest weight, so a long tail leaves few codes for the bulk of the distribution."""
    out = []
    for path, leaf in tree_items(params):
        if not is_quantized_leaf(path, leaf):
            continue
        w = np.asarray(leaf, np.float64)
        std = float(w.std())
        absmax = float(np.abs(w).max())
        out.append({"layer": path_str(path), "shape": "x".join(map(str, w.shape)), "min": float(w.min()),
                    "max": float(w.max()), "mean": float(w.mean()), "std": std,
                    "absmax_over_std": absmax / std if std > 0 else math.inf})
    return out


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def write_markdown(path: Path, run: PTQArgs, rows: Sequence[PTQRow]) -> str:
    """The paper's reward-error table (E per precision, one line per granularity) plus the full detail."""
    policy = run.policy
    fp32 = rows[0]
    floats = [r for r in rows[1:] if r["granularity"] == NO_GRANULARITY]
    ints = [r for r in rows if r["granularity"] != NO_GRANULARITY]
    int_names = list(dict.fromkeys(r["precision"] for r in ints))
    header = ["Policy", "Granularity", "fp32 return", *(f"E {r['precision']}" for r in floats),
              *(f"E {name}" for name in int_names)]
    lines = [f"# Post-training quantization: {policy.agent} on {policy.task}", "",
             f"Policy after {policy.steps} learner steps; {run.episodes} episodes per precision (env seeds "
             f"{run.seed}..{run.seed + run.episodes - 1}, the same for every precision); backend {run.backend}.",
             "E = (R_fp32 - R_q) / |R_fp32| on mean returns (positive = return lost)." + (
                 f" Every int row keeps the output layer at int{run.head_bits} (--head-bits), run dequantized in "
                 "fp32; its other layers at the row's width." if run.head_bits else ""), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for granularity, _ in GRANULARITIES:
        by_name = {r["precision"]: r for r in ints if r["granularity"] == granularity}
        cells = [f"{policy.agent} / {policy.task}", granularity,
                 f"{fp32['mean_return']:.1f} ± {fp32['std_return']:.1f}",
                 *(_pct(r["error_mean"]) for r in floats), *(_pct(by_name[n]["error_mean"]) for n in int_names)]
        lines.append("| " + " | ".join(cells) + " |")
    detail = ["Precision", "Granularity", "Execution", "Return (mean ± std)", "Min / max", "E (mean ± std)",
              "Weight SQNR (dB)", "Max rel. weight error"]
    lines += ["", "## All rows", "", "| " + " | ".join(detail) + " |", "|" + "---|" * len(detail)]
    for r in rows:
        error = "n/a" if math.isnan(r["error_mean"]) else f"{_pct(r['error_mean'])} ± {_pct(r['error_std'])}"
        cells = [r["precision"], r["granularity"], f"{r['execution']} ({r['backend']})",
                 f"{r['mean_return']:.1f} ± {r['std_return']:.1f}", f"{r['min_return']:.1f} / {r['max_return']:.1f}",
                 error, f"{r['weight_sqnr_db']:.1f}", f"{r['weight_max_rel_err']:.2e}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Execution: `int-kernel` = real integer matmul with 8-bit activations (W<b>A8); `simulated` = "
              "weights rounded to the precision, arithmetic in fp32 (weight-only); `native` = computed in that "
              "float format.", ""]
    text = "\n".join(lines)
    path.write_text(text, encoding="utf-8")
    return text


def write_outputs(run: PTQArgs, rows: list[PTQRow], episode_rows: list[EpisodeRow]) -> str:
    out = run.out
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "ptq.csv", rows, CSV_FIELDS)
    write_csv(out / "ptq_episodes.csv", episode_rows, EPISODE_FIELDS)
    stats = weight_stats(run.policy.params)
    write_csv(out / "weights.csv", stats, ("layer", "shape", "min", "max", "mean", "std", "absmax_over_std"))
    machine = machine_info().to_json()
    write_json_atomic(out / "machine.json", machine)
    plot_ptq_returns(rows, f"PTQ: {run.policy.agent} on {run.policy.task}",
                     granularities=[g for g, _ in GRANULARITIES], machine=machine, task=run.policy.task,
                     path=out / "ptq_returns.png")
    plot_weight_histograms(run.policy.params, stats, path=out / "weights.png")
    return write_markdown(out / "ptq.md", run, rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.report_only:
        if args.out is None or not (Path(args.out) / "ptq.csv").is_file():
            fail(f"{PROG}: error: --report-only redraws a sweep: --out must be a folder holding ptq.csv")
        print(f"wrote {redraw_ptq_returns(args.out)}")
        return 0
    if args.checkpoint is None:
        fail(f"{PROG}: error: the following arguments are required: --checkpoint")
    try:
        run = validate(args)
    except UsageError as e:
        fail(f"{PROG}: error: {e}")
    rows, episode_rows = run_sweep(run)
    print(write_outputs(run, rows, episode_rows))
    print(f"wrote {run.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
