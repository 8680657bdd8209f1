"""Observation bounds (`DQNConfig.observation_bounds` -> `PolicySpec.input_bounds`): the Q-network maps each
observation feature's [low, high] onto [-1, 1] before its first layer, identically in the learner (haiku), the
fp32 actor and the int8 actor (ONNX graph, JAX), so MountainCar-v0's velocity (range 0.14) is not rounded away
beside its position (range 1.8) by the int8 first layer, and CartPole-v1's pole angle (range 0.42) enters it on the
scale of the cart's position (range 4.8) and the velocities."""
from __future__ import annotations

import gymnasium
import jax
import numpy as np
import pytest

from agents.dqn import Builder, DQNConfig
from agents.dqn.config import CARTPOLE_BOUNDS, MOUNTAINCAR_BOUNDS, task_overrides
from agents.dqn.networks import init_params, make_q_spec, q_apply_fn
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.ops.checks import ConfigError
from quarl.policy.reference import reference_apply
from quarl.policy.spec import PolicySpec, mlp_q_network
from quarl.runtimes import make_executor_from_params

HIDDEN = (64, 64)


def _mountaincar_states(n: int, seed: int = 0) -> np.ndarray:
    return _states(MOUNTAINCAR_BOUNDS, n, seed)


def _states(bounds: tuple, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    low, high = (np.asarray(side) for side in bounds)
    return rng.uniform(low, high, size=(n, len(low))).astype(np.float32)


def test_mountaincar_bounds_are_the_environments_and_its_preset_uses_them():
    space = gymnasium.make("MountainCar-v0").observation_space
    np.testing.assert_array_equal(np.float32(MOUNTAINCAR_BOUNDS[0]), space.low)
    np.testing.assert_array_equal(np.float32(MOUNTAINCAR_BOUNDS[1]), space.high)
    config = DQNConfig(**task_overrides("MountainCar-v0"))
    assert config.observation_bounds == MOUNTAINCAR_BOUNDS
    spec = Builder(config).policy_spec(environment_spec(make_environment("MountainCar-v0", seed=0)))
    assert spec.input_bounds == MOUNTAINCAR_BOUNDS
    assert DQNConfig().observation_bounds is None and "input_bounds" not in make_q_spec(2, 3, HIDDEN).to_dict()


def test_cartpole_bounds_are_its_termination_thresholds_and_random_velocities_and_its_preset_uses_them():
    """Position and angle: gymnasium's termination thresholds (the angle's rounded up to 4 digits). Velocities,
    unbounded in the env: +-3.0 / +-3.5 hold every value of 200 random-action episodes (2,000 gave maxima 2.8 /
    3.1). Both the learner's and the actors' spec carry the preset's bounds."""
    env = gymnasium.make("CartPole-v1")
    low, high = (np.asarray(side) for side in CARTPOLE_BOUNDS)
    np.testing.assert_array_equal(low, -high)
    assert high[0] == env.unwrapped.x_threshold
    assert env.unwrapped.theta_threshold_radians <= high[2] < env.unwrapped.theta_threshold_radians + 1e-4
    rng, seen = np.random.default_rng(0), []
    for episode in range(200):
        obs, _ = env.reset(seed=episode)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
            seen.append(obs)
            done = terminated or truncated
    speeds = np.abs(np.asarray(seen)[:, [1, 3]]).max(0)
    assert np.all(speeds < high[[1, 3]]) and np.all(speeds > high[[1, 3]] / 2), speeds
    config = DQNConfig(**task_overrides("CartPole-v1"))
    assert config.observation_bounds == CARTPOLE_BOUNDS and config.huber_loss_parameter == 5.0
    spec = Builder(config).policy_spec(environment_spec(make_environment("CartPole-v1", seed=0)))
    assert spec.input_bounds == CARTPOLE_BOUNDS
    assert DQNConfig(**task_overrides("Acrobot-v1")).observation_bounds is None


@pytest.mark.parametrize("bounds", [((0.0,), (1.0, 2.0)), ((1.0, 0.0), (0.0, 1.0)), ((0.0, -np.inf), (1.0, 0.0)),
                                    "lows", ((0.0, 0.0), (1.0, None))])
def test_bad_bounds_are_refused_by_config_and_spec(bounds):
    with pytest.raises(ConfigError, match="observation_bounds"):
        DQNConfig(observation_bounds=bounds)
    with pytest.raises(ValueError, match="input_bounds"):
        mlp_q_network(2, HIDDEN, 3, bounds)


def test_bounds_round_trip_through_the_spec_dict_and_change_its_digest():
    spec = mlp_q_network(2, HIDDEN, 3, [[-1.2, -0.07], [0.6, 0.07]])  # lists arrive from JSON
    assert spec.input_bounds == MOUNTAINCAR_BOUNDS
    assert PolicySpec.from_dict(spec.to_dict()) == spec
    assert spec.digest() != mlp_q_network(2, HIDDEN, 3).digest()  # an actor refuses weights of the other net
    offset, scale = spec.input_affine()
    mapped = (np.float32(MOUNTAINCAR_BOUNDS) - offset) * scale
    np.testing.assert_allclose(mapped, [[-1.0, -1.0], [1.0, 1.0]], atol=1e-6)
    with pytest.raises(ValueError, match="vector observations"):
        make_q_spec(8, 3, HIDDEN, (2, 2, 2), MOUNTAINCAR_BOUNDS)


@pytest.mark.parametrize("backend", ["onnx", "jax"])
@pytest.mark.parametrize("bounds, num_actions", [(MOUNTAINCAR_BOUNDS, 3), (CARTPOLE_BOUNDS, 2)],
                         ids=["mountaincar", "cartpole"])
def test_learner_fp32_and_int8_actors_apply_the_same_bounds(backend, bounds, num_actions):
    """The learner's haiku network, the float64 reference and every actor runtime compute the same function,
    states past the bounds included (mapped linearly past [-1, 1], not clipped)."""
    dim = len(bounds[0])
    spec = make_q_spec(dim, num_actions, HIDDEN, observation_bounds=bounds)
    params = jax.tree.map(np.asarray, init_params(spec, jax.random.PRNGKey(0)))
    obs = _states(bounds, 256)
    obs[:16] *= 1.5  # past the bounds
    learner = np.asarray(q_apply_fn(spec)(params, obs))
    ref = reference_apply(spec, params, obs)
    # Without the bounds the same weights give another function (the map is really applied).
    assert np.abs(reference_apply(mlp_q_network(dim, HIDDEN, num_actions), params, obs) - ref).max() > 1e-2
    np.testing.assert_allclose(learner, ref, rtol=1e-5, atol=1e-5)
    fp32 = make_executor_from_params(spec, params, "fp32", backend, batch_size=256)(obs)
    np.testing.assert_allclose(fp32, ref, rtol=1e-5, atol=1e-5)
    int8 = make_executor_from_params(spec, params, "int8", backend, batch_size=256)(obs)
    assert 1e-6 < np.abs(int8 - ref).max() < 0.03 * np.ptp(ref)
    assert np.mean(int8.argmax(1) == ref.argmax(1)) >= 0.95


def _raw_input_twin(spec: PolicySpec, params: dict) -> tuple[PolicySpec, dict]:
    """The same fp32 function without the bounds: the map folded into the first layer's weights and bias."""
    offset, scale = (a.astype(np.float64) for a in spec.input_affine())
    w, b = (np.asarray(params["linear_0"][k], np.float64) for k in ("w", "b"))
    raw = dict(params, linear_0={"w": (w * scale[:, None]).astype(np.float32),
                                 "b": (b - (offset * scale) @ w).astype(np.float32)})
    return mlp_q_network(spec.input_dim, HIDDEN, spec.output_dim), raw


@pytest.mark.parametrize("backend", ["onnx", "jax"])
def test_int8_argmax_follows_fp32_far_more_often_with_the_bounds_on_mountaincar_states(backend):
    """One fp32 Q-function, two int8 actors: fed raw MountainCar observations, the first layer's per-column
    weight scale is set by the (13x larger) velocity weights and each row's activation scale by the position, so
    the int8 actor's greedy action departs from fp32's 2-3x as often as with the bounds applied first (random
    initialisations here; on the peers runs' trained MountainCar policies, int8 weights of the first layer alone
    flipped 1-5% of greedy actions raw and 0-0.3% with the bounds: results/bench/dqn_collapse.md)."""
    obs = _mountaincar_states(4096, seed=1)
    rates = []
    for seed in range(3):
        spec = make_q_spec(2, 3, HIDDEN, observation_bounds=MOUNTAINCAR_BOUNDS)
        params = jax.tree.map(np.asarray, init_params(spec, jax.random.PRNGKey(seed)))
        raw_spec, raw_params = _raw_input_twin(spec, params)
        ref = reference_apply(spec, params, obs)
        np.testing.assert_allclose(reference_apply(raw_spec, raw_params, obs), ref, rtol=1e-4, atol=1e-5)
        greedy = ref.argmax(1)
        for s, p in ((spec, params), (raw_spec, raw_params)):
            int8 = make_executor_from_params(s, p, "int8", backend, batch_size=len(obs))(obs)
            rates.append(np.mean(int8.argmax(1) != greedy))
    with_bounds, raw = np.mean(rates[0::2]), np.mean(rates[1::2])
    # Measured: onnx 0.40% vs 1.35%, jax 0.81% vs 1.87% (the rest is the deeper layers' int8 error, alike in both).
    assert raw > 0.01 and with_bounds < raw / 2, (with_bounds, raw)


@pytest.mark.slow
def test_int8_dqn_reaches_and_holds_mountaincar_with_its_preset(tmp_path):
    """MountainCar-v0 int8 seed 2 never reached the goal in 120k steps without the bounds (every evaluation -200 in
    results/bench/peers.md). With the preset (bounds, decaying learning rate) it solves, and the last 3
    evaluations of a 60k-step run (bench.peers.offpolicy' cadence: 10 episodes every 2,500 steps; measured -105 / -104 /
    -104) are still >= -130. The backend is fixed as `auto` chose it on the measuring machine."""
    from launch.experiments.config import ExperimentConfig
    from launch.experiments.run_experiment import run_experiment
    from tests.agents.test_dqn import _eval_returns
    run_experiment(ExperimentConfig(agent="dqn", task="MountainCar-v0", precision="int8", backend="onnx",
                                    kernel_form="fp32", max_actor_steps=60_000, seed=2, logdir=tmp_path,
                                    eval_every=2500, eval_episodes=10, overrides=task_overrides("MountainCar-v0")),
                   progress=False, energy=False)
    returns = _eval_returns(tmp_path)
    assert len(returns) == 24 and min(returns[-3:]) >= -130.0, returns
