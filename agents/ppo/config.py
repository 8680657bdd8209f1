"""PPO hyper-parameters, and A2C as PPO's one-epoch, one-minibatch, unclipped setting of the same code.

The defaults follow rl-baselines3-zoo's tuned CartPole-v1 PPO (8 environments, 32-step rollouts, lambda 0.8,
gamma 0.98, 20 epochs, learning rate 1e-3 annealed to 0), which reaches 500 within ~100k env steps: on-policy
runs in CI must be short, and these settings are the fastest published ones for the classic-control tasks.
`A2CConfig` changes only defaults (5-step rollouts, one epoch over one minibatch, no ratio or value clipping,
no advantage normalisation), so both algorithms share every line of the loss and the update.
"""
from __future__ import annotations

import dataclasses
import math

from agents.dqn.config import IMAGE_TORSOS
from quarl.envs.factory import task_family
from quarl.nets.qat import check_qat_bits

ACTIVATIONS = ("tanh", "relu")
# How the learner corrects for data its fp32 policy did not collect (quantized actors, and in the distributed
# program's asynchronous mode weights some versions old); `agents.ppo.learning` says what each does.
CORRECTIONS = ("none", "tis", "vtrace")
# DM Control tasks (1000-step episodes, dense rewards in [0, 1], continuous actions): a longer horizon (gamma 0.99,
# lambda 0.95), 64-step rollouts in 4 minibatches and a narrower initial Gaussian (std 0.6). With them
# cartpole:balance reached 998 at 90k env steps (seed 0), where the classic-control defaults stayed at 456 after
# 100k, below the ~650 that an untrained policy (mean action 0) scores. `PPOConfig(**CONTROL_OVERRIDES)`, or
# `--set` each key.
CONTROL_OVERRIDES: dict = {"discount": 0.99, "gae_lambda": 0.95, "num_steps": 64, "update_epochs": 10,
                           "num_minibatches": 4, "init_log_std": -0.5}


# Pixel tasks (MinAtar, ALE; conv torsos): cleanRL's ppo_atari settings (Huang et al., 2022, "The 37 implementation
# details of PPO"): 8 environments, 128-step rollouts, 4 epochs in 4 minibatches, gamma 0.99, lambda 0.95, clip
# 0.1 (value loss clipped too), entropy 0.01, learning rate 2.5e-4 annealed. The classic-control defaults' 20 epochs
# over 256-step rollouts cost ~2 s of conv updates per 256 env steps on a 2-core CPU, ~25x these per env step.
PIXEL_PPO_OVERRIDES: dict = {"num_envs": 8, "num_steps": 128, "update_epochs": 4, "num_minibatches": 4,
                             "discount": 0.99, "gae_lambda": 0.95, "clip_coef": 0.1, "clip_value_loss": True,
                             "entropy_coef": 0.01, "learning_rate": 2.5e-4}
# A2C on pixel tasks: rl-baselines3-zoo's Atari A2C (16 environments, 5-step rollouts, entropy 0.01, value
# coefficient 0.25, learning rate 7e-4; Adam here where the zoo uses RMSprop).
PIXEL_A2C_OVERRIDES: dict = {"num_envs": 16, "entropy_coef": 0.01, "value_coef": 0.25}


def task_overrides(task: str, config_name: str = "PPOConfig") -> dict:
    """The settings for `task` over the defaults: `CONTROL_OVERRIDES` for PPO on DM Control tasks
    ("domain:task"), the pixel presets on MinAtar and ALE. A2C keeps its one epoch and one minibatch everywhere
    (they are what make it A2C)."""
    family = task_family(task)
    pixels = family in ("minatar", "ale")
    if config_name == "PPOConfig":
        return dict(PIXEL_PPO_OVERRIDES if pixels else CONTROL_OVERRIDES if family == "control" else {})
    return dict(PIXEL_A2C_OVERRIDES) if pixels else {}


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Every field is validated in `__post_init__`; a bad value raises a one-line ValueError naming the field."""

    # Networks: separate policy (what actors run, quantized) and value (learner only, fp32) MLPs. Image tasks use
    # DQN's conv torsos (agents.dqn.networks) for both, whatever these sizes say; `image_torso` "mlp" flattens the
    # image into these MLPs instead (rejax's MinAtar networks, for bench.peers.anakin_rejax).
    policy_hidden_sizes: tuple[int, ...] = (64, 64)
    value_hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    image_torso: str = "conv"
    # Rollouts: `num_envs` environments stepped in lock-step for `num_steps` steps per update
    # (`--envs-per-actor K` > 1 replaces `num_envs`).
    num_envs: int = 8
    num_steps: int = 32
    # Returns and advantages.
    discount: float = 0.98
    gae_lambda: float = 0.8
    normalize_advantages: bool = True
    # The update: `update_epochs` passes over the rollout, each in `num_minibatches` shuffled minibatches.
    update_epochs: int = 20
    num_minibatches: int = 1
    clip_coef: float | None = 0.2  # None: no ratio clipping (A2C's plain policy gradient)
    clip_value_loss: bool = False  # clip the value change to +-clip_coef as cleanRL's clip_vloss
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    # Optimiser: Adam with global-norm clipping; `anneal_lr` decays the rate linearly to 0 over the run.
    learning_rate: float = 1e-3
    anneal_lr: bool = True
    adam_eps: float = 1e-5
    max_gradient_norm: float = 0.5
    # Continuous actions: a state-independent Gaussian log-std (learned), starting here.
    init_log_std: float = 0.0
    # Quantization-aware training of the policy for int-B actors (2..8), None = plain fp32 training.
    qat_bits: int | None = None
    # Off-policy correction (`CORRECTIONS`): "none" anchors PPO's ratio at the behaviour (quantized) policy;
    # "tis" anchors it at the learner's policy before the update and weights each sample by the truncated
    # importance ratio min(pi_learner / pi_behaviour, is_cap); "vtrace" takes advantages and value targets from
    # V-trace (rho-bar, c-bar) in place of GAE, with the same anchor.
    correction: str = "none"
    is_cap: float = 2.0
    vtrace_rho_bar: float = 1.0
    vtrace_c_bar: float = 1.0

    def __post_init__(self) -> None:
        for name in ("policy_hidden_sizes", "value_hidden_sizes"):
            sizes = getattr(self, name)
            if not isinstance(sizes, tuple) or not sizes or not all(_is_int(h) and h > 0 for h in sizes):
                raise ValueError(f"{name} must be a non-empty tuple of positive ints, got {sizes!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.image_torso not in IMAGE_TORSOS:
            raise ValueError(f"image_torso must be one of {', '.join(IMAGE_TORSOS)}, got {self.image_torso!r}")
        for name in ("num_envs", "num_steps", "update_epochs", "num_minibatches"):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise ValueError(f"num_minibatches ({self.num_minibatches}) must divide the rollout's "
                             f"num_envs * num_steps = {self.num_envs * self.num_steps} transitions")
        for name in ("discount", "gae_lambda"):
            v = getattr(self, name)
            if not _is_real(v) or not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v!r}")
        if self.clip_coef is not None and (not _is_real(self.clip_coef) or self.clip_coef <= 0):
            raise ValueError(f"clip_coef must be None or a positive finite number, got {self.clip_coef!r}")
        if self.clip_value_loss and self.clip_coef is None:
            raise ValueError("clip_value_loss needs a clip_coef")
        for name in ("value_coef", "entropy_coef"):
            v = getattr(self, name)
            if not _is_real(v) or v < 0:
                raise ValueError(f"{name} must be a non-negative finite number, got {v!r}")
        for name in ("learning_rate", "adam_eps", "max_gradient_norm"):
            v = getattr(self, name)
            if not _is_real(v) or v <= 0:
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        if not _is_real(self.init_log_std):
            raise ValueError(f"init_log_std must be a finite number, got {self.init_log_std!r}")
        for name in ("normalize_advantages", "clip_value_loss", "anneal_lr"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        check_qat_bits(self.qat_bits)
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {', '.join(CORRECTIONS)}, got {self.correction!r}")
        for name in ("is_cap", "vtrace_rho_bar", "vtrace_c_bar"):
            v = getattr(self, name)
            if not _is_real(v) or v <= 0:
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")


@dataclasses.dataclass(frozen=True)
class A2CConfig(PPOConfig):
    """A2C (Mnih et al., 2016, synchronous): PPO's code with one gradient step per rollout, on the whole
    rollout, and no clipping, so the ratio is 1 and the loss's gradient is the plain advantage policy gradient.
    Defaults after rl-baselines3-zoo's CartPole-v1 A2C (8 environments, 5-step rollouts, lambda 1, gamma 0.99)."""

    num_steps: int = 5
    discount: float = 0.99
    gae_lambda: float = 1.0
    normalize_advantages: bool = False
    update_epochs: int = 1
    num_minibatches: int = 1
    clip_coef: float | None = None
    learning_rate: float = 7e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.update_epochs, self.num_minibatches, self.clip_coef) != (1, 1, None):
            raise ValueError("A2C is one epoch over one minibatch without clipping (update_epochs=1, "
                             "num_minibatches=1, clip_coef=None); use --agent ppo for other settings")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
