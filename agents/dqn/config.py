"""DQN hyper-parameters (double DQN, n-step returns, optional prioritized replay).

Defaults are tuned for gym classic control (CartPole/Acrobot/MountainCar) with a small replay and a high
replay ratio: these tasks are cheap to simulate, so sample efficiency per env step is what makes wall-clock fast.
"""
from __future__ import annotations

import dataclasses

from agents.rate_limits import error_buffer
from quarl.envs.factory import task_family
from quarl.nets.qat import check_qat_bits
from quarl.ops.checks import ConfigError, check_bool, check_int, check_number, check_sizes, is_int
from quarl.policy.spec import ACTIVATIONS, parse_bounds

# What an image observation (MinAtar's 10x10xC cells, ALE's 84x84x4 frames) goes through: "conv" the published conv
# torso for its size (`agents.dqn.networks`; the hidden sizes unused), "mlp" the frame flattened into the MLP of the
# hidden sizes (the networks rejax runs on MinAtar, so that a peer benchmark compares like with like). PPO too.
IMAGE_TORSOS = ("conv", "mlp")


# MountainCar-v0's reward is sparse (-1 per step until the goal): with the defaults one seed in three never
# reached the goal within 150k steps. rl-baselines3-zoo's MountainCar hyper-parameters (faster learning rate,
# gamma 0.98, a small replay, longer exploration) reached -130 within ~50k steps on every seed tried
# (results/bench/learning_dqn.md). Use as `DQNConfig(**MOUNTAINCAR_OVERRIDES)` or `--set` each key.
# Its observation bounds (gymnasium's MountainCarEnv: position [-1.2, 0.6], velocity [-0.07, 0.07]) are mapped onto
# [-1, 1] before the first layer: raw, the velocity spans 1/13 of the position's range, so the int8 first layer
# (per-column weight scales set by the large velocity weights, per-row activation scales by the position) rounded
# away part of what the policy read from it: on trained policies its int8 weights alone flipped 1-5% of the greedy
# actions, 0-0.3% with the bounds, and int8 seed 2 never reached the goal in 120k steps (it does with them).
# The learning rate decays linearly from 4e-3 to 4e-4 over the 60k updates of the 120k-step budget: held at 4e-3,
# the solved policy kept swinging to -140..-190 between evaluations up to the end (results/bench/dqn_collapse.md).
MOUNTAINCAR_BOUNDS = ((-1.2, -0.07), (0.6, 0.07))
MOUNTAINCAR_OVERRIDES: dict = {"learning_rate": 4e-3, "discount": 0.98, "target_update_period": 300,
                               "batch_size": 128, "max_replay_size": 10_000, "epsilon_decay_steps": 24_000,
                               "epsilon_end": 0.07, "learning_rate_end": 4e-4, "learning_rate_decay_steps": 60_000,
                               "observation_bounds": MOUNTAINCAR_BOUNDS}
# CartPole-v1: a Huber threshold of 5 instead of 1. Once solved, almost every transition has a TD error near 0;
# the few that lead toward a fall or the track's edge have errors of 5-50, and at threshold 1 each of those pulls
# no harder than an error of 1, so the drift toward the edge was unlearned between visits and the policy
# collapsed (last 3 of the evaluations every 2,500 steps as low as 244); at 5 it stayed solved at no cost per update
# (results/bench/dqn_collapse.md).
# Its observation bounds are mapped onto [-1, 1] as MountainCar's are: raw, the features span 4.8 (cart position,
# +-2.4 at termination), ~0.42 (pole angle, +-12 degrees at termination) and ~5-6 (the two velocities, unbounded;
# at most 2.8 and 3.1 in 2,000 random-action episodes), so the angle the policy balances on entered the first
# layer ~10x smaller than the rest. Position and angle take gymnasium's termination thresholds, the velocities
# +-3.0 / +-3.5 (the random-action maxima, rounded up); values past the bounds map linearly past [-1, 1], as for
# any bounds. With them seed 0 stayed solved at both precisions (last 3 of bench.peers.offpolicy' evaluations: 500 where it
# was 440 int8 / 417 fp32) and all 6 seed x precision runs first reached 475 at 2.5k-7.5k env steps instead of
# 10k-17.5k (results/bench/dqn_collapse.md).
CARTPOLE_BOUNDS = ((-2.4, -3.0, -0.2095, -3.5), (2.4, 3.0, 0.2095, 3.5))
CARTPOLE_OVERRIDES: dict = {"huber_loss_parameter": 5.0, "observation_bounds": CARTPOLE_BOUNDS}
# Per-task settings over the defaults, for the gym tasks the defaults do not suit (Acrobot-v1 takes the
# defaults): what bench.learning.int8_vs_fp32's rows and bench.peers.offpolicy run, `task_overrides(task)` for a config;
# `launch.train` and `launch.actorq` start from them (`agents.task_defaults`), `--set` overrides each key.
TASK_OVERRIDES: dict[str, dict] = {"CartPole-v1": CARTPOLE_OVERRIDES, "MountainCar-v0": MOUNTAINCAR_OVERRIDES}
# MinAtar games: the MinAtar authors' DQN settings (Young & Tian, 2019; their examples/dqn.py): replay 100k, batch
# 32, one update per env step (samples_per_insert = batch_size), learning from 5k, target copy every 1,000 updates,
# epsilon 1 -> 0.1 over 100k steps, learning rate 2.5e-4 held. The optimiser (Adam) and 3-step targets stay the
# project's. bench.learning.minatar_dqn measures them against the authors' curves.
MINATAR_OVERRIDES: dict = {
    "batch_size": 32, "max_replay_size": 100_000, "min_replay_size": 5_000, "samples_per_insert": 32.0,
    "target_update_period": 1_000, "epsilon_start": 1.0, "epsilon_end": 0.1, "epsilon_decay_steps": 100_000,
    "learning_rate": 2.5e-4, "learning_rate_end": None, "discount": 0.99,
}
# ALE games (the Nature torso on 84x84x4 frames): the usual DQN-on-Atari recipe scaled to one CPU machine, where
# the Nature update (~40 ms at batch 32 on a 2-core EPYC) and not acting sets the time: replay 200k transitions
# (each frame stored once, `quarl.replay.frames`, ~1.3 GiB), batch 32, one update per 4 env steps, Adam 1e-4, 3-step
# double-DQN targets, and a shorter start than the 250k-step epsilon decay and 8k-step target period of the
# 200M-frame recipes: learning from 10k, epsilon 1 -> 0.01 over 100k env steps, target copy every 1,000 updates.
# Actors take new weights every 1,000 env steps (250 updates): each int8 publish of the Nature torso calibrates its
# conv activations on replay frames, ~1 s on 2 cores; at the default 100 steps publishing took 130 of a 14k-step
# run's 207 train seconds, at 1,000 it took 17 of 178 (results/bench/pong_preset_speed.md). With the
# classic-control defaults (batch 64, one update per env step) Pong ran at 9.3 env steps/s over 1,600 steps, ~4 once
# learning ran.
ATARI_OVERRIDES: dict = {
    "batch_size": 32, "max_replay_size": 200_000, "min_replay_size": 10_000, "samples_per_insert": 8.0,
    "target_update_period": 1_000, "epsilon_start": 1.0, "epsilon_end": 0.01, "epsilon_decay_steps": 100_000,
    "learning_rate": 1e-4, "learning_rate_end": None, "n_step": 3, "discount": 0.99, "actor_update_period": 1_000,
}
FAMILY_OVERRIDES: dict[str, dict] = {"minatar": MINATAR_OVERRIDES, "ale": ATARI_OVERRIDES}


def task_overrides(task: str, config_name: str = "DQNConfig") -> dict:
    """A copy of `task`'s config overrides: its own, else its family's (MinAtar, ALE), else {} (the defaults)."""
    del config_name  # one config class
    if task in TASK_OVERRIDES:
        return dict(TASK_OVERRIDES[task])
    return dict(FAMILY_OVERRIDES.get(task_family(task), {}))


@dataclasses.dataclass(frozen=True)
class DQNConfig:
    """Every field is validated in `__post_init__`; a bad value raises a ValueError naming the field."""

    # Network: an MLP of `hidden_sizes` with `activation` between its layers (vector observations, and images with
    # `image_torso` "mlp"), or a conv torso for images (`image_torso` "conv", `IMAGE_TORSOS`).
    hidden_sizes: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    image_torso: str = "conv"
    # ((lows), (highs)) of vector observations, mapped onto [-1, 1] before the first layer by the learner and every
    # actor (`quarl.policy.spec.PolicySpec.input_bounds`); None feeds them as they come.
    observation_bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    # Optimiser (Adam with global-norm clipping).
    learning_rate: float = 1e-3
    # Linear decay of the learning rate to `learning_rate_end` over `learning_rate_decay_steps` learner steps,
    # then held (None or 0 steps: constant). At a constant 1e-3 CartPole-v1 reached 500 by ~15k env steps and
    # then lost it (the greedy policy drifts the cart off the track: last 3 evaluations 455 / 103 / 356 on seeds
    # 0-2); decayed to 5e-5 by 30k updates it solved as soon and held 500 to 50k (results/bench/dqn_collapse.md).
    learning_rate_end: float | None = 5e-5
    learning_rate_decay_steps: int = 30_000
    adam_eps: float = 1e-8
    max_gradient_norm: float = 10.0
    # Targets.
    discount: float = 0.99
    n_step: int = 3
    huber_loss_parameter: float = 1.0
    target_update_period: int = 100  # learner steps between hard target-network copies
    # Polyak averaging instead of hard copies: target <- tau * online + (1 - tau) * target every update.
    target_update_tau: float | None = None
    # Replay.
    batch_size: int = 64
    min_replay_size: int = 1_000
    max_replay_size: int = 100_000
    # Items sampled per item inserted; learner steps per env step = samples_per_insert / batch_size.
    # One update per env step reached CartPole's 475 in ~10k env steps on every seed tried (0.5 took ~2x the
    # steps and varied more), and each env step is far cheaper than an update, so this is also fastest in time.
    samples_per_insert: float = 64.0
    # How far (in sampled items) the learner may run ahead of / behind the ratio before the limiter blocks.
    samples_per_insert_tolerance: float = 0.1
    prioritized_replay: bool = False
    priority_exponent: float = 0.6
    importance_sampling_exponent: float = 0.2
    # Exploration. A single actor decays epsilon linearly; N > 1 actors use Ape-X's fixed per-actor ladder
    # eps_i = apex_epsilon ** (1 + apex_alpha * i / (N - 1)).
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_decay_steps: int = 10_000
    apex_epsilon: float = 0.4
    apex_alpha: float = 7.0
    eval_epsilon: float = 0.0
    # Actor steps between weight pulls from the learner.
    actor_update_period: int = 100
    # Quantization-aware training: None trains the Q-network in fp32; B in [2, 8] trains the online network
    # (the one actors deploy) through the int-B arithmetic of the actors (quarl.nets.qat). The target stays fp32.
    qat_bits: int | None = None

    def __post_init__(self) -> None:
        # lists arrive from JSON/CLI; the hashable tuple is stored
        object.__setattr__(self, "hidden_sizes", check_sizes("hidden_sizes", self.hidden_sizes))
        if self.activation not in ACTIVATIONS:
            raise ConfigError("activation", f"must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.image_torso not in IMAGE_TORSOS:
            raise ConfigError("image_torso", f"must be one of {', '.join(IMAGE_TORSOS)}, got {self.image_torso!r}")
        if self.observation_bounds is not None:
            object.__setattr__(self, "observation_bounds", _checked_bounds(self.observation_bounds))
        _positive_float(self, "learning_rate")
        if self.learning_rate_end is not None:
            _positive_float(self, "learning_rate_end")
        _nonneg_int(self, "learning_rate_decay_steps")
        if self.target_update_tau is not None:
            _in_range(self, "target_update_tau", 0.0, 1.0)
            if self.target_update_tau == 0.0:
                raise ConfigError("target_update_tau", "must be in (0, 1] (0 would never update the target)")
        _positive_float(self, "adam_eps")
        _positive_float(self, "max_gradient_norm")
        _positive_float(self, "huber_loss_parameter")
        _in_range(self, "discount", 0.0, 1.0)
        for name in ("n_step", "target_update_period", "batch_size", "max_replay_size", "actor_update_period"):
            _positive_int(self, name)
        _positive_int(self, "min_replay_size")
        _nonneg_int(self, "epsilon_decay_steps")
        if self.min_replay_size < self.batch_size:
            raise ConfigError("min_replay_size", f"({self.min_replay_size}) must be >= batch_size ({self.batch_size})")
        if self.max_replay_size < self.min_replay_size:
            raise ConfigError("max_replay_size",
                              f"({self.max_replay_size}) must be >= min_replay_size ({self.min_replay_size})")
        _positive_float(self, "samples_per_insert")
        _nonneg_float(self, "samples_per_insert_tolerance")
        check_bool("prioritized_replay", self.prioritized_replay)
        _in_range(self, "priority_exponent", 0.0, 1.0)
        _in_range(self, "importance_sampling_exponent", 0.0, 1.0)
        for name in ("epsilon_start", "epsilon_end", "apex_epsilon", "eval_epsilon"):
            _in_range(self, name, 0.0, 1.0)
        _nonneg_float(self, "apex_alpha")
        check_qat_bits(self.qat_bits)

    @property
    def error_buffer(self) -> float:
        """Rate-limiter slack in sampled items (`agents.rate_limits.error_buffer`)."""
        return error_buffer(self.batch_size, self.min_replay_size, self.samples_per_insert,
                            self.samples_per_insert_tolerance)


def apex_epsilon(actor_id: int, num_actors: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X per-actor exploration: actor i of N explores with base ** (1 + alpha * i / (N - 1)), so a fleet
    spans greedy-ish to very exploratory policies without any schedule. A lone actor gets `base`."""
    if not is_int(num_actors) or num_actors <= 0:
        raise ValueError(f"num_actors must be a positive int, got {num_actors!r}")
    if not is_int(actor_id) or not 0 <= actor_id < num_actors:
        raise ValueError(f"actor_id must be in [0, {num_actors}), got {actor_id!r}")
    if num_actors == 1:
        return float(base)
    return float(base ** (1.0 + alpha * actor_id / (num_actors - 1)))


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """Linear decay from `start` to `end` over `decay_steps` actor steps, then constant (0 steps = `end`)."""
    if decay_steps <= 0 or step >= decay_steps:
        return float(end)
    return float(start + (end - start) * step / decay_steps)


def _checked_bounds(bounds: object) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """((lows), (highs)) as tuples (`quarl.policy.spec.parse_bounds`), as a ConfigError naming the field."""
    try:
        return parse_bounds(bounds)
    except ValueError as e:
        raise ConfigError("observation_bounds", str(e)) from None


# The shared checks (`quarl.ops.checks`: one error type, ConfigError, naming the field), read off the config.
def _positive_int(cfg: DQNConfig, name: str) -> None:
    check_int(name, getattr(cfg, name), minimum=1)


def _nonneg_int(cfg: DQNConfig, name: str) -> None:
    check_int(name, getattr(cfg, name), minimum=0)


def _positive_float(cfg: DQNConfig, name: str) -> None:
    check_number(name, getattr(cfg, name), low=0.0, low_open=True)


def _nonneg_float(cfg: DQNConfig, name: str) -> None:
    check_number(name, getattr(cfg, name), low=0.0)


def _in_range(cfg: DQNConfig, name: str, lo: float, hi: float) -> None:
    check_number(name, getattr(cfg, name), low=lo, high=hi)
