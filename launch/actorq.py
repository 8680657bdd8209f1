r"""Distributed ActorQ: an fp32 learner and N actors acting with a quantized policy, on Ray.

    python -m launch.actorq --agent d4pg --task cartpole:balance --precision int8 --num-actors 2 \
        --actor-update-period 100 --max-actor-steps 20000 --seed 0 --logdir runs/d4pg_int8 \
        [--backend auto --runner ray --ray-address ADDR --resume DIR --checkpoint-every K --set PATH=VALUE]

On-policy agents (PPO, A2C) run the same program without replay: N actors hand rollouts to the learner, which
waits for one from every actor per update (`--rollout-mode sync`, PPO with N actors) or trains on each as it comes
(`--rollout-mode async`, dropping rollouts more than `--max-staleness` versions old); `--correction none|tis|vtrace`
picks how the update corrects for the quantized, possibly stale behaviour policy (docs/on_policy_actorq.md):

    python -m launch.actorq --agent ppo --task CartPole-v1 --num-actors 2 --rollout-mode async --correction tis

With no flags it runs a short D4PG job on cartpole:balance (2 actors, int8, a couple of minutes on a 2-core
laptop) on a private local Ray and ends with a summary table. Every flag is checked before Ray starts: a bad
one prints one line on stderr and exits 2 with nothing written. Ctrl-C stops every node within seconds,
flushes logs, writes summary.json and a checkpoint, and exits 130.

Writes to --logdir: learner.csv, evaluator.csv (actor_steps, wall_clock_s, return), actor_<i>.csv,
replay.csv (the table's insert/sample counters over time), tb/<node>/ (TensorBoard), checkpoints/ (see
launch.experiments.checkpoint for what --resume restores), policy_fp32.qrlp + .json (the final fp32 learner policy, what
`launch.ptq --checkpoint LOGDIR` reads), events.log (restarts, rejected payloads, lost nodes, how the run
ended) and summary.json.

Faults: an actor whose process dies is restarted (up to 3 times) and pulls the latest weights; if the
learner, the replay server, the counter, the weight server or the evaluator dies, the run stops within seconds
with exit code 1 and an error naming the lost node, and every node process is ended. Resume such a run
from its last checkpoint with --resume LOGDIR (use --checkpoint-every to have one).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn, NotRequired, Sequence, TypedDict, TypeVar

from launch.experiments import checkpoint as ckpt
import agents
from launch.cli import (
    DEFAULT_STEPS, DEFAULT_TASKS, TARGET_RETURN_HELP, TASK_HELP, ListTasksAction, OneLineArgumentParser, UsageError,
    add_learner_loop_argument, add_qat_argument, add_set_argument, check_actor_precision, check_agent,
    check_agent_task, check_carbon_country, check_logdir, check_positive, check_task, fail, flag_names,
    parse_resources, qat_overrides, warn,
)
from launch.config_file import config_with_overrides, default_logdir, reject_with_config
from launch.overrides import SECTIONS, parse_settings, settings_help
from launch.experiments.config import (
    ALE_MIN_EVAL_EVERY, ROLLOUT_MODES, SERVICE_SHARE, DistributedConfig, ExperimentConfig,
)
from launch.experiments.budget import budget_warnings
from launch.experiments.summary_table import print_summary
from launch.program.devices import LEARNER_DEVICES, pin_driver_to_cpu
from quarl.quant.precision import Precision

T = TypeVar("T")


class Preset(TypedDict):
    """The quick preset of `quick_preset`: agent config fields, and for the default job its stopping rule."""

    overrides: dict[str, object]
    target_return: NotRequired[float]
    eval_every: NotRequired[int]
    target_streak: NotRequired[int]


# The default job (`make run`; DEFAULT_TASKS and DEFAULT_STEPS are launch.cli's, shared with launch.train):
# about two minutes on 2 cores, and it ends solved. D4PG: small networks, a value
# support fitted to cartpole's rewards (<= 1 per step, so returns <= 100 discounted), Adam 1e-3 and one learner
# step per 4 env steps (batch 128, 32 samples per insert), the setting agents/d4pg's learning test uses; the run
# stops once two evaluations in a row reach the target (cartpole:balance's maximum is 1000; single-process runs
# of this setting reach 950 within 20k-60k steps, results/bench/learning_d4pg.md), else at the step budget.
# DQN's own defaults are already tuned for classic control (CartPole reaches 500 within ~25k steps).


def quick_preset(agent: str, task: str) -> Preset:
    """The quick laptop preset's ExperimentConfig fields for `agent` on `task` (what `--full-size` turns off).

    D4PG's agent config is the small one above on every task; on its default task the preset also sets the
    target, the evaluation cadence and a streak of two evaluations (D4PG's policy still moves fast when it
    first scores 950: a 977 was followed by a 630 three hundred learner steps later, and the final evaluation
    runs on the stop's slightly newer weights). Flags given explicitly win over every preset field."""
    if agent != "d4pg":
        return {"overrides": {}}
    preset: Preset = {"overrides": {
        "policy_layer_sizes": (64, 64), "critic_layer_sizes": (128, 128), "vmin": -10.0, "vmax": 110.0,
        "batch_size": 128, "learning_rate": 1e-3, "min_replay_size": 1_000, "max_replay_size": 100_000,
        "samples_per_insert": 32.0}}
    if task == DEFAULT_TASKS[agent]:
        preset.update({"target_return": 950.0, "eval_every": 2_500, "target_streak": 2})
    return preset


# ------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------


SET_EXCLUDED = ("eval_fp32",)  # what the distributed runner does not read (one process only)


def build_parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(prog="launch.actorq", description=__doc__,
                              epilog=lambda: settings_help(SECTIONS, SET_EXCLUDED))
    p.add_argument("--config", default=None, metavar="FILE",
                   help="run the experiment in this JSON file: an ExperimentConfig (what launch.reproduce writes) "
                        "or a run's summary.json (its `experiment` object); only --logdir, --seed, --runner, "
                        "--ray-address and --no-progress may be given with it")
    p.add_argument("--agent", default="d4pg", help="d4pg (DM Control), dqn (gym classic control, MinAtar, ALE), "
                                                   "ppo or a2c (on-policy: rollouts, no replay)")
    p.add_argument("--task", default=None, help=TASK_HELP)
    p.add_argument("--list-tasks", action=ListTasksAction)
    p.add_argument("--precision", default="int8",
                   help="actor precision: fp32, fp16, bf16, int2..int8, int16 (shorthands 32, 16, 8..2)")
    p.add_argument("--num-actors", type=int, default=2, help="acting processes, one policy runtime each")
    p.add_argument("--actor-update-period", type=int, default=None,
                   help="actor steps between weight pulls (default: the agent config's)")
    p.add_argument("--envs-per-actor", type=int, default=1, metavar="K",
                   help="environments each actor steps together, with one policy call per step on the batch "
                        "of K observations (default 1, the paper's setting)")
    p.add_argument("--max-actor-steps", type=int, default=None,
                   help="environment steps over all actors (with --resume: including the steps before it; "
                        "default: " + ", ".join(f"{n} for {a}" for a, n in DEFAULT_STEPS.items()) + ")")
    p.add_argument("--seed", type=int, default=None, help="the run's seed (default: 0)")
    p.add_argument("--logdir", default=None,
                   help="new directory for logs (default: runs/actorq/<agent>-<task>-<precision>-<time>)")
    p.add_argument("--backend", default="auto", help="actor policy runtime: auto, jax, onnx or onnx-nbits")
    p.add_argument("--kernel-form", default=None, metavar="FORM",
                   help="ONNX integer kernel form to pin (u8s8, u8u8, fp32 = the dequantized graph, ...; still "
                        "self-checked): with --backend onnx and the same seed, a rerun on a CPU of the same class "
                        "computes the same numbers (default: this CPU's choice)")
    p.add_argument("--runner", default="ray", choices=("ray", "local"),
                   help="ray (one process per node) or local (threads in this process, for debugging)")
    p.add_argument("--ray-address", default=None,
                   help="join this Ray cluster (also RAY_ADDRESS); default: a private local Ray")
    p.add_argument("--actor-resource", dest="actor_resources", action="append", default=[],
                   metavar="NAME[=AMOUNT]",
                   help="Ray custom resource every actor needs (amount 1 by default), repeatable: pins the "
                        "actors to the cluster nodes started with --resources '{\"NAME\": N}'")
    p.add_argument("--learner-resource", dest="learner_resources", action="append", default=[], metavar="NAME",
                   help="Ray custom resource marking the learner's machine, repeatable: the learner, replay, "
                        "counter, weights server and evaluator each ask for 0.01 of it")
    p.add_argument("--learner-device", default="auto", choices=LEARNER_DEVICES,
                   help="where the learner's JAX runs: auto (a GPU when the learner's process sees one), cpu or "
                        "gpu (one GPU from Ray, else an error); every other process runs on the CPU")
    add_learner_loop_argument(p)
    p.add_argument("--pin-actors", action="store_true",
                   help="pin each actor to a core of its machine that no other actor holds (Linux): its policy "
                        "runtime and environments then share that one core")
    p.add_argument("--resume", default=None, help="continue from the latest checkpoint under this run dir")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="learner steps between checkpoints (0: only when the run ends)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="actor steps between evaluations (default: 2500 for the default d4pg job, else a tenth of "
                        f"--max-actor-steps; ALE: at most once every {ALE_MIN_EVAL_EVERY:,} steps)")
    p.add_argument("--eval-episodes", type=int, default=2, help="greedy episodes per evaluation")
    p.add_argument("--target-return", type=float, default=None,
                   help=TARGET_RETURN_HELP + " (default: 950 for the default d4pg job on cartpole:balance, else "
                                             "none)")
    p.add_argument("--target-streak", type=int, default=None,
                   help="evaluations in a row that must reach --target-return (default: 2 for the default d4pg "
                        "job, else 1)")
    p.add_argument("--publish-period", type=int, default=10, help="learner steps between weight versions")
    p.add_argument("--publish-min-interval-s", type=float, default=0.0, help="seconds at least between weight versions")
    p.add_argument("--learner-steps-per-call", type=int, default=None,
                   help="SGD steps per learner call, one lax.scan over K sampled batches (default: chosen for the "
                        "learner's device, 4 on CPU)")
    p.add_argument("--insert-batch", type=int, default=64, help="transitions per replay insert call")
    p.add_argument("--rollout-mode", default="sync", choices=ROLLOUT_MODES,
                   help="on-policy agents: sync (one rollout of the current weights from every actor per update: "
                        "PPO with N actors) or async (each rollout as it comes, IMPALA-style)")
    p.add_argument("--max-staleness", type=int, default=None, metavar="L",
                   help="on-policy, async: drop rollouts acted with weights more than L versions old (default: "
                        "2 x --num-actors + 2, what the pipeline itself holds)")
    p.add_argument("--correction", default=None, metavar="{none,tis,vtrace}",
                   help="on-policy agents: how updates correct for the quantized (and stale) behaviour policy: "
                        "none (PPO's ratio against it), tis (truncated importance weights, cap --set is_cap=C) or "
                        "vtrace (V-trace targets and advantages; --set vtrace_rho_bar=, vtrace_c_bar=); "
                        "default: the agent config's (none)")
    add_set_argument(p, distributed=True)
    p.add_argument("--full-size", action="store_true",
                   help="use the agent's full default config instead of the quick laptop preset")
    add_qat_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no live progress view")
    return p


RUNTIME_FLAGS = ("config", "runner", "ray_address", "no_progress")  # not part of the experiment
FLAGS = flag_names()
_UNSET = "<default>"  # no --logdir: runs/actorq/<run name>, or the --resume run's directory


@dataclasses.dataclass(frozen=True)
class Invocation:
    config: ExperimentConfig
    runner: str
    ray_address: str | None
    progress: bool


def validate(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> Invocation:
    """Every check that can fail, before anything is started or written (UsageError on a bad flag or file)."""
    parser = parser or build_parser()
    if args.ray_address is not None and not args.ray_address.strip():
        raise UsageError("--ray-address must not be empty")
    check_carbon_country()
    if args.config is not None:
        reject_with_config(args, parser, RUNTIME_FLAGS)
        config = config_with_overrides(args.config, args.logdir, args.seed)
    else:
        config = _config_from_flags(args, parser)
    if config.learner_device == "gpu" and args.runner != "ray":
        raise UsageError("--learner-device gpu needs --runner ray (the local runner keeps every node on the CPU)")
    _check_placement(config.distributed, args.runner)
    builder = check_agent_task(config)
    from agents.base import ReplayBuilder  # pylint: disable=import-outside-toplevel  (loaded with the builder)

    if not isinstance(builder, ReplayBuilder):
        _check_on_policy(config)
    asked = config.distributed.resume
    resume = None if asked is None else _check_resume(asked, config.agent, config.task, builder.config)
    logdir = _choose_logdir(None if config.logdir == _UNSET else config.logdir, asked, config.agent, config.task,
                            config.precision)
    config = config.replace(resume=resume, logdir=str(logdir))
    return Invocation(config, args.runner, args.ray_address, not args.no_progress)


def _check_placement(distributed: DistributedConfig, runner: str) -> None:
    """Ray custom resources place nodes on cluster machines: only the Ray runner has them."""
    if (distributed.actor_resources or distributed.learner_resources) and runner != "ray":
        raise UsageError("--actor-resource and --learner-resource need --runner ray")


def _check_on_policy(config: ExperimentConfig) -> None:
    """What an on-policy run cannot do: resume (its learner keeps no checkpoint, only its final policy)."""
    dist = config.distributed
    if dist.resume is not None or dist.checkpoint_every:
        raise UsageError(f"--agent {config.agent} is on-policy: its distributed run keeps no checkpoints "
                         "(--resume, --checkpoint-every); its final policy is saved as policy_fp32.qrlp")


def _config_from_flags(args: argparse.Namespace,
                       parser: argparse.ArgumentParser | None = None) -> ExperimentConfig:
    agent = check_agent(args.agent)
    task = check_task(args.task or DEFAULT_TASKS[agent])
    settings = parse_settings(agent, args.overrides, SECTIONS, SET_EXCLUDED)
    settings.check_once(args, parser or build_parser(), FLAGS)
    preset: Preset = {"overrides": {}} if args.full_size else quick_preset(agent, task)
    # Over the agent's tuned settings for this task (`task_preset`): the quick preset, then the user's --set values.
    overrides = {**preset["overrides"], **settings.agent}
    # Parsed once: the config carries the Precision.
    precision = check_actor_precision(str(settings.experiment.get("precision", args.precision)))
    overrides.update(qat_overrides(args.qat_bits, precision))
    from agents.base import ReplayBuilder  # pylint: disable=import-outside-toplevel  (loaded with the builder)

    if issubclass(agents.builder_class(agent), ReplayBuilder):
        given_flags = [flag for flag, value, default in (("--rollout-mode", args.rollout_mode, "sync"),
                                                         ("--max-staleness", args.max_staleness, None),
                                                         ("--correction", args.correction, None)) if value != default]
        given_flags += [f"--set {settings.paths['distributed', name]}" for name, default in
                        (("rollout_mode", "sync"), ("max_staleness", None))
                        if settings.distributed.get(name, default) != default]
        if given_flags:
            raise UsageError(f"{', '.join(given_flags)}: only for on-policy agents (ppo, a2c); --agent {agent} "
                             "learns from replay")
    if args.correction is not None:
        from agents.ppo.config import CORRECTIONS  # pylint: disable=import-outside-toplevel  (loaded just above)

        if args.correction not in CORRECTIONS:
            raise UsageError(f"--correction must be one of {', '.join(CORRECTIONS)}, got {args.correction!r}")
        overrides["correction"] = args.correction
    period = check_positive("--actor-update-period", args.actor_update_period, optional=True)
    if period is not None:
        overrides["actor_update_period"] = period
    if any("=" in r for r in args.learner_resources):
        raise UsageError("--learner-resource takes a resource NAME (each node there asks for 0.01 of it)")

    def given(value: T | None, default: T) -> T:
        return default if value is None else value

    return settings.config(
        FLAGS, agent=agent, task=task, precision=precision, backend=args.backend,
        task_preset=agents.task_defaults(agent, task),
        kernel_form=args.kernel_form, num_actors=args.num_actors,
        envs_per_actor=args.envs_per_actor, max_actor_steps=given(args.max_actor_steps, DEFAULT_STEPS[agent]),
        seed=given(args.seed, 0), logdir=given(args.logdir, _UNSET), overrides=overrides,
        eval_every=given(args.eval_every, preset.get("eval_every")), eval_episodes=args.eval_episodes,
        target_return=given(args.target_return, preset.get("target_return")),
        target_streak=given(args.target_streak, preset.get("target_streak", 1)),
        publish_period=args.publish_period, insert_batch=args.insert_batch, checkpoint_every=args.checkpoint_every,
        publish_min_interval_s=args.publish_min_interval_s, learner_steps_per_call=args.learner_steps_per_call,
        resume=args.resume, pin_actors=args.pin_actors, learner_device=args.learner_device,
        learner_loop=args.learner_loop,
        rollout_mode=args.rollout_mode, max_staleness=args.max_staleness,
        actor_resources=parse_resources("--actor-resource", args.actor_resources),
        learner_resources={k: SERVICE_SHARE for k in parse_resources("--learner-resource", args.learner_resources)})


def _check_resume(path: str, agent: str, task: str, agent_config: agents.AgentConfig) -> str:
    try:
        directory = ckpt.find_checkpoint(path)
        manifest = ckpt.read_manifest(directory)
        ckpt.check_compatible(manifest, agent=agent, task=task, agent_config=ckpt.agent_config_dict(agent_config))
    except ckpt.CheckpointError as e:
        raise UsageError(f"--resume: {e}") from None
    return str(directory)


def _run_dir_of(resume: str) -> Path:
    """The run directory a --resume path belongs to (resume may name the run, checkpoints/ or a step).
    Only called with a path `_check_resume` accepted, so expanding it cannot fail."""
    p = Path(resume).expanduser().absolute()
    if p.name.startswith("step_"):
        p = p.parent
    if p.name == "checkpoints":
        p = p.parent
    return p


def _choose_logdir(logdir: str | None, resume: str | None, agent: str, task: str, precision: Precision) -> Path:
    if logdir is None and resume is not None:
        logdir = str(_run_dir_of(resume))
    if logdir is None:
        logdir = default_logdir("actorq", agent, task, precision)
    try:
        p = Path(logdir).expanduser()
    except RuntimeError as e:  # an unknown ~user
        raise UsageError(f"--logdir {logdir!r} is not a usable path: {e}") from None
    if resume is not None and p.absolute() == _run_dir_of(resume):
        if not os.access(p, os.W_OK | os.X_OK):  # continuing a run in its own directory: append to its logs
            raise UsageError(f"--logdir {logdir!r} is not writable")
        return p
    return check_logdir(logdir)


# ------------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    pin_driver_to_cpu()  # before validate, which builds the task's specs: the driver never starts a GPU
    try:
        inv = validate(args, parser)
    except UsageError as e:
        fail(f"launch.actorq: error: {e}")
    # Imported only once the flags are valid: the supervisor brings the node classes, hence JAX (1.6 s of
    # imports on a 2-core machine against 0.08 s for this CLI), and a bad flag must fail at once.
    from launch.distributed.supervisor import make_runner, run_program  # pylint: disable=import-outside-toplevel
    warn("launch.actorq", budget_warnings(inv.config, "--max-actor-steps", distributed=True))
    runner = make_runner(inv.runner, inv.ray_address)
    summary, code = run_program(inv.config, runner, progress=inv.progress)
    print_summary(summary)
    if summary.get("error"):
        sys.stderr.write(f"launch.actorq: {summary['error']}\n")
    return code


def _exit_now(code: int) -> NoReturn:
    """Ends the CLI at once, without Python's interpreter teardown.

    Why: by now every file of the run is closed (CSV rows flushed, TensorBoard writers closed, checkpoint and
    summary.json fsynced) and Ray is shut down; what is left is tearing down native thread pools that the
    local runner loads in this very process (tensorstore's, through orbax's checkpointer; XLA's; onnxruntime's)
    and finalising hundreds of modules: seconds on a loaded machine, and a hang when a native pool waits on
    a thread that finalisation has already frozen."""
    if "ray" in sys.modules:
        try:
            sys.modules["ray"].shutdown()  # a joined (not owned) cluster: disconnect cleanly
        except Exception:  # pylint: disable=broad-except
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # pylint: disable=broad-except
            pass
    logging.shutdown()
    os._exit(code)  # pylint: disable=protected-access


if __name__ == "__main__":
    _exit_now(main())
