"""The learner's kept versions: what lets a solved run end on the policy its evaluations solved it with."""
from __future__ import annotations

from launch.distributed.nodes.kept_versions import KeptVersions
from launch.experiments.summary import final_policy_record


def test_a_pinned_version_outlives_newer_publications_and_an_unpinned_one_does_not():
    kept = KeptVersions(recent=2, pinned=2)
    for version in (10, 20, 30):
        kept.published(version, {"w": version})
    assert not kept.pin(10)  # two newer versions took its place before anyone pinned it
    assert kept.pin(20) and kept.pin(30)
    for version in range(40, 100, 10):
        kept.published(version, {"w": version})
    assert kept.pinned(20) == {"w": 20} and kept.pinned(30) == {"w": 30} and kept.pinned(40) is None
    assert kept.pin(90) and kept.pinned(20) is None  # at most `pinned` kept: the oldest goes
    assert kept.pin(30) and kept.pinned(None) is None


def test_the_final_policy_record_says_which_version_and_why():
    solved = final_policy_record(2000, 2412, solved=2000)
    assert solved == {"weights_version": 2000, "learner_steps": 2412,
                      "why": "the version whose evaluations solved the run (the learner had trained to step 2412)"}
    assert "no longer held" in final_policy_record(2412, 2412, solved=2000)["why"]
    assert final_policy_record(2412, 2412, solved=None)["why"] == "the learner's newest weights"
