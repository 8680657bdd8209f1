"""Activation-range calibration for int8 conv actors: the learner measures, the payload carries, actors use.

Why: the fast int8 conv kernels (ONNX Runtime's QLinearConv, and the static MatMulIntegerToFloat after it) take
*static* activation scales; quantizing each activation tensor per call (dynamic) costs more than the integer
conv saves. Static scales must come from the data the policy will see: ranges measured on random inputs put a
MinAtar-sized net 15% off its fp32 outputs in one case. So the learner runs the weights the actors will use
(dequantized, i.e. what an int8 actor computes with) on observations sampled from replay, records each
Linear/Conv2D layer's input range (min, max, widened to include 0) and ships {layer: [lo, hi]} with the weights
(`QuantizedParams.activation_ranges`, payload format 4). Min/max rather than a percentile: an input beyond
the range saturates, and a saturated Q-value can flip the greedy action.

Before the learner has sampled anything (the first publish) there are no replay observations: the ranges then
come from uniform [0, 1) inputs (`cold_start_observations`), a stand-in good enough for a policy that still
acts almost only at random, replaced from the next publish on. A saved policy without a replay (post-training
quantization sweeps) is calibrated on the observations it meets acting
(`quarl.acting.evaluation.rollout_observations`).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from quarl.policy.reference import reference_apply
from quarl.policy.spec import ParamTree, PolicySpec
from quarl.quant.precision import Precision, parse_precision
from quarl.quant.quantization import QuantizedParams, dequantize_params, quantize_params

# Observations a calibration uses at most (the most recent ones): enough for stable min/max on MinAtar and ALE
# frames, few enough that a float32 host forward of the Nature torso stays a few tens of milliseconds.
MAX_CALIBRATION_OBS = 256


def needs_calibration(spec: PolicySpec, precision: str | Precision) -> bool:
    """True for conv policies at int2..int8: their actors quantize activations with static scales."""
    prec = parse_precision(precision)
    return bool(spec.conv_layers) and prec.has_int_kernel


def cold_start_observations(spec: PolicySpec, count: int = 64, seed: int = 0) -> np.ndarray:
    """Uniform [0, 1) observations [count, input_dim]: the stand-in before any replay sample exists."""
    return np.random.default_rng(seed).random((count, spec.input_dim), dtype=np.float32)


def activation_ranges(spec: PolicySpec, params: ParamTree, observations: np.ndarray) -> dict[str, np.ndarray]:
    """{layer name: float32 [lo, hi]} of every Linear and Conv2D layer's input over `observations` ([N, input_dim]
    or [N, *input_shape]), with lo <= 0 <= hi. `params` is a float tree (the dequantized actor weights)."""
    obs = np.asarray(observations, np.float32)
    if obs.ndim < 2 or obs.shape[0] == 0 or int(np.prod(obs.shape[1:])) != spec.input_dim:
        raise ValueError(f"calibration needs observations [N, {spec.input_dim}] (N >= 1), got {obs.shape}")
    if not np.isfinite(obs).all():
        raise ValueError("calibration observations contain NaN or inf")
    obs = obs[-MAX_CALIBRATION_OBS:].reshape(-1, spec.input_dim)
    ranges: dict[str, np.ndarray] = {}

    def record(name: str, x: np.ndarray) -> None:
        ranges[name] = np.array([min(0.0, float(x.min())), max(0.0, float(x.max()))], np.float32)

    reference_apply(spec, params, obs, dtype=np.float32, on_input=record)
    return ranges


def quantize_for_actors(spec: PolicySpec, params: ParamTree, precision: str | Precision,
                        observations: np.ndarray | None = None, per_channel: bool = True,
                        layer_bits: Mapping[str, int] | None = None) -> QuantizedParams:
    """`quantize_params` (with `layer_bits`: modules kept wider), plus the activation ranges int conv actors need
    (measured on `observations`, or on `cold_start_observations` when None). Every learner-side publish goes
    through here."""
    return with_activation_ranges(spec, quantize_params(params, precision, per_channel, layer_bits), observations)


def with_activation_ranges(spec: PolicySpec, qp: QuantizedParams,
                           observations: np.ndarray | None = None) -> QuantizedParams:
    """`qp` with the activation ranges its int conv actors need (measured on the weights actors will compute with,
    over `observations` or `cold_start_observations` when None); `qp` itself for every other policy."""
    if not needs_calibration(spec, qp.precision):
        return qp
    obs = cold_start_observations(spec) if observations is None else observations
    return dataclasses.replace(qp, activation_ranges=activation_ranges(spec, dequantize_params(qp), obs))


def learner_observations(learner: object) -> np.ndarray | None:
    """The replay observations a learner last trained on (`calibration_observations()`, where it has one), or
    None (nothing sampled yet, or an agent without image policies)."""
    fn = getattr(learner, "calibration_observations", None)
    return None if fn is None else fn()
