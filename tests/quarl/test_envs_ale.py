"""Tests for quarl.envs.ale: specs, the DQN preprocessing, determinism under a seed, training-only reward clipping."""
from __future__ import annotations

import numpy as np
import pytest

from quarl.envs import factory as envs
from quarl.envs.ale import ALE_TASKS, AtariEnvironment, area_weights, resize_area
from quarl.envs.spec import environment_spec
from quarl.envs.vector import make_vector_environment


def _rollout(env, actions):
    steps = [env.reset()]
    steps += [env.step(np.int32(a)) for a in actions]
    return steps


def test_pong_spec_and_stacked_uint8_frames():
    env = envs.make_environment("ALE/Pong", seed=0)
    spec = environment_spec(env)
    assert spec.obs_shape == (84, 84, 4) and spec.obs_dtype == np.uint8 and spec.discrete
    assert spec.num_actions == 6  # Pong's minimal action set
    first = env.reset()
    assert first.first() and first.observation.shape == (84, 84, 4) and first.observation.dtype == np.uint8
    assert all(np.array_equal(first.observation[..., 0], first.observation[..., k]) for k in range(4))
    ts = env.step(np.int32(0))
    assert ts.mid() and isinstance(ts.reward, np.float32) and ts.discount == 1.0
    # The newest frame goes last; the others shift left by one.
    np.testing.assert_array_equal(ts.observation[..., :3], first.observation[..., 1:])
    assert set(ALE_TASKS) <= set(envs.list_tasks())


def test_area_resize_is_an_average():
    for n_in in (210, 160):
        idx, w = area_weights(n_in, 84)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
        assert idx.max() < n_in
    flat = np.full((210, 160), 77, np.uint8)
    assert np.all(resize_area(flat) == 77)
    ramp = np.tile(np.arange(160, dtype=np.uint8), (210, 1))
    out = resize_area(ramp)
    assert out.shape == (84, 84) and np.all(np.diff(out[0].astype(int)) >= 0) and out[0, 0] <= 1


def test_same_seed_same_frames_and_rewards():
    actions = np.random.default_rng(0).integers(0, 6, size=150)
    a = _rollout(AtariEnvironment("ALE/Pong", 5), actions)
    b = _rollout(AtariEnvironment("ALE/Pong", 5), actions)
    for x, y in zip(a, b):
        assert x.step_type == y.step_type and x.reward == y.reward
        np.testing.assert_array_equal(x.observation, y.observation)


def test_rewards_are_clipped_for_training_only():
    """Pong scores +-1 a point anyway, so clipping shows on a game with bigger rewards: Breakout's first bricks
    are worth 1, SpaceInvaders' aliens 5-30."""
    actions = np.random.default_rng(1).integers(0, 6, size=400)
    raw = _rollout(envs.make_environment("ALE/SpaceInvaders", 2), actions)
    clipped = _rollout(envs.make_environment("ALE/SpaceInvaders", 2, training=True), actions)
    raw_r = np.array([s.reward for s in raw[1:]])
    clip_r = np.array([s.reward for s in clipped[1:]])
    assert raw_r.max() > 1 and np.array_equal(clip_r, np.clip(raw_r, -1, 1))
    vec = make_vector_environment("ALE/SpaceInvaders", 2, 1).environments[0]
    assert vec._clip  # pylint: disable=protected-access  (the actors' environments are the training ones)


def test_bad_inputs_raise():
    env = envs.make_environment("ALE/Pong", seed=0)
    env.reset()
    with pytest.raises(ValueError, match="outside"):
        env.step(6)
    with pytest.raises(ValueError, match="integer"):
        env.step(0.5)
    with pytest.raises(ValueError, match="unknown ALE task"):
        AtariEnvironment("ALE/NotAGame", 0)
