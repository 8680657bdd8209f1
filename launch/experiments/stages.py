"""Where an actor's time goes (the paper's runtime breakdown): one stage vocabulary for both runners.

The single-process loop (`launch.experiments.run_experiment`) and every distributed actor (`launch.distributed.nodes.actor`,
through its `launch.distributed.nodes.weights_client.PolicyClient`) add to one `StageTimes` each, and `runtime_section` turns them into the
`runtime` section of summary.json, so the same key means the same thing in both runners:

- env_step_s: stepping (and restarting) the environments;
- policy_s: the policy executor's forward pass;
- insert_s: the adders and the replay insert (including time the rate limiter held the actor back);
- pull_s: fetching the published bytes (a round trip to the weight server on Ray; nothing to fetch in one
  process, so 0 there by construction);
- deserialize_s: decoding and validating a payload (`quarl.quant.payload.decode_payload`);
- load_s: swapping the new weights into the executor;
- quantize_encode_s: the learner's side of a weight version (policy_params + quantize + encode).

Units: seconds summed over the run (`summed_s`), milliseconds per weight update (`per_update`), microseconds
per env step (`per_step`).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from analysis.schema import RuntimeSection

# The actor-side stages, in the paper's order, then the learner's side of a weight update.
ACTOR_STAGES = ("env_step_s", "policy_s", "insert_s", "pull_s", "deserialize_s", "load_s")
STAGES = (*ACTOR_STAGES, "quantize_encode_s")
UPDATE_STAGES = ("quantize_encode_s", "pull_s", "deserialize_s", "load_s")  # the stages of one weight update


@dataclasses.dataclass
class StageTimes:
    """One actor's stage totals (seconds, summed over the run) and counts; see the module docstring."""

    env_step_s: float = 0.0
    policy_s: float = 0.0
    insert_s: float = 0.0
    pull_s: float = 0.0  # weight requests (including the cheap "not modified" ones) + reading the bytes
    deserialize_s: float = 0.0
    load_s: float = 0.0  # building / refreshing the executor with new weights
    quantize_encode_s: float = 0.0  # only where the actor's process also makes the payload (one process)
    env_steps: int = 0
    pulls: int = 0
    updates: int = 0  # pulls that brought a new version
    payload_bytes: int = 0  # summed over the updates

    def summary(self) -> dict[str, float | None]:
        """The totals plus ms per update of each update stage and µs per env step (one actor's entry)."""
        out: dict[str, float | None] = dataclasses.asdict(self)
        out.update(_per_update(out, self.updates, self.updates))
        out.update(_per_step(out, self.env_steps))
        return out


def _number(value: object) -> float:
    """A recorded stage total (an actor's record may lack one, or hold None): 0 where there is none."""
    return float(value) if isinstance(value, (int, float)) else 0.0


def _per_update(summed: Mapping[str, float | None], updates: int, versions: int) -> dict[str, float | None]:
    """ms per weight update of each update stage (quantize_encode per published version); None without any."""
    out: dict[str, float | None] = {}
    for stage in UPDATE_STAGES:
        n = versions if stage == "quantize_encode_s" else updates
        out[f"{stage[:-2]}_ms_per_update"] = 1e3 * _number(summed.get(stage)) / n if n else None
    actor_side = [_number(out[f"{s[:-2]}_ms_per_update"]) for s in UPDATE_STAGES[1:]]
    out["update_ms"] = sum(actor_side) if updates else None  # pull + deserialize + load: what an actor waits
    return out


def _per_step(summed: Mapping[str, float | None], env_steps: int) -> dict[str, float | None]:
    """µs per env step of the per-step stages; None before any step."""
    return {f"{stage[:-2]}_us_per_step": 1e6 * _number(summed.get(stage)) / env_steps if env_steps else None
            for stage in ("env_step_s", "policy_s", "insert_s")}


def runtime_section(actor_times: Sequence[Mapping[str, object]], quantize_encode_s: float,
                    versions: int) -> RuntimeSection:
    """summary.json's `runtime`: the actors' stage totals summed (plus the learner's quantize + encode over
    `versions` published versions), the counts, ms per update and µs per env step. Same keys in both runners.
    `actor_times`: each actor's `StageTimes.summary()`, as its record carried it."""
    summed: dict[str, float] = {k: float(sum(_number(t.get(k)) for t in actor_times)) for k in ACTOR_STAGES}
    summed["quantize_encode_s"] = float(quantize_encode_s)
    counts = {k: int(sum(_number(t.get(k)) for t in actor_times)) for k in ("env_steps", "pulls", "updates")}
    per_update = {k.replace("_ms_per_update", "_ms"): v
                  for k, v in _per_update(summed, counts["updates"], int(versions)).items()}
    per_step = {k.replace("_us_per_step", "_us"): v for k, v in _per_step(summed, counts["env_steps"]).items()}
    return {"summed_s": summed, **counts, "versions": int(versions), "per_update": per_update,
            "per_step": per_step}
