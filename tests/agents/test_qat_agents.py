"""QAT in both agents: `qat_bits` is validated, really changes what the learner optimises (loss and gradients
of the deployed network), leaves critics/targets fp32, and trains weights whose deployed int-B actor computes
exactly the network the learner saw."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dm_env import specs

import agents
from agents.d4pg import Builder as D4PGBuilder, D4PGConfig
from agents.d4pg.learning import policy_loss
from agents.d4pg.networks import make_networks
from agents.dqn import DQNConfig
from agents.dqn.learning import DQNLearner, make_loss
from agents.dqn.networks import make_q_spec, q_apply_fn
from launch.cli import UsageError
from launch.overrides import parse_overrides
from quarl.envs.spec import EnvironmentSpec
from quarl.quant.quantization import quantize_params
from quarl.replay.items import Sample
from quarl.runtimes import make_executor

D4PG_SMALL = dict(policy_layer_sizes=(32, 32), critic_layer_sizes=(64, 64), num_atoms=21, vmin=-10.0,
                  vmax=10.0, batch_size=32, min_replay_size=64, max_replay_size=10_000, samples_per_insert=8.0)
OBS, ACT, N_ACTIONS, BATCH = 5, 2, 3, 32


def _d4pg_env_spec() -> EnvironmentSpec:
    return EnvironmentSpec(specs.Array((OBS,), np.float32), specs.BoundedArray((ACT,), np.float32, -1, 1),
                           OBS, ACT, False, 0)


def _batch(seed: int, discrete: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs_dim = OBS
    action = (rng.integers(0, N_ACTIONS, BATCH).astype(np.int32) if discrete
              else rng.uniform(-1, 1, (BATCH, ACT)).astype(np.float32))
    return {
        "observation": rng.normal(size=(BATCH, obs_dim)).astype(np.float32),
        "action": action,
        "reward": rng.normal(size=BATCH).astype(np.float32),
        "discount": np.full(BATCH, 0.9, np.float32),
        "next_observation": rng.normal(size=(BATCH, obs_dim)).astype(np.float32),
    }


def _leaves_differ(a, b, atol: float = 1e-7) -> bool:
    return any(not np.allclose(x, y, atol=atol, rtol=0) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# ------------------------------------------------------------------------------------------------ configs


@pytest.mark.parametrize("cls, prefix", [(D4PGConfig, r"D4PGConfig\.qat_bits"), (DQNConfig, "qat_bits")])
@pytest.mark.parametrize("value", [1, 9, 0, True, 4.0, "4"])
def test_configs_reject_bad_qat_bits(cls, prefix, value):
    with pytest.raises(ValueError, match=prefix + r" must be None or an int in \[2, 8\]"):
        cls(qat_bits=value)


@pytest.mark.parametrize("cls", [D4PGConfig, DQNConfig])
def test_configs_default_to_fp32_training_and_accept_2_to_8(cls):
    assert cls().qat_bits is None
    assert [cls(qat_bits=b).qat_bits for b in range(2, 9)] == list(range(2, 9))


@pytest.mark.parametrize("agent", ["d4pg", "dqn"])
def test_cli_set_reaches_qat_bits(agent):
    assert parse_overrides(agent, ["qat_bits=4"]) == {"qat_bits": 4}
    assert parse_overrides(agent, ["qat_bits=none"]) == {"qat_bits": None}
    assert agents.get_builder(agent, **parse_overrides(agent, ["qat_bits=3"])).config.qat_bits == 3
    for bad in ("qat_bits=9", "qat_bits=four"):
        with pytest.raises(UsageError, match="qat_bits"):
            parse_overrides(agent, [bad])


# ------------------------------------------------------------------------------------------------ D4PG


def _d4pg_losses(qat_bits: int | None, params, critic_params, obs):
    nets = make_networks(D4PGConfig(**D4PG_SMALL, qat_bits=qat_bits), OBS, [-1.0] * ACT, [1.0] * ACT)
    fn = lambda p: policy_loss(nets, p, critic_params, obs, 1.0)[0]  # noqa: E731
    loss, grads = jax.value_and_grad(fn)(params)
    return float(loss), grads


@pytest.fixture(scope="module")
def d4pg_state():
    learner = D4PGBuilder(D4PGConfig(**D4PG_SMALL)).make_learner(_d4pg_env_spec(), seed=0)
    for i in range(5):
        learner.step(_batch(i, discrete=False))
    state = learner.get_state()
    # Acme's init leaves the last policy layer near zero (actions ~0) and the critic nearly flat in the
    # action, so a few steps barely move either; spread both to a trained-like scale, otherwise any weight
    # rounding changes the loss only below float resolution.
    rng = np.random.default_rng(0)
    last = max((n for n in state["policy_params"] if n.startswith("linear")), key=lambda n: int(n.split("_")[1]))
    w = state["policy_params"][last]["w"]
    state["policy_params"][last]["w"] = rng.normal(0.0, 0.5, np.shape(w)).astype(np.float32)
    for name, module in state["critic_params"].items():
        if "w" in module:
            module["w"] = np.asarray(module["w"]) * 3.0
    return state


@pytest.mark.slow  # agent QAT in the default suite: DQN's tests below
@pytest.mark.parametrize("bits", [2, 3])
def test_d4pg_low_bit_qat_changes_policy_loss_and_gradients(d4pg_state, bits):
    obs = jnp.asarray(_batch(99, discrete=False)["observation"])
    args = (d4pg_state["policy_params"], d4pg_state["critic_params"], obs)
    loss_fp32, grads_fp32 = _d4pg_losses(None, *args)
    loss_qat, grads_qat = _d4pg_losses(bits, *args)
    assert abs(loss_qat - loss_fp32) > 1e-3 * abs(loss_fp32)
    for name in (n for n in grads_fp32 if n.startswith("linear")):
        g, g32 = np.asarray(grads_qat[name]["w"]), np.asarray(grads_fp32[name]["w"])
        assert np.any(g != 0.0), f"QAT passes no gradient to {name}/w"
        assert not np.allclose(g, g32, rtol=1e-3, atol=1e-6), f"{name}/w gradient ignores quantization"


def _assert_int8_close_to_fp32(loss_at: Callable[[int | None], Any]) -> None:
    """`loss_at(bits)` (None: fp32) with int8 QAT differs from fp32, by less than int2's and at most 5%."""
    loss_fp32, loss_8, loss_2 = loss_at(None), loss_at(8), loss_at(2)
    assert loss_8 != loss_fp32
    assert abs(loss_8 - loss_fp32) < abs(loss_2 - loss_fp32)
    assert abs(loss_8 - loss_fp32) <= 0.05 * max(1.0, abs(loss_fp32))


@pytest.mark.slow  # agent QAT in the default suite: DQN's tests below
def test_d4pg_int8_qat_is_close_to_but_not_exactly_fp32(d4pg_state):
    obs = jnp.asarray(_batch(98, discrete=False)["observation"])
    args = (d4pg_state["policy_params"], d4pg_state["critic_params"], obs)
    _assert_int8_close_to_fp32(lambda bits: _d4pg_losses(bits, *args)[0])


@pytest.mark.slow  # agent QAT in the default suite: DQN's tests below
def test_d4pg_learner_qat_touches_only_the_policy():
    """Same seed, same batch: the critic loss (critic + fp32 target policy) is identical with and without
    QAT, the policy loss and the policy update are not."""
    env_spec = _d4pg_env_spec()
    plain = D4PGBuilder(D4PGConfig(**D4PG_SMALL)).make_learner(env_spec, seed=3)
    qat = D4PGBuilder(D4PGConfig(**D4PG_SMALL, qat_bits=2)).make_learner(env_spec, seed=3)
    batch = _batch(5, discrete=False)
    m_plain, m_qat = plain.step(batch), qat.step(batch)
    assert m_plain["critic_loss"] == m_qat["critic_loss"]
    assert m_plain["policy_loss"] != m_qat["policy_loss"]
    assert m_plain["policy_grad_norm"] != m_qat["policy_grad_norm"]
    s_plain, s_qat = plain.get_state(), qat.get_state()
    for a, b in zip(jax.tree.leaves(s_plain["critic_params"]), jax.tree.leaves(s_qat["critic_params"])):
        np.testing.assert_array_equal(a, b)
    assert _leaves_differ(s_plain["policy_params"], s_qat["policy_params"])


@pytest.mark.slow  # agent QAT in the default suite: DQN's tests below
def test_d4pg_qat_trained_policy_deploys_with_zero_extra_error():
    env_spec = _d4pg_env_spec()
    builder = D4PGBuilder(D4PGConfig(**D4PG_SMALL, qat_bits=3, learning_rate=1e-3))
    learner = builder.make_learner(env_spec, seed=1)
    for i in range(30):
        learner.step(_batch(i, discrete=False))
    params = learner.policy_params()
    nets = builder.networks(env_spec)
    obs = _batch(1234, discrete=False)["observation"]
    learner_view = np.asarray(nets.train_policy.apply(params, obs))
    deployed = make_executor(nets.policy_spec, quantize_params(params, "int3"), "jax", batch_size=BATCH)(obs)
    np.testing.assert_allclose(deployed, learner_view, rtol=1e-6, atol=1e-6)
    assert np.max(np.abs(np.asarray(nets.policy.apply(params, obs)) - learner_view)) > 1e-4
    # An evaluation actor (what the runners deploy) picks exactly those actions.
    actor = builder.make_actor(env_spec, quantize_params(params, "int3"), seed=0, evaluation=True, backend="jax")
    np.testing.assert_allclose(actor.act(obs[:1])[0][0], learner_view[0], rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------------ DQN


def _dqn_spec():
    return make_q_spec(OBS, N_ACTIONS, (32, 32))


def _dqn_loss_and_grads(qat_bits: int | None, params, target_params, batch):
    loss_fn = make_loss(_dqn_spec(), 1.0, qat_bits)
    weights = jnp.ones(BATCH, jnp.float32)
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, target_params, batch, weights)
    return float(loss), grads


def _sample(data: dict) -> Sample:
    return Sample(keys=np.arange(BATCH), probabilities=np.full(BATCH, 1.0 / BATCH), data=data)


def _dqn_learner(**overrides) -> DQNLearner:
    config = DQNConfig(hidden_sizes=(32, 32), batch_size=BATCH, min_replay_size=BATCH, **overrides)
    return DQNLearner(_dqn_spec(), config, seed=0)


@pytest.fixture(scope="module")
def dqn_state():
    learner = _dqn_learner(target_update_period=1000)
    for i in range(5):
        learner.step(_sample(_batch(i, discrete=True)))
    return learner.get_state()


@pytest.mark.parametrize("bits", [2, 3])
def test_dqn_low_bit_qat_changes_loss_and_gradients(dqn_state, bits):
    batch = {k: jnp.asarray(v) for k, v in _batch(77, discrete=True).items()}
    args = (dqn_state["params"], dqn_state["target_params"], batch)
    loss_fp32, grads_fp32 = _dqn_loss_and_grads(None, *args)
    loss_qat, grads_qat = _dqn_loss_and_grads(bits, *args)
    assert abs(loss_qat - loss_fp32) > 1e-3 * abs(loss_fp32)
    for name in grads_fp32:
        g, g32 = np.asarray(grads_qat[name]["w"]), np.asarray(grads_fp32[name]["w"])
        assert np.any(g != 0.0), f"QAT passes no gradient to {name}/w"
        assert not np.allclose(g, g32, rtol=1e-3, atol=1e-6), f"{name}/w gradient ignores quantization"


def test_dqn_int8_qat_is_close_to_but_not_exactly_fp32(dqn_state):
    batch = {k: jnp.asarray(v) for k, v in _batch(78, discrete=True).items()}
    args = (dqn_state["params"], dqn_state["target_params"], batch)
    _assert_int8_close_to_fp32(lambda bits: _dqn_loss_and_grads(bits, *args)[0])


def test_dqn_learner_qat_keeps_the_target_network_fp32(dqn_state):
    """The QAT loss bootstraps from the fp32 target network, at the action the (QAT) online net selects:
    target = r + d * Q_target_fp32(s', argmax_a Q_online_qat(s', a)); the online Q(s, a) is the QAT one."""
    spec = _dqn_spec()
    params, target_params = dqn_state["params"], dqn_state["target_params"]
    data = _batch(3, discrete=True)
    batch = {k: jnp.asarray(v) for k, v in data.items()}
    _, (td, q_taken) = make_loss(spec, 1.0, 2)(params, target_params, batch, jnp.ones(BATCH, jnp.float32))
    online_qat, fp32 = q_apply_fn(spec, 2), q_apply_fn(spec)
    best = np.argmax(np.asarray(online_qat(params, data["next_observation"])), axis=1)
    bootstrap = np.asarray(fp32(target_params, data["next_observation"]))[np.arange(BATCH), best]
    expected_target = data["reward"] + data["discount"] * bootstrap
    np.testing.assert_allclose(np.asarray(td + q_taken), expected_target, rtol=1e-5, atol=1e-5)
    q_online = np.asarray(online_qat(params, data["observation"]))[np.arange(BATCH), data["action"]]
    np.testing.assert_allclose(np.asarray(q_taken), q_online, rtol=1e-5, atol=1e-5)
    q_fp32 = np.asarray(fp32(params, data["observation"]))[np.arange(BATCH), data["action"]]
    assert not np.allclose(q_online, q_fp32, atol=1e-4)


def test_dqn_qat_trained_network_deploys_with_zero_extra_error():
    learner = _dqn_learner(qat_bits=3, learning_rate=3e-3)
    plain = _dqn_learner(learning_rate=3e-3)
    for i in range(30):
        m_qat = learner.step(_sample(_batch(i, discrete=True)))
        m_plain = plain.step(_sample(_batch(i, discrete=True)))
    assert float(m_qat["loss"]) != float(m_plain["loss"])
    params = learner.policy_params()
    spec = _dqn_spec()
    obs = _batch(4321, discrete=True)["observation"]
    learner_view = np.asarray(q_apply_fn(spec, 3)(params, obs))
    deployed = make_executor(spec, quantize_params(params, "int3"), "jax", batch_size=BATCH)(obs)
    np.testing.assert_allclose(deployed, learner_view, rtol=1e-6, atol=1e-6)
    assert np.max(np.abs(np.asarray(q_apply_fn(spec)(params, obs)) - learner_view)) > 1e-4
