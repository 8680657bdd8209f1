"""Batched acting (`act` on K observations, one policy call): exploration per environment row, epsilon
schedules counted in env steps, and a batch of K acting exactly as K batches of one."""
from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.d4pg import Builder as D4PGBuilder, D4PGConfig
from agents.dqn.actor import DQNActor, EpsilonSchedule
from agents.dqn.networks import make_q_spec
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.nets.haiku import haiku_forward
from quarl.quant.quantization import quantize_params
from tests.agents.helpers import act_one

OBS_DIM, NUM_ACTIONS = 4, 3


class _RowQ:
    """Executor stand-in whose Q-values are the first 3 observation entries (so each row's argmax is known);
    records the batch shapes it was called with."""

    def __init__(self, spec, qparams, backend="auto", batch_size=1):
        self.batch_size = batch_size
        self.shapes: list[tuple[int, ...]] = []
        self.backend, self.precision = "fake", "fp32"

    def __call__(self, obs):
        self.shapes.append(obs.shape)
        return np.asarray(obs)[:, :NUM_ACTIONS]

    def update(self, qparams):
        pass


def _dqn(schedule: EpsilonSchedule, seed: int = 0, batch_size: int = 1) -> DQNActor:
    return DQNActor(make_q_spec(OBS_DIM, NUM_ACTIONS, (8,)), None, num_actions=NUM_ACTIONS, schedule=schedule,
                    eval_epsilon=0.0, seed=seed, executor_factory=_RowQ, batch_size=batch_size)


def test_dqn_greedy_rows_take_their_own_argmax_in_one_call():
    actor = _dqn(EpsilonSchedule.constant(0.0), batch_size=4)
    assert actor._executor.batch_size == 4  # the runtime is built (and `auto` measures) at batch K
    obs = np.array([[3, 0, 0, 9], [0, 3, 0, 9], [0, 0, 3, 9], [0, 5, 1, 9]], np.float32)
    actions, extras = actor.act(obs)
    assert actions.tolist() == [0, 1, 2, 1] and extras == {}  # replay transitions carry no extras
    assert actor._executor.shapes == [(4, OBS_DIM)]


def test_dqn_batch_of_k_draws_exactly_what_k_batches_of_one_draw():
    obs = np.random.default_rng(0).standard_normal((300, OBS_DIM)).astype(np.float32)
    single, batched = _dqn(EpsilonSchedule(1.0, 0.05, 200), seed=5), _dqn(EpsilonSchedule(1.0, 0.05, 200), seed=5)
    a = [int(act_one(single, o)) for o in obs]
    b = batched.act(obs)[0].tolist()
    assert a == b and single.steps == batched.steps == 300


def test_dqn_epsilon_schedule_counts_env_steps_and_rows_explore_independently():
    actor = _dqn(EpsilonSchedule(1.0, 0.0, 100), batch_size=8)
    obs = np.tile(np.array([[0, 5, 0, 0]], np.float32), (8, 1))  # greedy action 1 for every row
    for _ in range(5):
        actor.act(obs)
    assert actor.steps == 40 and actor.epsilon == pytest.approx(0.6)  # 5 calls x 8 envs = 40 env steps
    # At epsilon ~0.5, rows of one call differ: each env row draws its own exploration decision.
    mixed = [actor.act(obs)[0] for _ in range(5)]
    assert any(len(set(a.tolist())) > 1 for a in mixed)
    # Every row random: no policy call at all; non-finite rows are still refused.
    random_actor = _dqn(EpsilonSchedule.constant(1.0), batch_size=8)
    acts = np.concatenate([random_actor.act(obs)[0] for _ in range(300)])
    np.testing.assert_allclose(np.bincount(acts, minlength=NUM_ACTIONS) / acts.size, 1 / NUM_ACTIONS, atol=0.04)
    assert random_actor._executor.shapes == []
    with pytest.raises(ValueError, match="finite"):
        random_actor.act(np.full((2, OBS_DIM), np.nan, np.float32))
    with pytest.raises(ValueError, match=r"\[K, 4\]"):  # one observation is a batch of one, not a bare row
        random_actor.act(np.zeros(OBS_DIM, np.float32))


@pytest.fixture(scope="module")
def d4pg_parts():
    env_spec = environment_spec(make_environment("cartpole:balance", 0))
    builder = D4PGBuilder(D4PGConfig(policy_layer_sizes=(32, 32), critic_layer_sizes=(32, 32), num_atoms=11,
                                     sigma=0.3))
    spec = builder.policy_spec(env_spec)
    params = hk.transform(haiku_forward(spec)).init(jax.random.PRNGKey(0), jnp.zeros((1, spec.input_dim)))
    return builder, env_spec, jax.device_get(params)


def test_d4pg_batched_policy_matches_row_by_row_and_noise_is_per_row(d4pg_parts):
    builder, env_spec, params = d4pg_parts
    qp = quantize_params(params, "fp32")
    obs = np.random.default_rng(1).standard_normal((6, env_spec.obs_dim)).astype(np.float32)
    greedy = builder.make_actor(env_spec, qp, seed=0, evaluation=True, backend="onnx", batch_size=6)
    rows = np.stack([act_one(greedy, o) for o in obs])
    np.testing.assert_allclose(greedy.act(obs)[0], rows, atol=1e-5)  # one batched call, same actions

    # The same seed: a batch of K draws the noise stream of K batches of one.
    single = builder.make_actor(env_spec, qp, seed=3, backend="onnx")
    batched = builder.make_actor(env_spec, qp, seed=3, backend="onnx", batch_size=6)
    np.testing.assert_allclose([act_one(single, o) for o in obs], batched.act(obs)[0], atol=1e-5)

    # Identical observations in every row: the exploration noise still differs per row, with sigma's spread.
    explorer = builder.make_actor(env_spec, qp, seed=0, backend="onnx", batch_size=16)
    same = np.tile(np.zeros((1, env_spec.obs_dim), np.float32), (16, 1))
    noisy = np.concatenate([explorer.act(same)[0] - greedy.act(same)[0] for _ in range(100)])
    assert noisy.shape == (1600, 1) and len(np.unique(noisy[:16])) == 16
    assert abs(np.std(noisy) - 0.3) < 0.05  # exploration actions are not clipped (Acme: the env clips)
    assert np.all(np.abs(greedy.act(same * 100.0)[0]) <= 1.0)  # evaluation actions are
