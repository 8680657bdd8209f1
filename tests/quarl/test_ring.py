"""The in-jit replay ring (`quarl.replay.ring`) gives the n-step transitions the project's n-step adder gives for the
same steps (terminations without bootstrap, time limits with gamma^k, windows cut at episode ends), after wrapping
around its capacity too."""
from __future__ import annotations

import dm_env
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from quarl.replay.adders import NStepTransitionAdder
from quarl.replay.ring import ring_add, ring_init, ring_samplable, ring_sample

N_ENVS, STEPS, N_STEP, GAMMA = 2, 60, 3, 0.9


def _episodes(rng: np.random.Generator) -> list[list[tuple[int, float, bool, bool]]]:
    """Per environment, STEPS steps of (action, reward, terminated, truncated), ends at random."""
    out = []
    for _ in range(N_ENVS):
        steps = []
        for _ in range(STEPS):
            end = rng.random()
            steps.append((int(rng.integers(0, 4)), float(rng.normal()), bool(end < 0.08), bool(0.08 <= end < 0.14)))
        out.append(steps)
    return out


def _next_obs(env: int, t: int, ended: bool) -> float:
    """Observations are ids (1000 * env + step); an episode's final observation is the step's id + 0.5."""
    return 1000.0 * env + t + (0.5 if ended else 1.0)


def _adder_transitions(steps: list[tuple[int, float, bool, bool]], env: int) -> dict[float, tuple]:
    """The adder's transitions keyed by their first observation (a unique id: 1000 * env + step)."""
    adder = NStepTransitionAdder(N_STEP, GAMMA)
    out, first = {}, True
    for t, (action, reward, terminated, truncated) in enumerate(steps):
        obs = np.array([1000.0 * env + t], np.float32)
        if first:
            adder.add_first(dm_env.restart(obs))
            first = False
        nxt = np.array([_next_obs(env, t, terminated or truncated)], np.float32)
        if terminated:
            ts = dm_env.termination(np.float32(reward), nxt)
        elif truncated:
            ts = dm_env.truncation(np.float32(reward), nxt, np.float32(1.0))
        else:
            ts = dm_env.transition(np.float32(reward), nxt, np.float32(1.0))
        for tr in adder.add(action, ts):
            get = (lambda name, tr=tr: tr[name]) if isinstance(tr, dict) else (lambda name, tr=tr: getattr(tr, name))
            out[float(np.ravel(get("observation"))[0])] = (
                int(get("action")), float(get("reward")), float(get("discount")),
                float(np.ravel(get("next_observation"))[0]))
        if terminated or truncated:
            first = True
    return out


@pytest.mark.parametrize("capacity", [STEPS, 25])  # 25 rows: wrapped around, only the newest rows kept
def test_ring_samples_the_adders_n_step_transitions(capacity):
    episodes = _episodes(np.random.default_rng(0))
    ring = ring_init(capacity, N_ENVS, (1,), jnp.float32)
    add = jax.jit(ring_add)
    for t in range(STEPS):
        cols = [[episodes[e][t][i] for e in range(N_ENVS)] for i in range(4)]
        obs = jnp.array([[1000.0 * e + t] for e in range(N_ENVS)], jnp.float32)
        done = jnp.array(cols[2]) | jnp.array(cols[3])
        nxt = jnp.array([[_next_obs(e, t, bool(done[e]))] for e in range(N_ENVS)], jnp.float32)
        ring = add(ring, obs, jnp.array(cols[0]), jnp.array(cols[1], jnp.float32), jnp.array(cols[2]), done, nxt)
    assert int(ring_samplable(ring, N_STEP)) == (min(STEPS, capacity) - N_STEP + 1) * N_ENVS
    sample = jax.jit(ring_sample, static_argnums=(2, 3, 4))(ring, jax.random.PRNGKey(1), 4000, N_STEP, GAMMA)
    want = {k: v for e in range(N_ENVS) for k, v in _adder_transitions(episodes[e], e).items()}
    got = {}
    for i in range(4000):
        key = float(sample["observation"][i, 0])
        got[key] = (int(sample["action"][i]), float(sample["reward"][i]), float(sample["discount"][i]),
                    float(sample["next_observation"][i, 0]))
    oldest = STEPS - min(STEPS, capacity)
    starts = {1000.0 * e + t for e in range(N_ENVS) for t in range(oldest, STEPS - N_STEP + 1)}
    assert set(got) == starts  # every window start held, and nothing else, was drawn
    for key, (action, reward, discount, nxt) in got.items():
        w_action, w_reward, w_discount, w_next = want[key]
        assert (action, nxt) == (w_action, w_next), key
        assert reward == pytest.approx(w_reward, rel=1e-5, abs=1e-6) and discount == pytest.approx(w_discount), key
