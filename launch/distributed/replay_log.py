"""replay.csv: the replay table's counters as the supervisor polls them, so the rate limiter's behaviour over a
distributed run (samples per insert, who was held back) can be checked afterwards."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Mapping

from quarl.ops.logs import CSVLogger

REPLAY_LOG_FIELDS = ["wall_clock_s", "actor_steps", "learner_steps", "size", "inserts", "samples",
                     "samples_per_insert", "rate_limiter_diff", "insert_blocked_calls", "sample_blocked_calls"]


class ReplayLog:
    """replay.csv: the table's counters as the driver polls them, every `every_s` seconds, so the rate
    limiter's behaviour over a run (samples per insert, who was held back) can be checked afterwards."""

    def __init__(self, logdir: str, every_s: float):
        self._path = Path(logdir) / "replay.csv"
        self._every_s = float(every_s)
        self._last = -math.inf
        self._log: CSVLogger | None = None

    def write(self, counts: Mapping[str, float], info: Mapping[str, object], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._every_s:
            return
        if self._log is None:
            self._log = CSVLogger(self._path, REPLAY_LOG_FIELDS)
        self._last = now
        row = {"wall_clock_s": float(counts["wall_clock_s"]), "actor_steps": int(counts["actor_steps"]),
               "learner_steps": int(counts["learner_steps"])}
        row.update({k: info[k] for k in REPLAY_LOG_FIELDS if k in info and k not in row})
        self._log.write(row)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
