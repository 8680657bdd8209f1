"""D4PG hyper-parameters.

Defaults are Acme's control-suite settings (`acme/agents/jax/d4pg`, `examples/baselines`): a 256x3 policy,
a 512-512-256 distributional critic with 51 atoms on [-150, 150], 5-step returns, Adam 1e-4 with global-norm
clipping, periodic (hard) target updates every 100 learner steps and Gaussian exploration with sigma 0.3.
The ActorQ paper's larger policy is one call away: `D4PGConfig.paper()` (policy 2048x3), or pass
`policy_layer_sizes=(2048, 2048, 2048)` directly.
"""
from __future__ import annotations

import dataclasses

from agents.rate_limits import error_buffer
from quarl.nets.qat import check_qat_bits
from quarl.ops.checks import ConfigError, check_int, check_number, check_sizes


def _field(name: str) -> str:
    return f"D4PGConfig.{name}"


@dataclasses.dataclass(frozen=True)
class D4PGConfig:
    """Frozen, validated D4PG settings (precision, backend and seeds are run-level, not here).

    `samples_per_insert_tolerance` is Acme's tolerance *rate*: the rate limiter may drift by
    `min_replay_size * samples_per_insert * tolerance` samples from the target ratio before it blocks.
    `sigma` is the Gaussian exploration std-dev in the canonical [-1, 1] action space; with
    `sigma_spread > 1` actors get log-spaced sigmas between `sigma / sqrt(spread)` and `sigma * sqrt(spread)`
    (see `sigma_for_actor`), `sigma_spread = 1` gives every actor `sigma` as Acme does.
    """

    policy_layer_sizes: tuple[int, ...] = (256, 256, 256)
    critic_layer_sizes: tuple[int, ...] = (512, 512, 256)
    num_atoms: int = 51
    vmin: float = -150.0
    vmax: float = 150.0
    n_step: int = 5
    discount: float = 0.99
    batch_size: int = 256
    learning_rate: float = 1e-4  # policy and critic, as in Acme
    max_gradient_norm: float | None = 40.0  # Acme's `clipping=True`; None disables global-norm clipping
    dqda_clipping: float | None = 1.0  # L2 clip of dQ/da in the DPG loss (Acme's `clipping=True`)
    target_update_period: int = 100  # hard copy of online -> target params every N learner steps
    sigma: float = 0.3
    sigma_spread: float = 1.0
    min_replay_size: int = 1000
    max_replay_size: int = 1_000_000
    samples_per_insert: float = 32.0
    samples_per_insert_tolerance: float = 0.1
    actor_update_period: int = 100  # actor steps between policy weight pulls
    # Which learner policy actors (and evaluators) run: "target" as Acme's D4PG (its learner serves the target
    # policy to actors), or "online".
    actor_policy: str = "target"
    # Quantization-aware training: None trains the policy in fp32; B in [2, 8] trains it through the int-B
    # arithmetic its actors deploy (quarl.nets.qat). Critic and target networks always stay fp32.
    qat_bits: int | None = None

    def __post_init__(self) -> None:
        for name in ("policy_layer_sizes", "critic_layer_sizes"):  # lists arrive from CLIs and JSON
            object.__setattr__(self, name, check_sizes(_field(name), getattr(self, name)))
        for name in ("num_atoms", "n_step", "batch_size", "target_update_period", "min_replay_size",
                     "max_replay_size", "actor_update_period"):
            check_int(_field(name), getattr(self, name))
        if self.num_atoms < 2:
            raise ConfigError(_field("num_atoms"), f"must be >= 2, got {self.num_atoms}")
        vmin, vmax = check_number(_field("vmin"), self.vmin), check_number(_field("vmax"), self.vmax)
        if not vmin < vmax:
            raise ConfigError(_field("vmax"), f"must exceed vmin, got vmin={vmin}, vmax={vmax}")
        check_number(_field("discount"), self.discount, low=0.0, high=1.0)
        for name in ("learning_rate", "samples_per_insert", "samples_per_insert_tolerance"):
            check_number(_field(name), getattr(self, name), low=0.0, low_open=True)
        for name in ("max_gradient_norm", "dqda_clipping"):
            if getattr(self, name) is not None:
                check_number(_field(name), getattr(self, name), low=0.0, low_open=True)
        check_number(_field("sigma"), self.sigma, low=0.0)
        check_number(_field("sigma_spread"), self.sigma_spread, low=1.0)
        if self.actor_policy not in ("target", "online"):
            raise ConfigError(_field("actor_policy"), f"must be 'target' or 'online', got {self.actor_policy!r}")
        check_qat_bits(self.qat_bits, _field("qat_bits"))
        if self.max_replay_size < self.min_replay_size:
            raise ConfigError(_field("max_replay_size"), f"({self.max_replay_size}) must be >= min_replay_size "
                                                         f"({self.min_replay_size})")
        if self.batch_size > self.max_replay_size:
            raise ConfigError(_field("batch_size"), f"({self.batch_size}) must be <= max_replay_size")

    @classmethod
    def paper(cls, **overrides: object) -> "D4PGConfig":
        """The ActorQ paper's D4PG setting: a 2048x3 policy (critic and the rest as Acme's defaults)."""
        return cls(**{"policy_layer_sizes": (2048, 2048, 2048), **overrides})

    @property
    def atoms(self) -> tuple[float, ...]:
        """Support of the critic's categorical distribution, `linspace(vmin, vmax, num_atoms)`."""
        step = (self.vmax - self.vmin) / (self.num_atoms - 1)
        return tuple(self.vmin + i * step for i in range(self.num_atoms))

    @property
    def error_buffer(self) -> float:
        """Rate-limiter slack in sampled items (`agents.rate_limits.error_buffer`)."""
        return error_buffer(self.batch_size, self.min_replay_size, self.samples_per_insert,
                            self.samples_per_insert_tolerance)

    @property
    def rate_limiter_diffs(self) -> tuple[float, float]:
        """(min_diff, max_diff) of the replay's rate limiter, on diff = inserts * samples_per_insert - samples.

        max_diff is Acme's: actors may run `error_buffer` samples ahead of the ratio. min_diff lets
        the learner draw exactly one batch when replay first holds `min_replay_size` items and then one batch per
        `batch_size / samples_per_insert` inserts, which is how Acme's local D4PG schedules learner steps
        (acme/agents/agent.py `_calculate_num_learner_steps`); the symmetric buffer would allow a burst of
        error_buffer / batch_size (12 at the defaults) learner steps at that moment. The learner's steady rate
        is the same either way."""
        offset = self.samples_per_insert * self.min_replay_size
        ahead = max(self.error_buffer, 2.0 * max(1.0, self.samples_per_insert))
        return offset - self.batch_size, offset + ahead


def sigma_for_actor(config: D4PGConfig, actor_id: int, num_actors: int) -> float:
    """Exploration std-dev of actor `actor_id` of `num_actors`: log-spaced around `config.sigma`.

    Spreading sigma (Ape-X's trick for epsilon, transposed to Gaussian noise) gives the replay both
    near-greedy and exploratory data; the geometric mean over actors stays `config.sigma`.
    """
    if isinstance(num_actors, bool) or not isinstance(num_actors, int) or num_actors <= 0:
        raise ValueError(f"num_actors must be a positive int, got {num_actors!r}")
    if isinstance(actor_id, bool) or not isinstance(actor_id, int) or not 0 <= actor_id < num_actors:
        raise ValueError(f"actor_id must be an int in [0, {num_actors}), got {actor_id!r}")
    if num_actors == 1 or config.sigma_spread == 1.0:
        return float(config.sigma)
    fraction = actor_id / (num_actors - 1) - 0.5  # in [-0.5, 0.5]
    return float(config.sigma * config.sigma_spread ** fraction)
