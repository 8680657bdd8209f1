"""Checkpoints of a distributed ActorQ run, and `--resume`.

Layout under the run's logdir:

    checkpoints/step_<N>/learner/      orbax-checkpoint of the learner state pytree (params, target params,
                                       optimizer state, step count; plain dicts/lists of NumPy arrays)
    checkpoints/step_<N>/replay.npz    the replay table's `state_dict()` (items oldest first, priorities,
                                       insert/sample counters), NumPy's npz, loaded with allow_pickle=False
    checkpoints/step_<N>/manifest.json format version, run config, agent config, learner step, weights
                                       version, run counters, SHA-256 of replay.npz and of every learner file,
                                       and a SHA-256 of the manifest itself (so an edited or bit-flipped
                                       manifest is refused, not trusted)
    checkpoints/latest.json            {"step": N} (written last, atomically: a checkpoint is either complete
                                       and listed, or ignored)

What `--resume` restores: the learner (weights, target networks, optimizer state, step count, hence the
target-update schedule), the replay contents and rate-limiter counters, the run counters (actor steps, learner
steps, episodes, elapsed wall clock) and the weights version. What it does not: actor and evaluator RNG
streams and environment states (episodes restart), a DQN actor's epsilon-decay position, the replay sampler's
RNG, energy counters (a resumed run measures its own), and items inserted after the checkpoint was taken.
A checkpoint whose agent, task or agent config differs from the resuming run's is rejected with a
ValueError naming the first mismatching field; a corrupted one (any file's bytes changed, a learner file
missing or added, the manifest edited) with a `CheckpointError` naming the file. A checkpoint that fails
half-way (e.g. the replay server died) leaves no directory behind, and latest.json keeps naming the last
complete one. Nothing here unpickles: orbax + npz + JSON only.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, TypedDict, cast

import numpy as np

from quarl.ops.io import JSONValue, atomic_output, jsonable, write_text_atomic
from quarl.replay.items import TableState

if TYPE_CHECKING:  # JAX-free at import: launch.actorq checks --resume with this module before JAX loads
    from chex import ArrayTree

    from agents import AgentConfig

FORMAT_VERSION = 2  # 2: per-file learner checksums and a manifest checksum
CHECKPOINT_DIR = "checkpoints"
MANIFEST = "manifest.json"
LATEST = "latest.json"
REPLAY_FILE = "replay.npz"
LEARNER_DIR = "learner"
KEEP = 2  # complete checkpoints kept; older ones are deleted once a newer one is listed
_DATA_PREFIX = "data:"
MANIFEST_DIGEST = "manifest_sha256"
LEARNER_FILES = "learner_files"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, incomplete, corrupted or from another configuration."""


class ReplaySnapshot(TypedDict):
    """What a replay snapshot's writer reports for the manifest: the npz file's SHA-256 and its item count."""

    sha256: str
    items: int


# ------------------------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under `root`, by relative path (so a mismatch can name the file)."""
    return {str(path.relative_to(root)): _sha256_file(path) for path in sorted(root.rglob("*")) if path.is_file()}


def _manifest_digest(manifest: Mapping[str, JSONValue]) -> str:
    """SHA-256 of the manifest's canonical JSON, without its own digest field."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _write_json_atomic(path: Path, obj: JSONValue) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True))


def _read_json(path: Path, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {what} {str(path)!r}: {e}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{what} {str(path)!r} is not a JSON object")
    return obj


# ------------------------------------------------------------------------------------------------------
# Replay snapshots (npz)
# ------------------------------------------------------------------------------------------------------


def save_replay(path: str | os.PathLike, state: TableState) -> ReplaySnapshot:
    """Writes a `Table.state_dict()` to `path` (npz); returns {"sha256", "items"} for the manifest."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {_DATA_PREFIX + column: np.asarray(arr) for column, arr in state["data"].items()}
    arrays.update({key: np.asarray(value) for key, value in state.items() if key != "data"})
    with atomic_output(path) as f:
        np.savez(f, **arrays)
    return {"sha256": _sha256_file(path), "items": int(np.asarray(state["keys"]).shape[0])}


def load_replay(path: str | os.PathLike, sha256: str | None = None) -> TableState:
    """Reads a replay snapshot (checking its SHA-256 when given) back into `Table.load_state_dict` form."""
    path = Path(path)
    if sha256 is not None and _sha256_file(path) != sha256:
        raise CheckpointError(f"replay snapshot {str(path)!r} does not match its checksum")
    data: dict[str, np.ndarray] = {}
    state: dict[str, object] = {"data": data}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            if key.startswith(_DATA_PREFIX):
                data[key[len(_DATA_PREFIX):]] = npz[key]
            else:
                arr = npz[key]
                state[key] = arr.item() if arr.ndim == 0 else arr
    return cast(TableState, state)  # as stored: `Table.load_state_dict` checks every field


# ------------------------------------------------------------------------------------------------------
# Learner state (orbax)
# ------------------------------------------------------------------------------------------------------


def save_learner(path: str | os.PathLike, state: ArrayTree) -> None:
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

    checkpointer = ocp.StandardCheckpointer()
    try:
        checkpointer.save(Path(path).absolute(), state)
        checkpointer.wait_until_finished()
    finally:
        checkpointer.close()


def restore_learner(path: str | os.PathLike, template: ArrayTree) -> ArrayTree:
    """Restores into the structure of `template` (the fresh learner's `get_state()`)."""
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

    checkpointer = ocp.StandardCheckpointer()
    try:
        return checkpointer.restore(Path(path).absolute(), template)
    except Exception as e:  # orbax raises many types for structure/shape mismatches
        raise CheckpointError(f"learner checkpoint {str(path)!r} does not fit this learner: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    finally:
        checkpointer.close()


# ------------------------------------------------------------------------------------------------------
# Whole checkpoints
# ------------------------------------------------------------------------------------------------------


def checkpoint_root(logdir: str | os.PathLike) -> Path:
    return Path(logdir) / CHECKPOINT_DIR


def write_checkpoint(logdir: str | os.PathLike, *, step: int, learner_state: ArrayTree,
                     save_replay_to: Callable[[str], ReplaySnapshot],
                     manifest: Mapping[str, JSONValue]) -> Path:
    """Writes checkpoint `step` (learner, then replay via `save_replay_to(path)`, then the manifest), lists
    it in latest.json and prunes older ones. Returns the checkpoint directory."""
    root = checkpoint_root(logdir)
    final = root / f"step_{int(step)}"
    tmp = root / f"step_{int(step)}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        # The replay first: it lives in another process, which is the part most likely to be gone.
        replay_meta = dict(save_replay_to(str(tmp / REPLAY_FILE)))
        save_learner(tmp / LEARNER_DIR, learner_state)
        body = dict(manifest)
        body.update({
            "format_version": FORMAT_VERSION,
            "learner_steps": int(step),
            "replay": replay_meta,
            "checksums": {REPLAY_FILE: replay_meta["sha256"], LEARNER_FILES: _file_digests(tmp / LEARNER_DIR)},
        })
        body[MANIFEST_DIGEST] = _manifest_digest(body)
        _write_json_atomic(tmp / MANIFEST, body)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # never leave a half-written checkpoint behind
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _write_json_atomic(root / LATEST, {"step": int(step)})
    steps = sorted(int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit())
    for old in steps[:-KEEP]:
        shutil.rmtree(root / f"step_{old}", ignore_errors=True)
    return final


def find_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint to resume from: `path` itself (a step_<N> directory), or the latest one listed under
    `path` (a run's logdir or its checkpoints/ directory). CheckpointError when there is none."""
    try:
        p = Path(path).expanduser()
        if (p / MANIFEST).is_file():
            return p
        for root in (p / CHECKPOINT_DIR, p):
            latest = root / LATEST
            if latest.is_file():
                step = _read_json(latest, "checkpoint index").get("step")
                candidate = root / f"step_{step}"
                if (candidate / MANIFEST).is_file():
                    return candidate
                raise CheckpointError(f"{str(latest)!r} lists step {step}, but {str(candidate)!r} is incomplete")
    except (OSError, ValueError, RuntimeError) as e:  # NUL in the path, unknown ~user, name too long, ...
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"cannot look for a checkpoint in {str(path)!r}: {e}") from None
    raise CheckpointError(f"no checkpoint in {str(p)!r} (expected {CHECKPOINT_DIR}/{LATEST} or {MANIFEST})")


def read_manifest(checkpoint_dir: str | os.PathLike, *, verify: bool = True) -> dict:
    """The manifest of a checkpoint, checked against its own checksum; with `verify`, also every learner file
    and the replay snapshot against theirs (CheckpointError naming the first file that does not match)."""
    d = Path(checkpoint_dir)
    manifest = _read_json(d / MANIFEST, "checkpoint manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {str(d)!r} has format version {manifest.get('format_version')!r}, "
                              f"this code reads {FORMAT_VERSION}")
    if manifest.get(MANIFEST_DIGEST) != _manifest_digest(manifest):
        raise CheckpointError(f"checkpoint manifest {str(d / MANIFEST)!r} does not match its own checksum "
                              f"(edited or corrupted)")
    for key in ("learner_steps", "run_config", "agent_config", "counts", "checksums"):
        if key not in manifest:
            raise CheckpointError(f"checkpoint manifest {str(d / MANIFEST)!r} lacks {key!r}")
    checksums = manifest["checksums"]
    if not (isinstance(checksums, dict) and isinstance(checksums.get(LEARNER_FILES), dict)):
        raise CheckpointError(f"checkpoint manifest {str(d / MANIFEST)!r} has no per-file checksums")
    if verify:
        _verify_files(d / LEARNER_DIR, checksums[LEARNER_FILES])
        replay = d / REPLAY_FILE
        if not replay.is_file():
            raise CheckpointError(f"checkpoint {str(d)!r} lacks its replay snapshot {REPLAY_FILE}")
        if _sha256_file(replay) != checksums.get(REPLAY_FILE):
            raise CheckpointError(f"replay snapshot {str(replay)!r} does not match its checksum in the manifest")
    return manifest


def _verify_files(root: Path, expected: Mapping[str, str]) -> None:
    actual = _file_digests(root) if root.is_dir() else {}
    for name in sorted(set(expected) | set(actual)):
        where = f"{str(root / name)!r}"
        if name not in actual:
            raise CheckpointError(f"learner checkpoint file {where} is missing")
        if name not in expected:
            raise CheckpointError(f"learner checkpoint file {where} is not listed in the manifest")
        if actual[name] != expected[name]:
            raise CheckpointError(f"learner checkpoint file {where} does not match its checksum in the manifest")


def check_compatible(manifest: Mapping[str, JSONValue], *, agent: str, task: str,
                     agent_config: Mapping[str, JSONValue]) -> None:
    """Rejects a checkpoint made for another agent, task or agent configuration (naming the field)."""
    saved = manifest["run_config"]
    for key, value in (("agent", agent), ("task", task)):
        if saved.get(key) != value:
            raise CheckpointError(f"checkpoint was made with --{key} {saved.get(key)!r}, this run uses {value!r}")
    saved_cfg = manifest["agent_config"]
    for key in sorted(set(saved_cfg) | set(agent_config)):
        if _json_round_trip(saved_cfg.get(key)) != _json_round_trip(agent_config.get(key)):
            raise CheckpointError(f"checkpoint was made with {key}={saved_cfg.get(key)!r}, "
                                  f"this run has {key}={agent_config.get(key)!r}")


def _json_round_trip(value: object) -> JSONValue:
    """Config values as they look after a JSON round trip (tuples become lists)."""
    return json.loads(json.dumps(jsonable(value)))


def agent_config_dict(config: AgentConfig) -> dict[str, JSONValue]:
    """A frozen agent config as JSON-able data (what the manifest stores and compares)."""
    return _json_round_trip(dataclasses.asdict(config))
