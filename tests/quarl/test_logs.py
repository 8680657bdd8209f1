"""Tests for quarl.ops.logs: CSV append/flush semantics, fan-out, TensorBoard events, atomic JSON."""
from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import pytest

from quarl.ops import logs


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_csv_rows_are_on_disk_after_each_write(tmp_path):
    path = tmp_path / "deep" / "dir" / "log.csv"
    logger = logs.CSVLogger(path)
    logger.write({"step": 1, "loss": np.float32(0.5), "precision": "int8"})
    # readable before close: every row is flushed
    assert _rows(path) == [["step", "loss", "precision"], ["1", "0.5", "int8"]]
    logger.write({"step": np.int64(2), "loss": float("nan")})
    logger.write({"step": 3, "loss": -math.inf, "precision": None})
    assert _rows(path)[2:] == [["2", "nan", ""], ["3", "-inf", ""]]
    logger.close()


def test_csv_appends_to_existing_file_with_its_header(tmp_path):
    path = tmp_path / "log.csv"
    first = logs.CSVLogger(path, fieldnames=["step", "ret"])
    first.write({"step": 0, "ret": 1.25})
    first.close()
    second = logs.CSVLogger(path)
    assert second.fieldnames == ["step", "ret"]
    second.write({"ret": 2.0, "step": 1})
    second.close()
    assert _rows(path) == [["step", "ret"], ["0", "1.25"], ["1", "2.0"]]
    with pytest.raises(ValueError, match="already has columns"):
        logs.CSVLogger(path, fieldnames=["step", "other"])


def test_csv_files_always_start_with_their_header(tmp_path):
    # Known columns: the header is on disk before any row, so a run stopped before its first evaluation leaves a
    # readable, header-only evaluator.csv rather than a 0-byte file.
    path = tmp_path / "evaluator.csv"
    logs.CSVLogger(path, fieldnames=["actor_steps", "return"]).close()
    assert _rows(path) == [["actor_steps", "return"]]
    again = logs.CSVLogger(path, fieldnames=["actor_steps", "return"])  # reopened: the header is not repeated
    again.write({"actor_steps": 5, "return": 1.5})
    again.close()
    assert _rows(path) == [["actor_steps", "return"], ["5", "1.5"]]
    # Columns known only from the first row: no file until that row, never an empty one.
    lazy = logs.CSVLogger(tmp_path / "learner.csv")
    assert not (tmp_path / "learner.csv").exists()
    lazy.close()
    assert not (tmp_path / "learner.csv").exists()


def test_csv_refuses_unknown_keys_and_arrays(tmp_path):
    logger = logs.CSVLogger(tmp_path / "log.csv", fieldnames=["a"])
    with pytest.raises(ValueError, match="not columns"):
        logger.write({"a": 1, "b": 2})
    with pytest.raises(ValueError, match="not a scalar"):
        logger.write({"a": np.zeros(3)})
    logger.close()
    with pytest.raises(ValueError, match="closed"):
        logger.write({"a": 1})


def test_logger_fans_out_and_drops_arrays(tmp_path):
    monkey_secret = "QUARL_TEST_SECRET_VALUE"
    os.environ["QUARL_TEST_TOKEN"] = monkey_secret
    try:
        with logs.Logger(csv_path=tmp_path / "m.csv", tensorboard_dir=tmp_path / "tb", name="learner") as logger:
            logger.write({"step": 10, "loss": 0.25, "priorities": np.ones(4)})
            logger.write({"step": 20, "loss": 0.125, "priorities": np.ones(4)})
    finally:
        del os.environ["QUARL_TEST_TOKEN"]
    assert _rows(tmp_path / "m.csv") == [["step", "loss"], ["10", "0.25"], ["20", "0.125"]]
    event_files = list((tmp_path / "tb" / "learner").glob("events.out.tfevents.*"))
    assert len(event_files) == 1
    content = event_files[0].read_bytes()
    assert b"loss" in content and monkey_secret.encode() not in content
    assert monkey_secret not in (tmp_path / "m.csv").read_text()


def test_scalar_items_keeps_only_scalars():
    items = logs.scalar_items({"a": np.float64(1.5), "b": np.array(2), "c": [1, 2], "d": "x", "e": True})
    assert items == {"a": 1.5, "b": 2, "d": "x", "e": True}
    assert type(items["a"]) is float and type(items["b"]) is int


def test_write_json_atomic(tmp_path):
    path = tmp_path / "out" / "result.json"
    logs.write_json_atomic(path, {"x": np.float32(0.5), "arr": np.arange(3), "nested": {"p": tmp_path}})
    data = json.loads(path.read_text())
    assert data == {"x": 0.5, "arr": [0, 1, 2], "nested": {"p": str(tmp_path)}}
    logs.write_json_atomic(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2}
    with pytest.raises(ValueError, match="JSON"):
        logs.write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"x": 2}  # a failed write leaves the old file intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]  # no temporary files left
