"""Tests for quarl.replay.table: FIFO storage, samplers, priorities, Reverb rate limiting, validation, state."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from quarl import replay

SIG = {"obs": ((3,), np.float32), "action": ((), np.int32)}


def _batch(start: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + n)
    return {"obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32), "action": ids.astype(np.int32)}


def _table(capacity=8, **kwargs) -> replay.Table:
    return replay.Table("t", capacity, SIG, seed=0, **kwargs)


def test_fifo_eviction_keeps_newest_in_order():
    table = _table(capacity=4)
    assert table.insert(_batch(0, 3)) == 3
    table.insert(_batch(3, 3))
    assert table.size == 4
    state = table.state_dict()
    np.testing.assert_array_equal(state["keys"], [2, 3, 4, 5])
    np.testing.assert_array_equal(state["data"]["action"], [2, 3, 4, 5])  # oldest (0, 1) evicted first
    info = table.info()
    assert info["inserts"] == 6 and info["deletes"] == 2
    # a batch larger than the capacity keeps only its tail
    table.insert(_batch(10, 9))
    np.testing.assert_array_equal(table.state_dict()["data"]["action"], [15, 16, 17, 18])


def test_uniform_sampling_covers_items_and_keys_match_data():
    table = _table(capacity=10)
    table.insert(_batch(0, 10))
    s = table.sample(2000)
    assert s.keys.dtype == np.int64 and s.keys.shape == (2000,)
    assert set(s.keys.tolist()) == set(range(10))
    np.testing.assert_array_equal(s.data["action"], s.keys)  # item with key k holds id k here
    np.testing.assert_array_equal(s.data["obs"][:, 0], s.keys)
    np.testing.assert_allclose(s.probabilities, 0.1)
    counts = np.bincount(s.keys, minlength=10)
    assert counts.min() > 120  # expectation 200 per item


def test_prioritized_frequencies_follow_p_pow_alpha():
    alpha = 0.6
    table = _table(capacity=6, sampler="prioritized", priority_exponent=alpha)
    prios = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 0.0])
    table.insert(_batch(0, 6), priorities=prios)
    expected = prios ** alpha / np.sum(prios ** alpha)
    n = 40_000
    s = table.sample(n)
    np.testing.assert_allclose(s.probabilities, expected[s.keys])
    counts = np.bincount(s.keys, minlength=6)
    assert counts[5] == 0  # zero priority is never drawn
    observed = counts[:5]
    exp_counts = n * expected[:5]
    chi2 = np.sum((observed - exp_counts) ** 2 / exp_counts)
    assert chi2 < 20.5  # chi-square, 4 dof, p ~ 0.0004


def test_update_priorities_changes_sampling_and_ignores_evicted_keys():
    table = _table(capacity=4, sampler="prioritized", priority_exponent=1.0)
    table.insert(_batch(0, 4), priorities=np.ones(4))
    assert table.update_priorities(np.array([0, 1, 2, 3]), np.array([0.0, 0.0, 0.0, 1.0])) == 4
    assert set(table.sample(200).keys.tolist()) == {3}
    table.insert(_batch(4, 2), priorities=np.zeros(2))  # evicts keys 0, 1
    # keys 0 and 1 are gone: ignored; key 2 repeated: the last value wins
    assert table.update_priorities(np.array([0, 1, 2, 2]), np.array([9.0, 9.0, 5.0, 3.0])) == 1
    s = table.sample(4000)
    assert set(s.keys.tolist()) == {2, 3}
    np.testing.assert_allclose(s.probabilities[s.keys == 2], 0.75)
    with pytest.raises(ValueError, match="finite"):
        table.update_priorities(np.array([2]), np.array([np.nan]))
    with pytest.raises(ValueError, match="shape"):
        table.update_priorities(np.array([2, 3]), np.array([1.0]))


def test_priorities_written_after_the_next_insert_leave_table_and_draws_unchanged():
    """launch.experiments.run_experiment writes an update's priorities just before the next sample, after the actor's insert
    (so the learner never waits on the device mid-step). That is only sound if the order does not matter: new
    items take their own priority, evicted keys are skipped, and the sum tree recomputes exact sums."""
    def run(deferred: bool) -> tuple[replay.Sample, dict]:
        table = _table(capacity=6, sampler="prioritized", priority_exponent=0.6)
        table.insert(_batch(0, 5))
        first = table.sample(4)
        prios = np.linspace(0.1, 2.3, 4)  # includes key 0, which the next insert evicts
        if not deferred:
            table.update_priorities(first.keys, prios)
        table.insert(_batch(5, 3))
        if deferred:
            table.update_priorities(first.keys, prios)
        return table.sample(64), table.state_dict()

    (a, state_a), (b, state_b) = run(False), run(True)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    np.testing.assert_array_equal(state_a["priorities"], state_b["priorities"])


def test_all_zero_priorities_fall_back_to_uniform():
    table = _table(capacity=4, sampler="prioritized")
    table.insert(_batch(0, 4), priorities=np.zeros(4))
    s = table.sample(400)
    assert set(s.keys.tolist()) == {0, 1, 2, 3}
    np.testing.assert_allclose(s.probabilities, 0.25)


def test_sum_tree_matches_prefix_sums():
    rng = np.random.default_rng(1)
    tree = replay.SumTree(13)
    values = rng.random(13)
    tree.set(np.arange(13), values)
    assert tree.total == pytest.approx(values.sum())
    u = rng.random(1000) * values.sum()
    expected = np.searchsorted(np.cumsum(values), u, side="right")
    np.testing.assert_array_equal(tree.find(u), expected)


def test_min_size_blocks_sampling_until_reached():
    table = _table(rate_limiter=replay.MinSize(3))
    table.insert(_batch(0, 2))
    assert not table.can_sample()
    with pytest.raises(replay.RateLimiterTimeout, match="0 of 1"):
        table.sample(1, timeout=0.01)
    table.insert(_batch(2, 1))
    assert table.sample(5, timeout=0.01).keys.shape == (5,)
    assert table.info()["sample_blocked_calls"] == 1


def test_sample_to_insert_ratio_follows_reverb_rule():
    # spi=2, min_size=2, error_buffer=2 -> min_diff=2, max_diff=6 (diff = inserts*spi - samples)
    limiter = replay.SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=2, error_buffer=2.0)
    assert (limiter.min_diff, limiter.max_diff) == (2.0, 6.0)
    table = _table(capacity=100, rate_limiter=limiter)
    table.insert(_batch(0, 2))  # size 2 <= min_size: free
    table.insert(_batch(2, 1))  # 3*2 - 0 = 6 <= 6
    assert not table.can_insert()  # 4*2 = 8 > 6
    with pytest.raises(replay.RateLimiterTimeout):
        table.insert(_batch(3, 1), timeout=0.01)
    assert table.size == 3
    # diff = 6: samples allowed while 6 - s >= 2 -> 4 samples
    assert table.can_sample(4) and not table.can_sample(5)
    table.sample(2)
    assert table.can_insert()  # (4*2) - 2 = 6 <= 6
    table.sample(2)
    with pytest.raises(replay.RateLimiterTimeout, match="0 of 1"):
        table.sample(1, timeout=0.01)
    info = table.info()
    assert info["samples"] == 4 and info["inserts"] == 3 and info["insert_blocked_calls"] == 1


def test_sample_to_insert_ratio_validates_buffer():
    with pytest.raises(ValueError, match="error_buffer"):
        replay.SampleToInsertRatio(8.0, 10, error_buffer=4.0)
    with pytest.raises(ValueError, match="min_size_to_sample"):
        replay.MinSize(0)
    with pytest.raises(ValueError, match="exceeds capacity"):
        _table(capacity=4, rate_limiter=replay.MinSize(5))


def test_blocked_insert_resumes_when_learner_samples():
    limiter = replay.SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=1.0)
    table = _table(capacity=100, rate_limiter=limiter)  # min_diff=0, max_diff=2
    table.insert(_batch(0, 2))
    started = threading.Event()
    result: list = []

    def insert_more():
        started.set()
        result.append(table.insert(_batch(2, 3), timeout=10.0))

    thread = threading.Thread(target=insert_more)
    thread.start()
    started.wait()
    for _ in range(3):  # each sample lets one more item in
        table.sample(1, timeout=10.0)
    thread.join(timeout=10.0)
    assert not thread.is_alive() and result == [3]
    assert table.size == 5
    assert table.info()["insert_blocked_calls"] == 1 and table.info()["insert_blocked_s"] > 0


def test_blocked_sample_resumes_on_insert_and_close_wakes_waiters():
    table = _table(rate_limiter=replay.MinSize(2))
    out: list = []
    thread = threading.Thread(target=lambda: out.append(table.sample(3, timeout=10.0)))
    thread.start()
    table.insert(_batch(0, 2))
    thread.join(timeout=10.0)
    assert not thread.is_alive() and out[0].keys.shape == (3,)

    errors: list = []
    table2 = _table(rate_limiter=replay.MinSize(1))

    def blocked_sample():
        try:
            table2.sample(1, timeout=10.0)
        except replay.TableClosed as err:
            errors.append(err)

    thread = threading.Thread(target=blocked_sample)
    thread.start()
    while table2.info()["sample_blocked_calls"] == 0:
        thread.join(timeout=0.001)
    table2.close()
    thread.join(timeout=10.0)
    assert not thread.is_alive() and len(errors) == 1
    with pytest.raises(replay.TableClosed):
        table2.insert(_batch(0, 1))


def test_insert_validation_errors():
    table = _table()
    with pytest.raises(ValueError, match="columns"):
        table.insert({"obs": np.zeros((1, 3), np.float32)})
    with pytest.raises(ValueError, match="shape"):
        table.insert({"obs": np.zeros((1, 4), np.float32), "action": np.zeros(1, np.int32)})
    with pytest.raises(ValueError, match="items"):
        table.insert({"obs": np.zeros((2, 3), np.float32), "action": np.zeros(1, np.int32)})
    with pytest.raises(ValueError, match="dtype"):
        table.insert({"obs": np.zeros((1, 3), np.float64), "action": np.zeros(1, np.int32)})
    with pytest.raises(ValueError, match="NaN"):
        table.insert({"obs": np.full((1, 3), np.inf, np.float32), "action": np.zeros(1, np.int32)})
    with pytest.raises(ValueError, match="priorities"):
        table.insert(_batch(0, 2), priorities=np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="sampler"):
        replay.Table("t", 4, SIG, sampler="lifo")
    with pytest.raises(ValueError, match="batch_size"):
        table.sample(0)
    assert table.size == 0
    # value-preserving casts are accepted
    table.insert({"obs": np.zeros((1, 3), np.float16), "action": np.zeros(1, np.int8)})
    assert table.size == 1


def test_state_round_trip_preserves_contents_and_counters():
    table = _table(capacity=5, sampler="prioritized", rate_limiter=replay.MinSize(2))
    table.insert(_batch(0, 7), priorities=np.arange(1.0, 8.0))
    table.sample(3)
    state = table.state_dict()
    for value in state.values():
        assert isinstance(value, (int, np.ndarray, dict))
    restored = replay.Table("t", 6, SIG, sampler="prioritized", rate_limiter=replay.MinSize(2), seed=0)
    restored.load_state_dict(state)
    new_state = restored.state_dict()
    np.testing.assert_array_equal(new_state["keys"], state["keys"])
    np.testing.assert_array_equal(new_state["priorities"], [3.0, 4.0, 5.0, 6.0, 7.0])
    for c in SIG:
        np.testing.assert_array_equal(new_state["data"][c], state["data"][c])
    assert {k: restored.info()[k] for k in ("size", "inserts", "samples", "deletes")} == \
        {"size": 5, "inserts": 7, "samples": 3, "deletes": 2}
    s = restored.sample(500)
    np.testing.assert_array_equal(s.data["action"], s.keys)
    restored.insert(_batch(7, 1))  # keys continue where the checkpoint stopped
    assert restored.state_dict()["keys"][-1] == 7
    bad = dict(state, format_version=99)
    with pytest.raises(ValueError, match="version"):
        restored.load_state_dict(bad)
    with pytest.raises(ValueError, match="capacity"):
        replay.Table("t", 4, SIG).load_state_dict(state)


def test_importance_weights():
    w = replay.importance_weights(np.array([0.1, 0.2, 0.4]), size=10, beta=1.0)
    np.testing.assert_allclose(w, [1.0, 0.5, 0.25])
    np.testing.assert_allclose(replay.importance_weights(np.array([0.1, 0.4]), 10, beta=0.0), [1.0, 1.0])
    with pytest.raises(ValueError, match="probabilities"):
        replay.importance_weights(np.array([0.0, 0.5]), 10, 0.5)


def test_timed_out_insert_reports_its_prefix_and_force_passes_the_limiter():
    limiter = replay.SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=1.0)
    table = _table(capacity=100, rate_limiter=limiter)  # max_diff=2: a third item waits for a sample
    with pytest.raises(replay.RateLimiterTimeout) as caught:
        table.insert(_batch(0, 5), timeout=0.05)
    assert caught.value.inserted == 2 and table.size == 2
    assert table.insert(_batch(2, 3), force=True) == 3  # an actor's flush at a stop: nobody samples any more
    assert table.size == 5 and table.info()["inserts"] == 5
    assert not table.can_insert(1)  # the limiter itself is unchanged


def test_sample_batches_draws_k_batches_in_one_call_counted_like_k_samples():
    table = _table(capacity=64, sampler="prioritized")
    table.insert(_batch(0, 40))
    batches = table.sample_batches(5, 3)
    assert len(batches) == 3 and table.info()["samples"] == 15
    for b in batches:
        assert b.keys.shape == b.probabilities.shape == (5,) and b.data["obs"].shape == (5, 3)
        np.testing.assert_array_equal(b.data["action"], b.keys)  # each item's columns travel with its key
    with pytest.raises(ValueError, match="num_batches"):
        table.sample_batches(5, 0)
    with pytest.raises(ValueError, match="batch_size"):
        table.sample_batches(0, 2)


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_sample_stacked_draws_what_one_big_sample_draws_for_the_same_seed(sampler):
    a, b = _table(capacity=64, sampler=sampler), _table(capacity=64, sampler=sampler)
    for t in (a, b):
        t.insert(_batch(0, 50))
        t.insert(_batch(50, 30))  # wraps the ring
        t.update_priorities(np.arange(40, 60), np.linspace(0.1, 3.0, 20))
    stacked = a.sample_stacked(5, 4)
    whole = b.sample(20)
    assert stacked.keys.shape == stacked.probabilities.shape == (4, 5)
    assert stacked.data["obs"].shape == (4, 5, 3) and stacked.data["obs"].flags.c_contiguous
    np.testing.assert_array_equal(stacked.keys.reshape(-1), whole.keys)
    np.testing.assert_array_equal(stacked.probabilities.reshape(-1), whole.probabilities)
    for c in whole.data:
        np.testing.assert_array_equal(stacked.data[c].reshape(whole.data[c].shape), whole.data[c])
    np.testing.assert_array_equal(stacked.data["action"], stacked.keys)  # columns travel with their key
    assert a.info()["samples"] == b.info()["samples"] == 20  # the limiter counts items, as for K samples
    with pytest.raises(ValueError, match="num_batches"):
        a.sample_stacked(5, 0)


def test_batched_priority_writes_keep_every_tree_node_the_exact_sum_of_its_children():
    rng = np.random.default_rng(3)
    table = _table(capacity=37, sampler="prioritized", priority_exponent=1.0)
    for start in range(0, 200, 13):  # inserts that wrap the ring at different offsets
        table.insert(_batch(start, 13), priorities=rng.uniform(0.1, 2.0, 13))
        keys = rng.integers(start - 20, start + 13, 9)  # repeats and evicted keys included
        table.update_priorities(keys, rng.uniform(0.0, 2.0, 9))
    tree = table._tree  # pylint: disable=protected-access
    leaves = tree._leaves  # pylint: disable=protected-access
    nodes = tree._tree  # pylint: disable=protected-access
    np.testing.assert_array_equal(nodes[leaves:leaves + 37], table._priorities)  # pylint: disable=protected-access
    for i in range(1, leaves):
        assert nodes[i] == nodes[2 * i] + nodes[2 * i + 1], i
    total = table.info()["inserts"]
    live = np.arange(total - 37, total)
    np.testing.assert_array_equal(table.state_dict()["keys"], live)
    np.testing.assert_array_equal(table.state_dict()["data"]["action"], live)  # FIFO across the wrap
