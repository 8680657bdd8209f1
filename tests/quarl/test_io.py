"""quarl.ops.io: atomic writes never leave a partial or temporary file; jsonable converts as the old copies did."""
import json
import math

import numpy as np
import pytest

from quarl.ops import io


def test_write_bytes_atomic_replaces_and_sets_mode(tmp_path):
    path = tmp_path / "sub" / "blob.bin"
    io.write_bytes_atomic(path, b"old")
    io.write_bytes_atomic(path, b"new", mode=0o644)
    assert path.read_bytes() == b"new"
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["blob.bin"]


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "result.json"
    io.write_text_atomic(path, "old")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(io.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        io.write_text_atomic(path, "new text that must never be seen half written")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_failed_first_write_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(io.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("rename refused")))
    with pytest.raises(OSError):
        io.write_bytes_atomic(tmp_path / "x.bin", b"data")
    assert list(tmp_path.iterdir()) == []


def test_write_json_atomic_converts_numpy_and_rejects_objects(tmp_path):
    path = tmp_path / "r.json"
    io.write_json_atomic(path, {"a": np.int64(3), "b": np.arange(2), "nan": float("nan")})
    assert path.read_text().endswith("\n")
    data = json.loads(path.read_text())
    assert data["a"] == 3 and data["b"] == [0, 1] and math.isnan(data["nan"])
    with pytest.raises(ValueError, match="JSON"):
        io.write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text())["a"] == 3


def test_jsonable_numpy_scalars_arrays_nan_and_keys():
    value = {1: (np.float32(0.5), np.int64(7)), "arr": np.array([[1, 2]], dtype=np.int8),
             "nested": [{"x": np.float64("nan")}], "s": "text", "none": None, "flag": np.bool_(True)}
    out = io.jsonable(value)
    assert out["1"] == [0.5, 7] and type(out["1"][1]) is int and type(out["1"][0]) is float
    assert out["arr"] == [[1, 2]] and type(out["arr"][0][0]) is int
    assert math.isnan(out["nested"][0]["x"]) and type(out["nested"][0]["x"]) is float
    assert out["s"] == "text" and out["none"] is None and out["flag"] is True
    json.dumps(out)  # plain JSON data now: no default= needed


def test_atomic_output_streams_a_writer_and_cleans_up_when_it_fails(tmp_path):
    path = tmp_path / "replay.npz"
    with io.atomic_output(path) as f:
        np.savez(f, a=np.arange(4))
    assert np.load(path)["a"].tolist() == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="writer failed"):
        with io.atomic_output(path) as f:
            f.write(b"half a snapshot")
            raise RuntimeError("writer failed")
    assert np.load(path)["a"].tolist() == [0, 1, 2, 3]  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["replay.npz"]


def test_json_readers_fall_back_on_missing_damaged_or_other_shaped_files(tmp_path):
    from quarl.ops.io import read_json_list, read_json_object

    files = {"obj": '{"a": 1}', "lst": '[{"a": 1}, 2, {"b": 3}]', "bad": "{nope", "num": "3"}
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert read_json_object(tmp_path / "obj") == {"a": 1}
    assert [read_json_object(tmp_path / n) for n in ("lst", "bad", "num", "missing")] == [None] * 4
    assert read_json_list(tmp_path / "lst") == [{"a": 1}, {"b": 3}]
    assert [read_json_list(tmp_path / n) for n in ("obj", "bad", "num", "missing")] == [[]] * 4
