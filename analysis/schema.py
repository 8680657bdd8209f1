"""The one summary.json layout, which both runners write (`launch.experiments.summary`) and every reader of run
folders reads (`analysis.runs`, `analysis.upgrade_summaries`, the notebooks): its keys, the energy section's layout,
and the evaluation record (`evaluator.csv` rows, the rule for when a run is solved). It lives here, below `launch`,
so analysis reads runs without importing the code that made them.

No `from __future__ import annotations` here: the TypedDicts' NotRequired keys are told apart at run time (the key
lists leave them out), which needs the annotations evaluated.
"""
import csv
import math
from pathlib import Path
from typing import Any, Mapping, NotRequired, Sequence, TypeAlias, TypedDict, TypeVar

from quarl.ops.carbon import EnergyReport, combine
from quarl.ops.io import JSONValue
from quarl.replay.items import TableInfo


# The one summary.json layout (both runners), as TypedDicts: the top level (`Summary`) and its sections. The key
# lists the writers and readers use (`SUMMARY_KEYS`, `ACTOR_KEYS`, ...) are read off these classes, so the layout
# is written once. A key a runner has no value for is present with None (see docs/ARCHITECTURE.md,
# "summary.json"); a NotRequired key is one some records have and others not (it is in no key list).


# An evaluation at or above the target (`first_at_target`, `solved`): its return, its actor and learner steps and
# the run clock at its start; `streak` (solved only) is the run of such evaluations it ended. Functional form:
# "return" is a keyword.
AtTarget = TypedDict("AtTarget", {"target_return": float | None, "streak": NotRequired[int], "return": float,
                                  "actor_steps": int, "learner_steps": int | None, "wall_clock_s": float})


class FinalPolicy(TypedDict):
    """Which weights version policy_file and the final evaluation are, and why."""

    weights_version: int
    learner_steps: int
    why: str


class ActorSection(TypedDict):
    """One entry of `actors`. learner_wait_s: seconds an on-policy actor stood still for its learner (distributed:
    the long poll for the weights after a rollout, and waiting for room in its outbox; one process: the updates it
    waited through), kept out of `times`' stages; None for a replay actor, whose wait is the rate limiter's
    (replay.insert_blocked_s). `kernel` is `agents.base.KernelRecord`, `times` a `StageTimes.summary()`."""

    actor_id: int
    attempt: int | None
    starts: int | None
    actor_steps: int
    total_steps: int | None
    episodes: int | None
    envs_per_actor: int | None
    pinned_core: int | None
    elapsed_s: float | None
    steps_per_s: float | None
    backend: str | None
    kernel: dict[str, object] | None
    weights_version: int | None
    first_weights_version: int | None
    transitions_inserted: int | None
    payloads_rejected: int | None
    last_payload_rejection: str | None
    build_s: float | None
    times: dict[str, float | None] | None
    learner_wait_s: float | None
    energy: dict[str, object] | None
    rollouts: NotRequired[int]  # an on-policy actor's rollouts handed out


class PublishSection(TypedDict):
    """`learner.publish`: the weight channel's costs. ready_wait_*: the distributed learner's publisher thread
    waiting for the offered params to be computed, kept out of quantize_encode_* (None in one process: no publisher
    thread there)."""

    versions: int
    quantize_encode_s: float
    put_s: float | None
    payload_bytes: int
    quantize_encode_ms_per_version: float | None
    put_ms_per_version: float | None
    ready_wait_s: float | None
    ready_wait_ms_per_version: float | None


class LearnerSection(TypedDict):
    """`learner`: steps, rates, where the time went, the policy file and the learner's loop form."""

    learner_steps: int
    steps_this_run: int | None
    training_s: float | None
    steps_per_s: float | None
    step_s: float | None
    step_s_mean: float | None
    sample_wait_s: float | None
    weights_version: int | None
    resumed_from: str | None
    policy_file: str | None
    publish: PublishSection
    energy: dict[str, object] | None
    steps_per_call: int | None
    publish_handoff: dict[str, float] | None
    loop_form: dict[str, str] | None
    on_policy: NotRequired[dict[str, object]]  # an on-policy learner's mode, correction, rollouts, lag, mismatch


class PayloadSection(TypedDict):
    """`payload`: the weight payload's size against fp32 and the weight server's counts."""

    precision: str
    bytes: int
    fp32_bytes: int
    compression: float | None
    versions: int | None
    published: int | None
    requests: int | None
    payloads_served: int | None
    not_modified: int | None
    quantize_encode_s: float | None
    put_s: float | None
    quantize_encode_ms_per_version: float | None
    put_ms_per_version: float | None
    ready_wait_s: float | None
    ready_wait_ms_per_version: float | None


class RuntimeSection(TypedDict):
    """`runtime` (`launch.experiments.stages.runtime_section`): the actors' stage seconds summed, the counts, ms per
    weight update and µs per env step, the same keys in both runners."""

    summed_s: dict[str, float]
    env_steps: int
    pulls: int
    updates: int
    versions: int
    per_update: dict[str, float | None]
    per_step: dict[str, float | None]


class EnergySection(TypedDict):
    """`energy` (`sum_energy`): each node's report and the totals; the kWh split exists where something was
    measured or modelled (NotRequired: absent when no tracker reported)."""

    nodes: dict[str, dict[str, object]]
    total_kwh: float | None
    total_emissions_kg: float | None
    untracked_nodes: list[str]
    method: str
    measured_kwh: NotRequired[float]
    modelled_kwh: NotRequired[float]
    ram_model_share: NotRequired[float | None]
    package_kwh: NotRequired[float | None]


# `replay`: the table's counters (`quarl.replay.items.TableInfo`), or {} for an agent without replay.
ReplaySection: TypeAlias = TableInfo | dict[str, object]


class Summary(TypedDict):
    """summary.json. The clocks (seconds), one meaning each in both runners: wall_clock_s, the launcher's around the
    whole run (start-up and shutdown included); run_wall_clock_s, the run's own from its start to its stop
    (evaluator.csv's wall_clock_s, and that of first_at_target and solved, is on it); train_clock_s, the run clock
    less the time training stood still for evaluations. first_at_target: the first evaluation at or above
    target_return; solved: the one that ended the first streak of target_streak such evaluations
    (time_to_target_s and actor_steps_to_target are solved's). best_policy_file: policy_best_<precision>.qrlp (one
    process). final_policy: a distributed run its evaluations solved ends on the solving version, though its learner
    trained on while the stop went round."""

    status: str
    error: str | None
    runner: str
    agent: str
    task: str
    precision: str
    backend: list[str]
    kernel_form: list[str]
    kernel_fallback: bool
    executed: str
    executor: str
    cpu_class: str | None
    num_actors: int
    envs_per_actor: int
    seed: int
    experiment: dict[str, JSONValue]
    config: dict[str, JSONValue] | None
    logdir: str
    final_eval_return: float | None
    final_eval_return_fp32: float | None
    best_eval_return: float | None
    evaluations: int
    eval_episodes: int | None
    target_return: float | None
    time_to_target_s: float | None
    actor_steps_to_target: int | None
    first_at_target: AtTarget | None
    solved: AtTarget | None
    wall_clock_s: float
    run_wall_clock_s: float
    train_clock_s: float | None
    evaluation_s: float | None
    sync_learner: bool | None
    actor_steps: int
    learner_steps: int
    episodes: int
    actor_steps_per_s: float
    learner_steps_per_s: float | None
    actor_update_period: int | None
    weight_updates: int
    weights_version: int | None
    payload: PayloadSection
    payload_bytes: int
    payload_bytes_fp32: int
    payloads_rejected: int
    runtime: RuntimeSection
    actors: list[ActorSection]
    learner: LearnerSection
    replay: ReplaySection
    energy: EnergySection
    policy_file: str | None
    best_policy_file: str | None
    final_policy: FinalPolicy | None
    lost_nodes: list[str]
    placement: dict[str, JSONValue]
    lost_hosts: list[str]
    learner_device: dict[str, JSONValue] | None


def layout_keys(section: type) -> tuple[str, ...]:
    """A section's keys every record has, in the TypedDict's order (NotRequired ones left out)."""
    required = getattr(section, "__required_keys__")
    return tuple(k for k in section.__annotations__ if k in required)


SUMMARY_KEYS = layout_keys(Summary)
ACTOR_KEYS = layout_keys(ActorSection)
LEARNER_KEYS = layout_keys(LearnerSection)
PUBLISH_KEYS = layout_keys(PublishSection)
PAYLOAD_KEYS = layout_keys(PayloadSection)


# Facts each runner passes itself (None where it has none): the single-process loop's switches, and the clocks
# the runners measure differently (train_clock_s: the run clock less the time training stood still for
# evaluations; the distributed evaluator runs beside training, so there it is the run clock).
RUNNER_FACTS = ("train_clock_s", "evaluation_s", "sync_learner", "final_eval_return_fp32", "actor_update_period",
                "policy_file", "best_policy_file", "final_policy")


def sum_energy(parts: Mapping[str, object]) -> EnergySection:
    """Per-node energy reports (quarl.ops.carbon) and their totals via `quarl.ops.carbon.combine` (attributed parts
    add up; a RAPL package reading is counted once per host, never per node). Totals are None when nothing was
    measured; emissions are None when any node's grid intensity was unavailable."""
    nodes = {k: dict(v) for k, v in parts.items() if isinstance(v, Mapping)}
    reports = []
    for value in nodes.values():
        try:
            reports.append(EnergyReport.from_dict(value))
        except TypeError:  # a node report without the fields of an EnergyReport: not summed
            continue
    untracked = sorted(k for k, v in parts.items() if not isinstance(v, Mapping))
    if not reports:
        return {"nodes": nodes, "total_kwh": None, "total_emissions_kg": None, "untracked_nodes": untracked,
                "method": "unavailable: no energy tracker reported"}
    total = combine(reports)
    methods = sorted({r.method for r in reports})
    return {"nodes": nodes, "total_kwh": total.energy_kwh, "total_emissions_kg": total.emissions_kg_co2eq,
            "measured_kwh": total.measured_kwh, "modelled_kwh": total.modelled_kwh,
            "ram_model_share": total.ram_model_share, "package_kwh": total.package_kwh,
            "untracked_nodes": untracked, "method": "; ".join(methods)}


def keyed(entry: Mapping[str, object] | None, keys: Sequence[str]) -> dict[str, object]:
    """`entry` with every key of `keys` (None where absent) first, then whatever else it holds."""
    entry = dict(entry or {})
    return {**{k: entry.pop(k, None) for k in keys}, **entry}


Row = TypeVar("Row", bound=Mapping[str, Any])  # an evaluator.csv row: `EvalRow`, or `read_evals`' floats


def solved_at(evals: Sequence[Row], target: float | None, streak: int = 1) -> Row | None:
    """The evaluation that solved the run: the first that ends `streak` evaluations in a row whose mean return
    is at or above `target` (None: not solved, or no target). One rule for stopping and for summary.json."""
    if target is None:
        return None
    run = 0
    for row in evals:
        run = run + 1 if row["return"] >= target else 0
        if run >= max(1, int(streak)):
            return row
    return None


def read_evals(path: Path) -> list[dict[str, float]]:
    """evaluator.csv rows (actor_steps, wall_clock_s, return, and learner_steps: NaN where absent) with finite
    values, in file order."""
    if not path.exists():
        return []
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                parsed = {k: float(row[k]) for k in ("actor_steps", "wall_clock_s", "return")}
            except (KeyError, ValueError):
                continue
            if all(math.isfinite(v) for v in parsed.values()):
                try:
                    parsed["learner_steps"] = float(row.get("learner_steps") or "nan")
                except ValueError:
                    parsed["learner_steps"] = math.nan
                out.append(parsed)
    return out

