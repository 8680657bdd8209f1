"""The learner's record of published weight versions that evaluations used, so that a run its evaluations solved can
end on the policy that solved it (`LearnerNode.stop(final_version)`), not on whatever the learner trained on to while
the stop went round (on cartpole:balance a few hundred steps can take a solved 994 down to 445)."""
from __future__ import annotations

import collections
import threading

from chex import ArrayTree

# fp32 snapshots of the newest published versions: the evaluator pins the version it fetched one call after fetching
# it, and at most a version or two are published in between (a publication takes milliseconds).
RECENT_VERSIONS = 2
PINNED_VERSIONS = 4  # the versions evaluations used, newest last: a streak of evaluations needs its last one


class KeptVersions:
    """Published versions' fp32 snapshots (device references that later updates leave valid: `policy_snapshot`):
    the newest `recent`, and up to `pinned` that evaluations pinned. Thread-safe (publisher thread, node calls)."""

    def __init__(self, recent: int = RECENT_VERSIONS, pinned: int = PINNED_VERSIONS):
        self._max_recent, self._max_pinned = int(recent), int(pinned)
        self._recent: collections.OrderedDict[int, ArrayTree] = collections.OrderedDict()
        self._pinned: collections.OrderedDict[int, ArrayTree] = collections.OrderedDict()
        self._lock = threading.Lock()

    def published(self, version: int, params: ArrayTree) -> None:
        with self._lock:
            self._recent[int(version)] = params
            while len(self._recent) > self._max_recent:
                self._recent.popitem(last=False)

    def pin(self, version: int) -> bool:
        """Keeps `version` while newer ones are published; False when it is no longer held."""
        with self._lock:
            params = self._pinned.get(version, self._recent.get(version))
            if params is None:
                return False
            self._pinned[int(version)] = params
            self._pinned.move_to_end(int(version))
            while len(self._pinned) > self._max_pinned:
                self._pinned.popitem(last=False)
            return True

    def pinned(self, version: int | None) -> ArrayTree | None:
        with self._lock:
            return None if version is None else self._pinned.get(int(version))
