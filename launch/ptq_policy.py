"""Which trained policy a PTQ sweep reads, and how each row of the sweep acts: shared by `launch.ptq` and
`bench.learning.ptq_study`.

All agents' policies load the same way. Every runner saves the final fp32 policy with `quarl.quant.policy_io.save_policy`
(a spec plus its weights, and a sidecar naming the agent and task), and a greedy policy needs nothing from the
agent's code: a discrete task acts on the argmax of the outputs (DQN's Q-values, PPO/A2C's logits), a continuous
task on the outputs themselves (D4PG's tanh-bounded action, PPO/A2C's Gaussian mean, which the environment clips
to its bounds). What is checked by agent name is only that this build knows the agent (`agents.AGENT_NAMES`), so
a policy from a newer build fails with one line instead of being evaluated under assumptions that may not hold,
and that the run's summary.json, when there is one, names the same agent and task as the policy's sidecar.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np
from dm_env import specs

import agents
from quarl.acting.evaluation import GreedyPolicy, check_compatible, make_greedy_policy, rollout_observations
from quarl.envs.factory import make_environment
from quarl.quant.calibration import quantize_for_actors
from quarl.quant.policy_io import LoadedPolicy, load_policy, policy_paths
from quarl.quant.precision import int_precision, parse_precision
from quarl.quant.quantization import fake_quantize_params, quantize_params
from quarl.policy.spec import Linear, PolicySpec

NO_GRANULARITY = "n/a"  # float casts have no scale, so per-tensor vs per-channel does not apply
GRANULARITIES = (("per-tensor", False), ("per-channel", True))
# The environment seed conv policies' int rows are calibrated in: far from the evaluation seeds (--seed + i).
CALIBRATION_SEED = 2**30
SUMMARY_FILE = "summary.json"
HEAD_SUFFIX = "-head"  # "int8-head16": int8 but the output layer at 16 bits


def load_trained_policy(path: str | os.PathLike) -> LoadedPolicy:
    """The fp32 policy of a run directory (or a `.qrlp` file) of any agent this build knows, checked against its
    task. Raises ValueError with one line naming what is wrong (missing, corrupt, unknown agent, a summary.json
    that disagrees, a task that cannot be built or does not fit the policy)."""
    policy = load_policy(path)
    if policy.agent not in agents.AGENT_NAMES:
        raise ValueError(f"the policy was trained by agent {policy.agent!r}, which this build does not know "
                         f"(agents: {', '.join(agents.AGENT_NAMES)})")
    _check_summary(policy_paths(path)[0].parent / SUMMARY_FILE, policy)
    _check_task(policy)
    return policy


def _check_summary(summary_path: Path, policy: LoadedPolicy) -> None:
    """A run's summary.json names the agent and task too: a policy file copied into another run's folder shows."""
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # a bare policy file (or a run that ended before its summary) has only its sidecar to go by
    if not isinstance(summary, dict):
        return
    for key, have in (("agent", policy.agent), ("task", policy.task)):
        said = summary.get(key)
        if said is not None and said != have:
            raise ValueError(f"{summary_path} says {key} {said!r} but the policy's sidecar says {have!r}")


def _check_task(policy: LoadedPolicy) -> None:
    try:
        env = make_environment(policy.task, 0)
    except ValueError as e:
        raise ValueError(f"the policy's task cannot be built: {e}") from None
    try:
        check_compatible(policy.spec, env.observation_spec(), env.action_spec())
    except ValueError as e:
        raise ValueError(f"the policy does not fit task {policy.task}: {e}") from None
    finally:
        env.close()


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One row of the sweep: a precision and how its weights are scaled."""

    precision: str
    granularity: str = NO_GRANULARITY
    # The output layer's weights at this wider integer width, the other layers at `precision` (an int one): the
    # "Q head at 16 bits" actor, against DQN's int8 misses from Q gaps smaller than the head's rounding.
    head_bits: int | None = None

    @property
    def bits(self) -> int:
        return parse_precision(self.precision).bits

    @property
    def name(self) -> str:
        """The row's name: the precision, with "-head16" for a wider output layer ("int8-head16")."""
        return self.precision + (f"{HEAD_SUFFIX}{self.head_bits}" if self.head_bits else "")

    @property
    def per_channel(self) -> bool:
        return self.granularity != "per-tensor"


def parse_row_name(name: str, granularity: str = "per-channel") -> GridPoint:
    """The GridPoint of a row name ("int8", "fp16", "int8-head16"); ValueError on anything else."""
    base, sep, head = name.partition(HEAD_SUFFIX)
    prec = parse_precision(base)
    if not sep:
        return GridPoint(prec.name, granularity if prec.is_int else NO_GRANULARITY)
    if not (prec.is_int and head.isdigit() and prec.bits < int(head) <= int_precision(int(head)).bits):
        raise ValueError(f"{name!r}: a wider head is an int precision with more head bits, e.g. int8{HEAD_SUFFIX}16")
    return GridPoint(prec.name, granularity, int(head))


def output_layer(spec: PolicySpec) -> str:
    """The name of the policy's last Linear layer: DQN's Q head, PPO/A2C's logits, D4PG's action layer."""
    names = [layer.name for layer in spec.layers if isinstance(layer, Linear)]
    if not names:
        raise ValueError("the policy has no Linear layer")
    return names[-1]


def sweep_grid(bits: Sequence[int], include: Sequence[str],
               granularities: Sequence[str] = tuple(g for g, _ in GRANULARITIES)) -> list[GridPoint]:
    """fp32 first (the baseline every error refers to), then the float references, then the integer widths
    from widest to narrowest, each at every granularity asked for."""
    points = [GridPoint("fp32"), *(GridPoint(name) for name in include)]
    for b in sorted(bits, reverse=True):
        points += [GridPoint(int_precision(b).name, granularity) for granularity in granularities]
    return points


def make_row_policy(point: GridPoint, policy: LoadedPolicy, action_spec: specs.Array, backend: str,
                    observations: np.ndarray | None = None) -> tuple[GreedyPolicy, str]:
    """The greedy policy for one row and how it executes: 'int-kernel' (with the head's width for a wider head),
    'native' or 'simulated'. Conv policies' int rows calibrate their activation ranges on `observations`
    (`calibration_observations`)."""
    prec = parse_precision(point.precision)
    if prec.simulated:
        rounded = fake_quantize_params(policy.params, prec, point.per_channel)
        fp32 = quantize_params(rounded, "fp32")
        return make_greedy_policy(policy.spec, fp32, action_spec, backend="jax"), "simulated"
    layer_bits = {output_layer(policy.spec): point.head_bits} if point.head_bits else None
    qparams = quantize_for_actors(policy.spec, policy.params, prec, observations, point.per_channel, layer_bits)
    greedy = make_greedy_policy(policy.spec, qparams, action_spec, backend=backend)
    if greedy.simulated:
        return greedy, "simulated"
    if point.head_bits:  # the other layers on the integer kernel, the wider head dequantized in fp32
        return greedy, f"int-kernel, head int{point.head_bits} in fp32"
    return greedy, "int-kernel" if prec.is_int else "native"


def calibration_observations(policy: LoadedPolicy, seed: int = CALIBRATION_SEED) -> np.ndarray | None:
    """For conv policies: observations the fp32 greedy policy meets in an environment seeded apart from the
    evaluation seeds (`quarl.acting.evaluation.rollout_observations`); None for the others (nothing to calibrate)."""
    if not policy.spec.conv_layers:
        return None
    env = make_environment(policy.task, seed)
    try:
        greedy = make_greedy_policy(policy.spec, quantize_params(policy.params, "fp32"), env.action_spec(),
                                    backend="onnx")
        return rollout_observations(env, greedy)
    finally:
        env.close()
