"""PPO / A2C: GAE and the clipped objective against hand-computed examples, A2C as the one-epoch unclipped setting,
discrete and continuous shapes, the policy spec round trip, and one-line errors for bad configs."""
from __future__ import annotations

import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dm_env import specs

import agents
from agents.ppo import A2CConfig, Builder, PPOConfig
from agents.ppo.learning import gae_advantages, ppo_loss
from agents.ppo.networks import log_prob
from quarl.envs.spec import EnvironmentSpec
from quarl.policy.reference import reference_apply
from quarl.policy.spec import PolicySpec
from quarl.quant.quantization import quantize_params
from quarl.replay.items import Rollout

OBS, N_ACTIONS, ACT_DIM, T, N = 4, 3, 2, 6, 4
SMALL = dict(policy_hidden_sizes=(16,), value_hidden_sizes=(16,), num_envs=N, num_steps=T)


def _discrete_spec() -> EnvironmentSpec:
    return EnvironmentSpec(specs.Array((OBS,), np.float32), specs.DiscreteArray(N_ACTIONS), OBS, 0, True, N_ACTIONS)


def _continuous_spec() -> EnvironmentSpec:
    return EnvironmentSpec(specs.Array((OBS,), np.float32), specs.BoundedArray((ACT_DIM,), np.float32, -1, 1),
                           OBS, ACT_DIM, False, 0)


def _rollout(env_spec: EnvironmentSpec, actor, seed: int = 0) -> Rollout:
    """A synthetic [T, N] rollout whose actions and behaviour log-probs come from `actor`."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(T, N, OBS)).astype(np.float32)
    sampled = [actor.sample(o) for o in obs]
    last = (rng.random((T, N)) < 0.2).astype(np.float32)
    return Rollout(observation=obs, action=np.stack([a for a, _ in sampled]),
                   behaviour_logp=np.stack([lp for _, lp in sampled]),
                   reward=rng.normal(size=(T, N)).astype(np.float32),
                   discount=np.where(rng.random((T, N)) < 0.5, 0.0, 1.0).astype(np.float32) * last + (1 - last),
                   last=last, next_observation=rng.normal(size=(T, N, OBS)).astype(np.float32))


def _parts(config: PPOConfig, env_spec: EnvironmentSpec, backend: str = "jax"):
    builder = Builder(config)
    learner = builder.make_learner(env_spec, 0)
    actor = builder.make_actor(env_spec, quantize_params(learner.policy_params(), "fp32"), seed=0, backend=backend,
                               batch_size=N)
    return builder, learner, actor


# ---------------------------------------------------------------------------------------------- GAE and loss


def test_gae_matches_a_hand_computed_rollout():
    """Column 0: an episode that terminates at its last step; column 1: a time limit (LAST, discount 1) at t=1,
    which bootstraps from its final observation's value but passes no advantage back from the next episode."""
    rewards = jnp.array([[1.0, 1.0], [1.0, 2.0], [1.0, 0.5]])
    values = jnp.array([[0.5, 1.0], [0.4, 1.0], [0.3, 1.0]])
    next_values = jnp.array([[0.4, 1.0], [0.3, 3.0], [0.2, 1.0]])
    discounts = jnp.array([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])
    lasts = jnp.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    adv = np.asarray(gae_advantages(rewards, values, next_values, discounts, lasts, 0.9, 0.8))
    # column 0: deltas 0.86, 0.87, 0.7 (no bootstrap after the termination); A = delta + 0.72 * A_next
    a2 = 0.7
    a1 = 0.87 + 0.72 * a2
    a0 = 0.86 + 0.72 * a1
    # column 1: delta_2 = 0.5 + 0.9 - 1 = 0.4 (last row: its own next value); delta_1 = 2 + 0.9 * 3 - 1 = 3.7
    # and the chain is cut at t=1; delta_0 = 1 + 0.9 - 1 = 0.9
    b2, b1 = 0.4, 3.7
    b0 = 0.9 + 0.72 * b1
    np.testing.assert_allclose(adv, [[a0, b0], [a1, b1], [a2, b2]], rtol=1e-6)


def _loss_inputs():
    """Two rows of a 2-action policy with uniform logits (log pi = log 0.5): behaviour log-probs chosen so that
    the ratios are 1.5 and 0.5; advantages +1 and -1; values 1 and 2, returns 0, old values 0.5 and 2.5."""
    params = {"logits": jnp.zeros((2, 2)), "values": jnp.array([1.0, 2.0])}
    batch = {"observation": jnp.zeros((2, 1)), "action": jnp.array([0, 1]),
             "behaviour_logp": jnp.log(jnp.array([0.5 / 1.5, 0.5 / 0.5])), "advantage": jnp.array([1.0, -1.0]),
             "return": jnp.zeros(2), "value": jnp.array([0.5, 2.5])}
    return params, (lambda p, obs: (p["logits"], p["values"])), batch


@pytest.mark.parametrize("clip,clip_value,pg,vloss", [
    (0.2, False, (-1.2 + 0.8) / 2, 0.5 * (1.0 + 4.0) / 2),   # clipped: max(-1.5, -1.2), max(0.5, 0.8)
    (0.2, True, (-1.2 + 0.8) / 2, 0.5 * (1.0 + 2.3 ** 2) / 2),  # old 2.5 + clip(-0.5) = 2.3 beats 2.0
    (None, False, (-1.5 + 0.5) / 2, 0.5 * (1.0 + 4.0) / 2),  # unclipped: -A * ratio
])
def test_ppo_loss_matches_hand_computed_values(clip, clip_value, pg, vloss):
    params, apply, batch = _loss_inputs()
    config = PPOConfig(clip_coef=clip, clip_value_loss=clip_value, normalize_advantages=False, value_coef=0.5,
                       entropy_coef=0.01)
    loss, aux = ppo_loss(params, apply, batch, config)
    assert float(aux["policy_loss"]) == pytest.approx(pg, abs=1e-6)
    assert float(aux["value_loss"]) == pytest.approx(vloss, abs=1e-6)
    assert float(aux["entropy"]) == pytest.approx(math.log(2.0), abs=1e-6)
    assert float(loss) == pytest.approx(pg + 0.5 * vloss - 0.01 * math.log(2.0), abs=1e-6)


def test_a2c_gradient_is_the_plain_policy_gradient():
    """At ratio 1 (A2C's single step on fresh data) the unclipped loss's policy gradient is -mean(A grad log pi)."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(5, N_ACTIONS)), jnp.float32)
    actions = jnp.asarray(rng.integers(0, N_ACTIONS, 5))
    adv = jnp.asarray(rng.normal(size=5), jnp.float32)
    batch = {"observation": jnp.zeros((5, 1)), "action": actions, "behaviour_logp": log_prob(logits, actions, None),
             "advantage": adv, "return": jnp.zeros(5), "value": jnp.zeros(5)}
    config = A2CConfig(value_coef=0.0, entropy_coef=0.0)
    grad = jax.grad(lambda lg: ppo_loss({"l": lg}, lambda p, o: (p["l"], jnp.zeros(5)), batch, config)[0])(logits)
    expected = jax.grad(lambda lg: -jnp.mean(adv * log_prob(lg, actions, None)))(logits)
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_a2c_is_one_unclipped_gradient_step_per_rollout():
    config = A2CConfig(**SMALL)
    assert (config.update_epochs, config.num_minibatches, config.clip_coef) == (1, 1, None)
    assert isinstance(agents.make_config("a2c"), A2CConfig) and agents.builder_class("a2c") is Builder
    _, learner, actor = _parts(config, _discrete_spec())
    learner.step(_rollout(_discrete_spec(), actor))
    adam = learner._state.opt_state[1][0]  # clip_by_global_norm, then adam's ScaleByAdamState
    assert int(adam.count) == 1
    ppo = PPOConfig(**SMALL, update_epochs=3, num_minibatches=2)
    _, learner, actor = _parts(ppo, _discrete_spec())
    learner.step(_rollout(_discrete_spec(), actor))
    assert int(learner._state.opt_state[1][0].count) == 6 and learner.steps == 1


# ---------------------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("env_spec", [_discrete_spec(), _continuous_spec()], ids=["discrete", "continuous"])
def test_actor_log_probs_are_the_learners_and_an_update_runs(env_spec):
    """A fresh fp32 actor's behaviour log-probs equal the learner's log pi of the same actions (ratio 1), and an
    update on a [T, N] rollout changes the policy and reports finite metrics."""
    builder, learner, actor = _parts(PPOConfig(**SMALL), env_spec)
    rollout = _rollout(env_spec, actor)
    width = N_ACTIONS if env_spec.discrete else ACT_DIM
    assert builder.policy_spec(env_spec).output_dim == width
    assert rollout.action.shape == ((T, N) if env_spec.discrete else (T, N, ACT_DIM))
    out = reference_apply(learner.networks.policy, learner.policy_params(), rollout.observation.reshape(-1, OBS))
    log_std = None if env_spec.discrete else jnp.asarray(learner.log_std())
    actions = rollout.action.reshape(T * N, *rollout.action.shape[2:])
    expected = log_prob(jnp.asarray(out), jnp.asarray(actions), log_std)
    np.testing.assert_allclose(rollout.behaviour_logp.reshape(-1), expected, atol=2e-5)
    before = learner.policy_params()
    metrics = learner.step(rollout)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert not np.allclose(before["linear_1"]["w"], learner.policy_params()["linear_1"]["w"])
    if env_spec.discrete:
        assert learner.log_std() is None and np.isnan(actor.sigma)
    else:
        assert learner.log_std().shape == (ACT_DIM,)
        greedy = builder.make_actor(env_spec, quantize_params(learner.policy_params(), "fp32"), seed=0,
                                    evaluation=True, backend="jax")
        assert np.all(np.abs(greedy.act(np.full((1, OBS), 50.0, np.float32))[0]) <= 1.0)


def test_minatar_policy_reuses_dqns_conv_torso():
    from agents.dqn.networks import make_q_spec
    shape = (10, 10, 4)
    env_spec = EnvironmentSpec(specs.Array(shape, np.uint8), specs.DiscreteArray(6), 400, 0, True, 6, shape,
                               np.dtype(np.uint8))
    builder = Builder(PPOConfig())
    assert builder.policy_spec(env_spec) == make_q_spec(400, 6, PPOConfig().policy_hidden_sizes, shape)
    nets = builder.networks(env_spec)
    assert nets.value.conv_layers and nets.value.output_dim == 1


@pytest.mark.parametrize("bits", [pytest.param(2, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow), 8])
def test_qat_on_a_conv_policy_computes_what_the_deployed_int_actor_runs(bits):
    """`qat_bits` on PPO's MinAtar conv policy: the learner's policy forward is the int-B JAX conv actor's
    arithmetic (conv QAT through `haiku_forward`), on the same parameters, and differs from the fp32 forward."""
    import jax

    from quarl.quant.calibration import quantize_for_actors
    from quarl.runtimes import make_executor
    shape = (10, 10, 4)
    env_spec = EnvironmentSpec(specs.Array(shape, np.uint8), specs.DiscreteArray(6), 400, 0, True, 6, shape,
                               np.dtype(np.uint8))
    builder = Builder(PPOConfig(qat_bits=bits))
    spec = builder.policy_spec(env_spec)
    assert spec.conv_layers
    params = builder.make_learner(env_spec, 0)._state.params
    obs = (np.random.default_rng(bits).random((16, spec.input_dim)) < 0.3).astype(np.float32)
    nets = builder.networks(env_spec)
    learner_view = np.asarray(jax.jit(nets.make_apply(bits))(params, obs)[0])
    qparams = quantize_for_actors(spec, params["policy"], f"int{bits}", obs)
    deployed = make_executor(spec, qparams, "jax", batch_size=len(obs))(obs)
    np.testing.assert_allclose(deployed, learner_view, rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(np.asarray(nets.make_apply()(params, obs)[0]) - learner_view)) > 1e-6


def test_policy_spec_round_trips_and_runs_in_the_runtimes(tmp_path):
    from quarl.quant.policy_io import load_policy, save_policy
    from quarl.runtimes import make_executor
    env_spec = _continuous_spec()
    builder, learner, _ = _parts(PPOConfig(**SMALL), env_spec)
    spec = builder.policy_spec(env_spec)
    assert PolicySpec.from_dict(spec.to_dict()) == spec
    loaded = load_policy(save_policy(tmp_path, spec, learner.policy_params(), task="t", agent="ppo"))
    assert loaded.spec == spec
    obs = np.random.default_rng(1).normal(size=(3, OBS)).astype(np.float32)
    executor = make_executor(spec, quantize_params(learner.policy_params(), "int8"), backend="onnx")
    mean = reference_apply(spec, learner.policy_params(), obs)
    np.testing.assert_allclose(executor(obs), mean, atol=0.02 * np.abs(mean).max() + 1e-4)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("field,value", [
    ("policy_hidden_sizes", ()), ("value_hidden_sizes", (8, 0)), ("activation", "sigmoid"), ("num_envs", 0),
    ("num_steps", 2.5), ("num_minibatches", 3), ("discount", 1.5), ("gae_lambda", -0.1), ("clip_coef", 0.0),
    ("value_coef", -1.0), ("entropy_coef", float("nan")), ("learning_rate", 0.0), ("max_gradient_norm", -1.0),
    ("init_log_std", float("inf")), ("anneal_lr", 1), ("qat_bits", 9),
])
def test_bad_config_values_are_one_line_errors(field, value):
    with pytest.raises(ValueError, match=field) as info:
        PPOConfig(**{field: value})
    assert "\n" not in str(info.value)


def test_a2c_refuses_ppo_settings_and_clip_value_needs_a_clip():
    with pytest.raises(ValueError, match="A2C is one epoch"):
        A2CConfig(update_epochs=4)
    with pytest.raises(ValueError, match="clip_value_loss needs a clip_coef"):
        PPOConfig(clip_coef=None, clip_value_loss=True)
    with pytest.raises(ValueError, match="discrete task needs >= 2"):
        Builder(PPOConfig()).policy_spec(EnvironmentSpec(specs.Array((OBS,), np.float32), specs.DiscreteArray(1),
                                                         OBS, 0, True, 1))


def test_rollouts_of_the_wrong_shape_are_refused():
    _, learner, actor = _parts(PPOConfig(**SMALL), _discrete_spec())
    rollout = _rollout(_discrete_spec(), actor)
    with pytest.raises(ValueError, match="behaviour_logp"):
        learner.step(rollout._replace(behaviour_logp=rollout.behaviour_logp[:, :2]))
    with pytest.raises(ValueError, match="NaN"):
        learner.step(rollout._replace(reward=np.full((T, N), np.nan, np.float32)))
    with pytest.raises(ValueError, match="finite"):
        actor.sample(np.full((N, OBS), np.inf, np.float32))


@pytest.mark.parametrize("argv,message", [
    (["launch.actorq", "--agent", "ppo", "--checkpoint-every", "10"], "on-policy"),
    pytest.param(["launch.train", "--agent", "ppo", "--actor-update-period", "5"], "after every update",
                 marks=pytest.mark.slow),  # a subprocess each: one stays in the default suite
    pytest.param(["launch.train", "--agent", "a2c", "--set", "num_minibatches=2"], "A2C is one epoch",
                 marks=pytest.mark.slow),
])
def test_cli_errors_are_one_line_and_exit_2(argv, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", *argv, "--logdir", str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- runner contract


@pytest.mark.parametrize("spec_fn", [_discrete_spec, _continuous_spec])
def test_ppo_pieces_satisfy_the_runner_protocols_and_act_through_the_rollout_sink(spec_fn):
    """What the actor's loop and the runners read: `act` gives the sampled actions with their log-probs (the
    same draws as `sample`), the sink makes [T, K] rollouts, weights come after every rollout, runs take whole
    rollouts, and the learner is sized to the run's updates."""
    from agents.base import Actor, BuilderBase, OnPolicyActor, OnPolicyLearner
    from quarl.acting.loop import RolloutSink

    env_spec = spec_fn()
    builder, learner, actor = _parts(PPOConfig(**SMALL), env_spec)
    assert isinstance(builder, BuilderBase) and isinstance(learner, OnPolicyLearner)
    assert isinstance(actor, Actor) and isinstance(actor, OnPolicyActor) and actor.backend == "jax"
    twin = builder.make_actor(env_spec, quantize_params(learner.policy_params(), "fp32"), seed=0, backend="jax",
                              batch_size=N)
    obs = np.random.default_rng(1).normal(size=(N, OBS)).astype(np.float32)
    actions, extras = actor.act(obs)
    want_actions, want_logp = twin.sample(obs)
    np.testing.assert_array_equal(actions, want_actions)
    np.testing.assert_array_equal(extras["behaviour_logp"], want_logp)
    assert math.isnan(actor.exploration) if env_spec.discrete else actor.exploration == pytest.approx(1.0)
    sink = builder.make_sink(N)
    assert isinstance(sink, RolloutSink) and (sink.num_steps, sink.num_envs) == (T, N)
    assert builder.steps_per_update(N) == builder.actor_update_period(N) == T * N
    assert builder.run_steps(T * N + 1, N) == 2 * T * N and builder.run_steps(1, N) == T * N
    run_learner = builder.make_learner(env_spec, 0, max_actor_steps=3 * T * N, num_envs=N)
    assert run_learner.steps == 0 and builder.num_envs(1) == N and builder.num_envs(3) == 3
    greedy = builder.make_actor(env_spec, quantize_params(learner.policy_params(), "fp32"), seed=0, evaluation=True,
                                backend="jax", batch_size=N)
    assert greedy.act(obs)[1] == {}  # an evaluating actor samples nothing
