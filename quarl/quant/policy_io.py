"""Saving and loading a trained fp32 policy: the hand-off from a training run to offline analysis (PTQ).

A run directory holds two files:

    policy_fp32.qrlp   a `quarl.quant.payload` payload of the fp32 weights and the `PolicySpec`
                       (version = learner steps; SHA-256 and format version in its header)
    policy_fp32.json   sidecar: format, task, agent, steps, SHA-256 of the payload file, free-form `extra`

Why the payload format rather than a new one: it already is the checked, versioned, msgpack (never pickle)
encoding of "a spec plus its weights" that every actor trusts, so a saved policy is exactly what an actor
would have received. The sidecar carries what the payload has no field for (which task and agent the policy
was trained on) and pins the payload bytes by hash, so a sidecar can never describe a different policy file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Mapping

import numpy as np

from quarl.ops.io import JSONValue, write_bytes_atomic
from quarl.policy.spec import ParamTree, PolicySpec
from quarl.quant.payload import decode_payload, encode_payload
from quarl.quant.quantization import dequantize_params, quantize_params

POLICY_FILE = "policy_fp32.qrlp"
META_FILE = "policy_fp32.json"
META_FORMAT = 1
_POLICY_SUFFIX = ".qrlp"
_READABLE = 0o644  # mkstemp's 0600 would hide the policy from other users' analyses


@dataclasses.dataclass(frozen=True)
class LoadedPolicy:
    """A trained policy read back from disk: `params` is a writable fp32 haiku tree matching `spec`."""

    spec: PolicySpec
    params: dict
    task: str
    agent: str
    meta: dict[str, JSONValue]  # the sidecar: format, task, agent, steps, sha256, nbytes, extra

    @property
    def steps(self) -> int:
        return int(self.meta["steps"])


def policy_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """(payload file, sidecar) for `path`: a `.qrlp` file path, or a run directory holding `policy_fp32.qrlp`."""
    p = Path(path).expanduser()
    if p.suffix == _POLICY_SUFFIX:
        return p, p.with_suffix(".json")
    return p / POLICY_FILE, p / META_FILE


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _check_tree(spec: PolicySpec, tree: Mapping[str, object]) -> None:
    """Every module and leaf the spec runs is in `tree` with the shape the spec needs (a ValueError naming the leaf
    otherwise), so no policy file is written that no runtime could load."""
    for module, leaves in spec.param_shapes().items():
        held = tree.get(module)
        if not isinstance(held, Mapping):
            raise ValueError(f"params have no module {module!r} (have {sorted(tree)})")
        for key, shape in leaves.items():
            if key not in held:
                raise ValueError(f"params {module!r} lack {key!r} (have {sorted(held)})")
            if np.shape(held[key]) != shape:
                raise ValueError(f"{module}/{key} has shape {np.shape(held[key])}, the spec needs {shape}")


def save_policy(path: str | os.PathLike, spec: PolicySpec, params: ParamTree, *, task: str, agent: str,
                steps: int = 0, extra: Mapping[str, JSONValue] | None = None) -> Path:
    """Write a trained fp32 policy for offline evaluation; returns the payload file's path.

    Call it at the end of a run with the run's log directory:

        save_policy(logdir, builder.policy_spec(env_spec), learner.policy_params(),
                    task=task, agent=builder.name, steps=learner.steps, extra={"seed": seed})

    `path` is a directory (files `policy_fp32.qrlp` + `policy_fp32.json` inside, created if needed) or a
    `*.qrlp` file path (sidecar next to it, same stem). `steps` (learner steps) becomes the payload version.
    `extra` is any JSON-able mapping kept in the sidecar (seed, precision trained at, final return, ...).
    The params are checked against the spec now (shapes, finiteness), so a bad policy fails at save time and
    not when someone analyses it later. Raises ValueError on bad arguments; existing files are replaced.
    """
    if not isinstance(spec, PolicySpec):
        raise ValueError(f"spec must be a quarl.policy.spec.PolicySpec, got {type(spec).__name__}")
    _check_name("task", task)
    _check_name("agent", agent)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    if extra is not None and not isinstance(extra, Mapping):
        raise ValueError(f"extra must be a mapping or None, got {type(extra).__name__}")
    extra_json = dict(extra or {})
    try:  # strict JSON: a NaN or a NumPy array in `extra` would make the sidecar unreadable elsewhere
        json.dumps(extra_json, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"extra must be plain JSON (no NaN/inf, arrays or objects): {e}") from None

    qparams = quantize_params(params, "fp32")  # validates leaves (float, finite) and copies them
    _check_tree(spec, qparams.tree)
    data = encode_payload(qparams, version=int(steps), spec=spec)
    payload_path, meta_path = policy_paths(path)
    meta = {"format": META_FORMAT, "task": task, "agent": agent, "steps": int(steps), "precision": "fp32",
            "payload": payload_path.name, "sha256": hashlib.sha256(data).hexdigest(), "nbytes": len(data),
            "extra": extra_json}
    # Payload first, sidecar last: a crash in between leaves a sidecar whose hash does not match, which
    # `load_policy` reports, rather than a sidecar pointing at a missing or older payload silently.
    write_bytes_atomic(payload_path, data, mode=_READABLE)
    write_bytes_atomic(meta_path, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(), mode=_READABLE)
    return payload_path


def _read_meta(meta_path: Path) -> dict[str, JSONValue]:
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"policy sidecar {meta_path} is missing (save_policy writes it next to the payload)") \
            from None
    except (OSError, ValueError) as e:
        raise ValueError(f"policy sidecar {meta_path} is unreadable: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise ValueError(f"policy sidecar {meta_path} has an unknown format (this build reads {META_FORMAT})")
    for key, kind in (("task", str), ("agent", str), ("steps", int), ("sha256", str), ("extra", dict)):
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise ValueError(f"policy sidecar {meta_path} has a missing or malformed {key!r}")
    return meta


def load_policy(path: str | os.PathLike) -> LoadedPolicy:
    """Read a policy written by `save_policy` from a run directory or a `*.qrlp` file.

    Raises ValueError (one line, naming the file) when the payload or sidecar is missing, corrupted,
    not fp32, lacks a spec, or the two files do not belong together.
    """
    payload_path, meta_path = policy_paths(path)
    try:
        data = payload_path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"no trained policy at {payload_path} (expected a file written by save_policy)") \
            from None
    except OSError as e:
        raise ValueError(f"cannot read policy {payload_path}: {e}") from None
    try:
        payload = decode_payload(data)
    except ValueError as e:
        raise ValueError(f"corrupt policy file {payload_path}: {e}") from None
    meta = _read_meta(meta_path)
    if hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise ValueError(f"policy file {payload_path} does not match its sidecar {meta_path.name} (hash differs)")
    if payload.precision != "fp32" or payload.spec is None:
        raise ValueError(f"policy file {payload_path} must hold fp32 weights with a spec, "
                         f"got {payload.precision} {'without' if payload.spec is None else 'with'} a spec")
    if payload.version != meta["steps"]:
        raise ValueError(f"policy file {payload_path} is at step {payload.version}, sidecar says {meta['steps']}")
    params = dequantize_params(payload.params)  # fresh float32 arrays, not views of `data`
    return LoadedPolicy(payload.spec, params, meta["task"], meta["agent"], meta)

