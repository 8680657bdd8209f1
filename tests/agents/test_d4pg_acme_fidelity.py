"""D4PG against Acme 0.4.0's JAX D4PG, piece by piece (issue: D4PG fidelity).

Each test pins one behaviour of Acme's reference (file named in the test) that this project's D4PG must share:
initialisation scales, the DPG loss (states, averaging, clipping), which policy actors run, the n-step items at
an episode's start and end, and the optimiser's clipping. Observation order is pinned in tests/quarl/test_envs.py,
the categorical projection and target updates in tests/agents/test_d4pg.py.
"""
from __future__ import annotations

import dataclasses

import dm_env
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agents.d4pg import Builder, D4PGConfig
from agents.d4pg.learning import TrainingState, make_optimizer, make_update_fn, policy_loss
from agents.d4pg.networks import make_networks
from quarl.replay import adders
from tests.agents.helpers import act_one

SMALL = dict(policy_layer_sizes=(32, 32), critic_layer_sizes=(64, 32), num_atoms=21, vmin=-10.0, vmax=10.0,
             batch_size=16, min_replay_size=32, max_replay_size=1000, samples_per_insert=8.0)
WIDE = dict(SMALL, policy_layer_sizes=(256, 256), critic_layer_sizes=(256, 128))  # for initialiser statistics


def _uniform_scaling_check(w: np.ndarray, scale: float) -> None:
    """`w` looks like hk.initializers.UniformScaling(scale): U(+-scale * sqrt(3 / fan_in))."""
    limit = scale * np.sqrt(3.0 / w.shape[0])
    assert np.abs(w).max() <= limit * (1 + 1e-6)
    assert np.abs(w).max() > 0.98 * limit  # uniform fills its range (a normal would not stop at the limit)
    np.testing.assert_allclose(w.std(), limit / np.sqrt(3.0), rtol=0.05)


@pytest.mark.slow  # the default suite keeps Acme's critic and DPG losses
def test_policy_and_critic_initialise_as_acme_layer_norm_mlp():
    """acme/jax/networks/continuous.py: LayerNormMLP layers use UniformScaling(0.333) (std 0.333/sqrt(fan_in),
    a third of haiku's default), the policy's last layer VarianceScaling(1e-4) (std 0.01/sqrt(fan_in)), biases
    zero, for the policy torso and every critic layer including the atom logits."""
    config = D4PGConfig(**WIDE)
    nets = make_networks(config, obs_dim=24, action_min=[-1.0] * 6, action_max=[1.0] * 6)
    obs, act = jnp.zeros((1, 24)), jnp.zeros((1, 6))
    policy = jax.device_get(nets.policy.init(jax.random.PRNGKey(0), obs))
    for name in ("linear_0", "linear_1"):
        _uniform_scaling_check(policy[name]["w"], 0.333)
        assert not policy[name]["b"].any()
    last = policy["linear_2"]["w"]
    assert last.shape == (256, 6)
    np.testing.assert_allclose(last.std(), np.sqrt(1e-4 / 256), rtol=0.1)
    critic = jax.device_get(nets.critic.init(jax.random.PRNGKey(1), obs, act))
    for name in ("critic_linear_0", "critic_linear_1", "critic_linear_2"):
        _uniform_scaling_check(critic[name]["w"], 0.333)
        assert not critic[name]["b"].any()
    assert critic["critic_linear_0"]["w"].shape == (30, 256)  # concat(obs, action), obs first


def _linear_critic_networks(config: D4PGConfig, slope: np.ndarray, obs_dim: int):
    """Networks whose (parameter-free) critic has Q(s, a) = 0.5 + slope . a exactly, so dQ/da = slope: atoms
    [0, 1] with logits [0, logit(q)] give E[Z] = q."""
    act_dim = slope.size
    nets = make_networks(config, obs_dim=obs_dim, action_min=[-1.0] * act_dim, action_max=[1.0] * act_dim)

    def critic(obs, action):
        del obs
        q = 0.5 + action @ jnp.asarray(slope, jnp.float32)
        logit = jnp.log(q) - jnp.log1p(-q)
        return jnp.stack([jnp.zeros_like(logit), logit], axis=-1)

    return dataclasses.replace(nets, critic=hk.without_apply_rng(hk.transform(critic)), atoms=jnp.array([0.0, 1.0]))


def test_dpg_loss_averages_over_batch_and_action_dimensions():
    """acme/agents/jax/d4pg/learning.py: `jnp.mean(vmap(rlax.dpg_loss)(...))` over [B, act_dim], where
    rlax.dpg_loss is 0.5 * (clipped dQ/da)^2 element-wise. Summing over actions would scale the policy gradient
    by act_dim (6x on walker) and change how often global-norm clipping bites."""
    config = D4PGConfig(**SMALL)
    slope = np.array([0.3, -0.4, 0.0], np.float32)  # |dQ/da| = 0.5 for every sample
    nets = _linear_critic_networks(config, slope, obs_dim=4)
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(8, 4)), jnp.float32)
    params = nets.policy.init(jax.random.PRNGKey(0), obs)
    loss, q = policy_loss(nets, params, {}, obs, dqda_clipping=1.0)
    np.testing.assert_allclose(float(loss), 0.5 * np.mean(slope ** 2), rtol=1e-4)  # not 0.5 * sum(slope^2)
    assert abs(float(q) - 0.5) < 0.01  # near-zero last layer: actions start near 0
    # dQ/da is clipped to L2 norm `dqda_clipping` per sample (rlax.dpg_loss): norm 0.5 -> 0.25 quarters the loss.
    loss_clipped, _ = policy_loss(nets, params, {}, obs, dqda_clipping=0.25)
    np.testing.assert_allclose(float(loss_clipped), 0.25 * float(loss), rtol=1e-4)


@pytest.mark.slow  # the default suite keeps Acme's critic and DPG losses
def test_policy_is_trained_at_next_observations():
    """Acme's sgd_step: `policy_loss(policy_params, critic_params, transitions.next_observation)`."""
    config = D4PGConfig(**SMALL)
    nets = make_networks(config, obs_dim=5, action_min=[-1.0], action_max=[1.0])
    optimizer = make_optimizer(config)
    key_p, key_c = jax.random.split(jax.random.PRNGKey(0))
    obs = jnp.zeros((1, 5))
    p = nets.policy.init(key_p, obs)
    c = nets.critic.init(key_c, obs, jnp.zeros((1, 1)))
    state = TrainingState(p, c, p, c, optimizer.init(p), optimizer.init(c), jnp.zeros((), jnp.int32))
    rng = np.random.default_rng(1)
    batch = {"observation": rng.normal(size=(16, 5)), "action": rng.uniform(-1, 1, (16, 1)),
             "reward": rng.normal(size=16), "discount": np.full(16, 0.9),
             "next_observation": 3.0 + rng.normal(size=(16, 5))}
    batch = {k: jnp.asarray(v, jnp.float32) for k, v in batch.items()}
    new_state, _ = jax.jit(make_update_fn(nets, config, optimizer))(state, batch)

    @jax.jit
    def after(states):
        grads = jax.grad(lambda q: policy_loss(nets, q, c, states, config.dqda_clipping)[0])(p)
        updates, _ = optimizer.update(grads, optimizer.init(p), p)
        return optax.apply_updates(p, updates)

    leaves = lambda t: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(t)])
    np.testing.assert_allclose(leaves(new_state.policy_params), leaves(after(batch["next_observation"])),
                               rtol=1e-5, atol=1e-7)
    assert not np.allclose(leaves(new_state.policy_params), leaves(after(batch["observation"])), atol=1e-7)


@pytest.mark.slow  # the default suite keeps Acme's critic and DPG losses
def test_actors_run_the_target_policy_as_acme_serves_it():
    """Acme's D4PGLearner.get_variables("policy") returns target_policy_params: actors and the evaluator act
    with weights that only change at target updates. `actor_policy="online"` serves the online policy."""
    rng = np.random.default_rng(2)
    from tests.agents.test_d4pg import _batch, _spec  # pylint: disable=import-outside-toplevel
    leaves = lambda t: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(t)])
    for mode in ("target", "online"):
        learner = Builder(D4PGConfig(**SMALL, target_update_period=3, actor_policy=mode)).make_learner(_spec(5), 0)
        start = leaves(learner.policy_params())
        for step in range(1, 7):
            learner.step(_batch(rng, 16))
            state = learner.get_state()
            served = leaves(learner.policy_params())
            np.testing.assert_array_equal(served, leaves(state[f"{'target_' if mode == 'target' else ''}policy_params"]))
            if mode == "target" and step % 3:
                np.testing.assert_array_equal(served, start)
            elif mode == "target":
                np.testing.assert_array_equal(served, leaves(state["policy_params"]))
                start = served
    with pytest.raises(ValueError, match="actor_policy"):
        D4PGConfig(actor_policy="behaviour")


def _acme_items(steps: list[tuple[float, float]], n: int, gamma: float) -> list[tuple[int, int, float, float]]:
    """Acme 0.4.0's NStepTransitionAdder items for one episode, re-derived from its index bookkeeping
    (acme/adders/reverb/transition.py: add() moves first/last indices, _write() after every add, _write_last()
    at the end). `steps[t] = (reward, env discount)` after action t. Returns (first, last, R, D * gamma), where
    the learner's bootstrap weight is Acme's `discount * transition.discount`."""
    items, first, last = [], 0, 0

    def write():
        ret, disc = steps[first][0], steps[first][1]
        for i in range(first + 1, last):
            disc *= gamma
            ret += steps[i][0] * disc
            disc *= steps[i][1]
        items.append((first, last, ret, disc * gamma))

    for episode_steps in range(len(steps)):
        if episode_steps >= n:
            first += 1
        last += 1
        write()
    first += 1
    while first < last:
        write()
        first += 1
    return items


@pytest.mark.parametrize("n, length, last_discount", [(5, 12, 0.0), (5, 12, 1.0), (3, 2, 0.0), (1, 4, 1.0),
                                                      (4, 4, 0.0)])
def test_n_step_items_match_acme_at_episode_start_and_end(n, length, last_discount):
    """With `start_transitions` (what the D4PG builder uses) the adder emits Acme's exact items: the short
    windows s_0 -> s_k at the start, full windows, and the short windows into s_T at the end, with Acme's
    n-step return and (after the learner's extra gamma) bootstrap weight; termination stops bootstrapping,
    truncation keeps it."""
    gamma = 0.9
    rng = np.random.default_rng(n * 100 + length)
    rewards = rng.normal(size=length)
    discounts = [float(d) for d in rng.choice([1.0, 0.7], size=length)]
    discounts[-1] = last_discount
    adder = Builder(D4PGConfig(n_step=n, discount=gamma)).make_adder()
    assert adder.start_transitions
    obs = lambda t: np.full(2, t, np.float32)
    adder.add_first(dm_env.restart(obs(0)))
    got = []
    for t in range(length):
        kind = dm_env.StepType.LAST if t == length - 1 else dm_env.StepType.MID
        got += adder.add(np.float32([t]), dm_env.TimeStep(kind, rewards[t], discounts[t], obs(t + 1)))
    want = _acme_items(list(zip(rewards, discounts)), n, gamma)
    assert len(got) == len(want) == length + min(n, length) - 1
    for item, (first, last, ret, boot) in zip(got, want):
        assert item.observation[0] == first and item.action[0] == first
        assert item.next_observation[0] == last
        assert item.reward == pytest.approx(ret, rel=1e-5, abs=1e-6)
        assert item.discount == pytest.approx(boot, rel=1e-5, abs=1e-7)
    # Without the flag (DQN's adder) the start windows are left out, everything else is the same.
    plain = adders.NStepTransitionAdder(n, gamma)
    plain.add_first(dm_env.restart(obs(0)))
    items = []
    for t in range(length):
        kind = dm_env.StepType.LAST if t == length - 1 else dm_env.StepType.MID
        items += plain.add(np.float32([t]), dm_env.TimeStep(kind, rewards[t], discounts[t], obs(t + 1)))
    assert len(items) == length


def test_optimiser_clips_the_global_norm_at_40_as_acme():
    """acme/agents/jax/d4pg/builder.py: `optax.chain(optax.clip_by_global_norm(40.), optax.adam(lr))` for
    both networks when `clipping=True` (Acme's default)."""
    config = D4PGConfig(**SMALL)
    opt = make_optimizer(config)
    params = {"w": jnp.zeros(4)}
    huge = {"w": jnp.full(4, 1e3)}
    small = {"w": jnp.full(4, 1e3 * 40 / np.linalg.norm(np.full(4, 1e3)))}
    up_huge, _ = opt.update(huge, opt.init(params), params)
    up_small, _ = opt.update(small, opt.init(params), params)
    np.testing.assert_allclose(up_huge["w"], up_small["w"], rtol=1e-6)  # the huge gradient was clipped to 40
    assert make_optimizer(dataclasses.replace(config, max_gradient_norm=None)) is not None


def test_critic_loss_is_acmes_categorical_td_learning():
    """Acme's critic_loss: `vmap(rlax.categorical_td_learning)(atoms, q_tm1, r, gamma * discount, atoms, q_t)`
    averaged over the batch. Ours stores gamma^k in `discount` (Acme stores gamma^(k-1) and multiplies by gamma in
    the learner), so feeding Acme's function our discount must give our loss exactly."""
    import rlax  # pylint: disable=import-outside-toplevel
    from agents.d4pg.learning import critic_loss  # pylint: disable=import-outside-toplevel
    from tests.agents.test_d4pg import _batch  # pylint: disable=import-outside-toplevel
    config = D4PGConfig(**SMALL)
    nets = make_networks(config, obs_dim=5, action_min=[-1.0], action_max=[1.0])
    obs, act = jnp.zeros((1, 5)), jnp.zeros((1, 1))
    p = nets.policy.init(jax.random.PRNGKey(0), obs)
    c, c_target = (nets.critic.init(jax.random.PRNGKey(k), obs, act) for k in (1, 2))
    batch = {k: jnp.asarray(v) for k, v in _batch(np.random.default_rng(4), 16, discount=0.9).items()}
    batch["discount"] = batch["discount"].at[:4].set(0.0)  # some terminal transitions
    batch["reward"] = batch["reward"] * 40.0  # targets beyond the support: mass lands on the end atoms
    ours = critic_loss(nets, c, p, c_target, batch)
    q_tm1 = nets.critic.apply(c, batch["observation"], batch["action"])
    q_t = nets.critic.apply(c_target, batch["next_observation"], nets.policy.apply(p, batch["next_observation"]))
    acme = jax.vmap(rlax.categorical_td_learning, in_axes=(None, 0, 0, 0, None, 0))(
        nets.atoms, q_tm1, batch["reward"], batch["discount"], nets.atoms, q_t)
    np.testing.assert_allclose(float(ours), float(jnp.mean(acme)), rtol=1e-5)


def test_replay_limiter_starts_learning_as_acmes_local_agent():
    """Acme's local D4PG (acme/agents/agent.py `_calculate_num_learner_steps`, min_observations 1000,
    observations_per_step = 256 / 32 = 8) takes one learner step when 1000 items are in and one per 8 more.
    Draining the table whenever it allows a batch (the single-process loop) must give the same schedule, while
    actors of a distributed run may still run Acme's error buffer (3200 samples = 100 inserts) ahead."""
    from tests.agents.test_d4pg import _spec  # pylint: disable=import-outside-toplevel
    config = D4PGConfig(max_replay_size=5000)
    table = Builder(config).make_table(_spec(3), seed=0)
    item = {"observation": np.zeros((1, 3), np.float32), "action": np.zeros((1, 1), np.float32),
            "reward": np.zeros(1, np.float32), "discount": np.ones(1, np.float32),
            "next_observation": np.zeros((1, 3), np.float32)}
    ours, acme = [], []
    for inserts in range(1, 2001):
        table.insert(item, timeout=0.0)
        while table.can_sample(config.batch_size):
            table.sample(config.batch_size, timeout=0.0)
            ours.append(inserts)
        n = inserts - max(config.batch_size, config.min_replay_size)
        if n >= 0 and n % int(config.batch_size / config.samples_per_insert) == 0:
            acme.append(inserts)
    assert ours == acme and ours[:2] == [1000, 1008]
    # Actors alone (no learner) may insert up to Acme's error buffer past the ratio, then block.
    fresh = Builder(config).make_table(_spec(3), seed=0)
    allowed = 0
    while fresh.can_insert(1) and allowed < 2000:
        fresh.insert(item, timeout=0.0)
        allowed += 1
    assert allowed == 1000 + int(config.error_buffer / config.samples_per_insert)


class _FixedPolicy:
    """Stands in for a runtime: every observation row gets the action `value`."""

    def __init__(self, spec, qparams, backend="auto", batch_size=1):
        del qparams, batch_size
        self.value, self.backend, self.precision = 0.95, backend, "int8"
        self._dim = spec.output_dim

    def __call__(self, obs):
        return np.full((obs.shape[0], self._dim), self.value, np.float32)

    def update(self, qparams):
        del qparams


def test_exploring_actions_are_stored_unclipped_single_and_batched():
    """Acme's behaviour policy is `rlax.add_gaussian_noise(pi(s))` with no clipping (the environment wrapper
    clips what it executes), so replay holds actions beyond the bounds; evaluation stays inside them."""
    from tests.agents.test_d4pg import _spec  # pylint: disable=import-outside-toplevel
    builder = Builder(D4PGConfig(**SMALL, sigma=0.3))
    spec = _spec(5)
    actor = builder.make_actor(spec, None, seed=0, executor_factory=_FixedPolicy)
    single = np.array([act_one(actor, np.zeros(5, np.float32)) for _ in range(500)])
    batched = actor.act(np.zeros((500, 5), np.float32))[0]
    for actions in (single, batched):
        assert (actions > 1.0).mean() > 0.3 and abs(actions.mean() - 0.95) < 0.05
        assert abs(actions.std() - 0.3) < 0.04
    actor.evaluation = True
    assert np.all(actor.act(np.zeros((4, 5), np.float32))[0] == 0.95)
    actor._executor.value = 1.02  # pylint: disable=protected-access  (a quantized head overshooting its bound)
    assert np.all(actor.act(np.zeros((4, 5), np.float32))[0] == 1.0)
    assert act_one(actor, np.zeros(5, np.float32))[0] == 1.0
