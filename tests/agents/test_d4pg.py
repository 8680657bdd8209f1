"""D4PG: config validation, categorical projection, critic and policy updates, actor, builder contract."""
from __future__ import annotations

import dataclasses
import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agents.d4pg import Builder, D4PGConfig, sigma_for_actor
from agents.d4pg.learning import categorical_target, critic_loss, policy_loss
from agents.d4pg.networks import critic_mean, make_networks
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.nets.haiku import haiku_forward
from quarl.policy.reference import reference_apply
from quarl.quant.quantization import quantize_params
from quarl.runtimes import make_executor
from tests.agents.executed import assert_integer_kernel_ran
from tests.agents.helpers import act_one

SMALL = dict(policy_layer_sizes=(32, 32), critic_layer_sizes=(64, 64), num_atoms=21, vmin=-10.0, vmax=10.0,
             batch_size=32, min_replay_size=64, max_replay_size=10_000, samples_per_insert=8.0)


def _batch(rng: np.random.Generator, n: int, obs_dim: int = 5, act_dim: int = 1, discount: float = 0.9) -> dict:
    return {
        "observation": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
        "reward": rng.normal(size=n).astype(np.float32),
        "discount": np.full(n, discount, np.float32),
        "next_observation": rng.normal(size=(n, obs_dim)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def env_spec():
    return environment_spec(make_environment("cartpole:balance", seed=0))


# ---------------------------------------------------------------- config

def test_config_defaults_follow_acme_control_suite():
    c = D4PGConfig()
    assert c.policy_layer_sizes == (256, 256, 256) and c.critic_layer_sizes == (512, 512, 256)
    assert (c.num_atoms, c.vmin, c.vmax, c.n_step, c.discount) == (51, -150.0, 150.0, 5, 0.99)
    assert (c.batch_size, c.learning_rate, c.target_update_period, c.sigma) == (256, 1e-4, 100, 0.3)
    assert (c.min_replay_size, c.max_replay_size, c.samples_per_insert) == (1000, 1_000_000, 32.0)
    assert len(c.atoms) == 51 and c.atoms[0] == -150.0 and c.atoms[-1] == pytest.approx(150.0)
    paper = D4PGConfig.paper()
    assert paper.policy_layer_sizes == (2048, 2048, 2048) and paper.critic_layer_sizes == c.critic_layer_sizes
    assert D4PGConfig.paper(n_step=3).n_step == 3
    assert D4PGConfig(policy_layer_sizes=[8, 8]).policy_layer_sizes == (8, 8)  # lists from CLIs/JSON


@pytest.mark.parametrize("field, value", [
    ("policy_layer_sizes", ()), ("critic_layer_sizes", (64, 0)), ("num_atoms", 1), ("vmax", -200.0),
    ("n_step", 0), ("discount", 1.5), ("batch_size", 0), ("learning_rate", 0.0), ("max_gradient_norm", -1.0),
    ("dqda_clipping", 0.0), ("target_update_period", 0), ("sigma", -0.1), ("sigma", float("nan")),
    ("sigma_spread", 0.5), ("min_replay_size", 0), ("max_replay_size", 10), ("samples_per_insert", 0.0),
    ("samples_per_insert_tolerance", 0.0), ("actor_update_period", 0), ("batch_size", 2.5),
])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        D4PGConfig(**{field: value})


def test_config_is_frozen_and_error_buffer_covers_a_batch():
    c = D4PGConfig(**SMALL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.sigma = 0.1  # type: ignore[misc]
    assert c.error_buffer >= c.batch_size
    assert D4PGConfig().error_buffer == pytest.approx(1000 * 0.1 * 32.0)


def test_sigma_for_actor_spreads_geometrically_around_sigma():
    flat = D4PGConfig(sigma=0.3)
    assert [sigma_for_actor(flat, i, 4) for i in range(4)] == [0.3] * 4
    spread = D4PGConfig(sigma=0.3, sigma_spread=4.0)
    sigmas = np.array([sigma_for_actor(spread, i, 5) for i in range(5)])
    assert np.all(np.diff(sigmas) > 0)
    np.testing.assert_allclose([sigmas[0], sigmas[-1]], [0.15, 0.6], rtol=1e-6)
    np.testing.assert_allclose(np.exp(np.mean(np.log(sigmas))), 0.3, rtol=1e-6)
    assert sigma_for_actor(spread, 0, 1) == 0.3
    for bad in ((5, 5), (-1, 5), (0, 0)):
        with pytest.raises(ValueError):
            sigma_for_actor(spread, *bad)


# ---------------------------------------------------------------- critic

def test_categorical_target_on_a_hand_example():
    atoms = jnp.linspace(-2.0, 2.0, 5)  # [-2, -1, 0, 1, 2]
    sure_zero = jnp.array([[-1e9, -1e9, 0.0, -1e9, -1e9]])  # Z_t is a point mass at 0
    # r + d * 0 = 0.5 lies halfway between atoms 0 and 1: mass splits evenly.
    got = categorical_target(atoms, jnp.array([0.5]), jnp.array([0.9]), sure_zero)
    np.testing.assert_allclose(got, [[0, 0, 0.5, 0.5, 0]], atol=1e-6)
    # Point masses at -1 and 1 (half each), r = 0.25, d = 0.5 -> -0.25 and 0.75.
    two = jnp.array([[-1e9, 0.0, -1e9, 0.0, -1e9]])
    got = categorical_target(atoms, jnp.array([0.25]), jnp.array([0.5]), two)
    np.testing.assert_allclose(got, [[0, 0.125, 0.5, 0.375, 0]], atol=1e-6)
    # Terminal (d = 0): a point mass at r whatever Z_t is; beyond vmax it is clipped to the last atom.
    uniform = jnp.zeros((2, 5))
    got = categorical_target(atoms, jnp.array([-1.0, 7.0]), jnp.array([0.0, 0.0]), uniform)
    np.testing.assert_allclose(got, [[0, 1, 0, 0, 0], [0, 0, 0, 0, 1]], atol=1e-6)
    # Mass is conserved and the mean matches r + d * E[Z_t] when nothing is clipped.
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(8, 5)), jnp.float32)
    r, d = jnp.asarray(rng.uniform(-0.5, 0.5, 8), jnp.float32), jnp.full(8, 0.5)
    got = categorical_target(atoms, r, d, logits)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose((got * atoms).sum(-1), r + d * critic_mean(logits, atoms), atol=1e-5)


@pytest.mark.slow  # D4PG's learning test covers the critic
def test_critic_loss_decreases_on_a_fixed_batch():
    # Terminal transitions: the target is a fixed two-atom split (entropy <= ln 2), so the loss can fall far.
    config = D4PGConfig(**{**SMALL, "learning_rate": 1e-3})
    nets = make_networks(config, 5, [-1.0], [1.0])
    learner = Builder(config).make_learner(_spec(5), seed=0)
    batch = _batch(np.random.default_rng(1), 64, discount=0.0)
    first = learner.step(batch)["critic_loss"]
    for _ in range(150):
        last = learner.step(batch)["critic_loss"]
    assert np.isfinite(first) and last < 0.5 * first
    # The learner's loss is the cross-entropy against the projected target (recomputed here independently).
    state = learner.get_state()
    loss = critic_loss(nets, state["critic_params"], state["target_policy_params"],
                       state["target_critic_params"], {k: jnp.asarray(v) for k, v in batch.items()})
    assert float(loss) < first


# ---------------------------------------------------------------- policy

def _toy_networks(config: D4PGConfig):
    """Real policy, toy critic whose mean Q = -sigmoid(8 (a - 0.5)^2): best action 0.5 everywhere."""
    nets = make_networks(config, 3, [-1.0], [1.0])

    def critic(obs, action):
        del obs
        bad = 8.0 * (action[:, 0] - 0.5) ** 2
        return jnp.stack([bad, jnp.zeros_like(bad)], axis=-1)  # atoms [-1, 0]

    toy = hk.without_apply_rng(hk.transform(critic))
    return dataclasses.replace(nets, critic=toy, atoms=jnp.array([-1.0, 0.0]))


def test_policy_gradient_moves_actions_toward_higher_q():
    config = D4PGConfig(**SMALL)
    nets = _toy_networks(config)
    obs = jnp.asarray(np.random.default_rng(2).normal(size=(64, 3)), jnp.float32)
    params = nets.policy.init(jax.random.PRNGKey(0), obs)
    opt = optax.adam(1e-3)
    opt_state = opt.init(params)
    grad = jax.jit(jax.grad(lambda p: policy_loss(nets, p, {}, obs, config.dqda_clipping)[0]))
    start = np.asarray(nets.policy.apply(params, obs))
    q_start = float(policy_loss(nets, params, {}, obs, None)[1])
    for _ in range(200):
        updates, opt_state = opt.update(grad(params), opt_state)
        params = optax.apply_updates(params, updates)
    end = np.asarray(nets.policy.apply(params, obs))
    assert np.abs(start).max() < 0.05  # near-zero last layer: actions start near the middle
    assert np.abs(end - 0.5).mean() < 0.25 * np.abs(start - 0.5).mean()
    assert float(policy_loss(nets, params, {}, obs, None)[1]) > q_start


# ---------------------------------------------------------------- learner state

def _spec(obs_dim: int, act_dim: int = 1):
    from dm_env import specs
    from quarl.envs.spec import EnvironmentSpec
    return EnvironmentSpec(specs.Array((obs_dim,), np.float32), specs.BoundedArray((act_dim,), np.float32, -1, 1),
                           obs_dim, act_dim, False, 0)


def test_learner_state_round_trip_and_validation():
    config = D4PGConfig(**SMALL, target_update_period=3)
    builder = Builder(config)
    a, b = builder.make_learner(_spec(5), seed=0), builder.make_learner(_spec(5), seed=1)
    rng = np.random.default_rng(3)
    for _ in range(4):
        a.step(_batch(rng, 32))
    assert a.steps == 4
    b.restore(a.get_state())
    assert b.steps == 4
    batch = _batch(rng, 32)
    assert jax.device_get(a.step(batch)) == jax.device_get(b.step(batch))
    jax.tree_util.tree_map(np.testing.assert_array_equal, a.policy_params(), b.policy_params())
    # Checkpointers may hand lists back as {"0": ..., "1": ...}.
    state = a.get_state()
    state["policy_opt_state"] = {str(i): v for i, v in enumerate(state["policy_opt_state"])}
    b.restore(state)
    bad = a.get_state()
    bad["critic_params"]["critic_linear_0"]["w"] = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match="shape"):
        b.restore(bad)
    bad = a.get_state()
    bad["policy_params"]["linear_0"]["b"][0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        b.restore(bad)
    with pytest.raises(ValueError, match="policy_params has structure"):
        b.restore({**a.get_state(), "policy_params": {}})
    missing = a.get_state()
    del missing["steps"]
    with pytest.raises(ValueError, match="malformed"):
        b.restore(missing)


def test_learner_rejects_bad_batches():
    learner = Builder(D4PGConfig(**SMALL)).make_learner(_spec(5), seed=0)
    rng = np.random.default_rng(4)
    batch = _batch(rng, 32)
    del batch["discount"]
    with pytest.raises(ValueError, match="discount"):
        learner.step(batch)
    batch = _batch(rng, 32)
    batch["observation"][3, 1] = np.inf
    with pytest.raises(ValueError, match="observation"):
        learner.step(batch)
    batch = _batch(rng, 32, obs_dim=4)
    with pytest.raises(ValueError, match="shape"):
        learner.step(batch)


def test_target_networks_follow_online_every_period():
    config = D4PGConfig(**SMALL, target_update_period=3)
    learner = Builder(config).make_learner(_spec(5), seed=0)
    rng = np.random.default_rng(5)
    first = learner.get_state()["target_policy_params"]
    for step in range(1, 7):
        learner.step(_batch(rng, 32))
        s = learner.get_state()
        same = jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, s["target_policy_params"],
                                                             s["policy_params"]))
        assert same == (step % 3 == 0), step
        if step < 3:
            jax.tree_util.tree_map(np.testing.assert_array_equal, s["target_policy_params"], first)


# ---------------------------------------------------------------- actor

class _ConstantExecutor:
    """Stands in for a runtime: returns a fixed action, records weight updates."""

    def __init__(self, spec, qparams, backend="auto", batch_size=1):
        self.value = np.full((1, spec.output_dim), 0.0, np.float32)
        self.updates = []
        self.backend, self.precision = backend, "int8"

    def __call__(self, obs):
        assert obs.shape == (1, 5) and obs.dtype == np.float32
        return self.value

    def update(self, qparams):
        self.updates.append(qparams)


def _qparams(spec):
    params = hk.transform(haiku_forward(spec)).init(jax.random.PRNGKey(0), jnp.zeros((1, spec.input_dim)))
    return quantize_params(jax.device_get(params), "int8")


def test_actor_noise_clipping_evaluation_and_seeding(env_spec):
    builder = Builder(D4PGConfig(**SMALL, sigma=0.3))
    spec = builder.policy_spec(env_spec)
    qp = _qparams(spec)

    def actor(**kw):
        return builder.make_actor(env_spec, qp, executor_factory=_ConstantExecutor, **{"seed": 7, **kw})

    obs = np.zeros(5, np.float32)
    a = actor()
    samples = np.array([act_one(a, obs) for _ in range(4000)])
    assert samples.shape == (4000, 1) and samples.dtype == np.float32
    assert abs(samples.mean()) < 0.03 and abs(samples.std() - 0.3) < 0.02
    # Same (seed, actor_id) -> same noise; another actor id -> different noise.
    again = actor()
    assert np.array_equal([act_one(again, obs) for _ in range(10)], samples[:10])
    other = actor(actor_id=1)
    assert not np.array_equal([act_one(other, obs) for _ in range(10)], samples[:10])
    # Near the bound, exploration actions are pi(s) + noise unclipped (Acme's rlax.add_gaussian_noise): replay
    # stores what the actor chose, the environment clips what it executes.
    a._executor.value[:] = 0.95
    near = np.array([act_one(a, obs) for _ in range(2000)])
    assert (near > 1.0).mean() > 0.3 and abs(near.mean() - 0.95) < 0.03
    # Evaluation: the policy action itself, clipped (a low-precision head may overshoot by a rounding step).
    a.evaluation = True
    assert np.array_equal(act_one(a, obs), np.float32([0.95]))
    a._executor.value[:] = 1.01
    assert np.array_equal(act_one(a, obs), np.float32([1.0]))
    a._executor.value[:] = 0.95
    a.update(qp)
    assert a._executor.updates == [qp]
    with pytest.raises(ValueError, match="observation"):
        act_one(a, np.zeros(4, np.float32))
    # A fleet spreads sigma when asked to.
    fleet = Builder(D4PGConfig(**SMALL, sigma=0.3, sigma_spread=4.0))
    sigmas = [fleet.make_actor(env_spec, qp, seed=0, actor_id=i, num_actors=3,
                               executor_factory=_ConstantExecutor).sigma for i in range(3)]
    np.testing.assert_allclose(sigmas, [0.15, 0.3, 0.6], rtol=1e-6)


def test_environment_clips_the_actors_unclipped_exploration_actions():
    """An action beyond [-1, 1] steps the environment exactly as the bound itself does (Acme's
    CanonicalSpecWrapper(clip=True)), so storing the unclipped action never changes what was executed."""
    outside, bound = make_environment("cartpole:balance", seed=3), make_environment("cartpole:balance", seed=3)
    outside.reset(), bound.reset()
    for action in (2.2, -1.7, 1.3):
        a = outside.step(np.float32([action]))
        b = bound.step(np.float32([np.clip(action, -1, 1)]))
        np.testing.assert_array_equal(a.observation, b.observation)
        assert a.reward == b.reward


@pytest.mark.parametrize("backend,form", [("onnx", None), ("onnx", "u8s8"), ("onnx", "u8u8"), ("jax", None)])
def test_actor_runs_the_learners_policy_through_an_int8_runtime(env_spec, backend, form):
    """Every ONNX kernel form (forced; a form the CPU's self-check refuses falls back to one that passes)."""
    factory = functools.partial(make_executor, kernel_form=form)
    builder = Builder(D4PGConfig(**SMALL, actor_policy="online"))
    learner = builder.make_learner(env_spec, seed=0)
    rng = np.random.default_rng(6)
    for _ in range(30):  # move the near-zero last layer so actions are not all ~0
        learner.step(_batch(rng, 32))
    params = learner.policy_params()
    actor = builder.make_actor(env_spec, quantize_params(params, "int8"), seed=0, evaluation=True, backend=backend,
                               executor_factory=factory)
    assert actor.backend == backend
    if backend == "onnx":
        check = actor._executor.kernel_check
        assert check["checks"][-1]["ok"] and actor._executor.kernel_form == check["form"]
        assert form is None or check["form"] == form or not check["checks"][0]["ok"]
    obs = rng.normal(size=(16, 5)).astype(np.float32)
    got = actor.act(obs)[0]
    want = reference_apply(builder.policy_spec(env_spec), params, obs)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max() + 1e-4)
    assert np.all(np.abs(got) <= 1.0)
    # update() swaps in new weights: the actor follows the learner.
    for _ in range(30):
        learner.step(_batch(rng, 32))
    new = learner.policy_params()
    actor.update(quantize_params(new, "int8"))
    want = reference_apply(builder.policy_spec(env_spec), new, obs)
    np.testing.assert_allclose(actor.act(obs)[0], want, atol=0.05 * np.abs(want).max() + 1e-4)


# ---------------------------------------------------------------- builder

def test_builder_contract(env_spec):
    config = D4PGConfig(**SMALL)
    builder = Builder(config)
    spec = builder.policy_spec(env_spec)
    assert spec.input_dim == env_spec.obs_dim == 5 and spec.output_dim == 1
    learner = builder.make_learner(env_spec, seed=0)
    params = learner.policy_params()
    # The learner's tree is exactly the spec's tree, in NumPy fp32, and computes the spec's function.
    expected = hk.transform(haiku_forward(spec)).init(jax.random.PRNGKey(1), jnp.zeros((1, 5)))
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(expected)
    for leaf in jax.tree_util.tree_leaves(params):
        assert isinstance(leaf, np.ndarray) and leaf.dtype == np.float32
    obs = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    np.testing.assert_allclose(builder.networks(env_spec).policy.apply(params, obs),
                               reference_apply(spec, params, obs), atol=1e-5)
    sig = builder.transition_signature(env_spec)
    assert sig["action"] == ((1,), np.dtype(np.float32)) and sig["observation"] == ((5,), np.dtype(np.float32))
    assert set(sig) == {"observation", "action", "reward", "discount", "next_observation"}
    tc = builder.table_config()
    assert tc["sampler"] == "uniform" and tc["capacity"] == config.max_replay_size
    assert tc["min_size_to_sample"] == config.min_replay_size
    assert tc["samples_per_insert"] == config.samples_per_insert
    discrete = environment_spec(make_environment("CartPole-v1", seed=0))
    with pytest.raises(ValueError, match="continuous"):
        builder.policy_spec(discrete)
    with pytest.raises(ValueError, match="D4PGConfig"):
        Builder(object())  # type: ignore[arg-type]


# ---------------------------------------------------------------- learning

def test_d4pg_learns_cartpole_balance_with_int8_actors(tmp_path):
    """Small nets, int8 ONNX actors (fixed backend: `auto` picks by timing, which would make the run
    machine-dependent). Rewards lie in [0, 1], so with discount 0.99 returns lie in [0, 100]: the support
    [-10, 110] covers them with 51 atoms 2.4 apart (Acme's [-150, 150] would waste two thirds of them).
    A larger learning rate and one learner step per 4 env steps (batch 128, 32 samples per insert) make the
    small networks learn within ~20-40k env steps (runs differ between machines: XLA's float results do).
    The untrained deterministic policy already scores ~735 here (its best episode ~770: balance starts upright
    and a near-constant push keeps the pole up for a while), so the bar is 850, above any untrained episode,
    and the run stops at the first evaluation averaging >= 850."""
    from launch.experiments.acting import evaluation_returns as evaluate
    overrides = dict(policy_layer_sizes=(64, 64), critic_layer_sizes=(128, 128), num_atoms=51, vmin=-10.0,
                     vmax=110.0, batch_size=128, learning_rate=1e-3, min_replay_size=1000,
                     max_replay_size=100_000, samples_per_insert=32.0)
    builder = Builder(D4PGConfig(**overrides))
    task, seed = "cartpole:balance", 0
    # The untrained agent (same seed, same initial weights the run starts from), at the same precision.
    env = make_environment(task, seed=123)
    spec = environment_spec(env)
    untrained = builder.make_actor(spec, quantize_params(builder.make_learner(spec, seed).policy_params(), "int8"),
                                   seed=seed, evaluation=True, backend="onnx")
    untrained_return = float(np.mean(evaluate(untrained, env, 5)))

    from launch.experiments.run_experiment import run_experiment
    from launch.experiments.config import ExperimentConfig
    summary = run_experiment(ExperimentConfig(agent="d4pg", task=task, precision="int8", backend="onnx",
                                              max_actor_steps=60_000, seed=seed, logdir=tmp_path, eval_every=2500,
                                              eval_episodes=5, overrides=overrides),
                             progress=False, energy=False, on_eval=lambda row: row["return"] >= 850.0)
    assert summary["precision"] == "int8" and summary["backend"] == ["onnx"]
    assert_integer_kernel_ran(summary)  # not a silent fallback to fp32 compute
    assert summary["learner_steps"] > 1000
    assert summary["best_eval_return"] >= 850.0, summary["best_eval_return"]
    assert summary["best_eval_return"] > untrained_return + 75.0, (summary["best_eval_return"], untrained_return)
