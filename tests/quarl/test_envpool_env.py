"""envpool against dm_control, per task in `quarl.envs.envpool.ENVPOOL_TASKS`: the evidence that lets a vectorized
actor step envpool's C++ version of a task instead of dm_control's (same specs after our flattening, same
trajectory from the same physics state under the same actions, same initial-state distribution)."""
from __future__ import annotations

import dm_env
import numpy as np
import pytest
from scipy import stats

from quarl.acting.loop import VectorEnvLoop
from quarl.envs.envpool import ENVPOOL_TASKS
from quarl.envs.factory import make_environment
from quarl.envs.vector import VectorEnvironment, env_implementation, make_vector_environment
from quarl.replay.adders import NStepTransitionAdder

pytest.importorskip("envpool")
from quarl.envs.envpool import EnvpoolVectorEnvironment  # noqa: E402  (needs envpool)


def _cartpole_state(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cartpole's observation is its whole state: position = (cart x, cos, sin of the pole angle), velocity."""
    return np.array([obs[0], np.arctan2(obs[2], obs[1])]), obs[3:5]


# Physics state (qpos, qvel) from a flat observation, for every verified task: a task added to ENVPOOL_TASKS
# without a way to compare trajectories here fails `test_every_verified_task_is_compared`.
STATE_FROM_OBS = {"cartpole:balance": _cartpole_state, "cartpole:swingup": _cartpole_state}


def _suite_env(env):
    """The dm_control environment under our wrappers (it holds the physics)."""
    while not hasattr(env, "physics"):
        env = env.environment
    return env


def test_every_verified_task_is_compared():
    assert set(ENVPOOL_TASKS) == set(STATE_FROM_OBS)


@pytest.mark.parametrize("task", sorted(ENVPOOL_TASKS))
def test_specs_match_dm_control_after_flattening(task):
    ours, ref = EnvpoolVectorEnvironment(task, [0]), make_environment(task, 0)
    assert ours.observation_spec() == ref.observation_spec()  # (dim,) float32
    a, b = ours.action_spec(), ref.action_spec()
    assert (a.shape, a.dtype, float(a.minimum), float(a.maximum)) == (b.shape, b.dtype, float(b.minimum),
                                                                      float(b.maximum))
    # The raw observation keys and shapes, i.e. what the flattening concatenates and in which order.
    import envpool
    raw = envpool.make_dm(ENVPOOL_TASKS[task], num_envs=1).observation_spec()
    suite = _suite_env(ref).observation_spec()
    assert {k: getattr(raw, k).shape for k in sorted(suite)} == {k: v.shape for k, v in sorted(suite.items())}
    raw_action, suite_action = envpool.make_dm(ENVPOOL_TASKS[task], num_envs=1).action_spec(), \
        _suite_env(ref).action_spec()
    assert raw_action.shape == suite_action.shape
    np.testing.assert_array_equal(raw_action.minimum, suite_action.minimum)
    np.testing.assert_array_equal(raw_action.maximum, suite_action.maximum)


@pytest.mark.parametrize("task", sorted(ENVPOOL_TASKS))
def test_same_state_and_actions_give_the_same_trajectory_for_a_whole_episode(task):
    """dm_control is put into envpool's initial physics state, then both take the same random actions until
    the episode ends: observations, rewards, discounts and step types agree step for step (float32 rounding
    only: envpool computes in float64 and bundles its own MuJoCo build)."""
    ours, ref = EnvpoolVectorEnvironment(task, [3]), make_environment(task, 0)
    first = ours.reset()[0]
    ref.reset()
    physics = _suite_env(ref).physics
    qpos, qvel = STATE_FROM_OBS[task](first.observation)
    with physics.reset_context():
        physics.data.qpos[:] = qpos
        physics.data.qvel[:] = qvel
    rng = np.random.default_rng(0)
    obs_err = reward_err = 0.0
    steps = 0
    while True:
        action = rng.uniform(-1, 1, ref.action_spec().shape).astype(np.float32)
        a, b = ours.step([action])[0], ref.step(action)
        steps += 1
        assert a.step_type == b.step_type and a.discount == b.discount, steps
        obs_err = max(obs_err, float(np.max(np.abs(a.observation - b.observation))))
        reward_err = max(reward_err, abs(float(a.reward) - float(b.reward)))
        if b.last():
            break
    assert steps == 1000  # the same episode length
    assert obs_err < 2e-3 and reward_err < 1e-3, (obs_err, reward_err)


@pytest.mark.parametrize("task", sorted(ENVPOOL_TASKS))
def test_initial_states_come_from_the_same_distribution(task):
    """300 envpool starts (10 seeds, 30 starts each) against 300 dm_control starts (one environment reset 300
    times): a two-sample Kolmogorov-Smirnov test per observation dimension does not tell them apart (p > 1e-3
    in every dimension)."""
    n = 300
    pool = EnvpoolVectorEnvironment(task, list(range(10)))  # 10 seeds x 30 successive starts
    ours = np.stack([t.observation for _ in range(n // 10) for t in pool.reset()])
    assert len(np.unique(ours, axis=0)) == n  # every start is a fresh draw
    env = make_environment(task, 1000)
    ref = np.stack([env.reset().observation for _ in range(n)])  # successive starts: independent draws
    for dim in range(ours.shape[1]):
        if np.ptp(ref[:, dim]) == 0 and np.ptp(ours[:, dim]) == 0:
            assert ours[0, dim] == pytest.approx(ref[0, dim], abs=1e-6)
            continue
        p = stats.ks_2samp(ours[:, dim], ref[:, dim]).pvalue
        assert p > 1e-3, (dim, p)


def test_vector_loop_restarts_finished_envpool_environments_and_keeps_every_transition():
    env = make_vector_environment("cartpole:balance", 0, 3)
    assert isinstance(env, EnvpoolVectorEnvironment)
    seeds_again = make_vector_environment("cartpole:balance", 0, 3).reset()
    first = env.reset()
    np.testing.assert_array_equal(np.stack([t.observation for t in first]),
                                  np.stack([t.observation for t in seeds_again]))  # seeded, reproducible
    assert len({t.observation.tobytes() for t in first}) == 3
    loop = VectorEnvLoop(env, lambda: NStepTransitionAdder(5, 0.99))
    loop.reset()
    transitions, episodes = 0, []
    rng = np.random.default_rng(0)
    for _ in range(1010):
        out = loop.step(lambda obs: rng.uniform(-1, 1, (obs.shape[0], 1)).astype(np.float32))
        transitions += len(out.items)
        episodes += out.episodes
    assert sorted(e.env_index for e in episodes) == [0, 1, 2] and all(e.length == 1000 for e in episodes)
    assert transitions == 3 * 1010 - 3 * 4  # all but the n-1 steps of each env's open window
    with pytest.raises(ValueError, match="2 actions for 3"):
        env.step(np.zeros((2, 1), np.float32))


def test_implementation_choice():
    assert env_implementation("cartpole:balance") == "envpool"
    assert env_implementation("cartpole:balance", "dm_control") == "dm_control"
    assert env_implementation("walker:stand") == "dm_control"  # not verified: stays on dm_control
    assert env_implementation("CartPole-v1") == "gymnasium"
    assert isinstance(make_vector_environment("walker:stand", 0, 2), VectorEnvironment)
    with pytest.raises(ValueError, match="not verified"):
        env_implementation("walker:stand", "envpool")
    with pytest.raises(ValueError, match="unknown environment implementation"):
        env_implementation("cartpole:balance", "mujoco")


def _timestep_fields(t):
    return (t.step_type, None if t.reward is None else (float(t.reward), type(t.reward)),
            None if t.discount is None else (float(t.discount), type(t.discount)), t.observation.dtype,
            t.observation.tobytes())


@pytest.mark.parametrize("num_envs", [1, 3])
def test_direct_stepping_gives_exactly_the_public_api_trajectory(num_envs):
    """`step` calls envpool's C++ send/receive directly (the pinned envpool's layout), skipping its per-call
    Python; over episode ends and out-of-range actions the timesteps are bit-identical to the public API's."""
    seeds = list(range(num_envs))
    direct = EnvpoolVectorEnvironment("cartpole:swingup", seeds)
    public = EnvpoolVectorEnvironment("cartpole:swingup", seeds, direct=False)
    assert direct.direct and not public.direct
    actions = np.random.default_rng(1).uniform(-1.5, 1.5, (1005, num_envs, 1)).astype(np.float32)
    trajectories = []
    for env in (direct, public):
        steps = [env.reset()]
        for a in actions:
            steps.append(env.step(a))
            steps += [[env.reset_one(i)] for i, t in enumerate(steps[-1]) if t.last()]
        trajectories.append([[_timestep_fields(t) for t in row] for row in steps])
    assert trajectories[0] == trajectories[1]
    assert sum(row[0][0] == dm_env.StepType.LAST for row in trajectories[0]) >= 1  # an episode ended


def test_an_unknown_envpool_layout_steps_through_the_public_api():
    from quarl.envs.envpool import _direct_layout

    pool = EnvpoolVectorEnvironment("cartpole:balance", [0])._pool
    keys = ["position", "velocity"]
    assert _direct_layout(pool, keys)["obs"] == [pool._state_keys.index("obs:position"),
                                                 pool._state_keys.index("obs:velocity")]
    assert _direct_layout(pool, ["position", "no_such_field"]) is None
    assert _direct_layout(object(), keys) is None  # no private entry points at all
