"""How a single-process run ends (`launch.experiments.run_experiment`), the one way for every agent whether it
completed or was stopped: the final fp32 policy and the best one by evaluation in the run folder, and summary.json
in the layout both runners write (`launch.experiments.summary.build_summary`)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from agents.base import ReplayBuilder
from agents.loops import loop_form_record
from analysis.schema import sum_energy
from launch.experiments.acting import EvalRow
from launch.experiments.config import ExperimentConfig
from launch.experiments.run_parts import Actors, Agent
from launch.experiments.stages import StageTimes, runtime_section
from launch.experiments.summary import Summary, build_summary, final_policy_record
from launch.program.devices import device_report
from quarl.ops.io import JSONValue, jsonable, write_json_atomic
from quarl.quant.payload import fp32_payload_nbytes
from quarl.quant.policy_io import save_policy

if TYPE_CHECKING:
    from agents.base import Learner
    from quarl.policy.spec import PolicySpec


def save_best_policy(config: ExperimentConfig, spec: "PolicySpec", learner: "Learner", row: EvalRow) -> str:
    """The policy of the best evaluation so far, beside the final one (a QAT or DQN run can peak early and end
    lower): policy_best_<precision>.qrlp, fp32 weights as `launch.ptq` reads them; returns the file name."""
    path = save_policy(Path(config.logdir) / f"policy_best_{config.precision}.qrlp", spec, learner.policy_params(),
                       task=config.task, agent=config.agent, steps=int(learner.steps),
                       extra={"seed": config.seed, "evaluated_at": str(config.precision),
                              "eval_return": row["return"], "actor_steps": row["actor_steps"]})
    return path.name


def save_final_policy(config: ExperimentConfig, agent: Agent, version: int,
                      evals: Sequence[EvalRow]) -> tuple[int, str]:
    """Writes the trained fp32 policy into the run folder, for offline analysis (`python -m launch.ptq
    --checkpoint LOGDIR`); returns its fp32 payload size (as weights `version`) and its file name."""
    learner = agent.learner
    final_params = learner.policy_params()  # one device-to-host copy, for the fp32 size and the saved policy
    fp32_bytes = fp32_payload_nbytes(final_params, version=max(version, 0), spec_hash=agent.spec.digest())
    path = save_policy(config.logdir, agent.spec, final_params, task=config.task, agent=config.agent,
                       steps=int(learner.steps), extra={"seed": config.seed, "precision": str(config.precision),
                                                        "final_eval_return": evals[-1]["return"] if evals else None})
    return fp32_bytes, path.name


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What the acting loop leaves for the summary: its status ("completed" or "interrupted"), the evaluator's
    rows and the best policy file, the episodes, the feed's table (or rollout) counters, the energy report, and
    the clocks: the `time.perf_counter()` readings when the launcher began building the run and when the run
    began (the origins of wall_clock_s and run_wall_clock_s), and the learner's and evaluator's seconds."""

    status: str
    evals: Sequence[EvalRow]
    best_policy_file: str | None
    episodes: int
    table_info: Mapping[str, object]
    energy: dict[str, JSONValue] | None
    started: tuple[float, float]
    clock: dict[str, float]
    sync_learner: bool


def finish_run(config: ExperimentConfig, agent: Agent, actors: Actors, record: RunRecord) -> Summary:
    """Ends the run: saves the final policy, writes summary.json atomically (with where the learner ran) and
    returns the summary."""
    wall = time.perf_counter() - record.started[1]  # the run clock stops here; the launcher's counts the saving
    fp32_bytes, policy_file = save_final_policy(config, agent, actors.channel.version, record.evals)
    launcher_wall = time.perf_counter() - record.started[0]
    summary = _summary(config, agent, actors, record, (launcher_wall, wall), fp32_bytes=fp32_bytes,
                       policy_file=policy_file)
    summary["learner_device"] = device_report()
    write_json_atomic(Path(config.logdir) / "summary.json", summary)
    return summary


def _summary(config: ExperimentConfig, agent: Agent, actors: Actors, record: RunRecord, clocks: tuple[float, float],
             *, fp32_bytes: int, policy_file: str) -> Summary:
    """This run in summary.json's one layout: one actor, one learner, and a weight channel that publishes one
    version per update, all in this process. `clocks`: (the launcher's wall clock, the run clock)."""
    launcher_wall, wall = clocks
    times, clock, channel, evals = actors.times, record.clock, actors.channel, record.evals
    steps = int(agent.learner.steps)
    publish = _publish(times, channel.payload_bytes)
    payload = {"precision": str(config.precision), "bytes": channel.payload_bytes, "fp32_bytes": fp32_bytes,
               "compression": round(fp32_bytes / max(1, channel.payload_bytes), 3),
               **{k: v for k, v in publish.items() if k != "payload_bytes"},
               "published": times.updates, "requests": times.updates, "payloads_served": times.updates,
               "not_modified": 0}
    return build_summary(
        config, runner="single", status=record.status, error=None, wall_clock_s=launcher_wall, run_wall_clock_s=wall,
        counts={"actor_steps": times.env_steps, "learner_steps": steps, "episodes": record.episodes}, evals=evals,
        final_eval_return=evals[-1]["return"] if evals else None, actors=[_actor_entry(agent, actors, record, wall)],
        learner=_learner_entry(steps, wall, clock, channel.version, policy_file, publish),
        runtime=runtime_section([times.summary()], times.quantize_encode_s, times.updates), payload=payload,
        replay=record.table_info, energy=sum_energy({"run": record.energy}),
        agent_config=jsonable(dataclasses.asdict(agent.builder.config)),
        train_clock_s=round(wall - clock["evaluation_s"], 3), evaluation_s=clock["evaluation_s"],
        sync_learner=bool(record.sync_learner),
        final_eval_return_fp32=evals[-1].get("return_fp32") if evals else None,
        actor_update_period=agent.update_period, policy_file=policy_file, best_policy_file=record.best_policy_file,
        final_policy=final_policy_record(steps, steps, solved=None))


def _publish(times: StageTimes, payload_bytes: int) -> dict[str, object]:
    """The learner's publishing: one version per actor update, no weight server to put the bytes on."""
    updates = times.updates
    return {"versions": updates, "quantize_encode_s": times.quantize_encode_s, "put_s": None,
            "payload_bytes": payload_bytes,
            "quantize_encode_ms_per_version": 1e3 * times.quantize_encode_s / updates if updates else None,
            "put_ms_per_version": None}


def _actor_entry(agent: Agent, actors: Actors, record: RunRecord, wall: float) -> dict[str, object]:
    times, actor = actors.times, actors.actor
    # On-policy, the actor stands still while the learner updates on its rollout.
    learner_wait_s = None if isinstance(agent.builder, ReplayBuilder) else record.clock["learner_s"]
    return {"actor_id": 0, "attempt": 1, "starts": 1, "actor_steps": times.env_steps,
            "total_steps": times.env_steps, "episodes": record.episodes, "envs_per_actor": agent.num_envs,
            "elapsed_s": wall, "steps_per_s": times.env_steps / max(wall, 1e-9), "backend": actor.backend,
            "kernel": actor.kernel,  # integer kernel form + self-check (None on floats)
            "weights_version": actors.channel.version, "first_weights_version": 0,
            "transitions_inserted": int(record.table_info.get("inserts", 0) or 0), "payloads_rejected": 0,
            "last_payload_rejection": None, "build_s": actors.build_s, "times": times.summary(),
            "learner_wait_s": learner_wait_s, "energy": None}  # one process: its energy is energy.nodes.run


def _learner_entry(steps: int, wall: float, clock: dict[str, float], version: int, policy_file: str,
                   publish: dict[str, object]) -> dict[str, object]:
    return {"learner_steps": steps, "steps_this_run": steps, "training_s": None,
            "steps_per_s": steps / max(wall, 1e-9), "step_s": clock["learner_s"],
            "step_s_mean": clock["learner_s"] / steps if steps else 0.0,
            "sample_wait_s": clock["sample_s"], "weights_version": version,
            "resumed_from": None, "policy_file": policy_file, "publish": publish, "energy": None,
            "loop_form": loop_form_record()}
