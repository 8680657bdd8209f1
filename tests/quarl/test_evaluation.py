"""Greedy policy evaluation: actions through the runtimes, real episodes through the environment stepper, paired
seeds, and the observations a saved policy is calibrated on."""
from __future__ import annotations

import dm_env
import numpy as np
import pytest
from dm_env import specs

from quarl.acting.evaluation import (
    GreedyPolicy, check_compatible, evaluate_policy, evaluate_seeds, make_greedy_policy, rollout_observations,
    run_episode, run_episodes,
)
from quarl.envs.factory import make_environment
from quarl.policy.spec import layer_norm_mlp_policy, mlp_q_network
from quarl.quant.quantization import quantize_params

# CartPole obs = [x, x_dot, theta, theta_dot]: pushing towards the side the pole falls to balances it.
BALANCING_GAINS = np.array([0.1, 0.5, 10.0, 2.0], np.float32)


def cartpole_q_network(gains: np.ndarray = BALANCING_GAINS, hidden: int = 16, seed: int = 0) -> tuple:
    """A hand-made 2-layer ReLU Q-network for CartPole: Q(right) - Q(left) ~ gains . obs, computed by
    hidden units 0/1 as relu(u) and relu(-u), plus small random units that perturb Q like a trained net."""
    rng = np.random.default_rng(seed)
    spec = mlp_q_network(4, (hidden,), 2)
    w0 = rng.normal(0.0, 0.05, (4, hidden)).astype(np.float32)
    w0[:, 0], w0[:, 1] = gains, -gains
    w1 = rng.normal(0.0, 0.05, (hidden, 2)).astype(np.float32)
    w1[0], w1[1] = (0.0, 1.0), (1.0, 0.0)
    params = {"linear_0": {"w": w0, "b": np.zeros(hidden, np.float32)},
              "linear_1": {"w": w1, "b": np.zeros(2, np.float32)}}
    return spec, params


def _policy(gains: np.ndarray = BALANCING_GAINS, precision: str = "fp32") -> GreedyPolicy:
    spec, params = cartpole_q_network(gains)
    env = make_environment("CartPole-v1", 0)
    return make_greedy_policy(spec, quantize_params(params, precision), env.action_spec(), backend="jax")


def test_balancing_q_network_balances_and_its_mirror_falls():
    good = evaluate_seeds("CartPole-v1", _policy(), [0, 1, 2])
    bad = evaluate_seeds("CartPole-v1", _policy(-BALANCING_GAINS), [0, 1, 2])
    np.testing.assert_array_equal(good.returns, 500.0)  # CartPole-v1's time limit: never fell
    np.testing.assert_array_equal(good.lengths, 500)
    assert bad.returns.max() < 50  # pushing the wrong way drops the pole within a few dozen steps
    np.testing.assert_array_equal(bad.returns, bad.lengths)  # CartPole pays 1 per step


def test_evaluation_is_deterministic_for_a_seed_and_seeds_matter():
    policy = _policy(-BALANCING_GAINS)  # short, start-dependent episodes: returns differ across seeds
    seeds = list(range(6))
    first = evaluate_seeds("CartPole-v1", policy, seeds)
    second = evaluate_seeds("CartPole-v1", policy, seeds)
    np.testing.assert_array_equal(first.returns, second.returns)
    assert len(set(first.returns.tolist())) > 1
    # One environment, consecutive episodes: same seed -> same sequence.
    a = run_episodes(make_environment("CartPole-v1", 3), policy, 4)
    b = run_episodes(make_environment("CartPole-v1", 3), policy, 4)
    np.testing.assert_array_equal(a.returns, b.returns)


def test_discrete_actions_are_the_argmax_of_the_executor_outputs():
    policy = _policy()
    rng = np.random.default_rng(1)
    for obs in rng.normal(0.0, 0.2, (20, 4)).astype(np.float32):
        q = policy.executor(obs[None])[0]
        action = policy(obs[None])[0]  # a batch of one
        assert action.dtype == np.int32 and action.shape == ()
        assert int(action) == int(np.argmax(q))
        assert int(action) == int(BALANCING_GAINS @ obs > 0) or abs(float(BALANCING_GAINS @ obs)) < 0.2


def test_int8_policy_runs_through_the_int_kernel():
    policy = _policy(precision="int8")
    assert policy.precision == "int8" and not policy.simulated
    stats = evaluate_seeds("CartPole-v1", policy, [0, 1])
    np.testing.assert_array_equal(stats.returns, 500.0)


def test_continuous_policy_outputs_are_the_actions():
    env = make_environment("Pendulum-v1", 0)
    action_spec = env.action_spec()
    spec = layer_norm_mlp_policy(3, [8], [-1.0], [1.0])
    rng = np.random.default_rng(0)
    params = {"linear_0": {"w": rng.normal(size=(3, 8)).astype(np.float32), "b": np.zeros(8, np.float32)},
              "layer_norm": {"scale": np.ones(8, np.float32), "offset": np.zeros(8, np.float32)},
              "linear_1": {"w": rng.normal(size=(8, 1)).astype(np.float32), "b": np.zeros(1, np.float32)}}
    policy = make_greedy_policy(spec, quantize_params(params, "fp32"), action_spec, backend="jax")
    obs = np.array([1.0, 0.0, 0.5], np.float32)
    action = policy(obs[None])[0]
    assert action.shape == action_spec.shape and action.dtype == action_spec.dtype
    np.testing.assert_allclose(action, policy.executor(obs[None])[0], rtol=0, atol=0)
    assert -1.0 <= float(action[0]) <= 1.0
    stats = evaluate_policy(env, spec, quantize_params(params, "bf16"), 2)
    assert stats.lengths.tolist() == [200, 200] and np.all(np.isfinite(stats.returns))
    assert np.all(stats.returns <= 0.0)  # Pendulum's reward is a cost


def test_mismatched_spec_and_bad_arguments_are_rejected():
    env = make_environment("CartPole-v1", 0)
    with pytest.raises(ValueError, match="observation values"):
        check_compatible(mlp_q_network(3, (4,), 2), env.observation_spec(), env.action_spec())
    with pytest.raises(ValueError, match="Q-values"):
        check_compatible(mlp_q_network(4, (4,), 3), env.observation_spec(), env.action_spec())
    with pytest.raises(ValueError, match="action shape"):
        check_compatible(mlp_q_network(4, (4,), 2), env.observation_spec(),
                         specs.BoundedArray((3,), np.float32, -1.0, 1.0))
    with pytest.raises(ValueError, match="episodes"):
        run_episodes(env, _policy(), 0)
    with pytest.raises(ValueError, match="seed"):
        evaluate_seeds("CartPole-v1", _policy(), [])


class _NaNExecutor:
    """Stands in for an executor whose low-precision arithmetic overflowed."""

    backend, precision, simulated, input_dim, output_dim = "jax", "fp16", False, 4, 2

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return np.full((obs.shape[0], 2), np.nan, np.float32)


def test_non_finite_outputs_never_become_actions():
    env = make_environment("CartPole-v1", 0)
    policy = GreedyPolicy(_NaNExecutor(), env.action_spec())
    with pytest.raises(ValueError, match="non-finite"):
        policy(np.zeros((1, 4), np.float32))


def test_run_episode_stops_when_asked_and_counts_every_step():
    from quarl.acting.evaluation import EpisodeInterrupted

    env = make_environment("CartPole-v1", 0)
    total, steps = run_episode(env, push_left)  # the pole falls within ~10 steps
    assert 0 < steps < 100 and total == float(steps)  # CartPole pays 1 per step
    checks = []

    def stop_after_three() -> bool:
        checks.append(1)
        return len(checks) > 3

    with pytest.raises(EpisodeInterrupted, match="after 3 steps"):
        run_episode(env, push_left, should_stop=stop_after_three)
    env.close()


def push_left(observations: np.ndarray) -> np.ndarray:
    """CartPole action 0 for every row of a batch."""
    return np.zeros(len(observations), np.int64)


class _Episodes(dm_env.Environment):
    """Episodes of 3 steps whose observation is [episode, t]; counts resets (an extra one would shift episodes)."""

    def __init__(self):
        self.resets, self.t = 0, 0

    def reset(self) -> dm_env.TimeStep:
        self.resets, self.t = self.resets + 1, 0
        return dm_env.restart(self._obs())

    def step(self, action) -> dm_env.TimeStep:
        self.t += 1
        if self.t == 3:
            return dm_env.termination(1.0, self._obs())
        return dm_env.transition(1.0, self._obs())

    def _obs(self) -> np.ndarray:
        return np.array([self.resets, self.t], np.float32)

    def observation_spec(self) -> specs.Array:
        return specs.Array((2,), np.float32)

    def action_spec(self) -> specs.DiscreteArray:
        return specs.DiscreteArray(2)


def test_episodes_run_through_the_acting_loop_one_reset_each_and_calibration_sees_every_observation():
    """Consecutive episodes of one environment take one reset each (the loop does not restart a finished
    evaluation episode, so the environment's random stream is what an episode-by-episode loop leaves it), and
    `rollout_observations` keeps every observation in order, each episode's LAST one included."""
    env = _Episodes()
    stats = run_episodes(env, push_left, 4)
    assert stats.returns.tolist() == [3.0] * 4 and stats.lengths.tolist() == [3] * 4 and env.resets == 4
    obs = rollout_observations(_Episodes(), push_left, steps=9)
    assert obs.tolist() == [[1, 0], [1, 1], [1, 2], [1, 3], [2, 0], [2, 1], [2, 2], [2, 3], [3, 0]]
    with pytest.raises(ValueError, match="steps"):
        rollout_observations(_Episodes(), push_left, steps=0)
