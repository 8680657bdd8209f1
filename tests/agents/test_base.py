"""agents.base: every agent satisfies the runner-facing Protocols; the replay agents share one replay/rate-limiter
scaffolding (`ReplayBuilder`), which an on-policy builder does not have at all."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import agents
from agents.base import Actor, BuilderBase, Learner, ReplayBuilder, error_buffer, replay_builder
from quarl.acting.loop import AdderSink, RolloutSink, VectorEnvLoop
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.envs.vector import make_vector_environment
from quarl.quant.quantization import quantize_params
from quarl.replay.items import stack_items

TINY = {"dqn": ("CartPole-v1", {"hidden_sizes": (8,)}),
        "d4pg": ("cartpole:balance", {"policy_layer_sizes": (8,), "critic_layer_sizes": (8,), "num_atoms": 5})}


@pytest.mark.parametrize("name", sorted(TINY))
def test_each_agent_builds_pieces_that_satisfy_the_runner_protocols(name):
    task, overrides = TINY[name]
    builder = agents.get_builder(name, **overrides)
    env_spec = environment_spec(make_environment(task, 0))
    learner = builder.make_learner(env_spec, 0)
    actor = builder.make_actor(env_spec, quantize_params(learner.policy_params(), "int8"), seed=0, backend="jax")
    assert isinstance(builder, ReplayBuilder) and isinstance(learner, Learner) and isinstance(actor, Actor)
    table = builder.make_table(env_spec, seed=0)
    c = builder.config
    buffer = error_buffer(c.batch_size, c.min_replay_size, c.samples_per_insert, c.samples_per_insert_tolerance)
    assert c.error_buffer == buffer
    # Actors may run Acme's error buffer ahead of the ratio (both agents; D4PG bounds the learner side tighter).
    limiter = table.rate_limiter
    assert limiter.max_diff == pytest.approx(c.samples_per_insert * c.min_replay_size + max(buffer, 2 * c.samples_per_insert))
    signature = builder.transition_signature(env_spec)
    transition = builder.make_adder()
    assert set(signature) == {"observation", "action", "reward", "discount", "next_observation"}
    assert transition.n_step == c.n_step
    actions, extras = actor.act(np.zeros((3, env_spec.obs_dim), np.float32))  # one batched call, K = 3
    assert actions.shape == (3, *signature["action"][0]) and extras == {}


def test_error_buffer_is_never_less_than_one_batch():
    assert error_buffer(256, 1000, 32.0, 0.1) == pytest.approx(3200.0)
    assert error_buffer(256, 10, 1.0, 0.1) == 256.0


def test_a_builder_refuses_another_agents_config():
    with pytest.raises(ValueError, match="needs a DQNConfig"):
        agents.builder_class("dqn")(agents.make_config("d4pg"))


def test_a_builder_missing_a_hook_fails_when_instantiated():
    """The agent-specific hooks are abstract: a builder that forgets one cannot be built at all."""
    full = agents.builder_class("dqn")

    class NoSampler(full):  # drops one hook the replay table needs
        sampler_settings = ReplayBuilder.sampler_settings

    with pytest.raises(TypeError, match="sampler_settings"):
        NoSampler()
    for base in (BuilderBase, ReplayBuilder):
        with pytest.raises(TypeError, match="abstract"):
            base()
    assert full().sampler_settings()["sampler"]  # the concrete builders implement every hook


REPLAY_PART = ("make_adder", "transition_signature", "table_config", "make_table", "sampler_settings",
               "error_buffer_setting")


def test_an_on_policy_builder_has_no_replay_part_and_a_replay_builders_parts_work_together():
    """PPO's builder is a BuilderBase without the replay part (no method that refuses: none at all), and asking
    for its replay is a one-line error; DQN's replay parts fit each other: the sink's adders emit transitions of
    the signature the table was built with, the table takes them and samples them back."""
    ppo = agents.get_builder("ppo")
    assert isinstance(ppo, BuilderBase) and not isinstance(ppo, ReplayBuilder)
    assert [name for name in REPLAY_PART if hasattr(ppo, name)] == []
    assert isinstance(ppo.make_sink(2), RolloutSink)
    with pytest.raises(ValueError, match="ppo is on-policy and has no replay") as error:
        replay_builder(ppo)
    assert "\n" not in str(error.value)

    dqn = agents.get_builder("dqn", hidden_sizes=(8,), min_replay_size=4, batch_size=4, n_step=2,
                             samples_per_insert=1.0)
    assert replay_builder(dqn) is dqn
    env = make_vector_environment("CartPole-v1", 0, 2)
    env_spec = environment_spec(env)
    sink = dqn.make_sink(2)
    assert isinstance(sink, AdderSink) and [adder.n_step for adder in sink.adders] == [2, 2]
    loop = VectorEnvLoop(env, sink=sink)
    loop.reset()
    transitions = [t for _ in range(5) for t in loop.step(lambda obs: np.zeros(len(obs), np.int32)).items]
    loop.close()
    signature = dqn.transition_signature(env_spec)
    assert len(transitions) == 8  # 2 environments x 4 full 2-step windows after 5 steps
    for name, (shape, dtype) in signature.items():
        assert np.asarray(getattr(transitions[0], name)).shape == shape, name
    table = dqn.make_table(env_spec, seed=0)
    assert dqn.table_config()["min_size_to_sample"] == 4
    table.insert(stack_items(transitions))  # the adders' Transitions, as a batch: the table's columns
    sample = table.sample(4)
    assert sample.data["observation"].shape == (4, env_spec.obs_dim) and set(sample.data) == set(signature)


def test_no_agent_refuses_a_contract_method():
    """A builder implements what it has and lacks what it has not: no `NoReturn` stubs anywhere in agents/."""
    root = Path(agents.__file__).resolve().parent
    assert [str(p.relative_to(root)) for p in sorted(root.rglob("*.py")) if "NoReturn" in p.read_text()] == []
