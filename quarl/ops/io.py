"""Atomic file writes, JSON conversion and forgiving JSON reads shared by the library, the launchers, the
analysis and the benchmarks.

Every results file, policy, checkpoint manifest and cache is written through `write_bytes_atomic` so a
reader (another process, a resumed run, an analysis notebook) sees the old file or the new one, never half
of one, and a failed write leaves no temporary file behind.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping, TypeAlias, cast

import numpy as np

# A value read from or bound for JSON: a dict with str keys, a list, a str, a number, a bool or None, nested (what
# `json.loads` returns). A reader checks what it finds (isinstance) before it uses a value; a record whose layout
# is known has a TypedDict instead (summary.json's, `analysis.schema`).
JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject: TypeAlias = dict[str, JSONValue]


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` only when the block ends without an exception: temp file in the same
    folder, fsync, rename (a writer such as `np.savez` streams into it, nothing is held in memory twice).
    `mode` (e.g. 0o644) replaces mkstemp's private 0600. On any failure the temp file is removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, mode: int | None = None) -> None:
    """`data` to `path` through `atomic_output`: a reader sees the old file or the new one, never half of one."""
    with atomic_output(path, mode=mode) as f:
        f.write(data)


def write_text_atomic(path: str | os.PathLike, text: str, *, mode: int | None = None) -> None:
    """`write_bytes_atomic` for UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def read_json_object(path: str | os.PathLike) -> JSONObject | None:
    """The JSON object in `path` (a run's machine.json, a grid's grid.json); None where the file is missing,
    unreadable or holds something else, for callers that fall back to a default."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_json_list(path: str | os.PathLike) -> list[JSONObject]:
    """The objects of a JSON list file (a study's run sessions); [] where the file is missing, unreadable or
    not a list, so a first run and a damaged record both start a fresh list."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def _json_default(obj: object) -> JSONValue:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def write_json_atomic(path: str | os.PathLike, obj: object) -> None:
    """Writes `obj` as JSON to `path` atomically (indented, keys sorted, trailing newline).

    NumPy scalars/arrays and paths are converted; NaN/inf are written as JSON's NaN/Infinity tokens
    (which Python's json and pandas read back). Anything else unserialisable is a ValueError.
    """
    try:
        text = json.dumps(obj, indent=2, sort_keys=True, default=_json_default)
    except (TypeError, ValueError) as err:
        raise ValueError(f"cannot write {Path(path)} as JSON: {err}") from None
    write_text_atomic(path, text + "\n")


def jsonable(value: object) -> JSONValue:
    """`value` as plain JSON data: mappings with str keys, tuples as lists, NumPy scalars/arrays as Python
    numbers/lists; NaN stays a float NaN (json writes it as NaN). Other values are returned unchanged (a JSON
    writer then says what it cannot write)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return cast(JSONValue, value)
