"""The shared learner scaffold (agents.learner_base): K SGD steps in one `lax.scan` are the same K steps as K
single calls, for both agents, including the periodic target copy and PER's per-batch priorities."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner
from agents.d4pg.networks import make_networks
from agents.dqn.config import DQNConfig
from agents.dqn.learning import DQNLearner
from agents.dqn.networks import make_q_spec
from quarl.replay.items import Sample
from quarl.replay.table import Table

K, B, OBS, ACT, NUM_ACTIONS = 5, 16, 4, 2, 3


def _columns(rng: np.random.Generator, discrete: bool) -> dict[str, np.ndarray]:
    return {"observation": rng.normal(size=(B, OBS)).astype(np.float32),
            "action": (rng.integers(0, NUM_ACTIONS, (B, 1)).astype(np.int32) if discrete
                       else rng.uniform(-1, 1, (B, ACT)).astype(np.float32)),
            "reward": rng.normal(size=(B, 1)).astype(np.float32),
            "discount": np.full((B, 1), 0.9, np.float32),
            "next_observation": rng.normal(size=(B, OBS)).astype(np.float32)}


def _d4pg() -> D4PGLearner:
    # target_update_period 2 < K: the periodic copy happens inside the scanned block, twice.
    config = D4PGConfig(policy_layer_sizes=(16, 16), critic_layer_sizes=(16, 16), num_atoms=11, vmin=-5.0, vmax=5.0,
                        batch_size=B, min_replay_size=B, target_update_period=2, actor_policy="target")
    return D4PGLearner(make_networks(config, OBS, [-1.0] * ACT, [1.0] * ACT), config, seed=0)


def test_kept_fields_must_name_training_state_fields():
    config = D4PGConfig(policy_layer_sizes=(8,), critic_layer_sizes=(8,), num_atoms=11, batch_size=B, min_replay_size=B)
    misnamed = type("Misnamed", (D4PGLearner,), {"kept_fields": ("policy",)})
    with pytest.raises(ValueError, match=r"kept_fields \['policy'\]"):
        misnamed(make_networks(config, OBS, [-1.0] * ACT, [1.0] * ACT), config, seed=0)


def _dqn() -> DQNLearner:
    config = DQNConfig(hidden_sizes=(16, 16), batch_size=B, min_replay_size=B, target_update_period=2,
                       prioritized_replay=True)
    return DQNLearner(make_q_spec(OBS, NUM_ACTIONS, config.hidden_sizes), config, seed=0)


def _assert_same_state(a, b, steps: int = K) -> None:
    sa, sb = a.get_state(), b.get_state()
    assert int(sa["steps"]) == int(sb["steps"]) == steps
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6), sa, sb)


@pytest.mark.parametrize("make", [pytest.param(_d4pg, marks=pytest.mark.slow), _dqn], ids=["d4pg", "dqn"])
def test_k_scanned_steps_equal_k_single_steps(make):
    discrete = make is _dqn
    table = Table("replay", 256, {"observation": ((OBS,), np.float32),
                                  "action": (((1,), np.int32) if discrete else ((ACT,), np.float32)),
                                  "reward": ((1,), np.float32), "discount": ((1,), np.float32),
                                  "next_observation": ((OBS,), np.float32)},
                  sampler="prioritized" if discrete else "uniform", seed=0)
    rng = np.random.default_rng(0)
    for _ in range(8):
        table.insert(_columns(rng, discrete))
    samples = [table.sample(B) for _ in range(K)]
    single, scanned = make(), make()
    metrics = [single.step(s) for s in samples]
    block = scanned.prepare(samples)
    assert block.size == K and block.keys.shape == (K, B)
    stacked = scanned.run_block(block)
    assert scanned.steps == single.steps == K
    _assert_same_state(single, scanned)
    for name, values in stacked.items():
        assert np.shape(values)[0] == K, name
        want = np.stack([np.asarray(m[name]) for m in metrics])
        np.testing.assert_allclose(np.asarray(values), want, rtol=2e-5, atol=1e-6, err_msg=name)
    if discrete:  # one |TD| vector per batch, each computed with that step's weights
        assert stacked["priorities"].shape == (K, B)
        assert not np.allclose(stacked["priorities"][0], stacked["priorities"][-1])


def test_blocks_are_checked_like_single_batches():
    learner = _d4pg()
    rng = np.random.default_rng(1)
    good, bad = _columns(rng, False), _columns(rng, False)
    bad["next_observation"][2, 1] = np.nan
    with pytest.raises(ValueError, match="next_observation.*NaN"):
        learner.prepare([good, bad])
    plain = learner.prepare([good, good])  # plain column mappings: no replay keys
    assert plain.keys is None and plain.size == 2 and plain.batches["observation"].shape == (2, B, OBS)
    with pytest.raises(ValueError, match="at least one"):
        learner.prepare([])
    short = {k: v[:8] for k, v in good.items()}
    with pytest.raises(ValueError, match="different sizes"):
        learner.prepare([good, short])
    dqn = _dqn()
    nan = _columns(rng, True)
    nan["reward"][0] = np.inf  # the same non-finite rule for every agent
    with pytest.raises(ValueError, match="reward.*NaN or inf"):
        dqn.step(Sample(np.arange(B), np.full(B, 1 / B), nan))


def test_policy_snapshot_is_a_reference_the_donating_update_never_invalidates():
    learner = _d4pg()
    rng = np.random.default_rng(2)
    learner.step(_columns(rng, False))
    snapshot = learner.policy_snapshot()
    served = learner._policy_tree()  # pylint: disable=protected-access
    # The served policy is a kept (never donated) field: the hand-over is the very arrays, no device copy.
    assert all(a is b for a, b in zip(jax.tree_util.tree_leaves(snapshot), jax.tree_util.tree_leaves(served)))
    before = learner.policy_params()
    for _ in range(3):  # donates the rest of the state; the target copy (period 2) changes the served policy
        learner.step(_columns(rng, False))
    learner.run_block(learner.prepare([_columns(rng, False) for _ in range(K)]))  # the scanned update too
    assert not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(snapshot))
    jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(snapshot), before)  # still that version
    after = learner.policy_params()
    assert any(not np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(before),
                                                        jax.tree_util.tree_leaves(after)))


@pytest.mark.parametrize("make", [pytest.param(_d4pg, marks=pytest.mark.slow), _dqn], ids=["d4pg", "dqn"])
def test_a_stacked_sample_trains_like_the_same_batches_as_a_list(make):
    discrete = make is _dqn
    sig = {"observation": ((OBS,), np.float32), "action": (((), np.int32) if discrete else ((ACT,), np.float32)),
           "reward": ((), np.float32), "discount": ((), np.float32), "next_observation": ((OBS,), np.float32)}
    tables = [Table("replay", 256, sig, sampler="prioritized" if discrete else "uniform", seed=0) for _ in range(2)]
    rng = np.random.default_rng(4)
    for _ in range(8):
        cols = _columns(rng, discrete)
        cols = {k: (v.reshape(B) if sig[k][0] == () else v) for k, v in cols.items()}
        for t in tables:
            t.insert(cols)
    for k in (1, K):  # one batch runs the single-step update, K the scan
        listed, stacked = make(), make()
        a = listed.run_block(listed.prepare(tables[0].sample_batches(B, k)))
        block = stacked.prepare(tables[1].sample_stacked(B, k))
        assert block.size == k and block.keys.shape == (k, B)
        b = stacked.run_block(block)
        _assert_same_state(listed, stacked, k)
        for name in a:
            np.testing.assert_allclose(np.asarray(b[name]), np.asarray(a[name]), rtol=2e-5, atol=1e-6, err_msg=name)
    wrong = tables[0].sample_stacked(B, 2)
    wrong.data["discount"] = wrong.data["discount"][:, :-1]
    with pytest.raises(ValueError, match="discount.*shape"):
        make().prepare(wrong)
