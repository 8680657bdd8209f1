"""What `bench.peers.anakin_rejax` runs: its cases, rejax's presets (as `../shared/anchors/rejax/run.py` writes them)
and their translation into `launch.anakin` flags and `--set` keys, with every difference that remains.

rejax and this project name the same settings differently (rejax's `num_epochs` is our `update_epochs`, its
`fill_buffer` our `min_replay_size`, ...) and some have no counterpart on one side (rejax's dueling head and swish
activation; its Polyak step every N env steps against ours every update). `translate` maps what has one and lists what
does not, so the benchmark's page says what was compared. Both sides run the same number of env steps: a case's
budget is rounded up to whole rollouts (PPO) or environment groups (DQN) times our evaluation chunks (`unit`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

# rejax 0.1.3's presets, copied from run.py's PRESETS (tests/bench/test_anakin_rejax.py checks they still agree).
REJAX_PRESETS: dict[tuple[str, str], dict[str, Any]] = {
    ("ppo", "CartPole-v1"): dict(agent_kwargs={"activation": "tanh"}, num_envs=5, num_steps=100, num_epochs=5,
                                 num_minibatches=5, learning_rate=0.00075, max_grad_norm=0.5, eval_freq=10_000,
                                 gamma=0.99, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5),
    ("dqn", "CartPole-v1"): dict(agent="DuelingQNetwork", agent_kwargs={"activation": "swish"}, num_envs=10,
                                 buffer_size=50_000, fill_buffer=5_000, batch_size=100, max_grad_norm=10,
                                 learning_rate=0.001, num_epochs=5, eval_freq=10_000, polyak=0.98, eps_start=1,
                                 eps_end=0.05, exploration_fraction=0.5, gamma=0.99, ddqn=True),
    ("ppo", "Breakout-MinAtar"): dict(agent_kwargs={"activation": "tanh"}, num_envs=32, num_steps=32, num_epochs=4,
                                      num_minibatches=4, learning_rate=0.00025674088686342003, max_grad_norm=1,
                                      eval_freq=50_000, gamma=0.995, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01,
                                      vf_coef=0.5),
    ("dqn", "Breakout-MinAtar"): dict(agent="ConvQNetwork", agent_kwargs={"activation": "tanh"}, num_envs=1,
                                      buffer_size=100_000, fill_buffer=20_000, batch_size=100, max_grad_norm=10,
                                      learning_rate=0.0005, eval_freq=50_000, target_update_freq=1000,
                                      eps_start=1, eps_end=0.05, exploration_fraction=0.5, gamma=1.0, ddqn=False),
}
# rejax 0.1.3's defaults for what the presets leave out (its Algorithm, mixins and create_agent).
REJAX_DEFAULTS: dict[str, Any] = {"hidden_layer_sizes": (64, 64), "num_epochs": 1, "polyak": 0.99,
                                  "target_update_freq": 1}
# rejax 0.1.3's DQN builds QNetwork or DuelingQNetwork only: its Breakout preset's ConvQNetwork ends in a KeyError.
REJAX_DQN_AGENTS = ("QNetwork", "DuelingQNetwork")
CHUNKS = 5  # our evaluation chunks per run: the first (compile included) is left out of our rate
# Our activations (PPO: agents.ppo.config.ACTIVATIONS; DQN: the policy spec's); rejax's swish has no counterpart.
NEAREST_ACTIVATION = {"swish": "relu", "silu": "relu", "gelu": "relu"}


@dataclasses.dataclass(frozen=True)
class Case:
    """One task and algorithm: rejax's preset for it (None: ours only) and our network on it."""

    name: str
    algo: str  # "ppo" or "dqn"
    rejax_env: str  # rejax/gymnax's name: the preset's key
    task: str  # launch.anakin's
    torso: str  # "mlp" (rejax's networks) or "conv" (ours, MinAtar only)
    peer: bool  # rejax runs this case too
    steps: int  # default env steps per seed
    quick_steps: int

    @property
    def preset(self) -> dict[str, Any]:
        return REJAX_PRESETS[(self.algo, self.rejax_env)]

    @property
    def unit(self) -> int:
        """Env steps per seed that both sides split evenly: our CHUNKS chunks of whole periods, rejax's iterations."""
        p = self.preset
        return CHUNKS * (p["num_envs"] * p["num_steps"] if self.algo == "ppo" else p["num_envs"])

    def budget(self, steps: int) -> int:
        """`steps` rounded up to whole units."""
        return -(-int(steps) // self.unit) * self.unit


CASES: dict[str, Case] = {c.name: c for c in (
    Case("ppo-cartpole", "ppo", "CartPole-v1", "CartPole-v1", "mlp", True, 100_000, 5_000),
    Case("dqn-cartpole", "dqn", "CartPole-v1", "CartPole-v1", "mlp", True, 100_000, 3_000),
    Case("ppo-breakout", "ppo", "Breakout-MinAtar", "MinAtar/Breakout", "mlp", True, 204_800, 5_120),
    Case("ppo-breakout-conv", "ppo", "Breakout-MinAtar", "MinAtar/Breakout", "conv", False, 204_800, 5_120),
    Case("dqn-breakout", "dqn", "Breakout-MinAtar", "MinAtar/Breakout", "mlp", True, 100_000, 2_000),
    Case("dqn-breakout-conv", "dqn", "Breakout-MinAtar", "MinAtar/Breakout", "conv", False, 100_000, 2_000),
)}


def quick_fill(case: Case, steps: int) -> int | None:
    """A quick (smoke) run's replay fill: a quarter of its budget, so that it learns at all; None: the preset's."""
    if case.algo != "dqn":
        return None
    return max(case.preset["batch_size"], min(case.preset["fill_buffer"], steps // 4))


def rejax_overrides(case: Case, steps: int, fill: int | None = None) -> dict[str, Any]:
    """What the benchmark passes run.py over its preset: one evaluation at the end (eval_freq = the budget, the
    initial one skipped), a Q-network rejax 0.1.3 has, and a quick run's fill."""
    out: dict[str, Any] = {"eval_freq": steps, "skip_initial_evaluation": True}
    if case.algo == "dqn" and case.preset.get("agent", "QNetwork") not in REJAX_DQN_AGENTS:
        out["agent"] = "QNetwork"
    if fill is not None:
        out["fill_buffer"] = fill
    return out


def rejax_settings(case: Case, steps: int, fill: int | None = None) -> dict[str, Any]:
    """The settings rejax runs with: its preset under `rejax_overrides`."""
    return {**case.preset, **rejax_overrides(case, steps, fill)}


def set_arguments(overrides: dict[str, Any]) -> list[str]:
    """run.py's `--set k=v ...` words (its values as Python literals)."""
    return [f"{k}={v!r}" if not isinstance(v, str) else f"{k}={v}" for k, v in overrides.items()]


def set_value(v: Any) -> str:
    """A value as launch.anakin's `--set` parses it by the field's type."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (tuple, list)):
        return ",".join(str(int(x)) for x in v)
    return repr(v) if isinstance(v, float) else str(v)


@dataclasses.dataclass(frozen=True)
class Translation:
    """launch.anakin's settings for a case: `--set` keys, the flags beside them, and what differs from rejax."""

    sets: dict[str, Any]
    flags: dict[str, int]  # "--envs-per-actor", "--actor-update-period" (DQN)
    differences: list[str]

    def arguments(self) -> list[str]:
        words = [w for flag, v in self.flags.items() for w in (flag, str(v))]
        return words + [w for k, v in self.sets.items() for w in ("--set", f"{k}={set_value(v)}")]


def translate(case: Case, steps: int, fill: int | None = None) -> Translation:
    """Our settings for `case` from rejax's (`rejax_settings`), and the differences that remain."""
    r = rejax_settings(case, steps, fill)
    kwargs = r.get("agent_kwargs", {})
    act = kwargs.get("activation", "swish")  # rejax's default activation
    ours_act = NEAREST_ACTIVATION.get(act, act)
    hidden = tuple(kwargs.get("hidden_layer_sizes", REJAX_DEFAULTS["hidden_layer_sizes"]))
    diffs = [] if act == ours_act else [f"activation: rejax's {act} has no counterpart here; ours runs {ours_act}, "
                                        "the nearest"]
    if case.algo == "ppo":
        sets, flags = _ppo(r, ours_act, hidden), {}
        diffs += PPO_DIFFERENCES
    else:
        sets, flags, more = _dqn(r, steps, ours_act, hidden)
        diffs += more + DQN_DIFFERENCES
        if case.preset.get("agent") != r.get("agent"):
            diffs.insert(0, REJAX_CONV_MISSING)
    if case.task.startswith("MinAtar/"):
        sets["image_torso"] = case.torso
        diffs += [MINATAR_DIFFERENCE, CONV_DIFFERENCE if case.torso == "conv" else
                  "network: both the same MLP on the flattened 10x10x4 frame (ours: image_torso=mlp)"]
    return Translation(sets, flags, diffs)


def _ppo(r: dict[str, Any], activation: str, hidden: tuple[int, ...]) -> dict[str, Any]:
    return {"num_envs": r["num_envs"], "num_steps": r["num_steps"], "update_epochs": r["num_epochs"],
            "num_minibatches": r["num_minibatches"], "learning_rate": float(r["learning_rate"]), "anneal_lr": False,
            "max_gradient_norm": float(r["max_grad_norm"]), "discount": float(r["gamma"]),
            "gae_lambda": float(r["gae_lambda"]), "clip_coef": float(r["clip_eps"]), "clip_value_loss": True,
            "entropy_coef": float(r["ent_coef"]), "value_coef": float(r["vf_coef"]), "normalize_advantages": True,
            "adam_eps": 1e-8, "activation": activation, "policy_hidden_sizes": hidden, "value_hidden_sizes": hidden}


def _dqn(r: dict[str, Any], steps: int, activation: str,
         hidden: tuple[int, ...]) -> tuple[dict[str, Any], dict[str, int], list[str]]:
    envs, epochs = int(r["num_envs"]), int(r.get("num_epochs", REJAX_DEFAULTS["num_epochs"]))
    freq = int(r.get("target_update_freq", REJAX_DEFAULTS["target_update_freq"]))
    polyak = float(r.get("polyak", REJAX_DEFAULTS["polyak"]))
    # rejax moves its target once the env step count crosses a multiple of target_update_freq: every
    # max(1, freq // num_envs) iterations of num_epochs updates each.
    updates_between = epochs * max(1, freq // envs)
    sets: dict[str, Any] = {
        "hidden_sizes": hidden, "activation": activation, "n_step": 1, "discount": float(r["gamma"]),
        "batch_size": r["batch_size"], "min_replay_size": r["fill_buffer"], "max_replay_size": r["buffer_size"],
        "samples_per_insert": float(epochs * r["batch_size"] / envs), "learning_rate": float(r["learning_rate"]),
        "learning_rate_end": None, "adam_eps": 1e-8, "max_gradient_norm": float(r["max_grad_norm"]),
        "huber_loss_parameter": 1e6, "epsilon_start": float(r["eps_start"]), "epsilon_end": float(r["eps_end"]),
        "epsilon_decay_steps": int(r["exploration_fraction"] * steps), "observation_bounds": None}
    if polyak == 0.0:
        sets.update(target_update_period=updates_between, target_update_tau=None)
        target = f"a hard copy every {updates_between} updates, as rejax's polyak 0 every {freq} env steps"
    else:
        sets["target_update_tau"] = 1.0 - polyak ** (1.0 / updates_between)
        target = (f"rejax moves its target {1 - polyak:g} of the way to the online network every {updates_between} "
                  f"updates (polyak {polyak:g} once per {freq} env step(s)); ours Polyak-averages every update with "
                  f"tau {sets['target_update_tau']:.4g}, the same decay over {updates_between} updates")
    diffs = [f"target network: {target}"]
    agent = r.get("agent", "QNetwork")
    if agent == "DuelingQNetwork":
        diffs.append("head: rejax's DuelingQNetwork (a value head plus mean-centred advantages); ours has no dueling "
                     "head, a plain linear Q head on the same torso")
    if not r.get("ddqn", True):
        diffs.append("targets: rejax's preset turns double DQN off; ours is always double DQN")
    return sets, {"--envs-per-actor": envs, "--actor-update-period": envs}, diffs


PPO_DIFFERENCES = [
    "gradient clipping: rejax's max_grad_norm clips each gradient element (optax.clip); ours clips the global norm",
    "optimiser: rejax trains the policy and value networks with an Adam each; ours one Adam over both (the same "
    "losses summed: policy - entropy_coef * entropy + value_coef * clipped value loss)",
    "initialisation: flax's default Dense layers in rejax; haiku's, with a 1e-4-scale policy head, in ours",
    "time limits: rejax (gymnax 0.0.9) ends a truncated episode like a terminated one; ours bootstraps it from its "
    "last observation",
    "acting: rejax samples its fp32 policy; ours samples the in-jit actor at the run's precision (int8 or fp32), "
    "with the weights of the update before, as rejax's",
    "evaluation: rejax's run is timed whole, its one evaluation (128 episodes, sampling the policy as in training) "
    "included; ours greedy (argmax) after each fifth of the run, outside its rate",
]
DQN_DIFFERENCES = [
    "loss: rejax's L2 (optax.l2_loss); ours Huber with delta 1e6, the same below it",
    "gradient clipping: rejax's max_grad_norm clips each gradient element (optax.clip); ours clips the global norm",
    "filling: rejax acts uniformly at random for its first fill_buffer env steps and learns after them; ours acts "
    "epsilon-greedy throughout (epsilon near 1 then) and learns once the replay holds min_replay_size windows",
    "updates: both num_epochs updates of batch_size per iteration of num_envs env steps (ours: samples_per_insert = "
    "num_epochs * batch_size / num_envs); our actors take the online network's weights every iteration "
    "(--actor-update-period = num_envs), as rejax acts with its newest",
    "evaluation: rejax's run is timed whole, its one evaluation (128 episodes, epsilon 0.005) included; ours greedy "
    "after each fifth of the run, outside its rate",
    "rate window: rejax's rate covers its whole run, the fast replay-filling steps included; ours leaves out its "
    "first fifth (compile included), which holds most or all of the filling",
]
MINATAR_DIFFERENCE = ("environment: rejax runs gymnax 0.0.9's Breakout-MinAtar as it comes (3 actions, no sticky "
                      "actions, episodes cut at 1,000 steps); ours the project's port (6 actions, sticky actions "
                      "p=0.1, 10,000-step limit): returns are not comparable one for one")
CONV_DIFFERENCE = ("network: ours only, the MinAtar conv torso (3x3 conv of 16, fc 128, ReLU) for policy and value "
                   "(Q-network); rejax's row beside it is its MLP")
REJAX_CONV_MISSING = ("rejax's Breakout DQN preset names ConvQNetwork, which rejax 0.1.3 does not have (its DQN builds "
                      "QNetwork or DuelingQNetwork; the preset fails with KeyError): rejax runs QNetwork, the 64x64 "
                      "MLP on the flattened frame")
