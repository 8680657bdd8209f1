"""quarl.envs.vector + quarl.acting.loop: K environments, one batched policy call, one n-step adder per environment."""
from __future__ import annotations

import dm_env
import numpy as np
import pytest
from dm_env import specs

from quarl.acting.loop import EpisodeEnd, NoSink, ObservationSink, VectorEnvLoop
from quarl.envs.factory import make_environment
from quarl.envs.vector import VectorEnvironment, env_seeds, make_vector_environment
from quarl.replay.adders import NStepTransitionAdder

N_STEP, GAMMA = 3, 0.9


class CountingEnv(dm_env.Environment):
    """Environment `ident`: observation (ident, t), reward 100*ident + t after step t, episodes of `length`
    steps ending in a termination (discount 0) or a truncation (discount 1). It records the actions it got."""

    def __init__(self, ident: int, length: int, terminate: bool):
        self.ident, self.length, self.terminate = ident, length, terminate
        self.t = 0
        self.actions: list[float] = []

    def _obs(self) -> np.ndarray:
        return np.array([self.ident, self.t], np.float32)

    def reset(self) -> dm_env.TimeStep:
        self.t = 0
        return dm_env.restart(self._obs())

    def step(self, action) -> dm_env.TimeStep:
        self.actions.append(float(action))
        self.t += 1
        reward = np.float32(100 * self.ident + self.t)
        if self.t == self.length:
            discount = np.float32(0.0 if self.terminate else 1.0)
            return dm_env.TimeStep(dm_env.StepType.LAST, reward, discount, self._obs())
        return dm_env.transition(reward, self._obs(), np.float32(1.0))

    def observation_spec(self):
        return specs.Array((2,), np.float32)

    def action_spec(self):
        return specs.BoundedArray((), np.float32, -1e6, 1e6)


def _expected(ident: int, length: int, terminate: bool, steps: int) -> list[tuple]:
    """(obs t, action, n-step reward, discount, next obs t) of every transition env `ident` completes in `steps`
    steps, in order: whole episodes, then the windows of the unfinished episode that already span n steps."""
    out = []
    done = 0
    while done < steps:
        played = min(length, steps - done)
        for t in range(played):
            k = min(N_STEP, length - t)
            if t + k > played:  # window still open when the loop stopped
                break
            reward = sum(GAMMA ** j * (100 * ident + t + j + 1) for j in range(k))
            discount = GAMMA ** k * (0.0 if terminate and t + k == length else 1.0)
            out.append((t, 10.0 * t + ident, reward, discount, t + k))
        done += played
    return out


def _policy(obs: np.ndarray) -> np.ndarray:
    """Action = 10 * t + ident: each transition's action tells which environment and step it came from."""
    return (10.0 * obs[:, 1] + obs[:, 0]).astype(np.float32)


def test_k_envs_give_k_times_the_transitions_with_per_env_n_step_returns_and_episode_ends():
    shapes = [(0, 5, True), (1, 7, False), (2, 2, True), (3, 4, False)]  # episode lengths differ per env
    vec = VectorEnvironment([CountingEnv(*s) for s in shapes])
    loop = VectorEnvLoop(vec, lambda: NStepTransitionAdder(N_STEP, GAMMA))
    loop.reset()
    calls = []
    steps = 23
    transitions, episodes = [], []
    for _ in range(steps):
        out = loop.step(lambda obs: (calls.append(obs.shape), _policy(obs))[1])
        transitions += out.items
        episodes += out.episodes
        assert out.env_s >= 0 and out.policy_s >= 0 and out.sink_s >= 0
    assert calls == [(4, 2)] * steps  # one policy call per step, on the batch of all K observations

    for ident, length, terminate in shapes:
        got = [tr for tr in transitions if tr.observation[0] == ident]
        want = _expected(ident, length, terminate, steps)
        assert len(got) == len(want), ident
        for tr, (t, action, reward, discount, next_t) in zip(got, want):
            assert tr.observation.tolist() == [ident, t]
            assert float(tr.action) == action  # its own env's action, never a neighbour's
            assert float(tr.reward) == pytest.approx(reward, rel=1e-6)
            assert float(tr.discount) == pytest.approx(discount, rel=1e-6)
            assert tr.next_observation.tolist() == [ident, next_t]
        ends = [e for e in episodes if e.env_index == ident]
        assert len(ends) == steps // length
        assert all(e.length == length and e.episode_return == pytest.approx(
            sum(100 * ident + j for j in range(1, length + 1))) for e in ends)
        # Every step of every env was acted on with that env's own observation.
        assert len(vec.environments[ident].actions) == steps

    # Every env step became a transition except the ones still inside an open n-step window.
    open_windows = sum(min(steps % length, N_STEP - 1) for _, length, _ in shapes)
    assert len(transitions) == len(shapes) * steps - open_windows


def test_k_equals_one_is_the_single_environment_actor():
    """K=1 keeps the paper's actor: the same seed, the same episodes as `make_environment` alone."""
    assert env_seeds(7, 1) == [7]
    vec = make_vector_environment("CartPole-v1", 7, 1)
    single = make_environment("CartPole-v1", 7)
    np.testing.assert_array_equal(vec.reset()[0].observation, single.reset().observation)
    for _ in range(30):
        a, b = vec.step(np.array([1], np.int32))[0], single.step(np.int32(1))
        np.testing.assert_array_equal(a.observation, b.observation)
        if b.last():
            break


def test_k_environments_are_independently_seeded_and_reproducible():
    seeds = env_seeds(3, 4)
    assert seeds[0] == 3 and len(set(seeds)) == 4 and env_seeds(3, 4) == seeds
    first = [ts.observation for ts in make_vector_environment("CartPole-v1", 3, 4).reset()]
    again = [ts.observation for ts in make_vector_environment("CartPole-v1", 3, 4).reset()]
    np.testing.assert_array_equal(np.stack(first), np.stack(again))
    assert len({o.tobytes() for o in first}) == 4  # four different initial states


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_number_of_environments_is_refused(bad):
    with pytest.raises(ValueError, match="num_envs"):
        env_seeds(0, bad)


def test_mismatched_environments_and_action_counts_are_refused():
    with pytest.raises(ValueError, match="other specs"):
        VectorEnvironment([make_environment("CartPole-v1", 0), make_environment("Acrobot-v1", 0)])
    loop = VectorEnvLoop(make_vector_environment("CartPole-v1", 0, 2), lambda: NStepTransitionAdder(1, 0.9))
    with pytest.raises(ValueError, match="reset"):
        loop.observations()
    loop.reset()
    with pytest.raises(ValueError, match="3 actions for 2"):
        loop.step(lambda obs: np.zeros(3, np.int32))


def test_a_loop_without_restarts_plays_whole_episodes_and_the_observation_sink_keeps_every_observation():
    """`restart=False` (evaluation) leaves a finished episode finished: the next step before `reset()` is refused
    and nothing reset the environment behind the caller's back. `ObservationSink` keeps what the environments
    showed, FIRST to LAST, in order (a saved policy's calibration data); `NoSink` keeps nothing."""
    env = CountingEnv(1, 3, terminate=True)
    loop = VectorEnvLoop(VectorEnvironment([env]), sink=NoSink(), restart=False)
    loop.reset()
    ends = [loop.step(lambda obs: np.zeros(len(obs))).episodes for _ in range(3)]
    assert ends[:2] == [[], []] and ends[2] == [EpisodeEnd(0, 101.0 + 102.0 + 103.0, 3)] and env.t == 3
    with pytest.raises(ValueError, match="reset"):
        loop.step(lambda obs: np.zeros(len(obs)))
    assert env.actions == [0.0] * 3 and loop.sink.pending == 0 and loop.sink.flush() == []
    loop.reset()
    assert env.t == 0 and loop.step(lambda obs: np.ones(len(obs))).episodes == []

    sink = ObservationSink()
    loop = VectorEnvLoop(VectorEnvironment([CountingEnv(0, 2, terminate=False), CountingEnv(1, 3, terminate=True)]),
                         sink=sink)
    loop.reset()
    for _ in range(2):
        loop.step(lambda obs: np.zeros(len(obs)))
    # step 1: both MID; step 2: env 0 ends (its LAST, then its restart), env 1 goes on.
    assert [o.tolist() for o in sink.observations] == [[0, 0], [1, 0], [0, 1], [1, 1], [0, 2], [1, 2], [0, 0]]
