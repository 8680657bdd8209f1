"""quarl.replay.frames.FrameTable: each frame stored once, sampled stacks identical to a plain table's, through
episode boundaries, n-step windows, eviction, checkpoints and the replay server."""
from __future__ import annotations

import collections

import dm_env
import numpy as np
import pytest

from launch.distributed.nodes.services import ReplayServer
from launch.experiments import checkpoint as ckpt
from quarl import replay
from quarl.replay import frames as replay_frames
from quarl.replay.adders import NStepTransitionAdder
from quarl.replay.frames import FrameTable, frame_columns
from quarl.replay.items import Transition, stack_items

H = W = 32  # 1,024 pixels: the smallest frame FrameTable takes
K = 4
OBS = ((H, W, K), np.dtype(np.uint8))
SIG = {"observation": OBS, "action": ((), np.dtype(np.int32)), "reward": ((), np.dtype(np.float32)),
       "discount": ((), np.dtype(np.float32)), "next_observation": OBS}


def _transitions(steps: int, seed: int, n_step: int = 3) -> list[Transition]:
    """Transitions of a frame-stacked game (an episode's first stack repeats its frame, as ALE's does) through
    the n-step adder with Acme's start windows: episodes of random lengths end in terminations and truncations."""
    rng = np.random.default_rng(seed)
    adder = NStepTransitionAdder(n_step, 0.99, start_transitions=True)
    stack: collections.deque = collections.deque(maxlen=K)
    out: list[Transition] = []
    t = 0
    while t < steps:
        frame = rng.integers(0, 256, (H, W), dtype=np.uint8)
        stack.extend([frame] * K)
        adder.add_first(dm_env.restart(np.stack(stack, -1)))
        length = int(rng.integers(1, 12))
        for i in range(length):
            stack.append(rng.integers(0, 256, (H, W), dtype=np.uint8))
            obs = np.stack(stack, -1)
            reward = np.float32(rng.normal())
            if i < length - 1:
                ts = dm_env.transition(reward, obs, np.float32(1.0))
            elif rng.random() < 0.5:
                ts = dm_env.termination(reward, obs)
            else:
                ts = dm_env.truncation(reward, obs, np.float32(1.0))
            out.extend(adder.add(np.int32(rng.integers(4)), ts))
            t += 1
    return out


def _batches(transitions: list[Transition], size: int) -> list[dict[str, np.ndarray]]:
    return [{k: v.astype(SIG[k][1]) for k, v in stack_items(transitions[i:i + size])._asdict().items()}
            for i in range(0, len(transitions), size)]


def _pair(capacity: int, sampler: str = "uniform") -> tuple[replay.Table, FrameTable]:
    return (replay.Table("naive", capacity, SIG, sampler=sampler, seed=7),
            FrameTable("frames", capacity, SIG, sampler=sampler, seed=7))


def _assert_same_sample(a: replay.Sample, b: replay.Sample) -> None:
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    assert set(a.data) == set(b.data)
    for c in a.data:
        assert a.data[c].dtype == b.data[c].dtype and a.data[c].shape == b.data[c].shape
        np.testing.assert_array_equal(a.data[c], b.data[c], err_msg=c)


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_sampled_stacks_equal_the_plain_tables_across_episodes_nstep_and_eviction(sampler):
    naive, frames = _pair(capacity=150, sampler=sampler)
    transitions = _transitions(400, seed=0)
    for batch in _batches(transitions, 37):  # several batches, > capacity in all: FIFO eviction runs
        naive.insert(batch)
        frames.insert(batch)
        _assert_same_sample(naive.sample(64), frames.sample(64))
    # every live item, in key order, is exactly what went in
    _assert_same_sample(naive.sample(200), frames.sample(200))
    assert naive.size == frames.size == 150
    live = frames.memory()["frames_live"]
    steps_live = 150 + 3 + K  # one new frame per env step; the oldest items' stacks reach a few frames further back
    assert live <= steps_live + 20, live  # the plain table holds 8 frames an item: 1,200


def test_frames_shared_by_consecutive_stacks_are_stored_once():
    table = FrameTable("f", 1000, SIG, seed=0)
    transitions = _transitions(300, seed=1, n_step=1)
    for batch in _batches(transitions, 50):
        table.insert(batch)
    distinct = {getattr(t, c)[..., j].tobytes() for t in transitions for c in ("observation", "next_observation")
                for j in range(K)}
    mem = table.memory()
    assert mem["frames_live"] == len(distinct)
    assert mem["frame_bytes_live"] == len(distinct) * H * W
    assert len(distinct) < 2 * len(transitions)  # vs 8 per transition stored naively


def test_eviction_frees_frames_and_reuses_their_slots():
    table = FrameTable("f", 20, SIG, seed=0)
    for batch in _batches(_transitions(2000, seed=2), 16):
        table.insert(batch)
    mem = table.memory()
    assert mem["frames_live"] <= 20 * 2 * K  # bounded by what 20 items can reference, not by what was inserted
    assert mem["frame_store"] == replay_frames.CHUNK_BYTES // (H * W) * H * W  # one chunk, slots recycled


def test_digest_collisions_cost_a_copy_never_a_wrong_frame(monkeypatch):
    class SameDigest:
        def __init__(self, *_args, **_kwargs):
            pass

        def digest(self) -> bytes:
            return b"\0" * 16

    monkeypatch.setattr(replay_frames.hashlib, "blake2b", SameDigest)
    naive, frames = _pair(capacity=60)
    for batch in _batches(_transitions(120, seed=3), 25):
        naive.insert(batch)
        frames.insert(batch)
    _assert_same_sample(naive.sample(100), frames.sample(100))


def test_compact_checkpoint_round_trips_through_npz(tmp_path):
    naive, frames = _pair(capacity=80)
    for batch in _batches(_transitions(150, seed=4), 40):
        naive.insert(batch)
        frames.insert(batch)
    naive.sample(10)
    frames.sample(10)
    state = frames.state_dict()
    assert state["frames"].shape[0] == frames.memory()["frames_live"]  # each live frame once in the snapshot
    ckpt.save_replay(tmp_path / "replay.npz", state)
    restored = FrameTable("r", 80, SIG, seed=7)
    restored.load_state_dict(ckpt.load_replay(tmp_path / "replay.npz"))
    plain = replay.Table("p", 80, SIG, seed=7)
    plain.load_state_dict(naive.state_dict())
    assert restored.info()["samples"] == plain.info()["samples"] == 10
    _assert_same_sample(plain.sample(50), restored.sample(50))
    # a plain table's snapshot (full stacks) loads into a FrameTable too
    from_plain = FrameTable("q", 80, SIG, seed=7)
    from_plain.load_state_dict(naive.state_dict())
    _assert_same_sample(_reloaded(naive), from_plain.sample(50))


def _reloaded(table: replay.Table) -> replay.Sample:
    copy = replay.Table("copy", table.capacity, SIG, seed=7)
    copy.load_state_dict(table.state_dict())
    return copy.sample(50)


def test_bad_compact_state_is_refused():
    frames = FrameTable("f", 30, SIG, seed=0)
    frames.insert(_batches(_transitions(20, seed=5), 20)[0])
    state = frames.state_dict()
    state["data"]["observation"] = state["data"]["observation"] + state["frames"].shape[0]
    with pytest.raises(ValueError, match="bad frame indices"):
        FrameTable("g", 30, SIG).load_state_dict(state)


def test_table_from_config_picks_frames_for_stacked_images_only():
    config = {"capacity": 100, "sampler": "uniform", "priority_exponent": 0.6, "samples_per_insert": 8.0,
              "min_size_to_sample": 10, "error_buffer": 100.0}
    assert isinstance(replay.table_from_config(SIG, config), FrameTable)
    minatar = dict(SIG, observation=((10, 10, 4), np.uint8), next_observation=((10, 10, 4), np.uint8))
    assert not frame_columns(minatar) and type(replay.table_from_config(minatar, config)) is replay.Table
    vector = dict(SIG, observation=((4,), np.float32), next_observation=((4,), np.float32))
    assert type(replay.table_from_config(vector, config)) is replay.Table
    with pytest.raises(ValueError, match="FrameTable needs"):
        FrameTable("x", 10, vector)


def test_replay_server_stores_ale_frames_once_and_samples_the_inserted_stacks(tmp_path):
    from launch.experiments.agent_spec import AgentSpec, table_spec

    spec = AgentSpec("dqn", "ALE/Pong", {"min_replay_size": 64, "batch_size": 32, "max_replay_size": 1000})
    table = table_spec(spec.builder(), spec.env_spec())
    server = ReplayServer(table, seed=0)
    assert isinstance(server._table, FrameTable)  # pylint: disable=protected-access
    env = spec.env_spec()
    assert tuple(env.observation_shape) == (84, 84, 4)
    from quarl.envs.factory import make_environment

    game = make_environment("ALE/Pong", 0)
    adder = NStepTransitionAdder(3, 0.99)
    adder.add_first(game.reset())
    rng = np.random.default_rng(0)
    transitions: list[Transition] = []
    while len(transitions) < 64:
        transitions.extend(adder.add(np.int32(rng.integers(env.num_actions)), game.step(rng.integers(env.num_actions))))
    batch = stack_items(transitions)._asdict()
    assert server.insert(stack_items(transitions)) == 64  # the adder's Transitions, as one batch
    sample = server.sample(32)
    for key, obs, next_obs in zip(sample.keys, sample.data["observation"], sample.data["next_observation"]):
        np.testing.assert_array_equal(obs, batch["observation"][key])
        np.testing.assert_array_equal(next_obs, batch["next_observation"][key])
    assert server._table.memory()["frames_live"] <= 64 + 3 + K  # pylint: disable=protected-access
    restored = ReplayServer(table, seed=0)
    restored._table.load_state_dict(server._table.state_dict())  # pylint: disable=protected-access
    assert restored.info()["size"] == 64
