"""PPO's off-policy corrections (`agents.ppo.learning`): V-trace against a NumPy reference written from the IMPALA
paper's definition on hand-made trajectories, the truncated importance weights, and what each correction does to an
update when the behaviour policy is the learner's own (nothing) or differs from it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.ppo.config import A2CConfig, PPOConfig
from agents.ppo.learning import PPOLearner, importance_stats, vtrace_targets
from agents.ppo.networks import log_prob, make_networks
from quarl.replay.items import Rollout


def vtrace_reference(rewards, values, next_values, discounts, lasts, log_rhos, gamma, rho_bar, c_bar):
    """V-trace by its definition (Espeholt et al., 2018, eq. 1), one environment at a time, no recursion:
    v_s = V(x_s) + sum_{t=s}^{end} gamma^{t-s} (prod_{i=s}^{t-1} c_i d_i) delta_t, the sum ending at the episode's
    or the rollout's last step; delta_t = rho_t (r_t + gamma d_t V(x'_t) - V(x_t))."""
    t_len, n = rewards.shape
    rhos = np.exp(log_rhos)
    vs = np.zeros_like(values)
    adv = np.zeros_like(values)
    for env in range(n):
        for s in range(t_len):
            total, weight = 0.0, 1.0
            for t in range(s, t_len):
                delta = min(rho_bar, rhos[t, env]) * (rewards[t, env] + gamma * discounts[t, env]
                                                      * next_values[t, env] - values[t, env])
                total += weight * delta
                if lasts[t, env]:
                    break
                weight *= gamma * discounts[t, env] * min(c_bar, rhos[t, env])
            vs[s, env] = values[s, env] + total
        for s in range(t_len):
            following = next_values[s, env] if lasts[s, env] or s == t_len - 1 else vs[s + 1, env]
            adv[s, env] = min(rho_bar, rhos[s, env]) * (rewards[s, env] + gamma * discounts[s, env] * following
                                                         - values[s, env])
    return vs, adv


def _trajectories(seed: int):
    """Two environments over 7 steps: env 0 terminates at step 2 (discount 0) and runs on; env 1 hits a time limit
    at step 4 (last, discount 1: it bootstraps). Ratios spread on both sides of the caps."""
    rng = np.random.default_rng(seed)
    t_len, n = 7, 2
    rewards = rng.normal(size=(t_len, n)).astype(np.float32)
    values = rng.normal(size=(t_len, n)).astype(np.float32)
    next_values = np.roll(values, -1, axis=0) + rng.normal(scale=0.1, size=(t_len, n)).astype(np.float32)
    discounts = np.ones((t_len, n), np.float32)
    lasts = np.zeros((t_len, n), np.float32)
    discounts[2, 0], lasts[2, 0] = 0.0, 1.0
    lasts[4, 1] = 1.0
    next_values[4, 1] = 3.0  # the final observation of the truncated episode: not the next step's value
    log_rhos = rng.normal(scale=0.7, size=(t_len, n)).astype(np.float32)
    return rewards, values, next_values, discounts, lasts, log_rhos


@pytest.mark.parametrize("seed,rho_bar,c_bar", [(0, 1.0, 1.0), (1, 2.0, 0.5), (2, 100.0, 100.0)])
def test_vtrace_matches_the_papers_definition_on_hand_made_trajectories(seed, rho_bar, c_bar):
    data = _trajectories(seed)
    vs, adv = vtrace_targets(*map(jnp.asarray, data), gamma=0.9, rho_bar=rho_bar, c_bar=c_bar)
    ref_vs, ref_adv = vtrace_reference(*data, gamma=0.9, rho_bar=rho_bar, c_bar=c_bar)
    np.testing.assert_allclose(np.asarray(vs), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-5, atol=1e-5)


def test_on_policy_vtrace_targets_are_lambda_one_returns():
    """With pi = mu (every ratio 1) and caps >= 1, v_s is the n-step bootstrapped return, the GAE(1) target (on
    consistent data: a step's successor is the next step's observation unless the episode ended there)."""
    rewards, values, next_values, discounts, lasts, _ = _trajectories(3)
    following_values = np.roll(values, -1, axis=0)
    next_values = np.where(lasts > 0, next_values, following_values)
    next_values[-1] = _trajectories(3)[2][-1]
    vs, _ = vtrace_targets(*map(jnp.asarray, (rewards, values, next_values, discounts, lasts,
                                               np.zeros_like(rewards))), gamma=0.9, rho_bar=1.0, c_bar=1.0)
    expected = np.zeros_like(values)
    for env in range(2):
        following = next_values[-1, env]
        for s in reversed(range(7)):
            if lasts[s, env]:
                following = next_values[s, env]
            expected[s, env] = rewards[s, env] + 0.9 * discounts[s, env] * following
            following = expected[s, env]
    np.testing.assert_allclose(np.asarray(vs), expected, rtol=1e-5, atol=1e-5)


def test_importance_stats_measure_the_ratio_spread_and_the_kl():
    log_rhos = jnp.log(jnp.asarray([0.5, 1.0, 1.0, 4.0]))
    stats = {k: float(v) for k, v in importance_stats(log_rhos, cap=2.0).items()}
    assert stats["is_ratio_mean"] == pytest.approx(1.625) and stats["is_ratio_max"] == pytest.approx(4.0)
    assert stats["is_ratio_min"] == pytest.approx(0.5) and stats["is_truncated_frac"] == pytest.approx(0.25)
    # E_mu[r log r] = KL(pi || mu) when actions come from mu.
    assert stats["kl_learner_behaviour"] == pytest.approx(np.mean([0.5 * np.log(0.5), 0, 0, 4 * np.log(4.0)]))


def _rollout(learner: PPOLearner, shift: np.ndarray | float = 0.0, seed: int = 0) -> Rollout:
    """A CartPole-shaped rollout [T=8, N=4] whose behaviour log-probs are the learner's own minus `shift`
    (shift 0: collected by the learner's policy; log pi/mu = shift)."""
    rng = np.random.default_rng(seed)
    t_len, n = 8, 4
    obs = rng.normal(size=(t_len, n, 4)).astype(np.float32)
    actions = rng.integers(0, 2, size=(t_len, n)).astype(np.int32)
    params = learner.get_state()["params"]
    out, _ = learner.networks.make_apply()(params, jnp.asarray(obs.reshape(-1, 4)))
    own = np.asarray(log_prob(out, jnp.asarray(actions.reshape(-1)), None)).reshape(t_len, n)
    return Rollout(observation=obs, action=actions, reward=rng.normal(size=(t_len, n)).astype(np.float32),
                   discount=np.ones((t_len, n), np.float32), last=(rng.random((t_len, n)) < 0.1).astype(np.float32),
                   next_observation=rng.normal(size=(t_len, n, 4)).astype(np.float32),
                   behaviour_logp=(own - shift).astype(np.float32))


def _learner(correction: str, cls=PPOConfig, **kw) -> PPOLearner:
    config = cls(policy_hidden_sizes=(16,), value_hidden_sizes=(16,), num_envs=4, num_steps=8, correction=correction,
                 **({"update_epochs": 2} if cls is PPOConfig else {}), **kw)
    return PPOLearner(make_networks(config, 4, 2), config, seed=0)


def _policy(learner: PPOLearner) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(learner.policy_params())]


def test_truncated_is_is_plain_ppo_when_the_behaviour_policy_is_the_learners():
    """Data from the learner's own policy: every ratio is 1, no weight is truncated, and "tis" anchors PPO's ratio
    where "none" does, so both updates are the same."""
    none, tis = _learner("none"), _learner("tis")
    rollout = _rollout(none)
    m_none, m_tis = none.step(rollout), tis.step(rollout)
    assert float(m_tis["is_truncated_frac"]) == 0.0 and float(m_tis["is_ratio_max"]) == pytest.approx(1.0, abs=1e-5)
    for a, b in zip(_policy(none), _policy(tis)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert float(m_none["loss"]) == pytest.approx(float(m_tis["loss"]), rel=1e-4, abs=1e-6)


def test_truncated_is_weights_are_the_capped_ratios():
    """Behaviour log-probs below the learner's by log 3 on half the samples and by log 1.5 on the rest: the ratios
    are 3 and 1.5; with cap 2 the weights are 2 and 1.5, so the first epoch's policy loss (ratio anchored at 1) is
    -mean(w * A) with the normalised advantages, and half the samples are truncated."""
    learner = _learner("tis", cls=A2CConfig, is_cap=2.0, normalize_advantages=True)
    shift = np.where(np.arange(8)[:, None] % 2 == 0, np.log(3.0), np.log(1.5)) * np.ones((8, 4))
    rollout = _rollout(learner, shift)
    metrics = learner.step(rollout)
    assert float(metrics["is_truncated_frac"]) == pytest.approx(0.5)
    assert float(metrics["is_ratio_mean"]) == pytest.approx(2.25, rel=1e-4)
    # The loss reported is that of the one minibatch at the update's start (A2C: one epoch, one minibatch).
    fresh = _learner("tis", cls=A2CConfig, is_cap=2.0, normalize_advantages=True)
    params = fresh.get_state()["params"]
    apply = fresh.networks.make_apply()
    flat = lambda x: x.reshape(32, *x.shape[2:])  # noqa: E731
    values = np.asarray(apply(params, jnp.asarray(flat(rollout.observation)))[1]).reshape(8, 4)
    next_values = np.asarray(apply(params, jnp.asarray(flat(rollout.next_observation)))[1]).reshape(8, 4)
    adv = np.zeros((8, 4))
    following = np.zeros(4)
    for t in reversed(range(8)):
        delta = rollout.reward[t] + 0.99 * rollout.discount[t] * next_values[t] - values[t]
        following = delta + 0.99 * 1.0 * (1 - rollout.last[t]) * following
        adv[t] = following
    adv = adv.reshape(-1)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    weights = np.minimum(np.exp(shift.reshape(-1)), 2.0)
    assert float(metrics["policy_loss"]) == pytest.approx(float(np.mean(-adv * weights)), rel=1e-3, abs=1e-5)


@pytest.mark.parametrize("correction", [pytest.param("tis", marks=pytest.mark.slow), "vtrace"])
def test_corrections_change_the_update_only_when_the_behaviour_policy_differs(correction):
    """Stale or quantized data (behaviour log-probs off by up to +-1): each correction's update differs from
    PPO's plain ratio against the behaviour policy, and the learner reports the mismatch it saw."""
    plain, corrected = _learner("none"), _learner(correction)
    shift = np.random.default_rng(5).uniform(-1.0, 1.0, size=(8, 4))
    rollout = _rollout(plain, shift)
    metrics = corrected.step(rollout)
    plain.step(rollout)
    assert any(not np.allclose(a, b, atol=1e-6) for a, b in zip(_policy(plain), _policy(corrected)))
    assert float(metrics["kl_learner_behaviour"]) > 0.01 and float(metrics["is_ratio_std"]) > 0.1


def test_bad_correction_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="correction must be one of none, tis, vtrace"):
        PPOConfig(correction="retrace")
    with pytest.raises(ValueError, match="is_cap must be a positive"):
        PPOConfig(is_cap=0.0)
    with pytest.raises(ValueError, match="vtrace_c_bar must be a positive"):
        PPOConfig(vtrace_c_bar=float("nan"))
