"""agents.base: both agents satisfy the runner-facing Protocols and share one replay/rate-limiter scaffolding."""
from __future__ import annotations

import numpy as np
import pytest

import agents
from agents.base import Actor, BuilderBase, Learner, error_buffer
from quarl.envs.factory import make_environment
from quarl.envs.spec import environment_spec
from quarl.quant.quantization import quantize_params

TINY = {"dqn": ("CartPole-v1", {"hidden_sizes": (8,)}),
        "d4pg": ("cartpole:balance", {"policy_layer_sizes": (8,), "critic_layer_sizes": (8,), "num_atoms": 5})}


@pytest.mark.parametrize("name", sorted(TINY))
def test_each_agent_builds_pieces_that_satisfy_the_runner_protocols(name):
    task, overrides = TINY[name]
    builder = agents.get_builder(name, **overrides)
    env_spec = environment_spec(make_environment(task, 0))
    learner = builder.make_learner(env_spec, 0)
    actor = builder.make_actor(env_spec, quantize_params(learner.policy_params(), "int8"), seed=0, backend="jax")
    assert isinstance(builder, BuilderBase) and isinstance(learner, Learner) and isinstance(actor, Actor)
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
    action = actor.select_action(np.zeros(env_spec.obs_dim, np.float32))
    assert np.asarray(action).shape == signature["action"][0]


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
        sampler_settings = BuilderBase.sampler_settings

    with pytest.raises(TypeError, match="sampler_settings"):
        NoSampler()
    with pytest.raises(TypeError, match="abstract"):
        BuilderBase()
    assert full().sampler_settings()["sampler"]  # the concrete builders implement every hook
