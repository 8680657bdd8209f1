"""Replay: Reverb's table semantics in NumPy (FIFO storage, uniform or prioritized sampling, rate limiters,
blocking calls with timeouts), a table that stores stacked frames once, and the actor-side n-step adders.

`table_from_config` is the one place an agent's replay settings become a table, for the single-process runner and
the replay server alike.
"""
from __future__ import annotations

from quarl.replay.frames import FrameTable, frame_columns
from quarl.replay.items import (
    Rollout, Sample, Signature, StackedSample, TableConfig, TableInfo, TableState, Transition,
)
from quarl.replay.limiter import MinSize, RateLimiter, RateLimiterTimeout, SampleToInsertRatio
from quarl.replay.sumtree import SumTree, importance_weights
from quarl.replay.table import Table, TableClosed

__all__ = ["FrameTable", "MinSize", "RateLimiter", "RateLimiterTimeout", "Rollout", "Sample", "SampleToInsertRatio",
           "Signature", "StackedSample", "SumTree", "Table", "TableClosed", "TableConfig", "TableInfo", "TableState", "Transition",
           "importance_weights", "table_from_config"]


def table_from_config(signature: Signature, table_config: TableConfig, *, name: str = "replay",
                      seed: int | None = None) -> Table:
    """A `Table` with a samples-per-insert limiter from an agent builder's `table_config()` dict (keys capacity,
    sampler, priority_exponent, samples_per_insert, min_size_to_sample, error_buffer): the one place that turns an
    agent's replay settings into a table, for the single-process runner and the replay server alike. Image
    observations of stacked frames get a `quarl.replay.frames.FrameTable` (each frame stored once)."""
    limiter = SampleToInsertRatio(table_config["samples_per_insert"], table_config["min_size_to_sample"],
                                  table_config["error_buffer"])
    cls = FrameTable if frame_columns(signature) else Table  # stacked frames (ALE): each frame stored once
    return cls(name, table_config["capacity"], signature, sampler=table_config["sampler"],
               priority_exponent=table_config["priority_exponent"], rate_limiter=limiter, seed=seed)

