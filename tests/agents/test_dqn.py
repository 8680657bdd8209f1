"""DQN: config validation, the jitted learner on synthetic batches, actor exploration, and a learning run."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import agents
from agents.dqn import Builder, DQNConfig, apex_epsilon, linear_epsilon
from agents.dqn.actor import DQNActor, EpsilonSchedule
from agents.dqn.learning import DQNLearner, double_q_targets, importance_weights
from agents.dqn.networks import make_q_spec
from launch.experiments.config import ExperimentConfig
from quarl.replay.items import Sample, Transition, stack_items
from tests.agents.executed import assert_integer_kernel_ran
from tests.agents.helpers import act_one

OBS_DIM, NUM_ACTIONS, BATCH = 4, 3, 32


def _batch(seed: int = 0, discount: float = 0.9, batch: int = BATCH) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "observation": rng.normal(size=(batch, OBS_DIM)).astype(np.float32),
        "action": rng.integers(0, NUM_ACTIONS, batch).astype(np.int32),
        "reward": rng.normal(size=batch).astype(np.float32),
        "discount": np.full(batch, discount, np.float32),
        "next_observation": rng.normal(size=(batch, OBS_DIM)).astype(np.float32),
    }


def _sample(data: dict, probabilities: np.ndarray | None = None) -> Sample:
    n = len(data["reward"])
    probs = np.full(n, 1.0 / n) if probabilities is None else probabilities
    return Sample(keys=np.arange(n), probabilities=probs, data=data)


def _learner(**overrides) -> DQNLearner:
    config = DQNConfig(hidden_sizes=(32, 32), batch_size=BATCH, min_replay_size=BATCH, **overrides)
    return DQNLearner(make_q_spec(OBS_DIM, NUM_ACTIONS, config.hidden_sizes), config, seed=0)


def _q(learner: DQNLearner, params: dict, obs: np.ndarray) -> np.ndarray:
    from quarl.policy.reference import reference_apply
    return reference_apply(learner.spec, params, obs).astype(np.float64)


# ---------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("field,value", [
    ("hidden_sizes", ()), ("hidden_sizes", (64, 0)), ("learning_rate", 0.0), ("learning_rate", float("nan")),
    ("discount", 1.5), ("n_step", 0), ("batch_size", -1), ("target_update_period", 0),
    ("huber_loss_parameter", -1.0), ("max_gradient_norm", 0.0), ("samples_per_insert", 0.0),
    ("samples_per_insert_tolerance", -0.1), ("epsilon_start", 1.1), ("eval_epsilon", -0.1),
    ("priority_exponent", 2.0), ("importance_sampling_exponent", -0.5), ("prioritized_replay", 1),
    ("epsilon_decay_steps", -1), ("actor_update_period", 0), ("n_step", 2.5),
    ("learning_rate_end", -1e-4), ("learning_rate_end", float("inf")), ("learning_rate_decay_steps", -1),
    ("target_update_tau", 0.0), ("target_update_tau", 1.5),
])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DQNConfig(**{field: value})


def test_config_replay_sizes_must_be_consistent():
    with pytest.raises(ValueError, match="min_replay_size"):
        DQNConfig(batch_size=256, min_replay_size=100)
    with pytest.raises(ValueError, match="max_replay_size"):
        DQNConfig(min_replay_size=5000, max_replay_size=1000)


def test_config_is_frozen_and_accepts_list_hidden_sizes():
    config = DQNConfig(hidden_sizes=[64, 64])
    assert config.hidden_sizes == (64, 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.batch_size = 1  # type: ignore[misc]


def test_task_overrides_build_valid_configs_and_are_copies():
    from agents.dqn.config import CARTPOLE_BOUNDS, TASK_OVERRIDES, task_overrides
    from bench.learning.int8_vs_fp32 import DQN_ROWS
    assert task_overrides("CartPole-v1") == {"huber_loss_parameter": 5.0, "observation_bounds": CARTPOLE_BOUNDS}
    assert task_overrides("Acrobot-v1") == {}
    for task in TASK_OVERRIDES:
        DQNConfig(**task_overrides(task))
    mountaincar = task_overrides("MountainCar-v0")
    mountaincar["learning_rate"] = 1.0
    assert task_overrides("MountainCar-v0")["learning_rate"] == 4e-3
    assert {r.task: dict(r.overrides) for r in DQN_ROWS} == {t: task_overrides(t) for t in
                                                            ("CartPole-v1", "Acrobot-v1", "MountainCar-v0")}


def test_registry_builds_dqn_with_overrides_and_rejects_unknown_keys():
    builder = agents.get_builder("dqn", batch_size=16, min_replay_size=100)
    assert isinstance(builder, Builder) and builder.config.batch_size == 16
    with pytest.raises(ValueError, match="no_such_key"):
        agents.get_builder("dqn", no_such_key=1)
    with pytest.raises(ValueError, match="unknown agent"):
        agents.get_builder("sac")


# ---------------------------------------------------------------------------------------------- epsilon


def test_apex_epsilon_ladder_spans_base_to_base_pow_one_plus_alpha():
    eps = [apex_epsilon(i, 8, 0.4, 7.0) for i in range(8)]
    assert eps[0] == pytest.approx(0.4)
    assert eps[-1] == pytest.approx(0.4 ** 8)
    assert all(a > b for a, b in zip(eps, eps[1:]))
    assert apex_epsilon(0, 1, 0.4, 7.0) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="actor_id"):
        apex_epsilon(8, 8)


def test_linear_epsilon_decays_then_holds():
    assert linear_epsilon(0, 1.0, 0.1, 100) == pytest.approx(1.0)
    assert linear_epsilon(50, 1.0, 0.1, 100) == pytest.approx(0.55)
    assert linear_epsilon(100, 1.0, 0.1, 100) == pytest.approx(0.1)
    assert linear_epsilon(10_000, 1.0, 0.1, 100) == pytest.approx(0.1)
    assert linear_epsilon(0, 1.0, 0.1, 0) == pytest.approx(0.1)


# ---------------------------------------------------------------------------------------------- learner


def test_double_q_target_on_a_hand_example():
    # Online net picks action 1 in row 0 and action 0 in row 1; the target net evaluates those actions.
    q_t_value = np.array([[10.0, 2.0], [5.0, 7.0]], np.float32)
    q_t_selector = np.array([[0.0, 1.0], [3.0, -1.0]], np.float32)
    reward = np.array([1.0, -1.0], np.float32)
    discount = np.array([0.5, 0.0], np.float32)  # row 1 terminated: no bootstrap
    target = np.asarray(double_q_targets(q_t_value, q_t_selector, reward, discount))
    np.testing.assert_allclose(target, [1.0 + 0.5 * 2.0, -1.0])


def test_importance_weights_favour_rare_items_and_max_out_at_one():
    w = np.asarray(importance_weights(np.array([0.5, 0.25, 0.125], np.float32), 0.5))
    assert w.max() == pytest.approx(1.0)
    assert w[0] < w[1] < w[2]
    np.testing.assert_allclose(w, np.sqrt([0.25, 0.5, 1.0]), rtol=1e-6)


def test_loss_decreases_on_a_fixed_batch():
    learner = _learner(target_update_period=10_000, learning_rate=1e-3)
    sample = _sample(_batch())
    first = float(learner.step(sample)["loss"])
    for _ in range(200):
        metrics = learner.step(sample)
    assert float(metrics["loss"]) < 0.1 * first
    assert learner.steps == 201


def test_td_error_matches_the_double_dqn_target_computed_by_hand():
    learner = _learner(prioritized_replay=True)
    data = _batch(seed=3)
    params = learner.policy_params()  # before the step: online == target
    q_tm1 = _q(learner, params, data["observation"])
    q_t = _q(learner, params, data["next_observation"])
    target = data["reward"] + data["discount"] * q_t[np.arange(BATCH), q_t.argmax(1)]
    expected = np.abs(target - q_tm1[np.arange(BATCH), data["action"]])
    metrics = learner.step(_sample(data))
    assert metrics["priorities"].shape == (BATCH,)
    np.testing.assert_allclose(metrics["priorities"], expected, rtol=1e-4, atol=1e-5)
    assert float(metrics["td_abs_mean"]) == pytest.approx(expected.mean(), rel=1e-4)


def test_uniform_learner_returns_no_priorities():
    assert "priorities" not in _learner().step(_sample(_batch()))


def test_target_network_is_copied_every_period():
    period = 5
    learner = _learner(target_update_period=period)
    initial = learner.get_state()["params"]
    sample = _sample(_batch())
    for _ in range(period - 1):
        learner.step(sample)
    state = learner.get_state()
    jax.tree.map(np.testing.assert_array_equal, state["target_params"], initial)
    assert not np.allclose(state["params"]["linear_0"]["w"], initial["linear_0"]["w"])
    learner.step(sample)
    state = learner.get_state()
    jax.tree.map(np.testing.assert_array_equal, state["target_params"], state["params"])
    learner.step(sample)  # one more step: online moves on, target stays at the copy
    after = learner.get_state()
    jax.tree.map(np.testing.assert_array_equal, after["target_params"], state["params"])


def test_learning_rate_decays_linearly_then_holds():
    from agents.dqn.learning import learning_rate_schedule
    schedule = learning_rate_schedule(DQNConfig(learning_rate=1e-3, learning_rate_end=1e-4,
                                                learning_rate_decay_steps=100))
    assert [float(schedule(n)) for n in (0, 50, 100, 10_000)] == pytest.approx([1e-3, 5.5e-4, 1e-4, 1e-4])
    constant = learning_rate_schedule(DQNConfig(learning_rate=1e-3, learning_rate_end=None))
    assert float(constant(0)) == float(constant(10_000)) == pytest.approx(1e-3)


def test_learner_steps_shrink_with_the_decayed_learning_rate():
    """Same batches, same first update; after a 1-update decay to lr/100 the next Adam step moves the weights
    about 100x less than at the constant rate (Adam's step is ~lr per weight whatever the gradient's scale)."""
    def moves(**overrides):
        learner = _learner(**overrides)
        before = learner.policy_params()["linear_0"]["w"]
        learner.step(_sample(_batch(seed=1)))
        middle = learner.policy_params()["linear_0"]["w"]
        learner.step(_sample(_batch(seed=2)))
        after = learner.policy_params()["linear_0"]["w"]
        return np.abs(middle - before).mean(), np.abs(after - middle).mean()

    first_c, second_c = moves(learning_rate_end=None)
    first_d, second_d = moves(learning_rate_end=1e-5, learning_rate_decay_steps=1)
    assert first_d == pytest.approx(first_c, rel=1e-5)
    assert 50 < second_c / second_d < 200


def test_polyak_target_moves_a_tau_fraction_toward_the_online_network_every_update():
    learner = _learner(target_update_tau=0.25, target_update_period=1000)
    initial = learner.get_state()["target_params"]
    learner.step(_sample(_batch()))
    state = learner.get_state()
    expected = jax.tree.map(lambda o, t: 0.25 * o + 0.75 * t, state["params"], initial)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), state["target_params"],
                 expected)


def test_state_round_trip_reproduces_the_next_update():
    a, b = _learner(), _learner(learning_rate=1e-3)
    sample = _sample(_batch())
    for _ in range(7):
        a.step(sample)
    b.restore(a.get_state())
    assert b.steps == 7
    next_sample = _sample(_batch(seed=9))
    np.testing.assert_allclose(float(a.step(next_sample)["loss"]), float(b.step(next_sample)["loss"]), rtol=1e-6)
    jax.tree.map(np.testing.assert_allclose, a.policy_params(), b.policy_params())


def test_restore_rejects_mismatched_or_non_finite_state():
    learner = _learner()
    state = learner.get_state()
    bad_shape = dict(state, params={**state["params"], "linear_0": {"w": np.zeros((5, 32), np.float32),
                                                                    "b": state["params"]["linear_0"]["b"]}})
    with pytest.raises(ValueError, match="shape"):
        learner.restore(bad_shape)
    nan = jax.tree.map(lambda x: np.full_like(x, np.nan), state["params"])
    with pytest.raises(ValueError, match="non-finite"):
        learner.restore(dict(state, params=nan))
    with pytest.raises(ValueError, match="malformed"):
        learner.restore({"params": state["params"]})


def test_step_rejects_batches_missing_columns():
    data = _batch()
    del data["discount"]
    with pytest.raises(ValueError, match="discount"):
        _learner().step(_sample(data))


# ---------------------------------------------------------------------------------------------- actor


class _FixedQ:
    """Executor stand-in: fixed Q-values, counts calls (so tests can see when inference is skipped)."""

    def __init__(self, spec, qparams, backend="auto", batch_size=1):
        self.q = np.array([[0.0, 2.0, 1.0]], np.float32)
        self.calls = 0
        self.backend, self.precision = "fake", "fp32"

    def __call__(self, obs):
        self.calls += 1
        return self.q

    def update(self, qparams):
        self.q = qparams


def _actor(schedule: EpsilonSchedule, evaluation: bool = False, seed: int = 0) -> DQNActor:
    spec = make_q_spec(OBS_DIM, NUM_ACTIONS, (8,))
    return DQNActor(spec, None, num_actions=NUM_ACTIONS, schedule=schedule, eval_epsilon=0.0, seed=seed,
                    evaluation=evaluation, executor_factory=_FixedQ)


def test_greedy_actor_takes_the_argmax_and_follows_updates():
    actor = _actor(EpsilonSchedule.constant(0.0))
    obs = np.zeros(OBS_DIM, np.float32)
    assert [int(act_one(actor, obs)) for _ in range(20)] == [1] * 20
    actor.update(np.array([[5.0, 0.0, 1.0]], np.float32))
    assert int(act_one(actor, obs)) == 0


def test_fully_random_actor_is_uniform_and_skips_inference():
    actor = _actor(EpsilonSchedule.constant(1.0))
    actions = np.array([act_one(actor, np.zeros(OBS_DIM)) for _ in range(3000)])
    counts = np.bincount(actions, minlength=NUM_ACTIONS) / len(actions)
    np.testing.assert_allclose(counts, 1.0 / NUM_ACTIONS, atol=0.04)
    assert actor._executor.calls == 0


def test_epsilon_decays_with_exploration_steps_but_not_evaluation_steps():
    actor = _actor(EpsilonSchedule(1.0, 0.0, 100))
    obs = np.zeros(OBS_DIM)
    for _ in range(50):
        act_one(actor, obs)
    assert actor.epsilon == pytest.approx(0.5)
    actor.evaluation = True
    assert actor.epsilon == 0.0
    assert [int(act_one(actor, obs)) for _ in range(10)] == [1] * 10
    actor.evaluation = False
    assert actor.steps == 50 and actor.epsilon == pytest.approx(0.5)
    # Around epsilon 0.5 with 3 actions, the greedy action shows up ~2/3 of the time.
    greedy = np.mean([int(act_one(actor, obs)) == 1 for _ in range(50)])
    assert 0.3 < greedy < 0.95


def test_actor_rejects_non_finite_observations_on_random_steps():
    actor = _actor(EpsilonSchedule.constant(1.0))
    with pytest.raises(ValueError, match="finite"):
        act_one(actor, np.array([0.0, np.nan, 0.0, 0.0]))


def test_fleet_epsilons_follow_the_apex_ladder():
    builder = Builder(DQNConfig())
    assert builder.actor_epsilon(0, 1)(0) == pytest.approx(1.0)  # lone actor: linear schedule from 1.0
    assert builder.actor_epsilon(0, 1)(10**9) == pytest.approx(0.05)
    assert builder.actor_epsilon(3, 4)(0) == pytest.approx(0.4 ** 8)


# ---------------------------------------------------------------------------------------------- with replay


def _cartpole_spec():
    from quarl.envs.spec import environment_spec
    from quarl.envs.factory import make_environment
    return environment_spec(make_environment("CartPole-v1", 0))


def test_prioritized_table_priorities_follow_the_learner_td_errors():
    """Learner priorities written back to a real prioritized table change what gets sampled."""
    # The limiter admits all 64 items (the warm-up) and then 64 x 64 sampled items (tolerance 1.0).
    config = DQNConfig(hidden_sizes=(32,), batch_size=16, min_replay_size=64, prioritized_replay=True,
                       samples_per_insert_tolerance=1.0)
    builder = Builder(config)
    env_spec = _cartpole_spec()
    table = builder.make_table(env_spec, seed=0)
    assert table.sampler == "prioritized"
    rng = np.random.default_rng(0)
    n = 64
    table.insert({"observation": rng.normal(size=(n, 4)).astype(np.float32),
                  "action": rng.integers(0, 2, n).astype(np.int32),
                  "reward": np.where(np.arange(n) < 4, 100.0, 0.0).astype(np.float32),  # 4 surprising items
                  "discount": np.zeros(n, np.float32),
                  "next_observation": rng.normal(size=(n, 4)).astype(np.float32)})
    learner = builder.make_learner(env_spec, seed=0)
    # Cover every item once (priorities start at 1.0), writing back |TD| as the runner does.
    sample = table.sample(16, timeout=5.0)
    for _ in range(20):
        metrics = learner.step(sample)
        table.update_priorities(sample.keys, metrics["priorities"])
        sample = table.sample(16, timeout=5.0)
    keys = np.concatenate([table.sample(16, timeout=5.0).keys for _ in range(50)])
    surprising = np.mean(keys < 4)
    assert surprising > 0.3  # 4 of 64 items (6%) under uniform sampling


def test_dqn_learns_cartpole_with_int8_actors(tmp_path):
    """Default config, int8 ONNX actors (a fixed backend: `auto` chooses by timing, which would make the run
    depend on the machine). Stops at the first evaluation averaging >= 150 (a random policy scores ~20)."""
    from launch.experiments.acting import evaluation_returns as evaluate
    from launch.experiments.run_experiment import run_experiment
    from quarl.envs.factory import make_environment
    from quarl.quant.quantization import quantize_params

    builder = Builder(DQNConfig())
    env_spec = _cartpole_spec()
    untrained = builder.make_actor(env_spec, quantize_params(builder.make_learner(env_spec, 0).policy_params(),
                                                             "int8"), seed=0, evaluation=True, backend="onnx")
    untrained_return = float(np.mean(evaluate(untrained, make_environment("CartPole-v1", 123), 5)))
    summary = run_experiment(ExperimentConfig(agent="dqn", task="CartPole-v1", precision="int8", backend="onnx",
                                              max_actor_steps=20_000, seed=0, logdir=tmp_path, eval_every=2500,
                                              eval_episodes=5),
                             progress=False, energy=False, on_eval=lambda row: row["return"] >= 150.0)
    assert summary["precision"] == "int8" and summary["backend"] == ["onnx"]
    assert_integer_kernel_ran(summary)  # not a silent fallback to fp32 compute
    assert summary["best_eval_return"] >= 150.0, summary["best_eval_return"]
    assert summary["best_eval_return"] > untrained_return + 100.0, (summary["best_eval_return"], untrained_return)
    assert summary["weight_updates"] == summary["actor_steps"] // builder.config.actor_update_period


@pytest.mark.slow
def test_dqn_stays_solved_on_cartpole_to_the_end_of_its_run(tmp_path):
    """Not only solved once: the last 3 evaluations (25k, 27.5k, 30k env steps, evaluating every 2,500 steps as
    bench.peers.offpolicy does) of a CartPole-v1 run with int8 actors and CartPole's settings (Huber threshold 5, observation
    bounds) all reach 475 (measured 500 / 500 / 494 on an AVX-512 VNNI EPYC). Seed 1 is the run that collapsed hardest
    at the Huber threshold of 1 (207 and 278 at 25k and 27.5k, last 3 at 50k: 244, results/bench/peers_cartpole). The
    backend is fixed (auto picks by timing): int8 weights dequantized through ONNX's fp32 kernel, what `auto` chose on
    the machine that measured results/bench/dqn_collapse.md.

    Slow-marked: one seed's trajectory is not the same on every CPU class. The learner's XLA code and ONNX Runtime's
    fp32 kernels sum in a different order with and without AVX-512, and a 30k-step RL run amplifies the last bit: on
    an AVX2-only EPYC the same run ends 500 / 500 / 294.9. The claim it checks needs seeds, not one trajectory
    (`python -m bench.learning.dqn_stability`); the default suite's DQN learning tests assert thresholds with
    margin instead."""
    from agents.dqn.config import task_overrides
    from launch.experiments.run_experiment import run_experiment
    run_experiment(ExperimentConfig(agent="dqn", task="CartPole-v1", precision="int8", backend="onnx",
                                    kernel_form="fp32", max_actor_steps=30_000, seed=1, logdir=tmp_path,
                                    eval_every=2500, eval_episodes=10, overrides=task_overrides("CartPole-v1")),
                   progress=False, energy=False)
    returns = _eval_returns(tmp_path)
    assert len(returns) == 12, returns
    assert max(returns[:6]) >= 475.0 and min(returns[-3:]) >= 475.0, returns


def _eval_returns(logdir) -> list[float]:
    import csv
    with open(logdir / "evaluator.csv", newline="", encoding="utf-8") as f:
        return [float(row["return"]) for row in csv.DictReader(f)]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_dqn_solves_cartpole_and_stays_solved(tmp_path, precision):
    """bench.peers.offpolicy' CartPole-v1 run (50k env steps, 10 evaluation episodes every 2,500 steps, CartPole's settings):
    solved, and the last 3 evaluations (45k-50k) still average >= 475 (measured with the observation bounds: 500
    int8, 498.8 fp32). Seed 1 collapsed at both precisions with the Huber threshold of 1 (last 3: 244 int8, 455
    fp32; results/bench/peers_cartpole)."""
    from agents.dqn.config import task_overrides
    from launch.experiments.run_experiment import run_experiment
    summary = run_experiment(ExperimentConfig(agent="dqn", task="CartPole-v1", precision=precision, backend="onnx",
                                              kernel_form="fp32" if precision == "int8" else None,
                                              max_actor_steps=50_000, seed=1, logdir=tmp_path, eval_every=2500,
                                              eval_episodes=10, overrides=task_overrides("CartPole-v1")),
                             progress=False, energy=False)
    returns = _eval_returns(tmp_path)
    assert summary["best_eval_return"] >= 475.0, returns
    assert np.mean(returns[-3:]) >= 475.0, returns


def test_run_experiment_with_prioritized_replay_updates_priorities(tmp_path):
    from launch.experiments.run_experiment import run_experiment
    config = ExperimentConfig(agent="dqn", task="CartPole-v1", precision="int4", backend="jax", max_actor_steps=600,
                              seed=0, logdir=tmp_path, eval_episodes=1,
                              overrides={"hidden_sizes": (32, 32), "min_replay_size": 200, "prioritized_replay": True})
    summary = run_experiment(config, progress=False, energy=False)
    assert summary["replay"]["sampler"] == "prioritized" and summary["precision"] == "int4"
    assert summary["learner_steps"] >= 350  # ~one update per insert after the 200-item warm-up
    assert summary["replay"]["samples"] == summary["learner_steps"] * 64


# ------------------------------------------------------------------------------------------ episode ends


def _episode_transitions(builder: Builder, max_episode_steps: int, actions: list[int]) -> list[Transition]:
    """One CartPole episode through the gym wrapper and the builder's n-step adder; every emitted transition."""
    import gymnasium

    from quarl.envs.gym import GymWrapper
    from quarl.envs.wrappers import SinglePrecisionWrapper
    env = SinglePrecisionWrapper(GymWrapper(gymnasium.make("CartPole-v1", max_episode_steps=max_episode_steps),
                                            seed=0))
    adder = builder.make_adder()
    timestep = env.reset()
    adder.add_first(timestep)
    out: list[Transition] = []
    for action in actions:
        timestep = env.step(np.int32(action))
        out.extend(adder.add(np.int32(action), timestep))
        if timestep.last():
            return out
    raise AssertionError("the episode did not end")


def test_time_limit_bootstraps_and_termination_does_not_through_wrapper_adder_and_loss():
    """CartPole-v1's 500-step limit is a truncation: the n-step windows ending there must keep bootstrapping
    from the last observation (discount gamma^k), while a pole that falls (termination) gives discount 0. Checked
    end to end: gymnasium -> GymWrapper -> NStepTransitionAdder -> the learner's double-DQN TD errors."""
    gamma, n = 0.9, 3
    builder = Builder(DQNConfig(hidden_sizes=(32, 32), batch_size=6, min_replay_size=6, discount=gamma, n_step=n,
                                prioritized_replay=True))
    # Alternating pushes keep the pole up for 4 steps, so the limit (not a fall) ends the episode.
    truncated = _episode_transitions(builder, 4, [0, 1, 0, 1])
    terminated = _episode_transitions(builder, 500, [0] * 100)  # always pushing left topples the pole
    # The windows that end at the episode's last step: the full one and the two shorter flushed ones.
    tail_trunc, tail_term = truncated[-n:], terminated[-n:]
    np.testing.assert_allclose([t.discount for t in tail_trunc], [gamma ** 3, gamma ** 2, gamma], rtol=1e-6)
    assert [float(t.discount) for t in tail_term] == [0.0, 0.0, 0.0]
    assert float(truncated[0].discount) == pytest.approx(gamma ** 3)  # a mid-episode window, for reference

    env_spec = _cartpole_spec()
    learner = builder.make_learner(env_spec, 0)
    items = tail_trunc + tail_term
    data = stack_items(items)._asdict()
    params = learner.policy_params()  # online == target before the first update
    q_tm1 = _q(learner, params, data["observation"])[np.arange(6), data["action"]]
    q_next = _q(learner, params, data["next_observation"]).max(axis=1)
    assert np.all(np.abs(q_next) > 1e-3)  # so a dropped bootstrap would show
    td = learner.step(_sample(data))["priorities"]
    bootstrapped = data["reward"][:3] + np.array([gamma ** 3, gamma ** 2, gamma]) * q_next[:3]
    np.testing.assert_allclose(td[:3], np.abs(bootstrapped - q_tm1[:3]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(td[3:], np.abs(data["reward"][3:] - q_tm1[3:]), rtol=1e-4, atol=1e-5)
