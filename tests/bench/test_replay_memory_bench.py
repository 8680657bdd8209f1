"""bench.micro.replay_memory at a tiny size: the frame-deduplicated table's bytes, its eviction, and bad arguments."""
from __future__ import annotations

import json

import pytest

from bench.micro import replay_memory


def test_synthetic_fill_counts_one_frame_an_item_and_evicts():
    row = replay_memory.fill("synthetic", 600, 500, progress=False)
    assert row["transitions"] == 600 and row["size"] == 500  # capacity reached, the oldest evicted
    # one new frame per step: the live frames are the items plus the few at the eviction edge
    assert 1.0 <= row["frames_per_item"] < 1.05
    mem = row["memory"]
    assert mem["frame_bytes_live"] == mem["frames_live"] * 84 * 84
    assert mem["total"] >= mem["frame_bytes_live"] and row["plain_item_bytes"] == 2 * 84 * 84 * 4 + 12
    assert row["plain_table_bytes"] == 500 * (row["plain_item_bytes"] + 16)
    # ~1 frame an item instead of 8 (the store itself grows in 64 MiB chunks, so compare the live frames)
    assert mem["frame_bytes_live"] < row["plain_table_bytes"] / 6
    assert "extrapolated_1m" in row


def test_main_writes_a_row_with_the_machine(tmp_path):
    assert replay_memory.main(["--transitions", "300", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "replay_memory.json").read_text())
    assert rows[-1]["transitions"] == 300 and "cpu_model" in rows[-1]["machine"]


@pytest.mark.parametrize("argv", [["--transitions", "0"], ["--capacity", "-1"]])
def test_bad_sizes_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        replay_memory.main(argv)
    assert e.value.code == 2 and "must be positive" in capsys.readouterr().err
