"""Single-process ActorQ run (Acme's `run_experiment`): one env loop, one learner, one in-memory table.

It runs the same pieces, in the same order, as the distributed runner, just in one thread: the actor only ever
sees weights that went learner.policy_params() -> quantize_params(precision) -> encode_payload -> bytes ->
decode_payload -> actor.update, so quantization and the wire format are exercised on every pull, and each stage
is timed. Acting and learning are interleaved under the table's samples-per-insert rate limiter: after every
env step the learner takes as many steps as the limiter allows (never blocking).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np

from quarl.env_loop import VectorEnvLoop
from quarl.envs import environment_spec, make_environment
from quarl.evaluation import run_episode
from quarl.vector_env import make_vector_environment
from quarl.carbon import start_tracking, stop_tracking
from quarl.io import write_json_atomic
from quarl.logs import CSVLogger
from quarl.policy_io import save_policy
from quarl.payload import decode_payload, encode_payload, fp32_payload_nbytes
from quarl.quantization import quantize_params
from quarl.io import jsonable
from launch.experiment_config import ExperimentConfig
from launch.summary import solved_at

EVAL_SEED_OFFSET = 10_000  # evaluation episodes come from their own env instance and seed
LEARNER_LOG_EVERY = 1_000  # learner steps between learner.csv rows


@dataclasses.dataclass
class StageTimes:
    """Wall-clock totals (seconds) of each stage of the loop, plus how many times each ran."""

    env_step_s: float = 0.0
    policy_s: float = 0.0
    insert_s: float = 0.0  # the adders and the table insert
    sample_s: float = 0.0
    learner_s: float = 0.0
    quantize_encode_s: float = 0.0  # policy_params + quantize + encode (the learner side of a weight update)
    pull_s: float = 0.0  # fetching the published bytes: nothing to fetch in one process (the distributed runner's
    # actors pay a round trip to the weight server here), so 0 by construction; same name, same meaning
    deserialize_s: float = 0.0  # decode_payload (the actor side)
    load_s: float = 0.0  # actor.update (the executor swapping in the new weights)
    evaluation_s: float = 0.0
    actor_build_s: float = 0.0
    env_steps: int = 0
    learner_steps: int = 0
    updates: int = 0

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {k: round(v, 6) if isinstance(v, float) else v
                                 for k, v in dataclasses.asdict(self).items()}
        per_update = max(1, self.updates)
        for stage in ("quantize_encode_s", "pull_s", "deserialize_s", "load_s"):
            out[f"{stage[:-2]}_ms_per_update"] = round(1e3 * getattr(self, stage) / per_update, 4)
        steps = max(1, self.env_steps)
        out["env_step_us_per_step"] = round(1e6 * self.env_step_s / steps, 3)
        out["policy_us_per_step"] = round(1e6 * self.policy_s / steps, 3)
        out["learner_ms_per_step"] = round(1e3 * self.learner_s / max(1, self.learner_steps), 4)
        return out


class WeightChannel:
    """Learner -> actor weight transport in one process: exactly the bytes a remote actor would receive (the
    payload carries the learner step as its version and the policy spec's digest, as in the distributed run)."""

    def __init__(self, learner: Any, spec: Any, precision: str, times: StageTimes):
        self._learner, self._precision, self._times = learner, precision, times
        self._spec_hash = spec.digest()
        self.version = -1
        self.payload_bytes = 0

    def pull(self, count: bool = True) -> Any:
        """Publishes the learner's current weights; returns the actor-side QuantizedParams."""
        t0 = time.perf_counter()
        version = int(self._learner.steps)
        qparams = quantize_params(self._learner.policy_params(), self._precision)
        data = encode_payload(qparams, version=version, spec_hash=self._spec_hash)
        t1 = time.perf_counter()
        payload = decode_payload(data)
        t2 = time.perf_counter()
        if payload.version != version or payload.spec_hash != self._spec_hash:
            raise RuntimeError(f"payload version {payload.version} != published {version}")
        self.version = version
        self.payload_bytes = len(data)
        if count:
            self._times.quantize_encode_s += t1 - t0
            self._times.deserialize_s += t2 - t1
        return payload.params


def evaluate(actor: Any, env: Any, episodes: int) -> list[float]:
    """Undiscounted returns of `episodes` full episodes with the (evaluation-mode) actor."""
    return [run_episode(env, actor.select_action)[0] for _ in range(episodes)]


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Any]:
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    bar = tqdm(total=total, disable=not enabled, unit="step", mininterval=1.0, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()


def run_experiment(config: ExperimentConfig, *, progress: bool = True, energy: bool = True,
                   sync_learner: bool = False, on_eval: Callable[[dict[str, Any]], bool | None] | None = None,
                   on_builder: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Trains `config`'s agent on its task for `config.max_actor_steps` env steps; returns (and writes) the
    summary, with the whole config under "experiment". Fields marked [distributed] in ExperimentConfig are
    ignored here (one actor, no Ray, no checkpoints).

    Evaluations every `config.eval_every` actor steps run greedily at the deployed precision (plus fp32 with
    `eval_fp32`); a final one always runs. The run ends early once `target_streak` evaluations in a row reach
    `target_return`, or when `on_eval(row)` (it sees every evaluator row) returns True.
    The keyword arguments are how this process runs the experiment, not part of it: `progress` (a bar),
    `energy` (the energy tracker), `on_builder(builder)` (sees the builder before anything is made from it:
    benchmarks wrap its factories to keep a handle on the learner). Learner updates are dispatched
    asynchronously (JAX), so their compute overlaps acting and part of it shows up in the stage that next waits
    on the device (usually `quantize_encode_s`); `sync_learner=True` waits for every update so each stage's
    time is its own, at some cost in throughput.
    `envs_per_actor` K > 1 makes the actor step K environments and run its policy once per step on the batch
    of K observations (`quarl.env_loop`); every count (steps, evaluation and update periods) is in env steps,
    so one loop iteration advances them by K.
    Writes evaluator.csv, learner.csv, actor.csv, summary.json and the final fp32 policy
    (policy_fp32.qrlp + .json, see `quarl.policy_io`) under `config.logdir`.
    """
    builder = config.builder()
    if on_builder is not None:
        on_builder(builder)
    task, prec, seed, num_envs = config.task, config.precision, config.seed, config.envs_per_actor
    max_actor_steps, eval_every, eval_episodes = config.max_actor_steps, int(config.eval_every), config.eval_episodes
    backend = config.backend
    agent_config = builder.config
    update_period = int(agent_config.actor_update_period)

    env = make_vector_environment(task, seed, num_envs)
    eval_env = make_environment(task, seed + EVAL_SEED_OFFSET)
    env_spec = environment_spec(env)
    spec = builder.policy_spec(env_spec)
    learner = builder.make_learner(env_spec, seed)
    table = builder.make_table(env_spec, seed=seed)
    loop = VectorEnvLoop(env, builder.make_adder)
    prioritized = getattr(table, "sampler", "uniform") == "prioritized"
    batch_size = int(agent_config.batch_size)

    logdir = Path(config.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    times = StageTimes()
    channel = WeightChannel(learner, spec, prec, times)
    qparams = channel.pull(count=False)
    t0 = time.perf_counter()
    actor = builder.make_actor(env_spec, qparams, seed=seed, actor_id=0, evaluation=False, backend=backend,
                               batch_size=num_envs)
    times.actor_build_s = time.perf_counter() - t0  # includes `auto` measuring backends; not an update
    eval_actor = builder.make_actor(env_spec, qparams, seed=seed + 1, actor_id=0, evaluation=True,
                                    backend=backend)
    fp32_channel = WeightChannel(learner, spec, "fp32", StageTimes())
    fp32_actor = None
    if config.eval_fp32 and prec != "fp32":
        fp32_actor = builder.make_actor(env_spec, fp32_channel.pull(), seed=seed + 2, actor_id=0,
                                        evaluation=True, backend=backend)

    evaluator_log = CSVLogger(logdir / "evaluator.csv")
    learner_log = CSVLogger(logdir / "learner.csv")
    actor_log = CSVLogger(logdir / "actor.csv")
    tracker = start_tracking(logdir, "run") if energy else None
    evals: list[dict[str, Any]] = []
    start = time.perf_counter()
    learner_window = (start, 0)  # (time, learner steps) at the previous learner.csv row

    def run_evaluation(actor_steps: int) -> bool:
        t = time.perf_counter()
        eval_actor.update(channel.pull(count=False))
        returns = evaluate(eval_actor, eval_env, eval_episodes)
        # Clocks at the start of this evaluation; train_clock_s leaves out all evaluation time.
        row = {"actor_steps": actor_steps, "learner_steps": learner.steps, "wall_clock_s": round(t - start, 3),
               "train_clock_s": round(t - start - times.evaluation_s, 3), "return": float(np.mean(returns)),
               "return_std": float(np.std(returns)), "return_min": float(np.min(returns)),
               "return_max": float(np.max(returns)),
               "return_first": returns[0]}  # one noiseless episode: Acme's usual evaluation protocol
        if fp32_actor is not None:
            fp32_actor.update(fp32_channel.pull())
            row["return_fp32"] = float(np.mean(evaluate(fp32_actor, eval_env, eval_episodes)))
        evaluator_log.write(row)
        evals.append(row)
        times.evaluation_s += time.perf_counter() - t
        solved = solved_at(evals, config.target_return, config.target_streak) is not None
        stop = bool(on_eval(row)) if on_eval is not None else False
        return stop or solved

    last_metrics: dict[str, Any] = {}

    def log_learner() -> None:
        nonlocal learner_window
        now = time.perf_counter()
        rate = (learner.steps - learner_window[1]) / max(now - learner_window[0], 1e-9)
        row = {"learner_steps": learner.steps, "actor_steps": times.env_steps, "wall_clock_s": round(now - start, 3),
               "steps_per_s": round(rate, 2)}
        row.update({k: float(v) for k, v in last_metrics.items() if k != "priorities"})
        learner_log.write(row)
        learner_window = (now, learner.steps)

    def learn() -> None:
        while table.can_sample(batch_size):
            t = time.perf_counter()
            sample = table.sample(batch_size, timeout=0.0)
            t1 = time.perf_counter()
            metrics = learner.step(sample)
            if sync_learner:
                jax.block_until_ready(metrics)
            if prioritized:
                table.update_priorities(sample.keys, metrics["priorities"])
            t2 = time.perf_counter()
            times.sample_s += t1 - t
            times.learner_s += t2 - t1
            times.learner_steps += 1
            last_metrics.update(metrics)
            if learner.steps % LEARNER_LOG_EVERY == 0:
                log_learner()

    times.env_step_s += loop.reset()
    episodes = 0
    step = 0
    try:
        with _progress(max_actor_steps, progress) as bar:
            while step < max_actor_steps:
                out = loop.step(actor.select_actions)
                prev, step = step, step + num_envs
                t = time.perf_counter()
                if out.transitions:
                    _insert(table, out.transitions, learn)
                times.policy_s += out.policy_s
                times.env_step_s += out.env_s
                times.insert_s += out.adder_s + time.perf_counter() - t
                times.env_steps = step
                learn()

                for episode in out.episodes:
                    episodes += 1
                    actor_log.write({"actor_steps": step, "episodes": episodes,
                                     "wall_clock_s": round(time.perf_counter() - start, 3),
                                     "episode_return": episode.episode_return, "episode_length": episode.length,
                                     "exploration": _exploration(actor),
                                     "learner_steps": learner.steps})

                if _crossed(prev, step, update_period):
                    qp = channel.pull()
                    t = time.perf_counter()
                    actor.update(qp)
                    times.load_s += time.perf_counter() - t
                    times.updates += 1

                stop = False
                if _crossed(prev, step, eval_every) or step >= max_actor_steps:
                    stop = run_evaluation(step)
                    bar.set_postfix(eval_return=f"{evals[-1]['return']:.1f}", learner_steps=learner.steps,
                                    refresh=False)
                if _crossed(prev, step, 100) or step >= max_actor_steps or stop:
                    bar.update(min(step, max_actor_steps) - bar.n)
                if stop:
                    break
        if last_metrics and learner.steps % LEARNER_LOG_EVERY:
            log_learner()  # the final state, whatever the log period
    finally:
        for log in (evaluator_log, learner_log, actor_log):
            log.close()
        energy_result = stop_tracking(tracker)
        loop.close()
        eval_env.close()

    wall = time.perf_counter() - start
    final_params = learner.policy_params()  # one device-to-host copy, for the fp32 size and the saved policy
    fp32_bytes = fp32_payload_nbytes(final_params, version=max(channel.version, 0), spec_hash=spec.digest())
    returns = [row["return"] for row in evals]
    summary = {
        "agent": config.agent,
        "task": task,
        "precision": prec,
        "backend": actor.backend,
        "kernel": getattr(actor, "kernel", None),  # integer kernel form + self-check (None on float runs)
        "seed": seed,
        "config": jsonable(dataclasses.asdict(agent_config)),
        "actor_steps": times.env_steps,  # a multiple of envs_per_actor: the last step may pass max_actor_steps
        "envs_per_actor": num_envs,
        "learner_steps": learner.steps,
        "episodes": episodes,
        "wall_clock_s": round(wall, 3),
        "train_clock_s": round(wall - times.evaluation_s, 3),
        "sync_learner": bool(sync_learner),
        "env_steps_per_s": round(times.env_steps / max(wall, 1e-9), 2),
        "final_eval_return": returns[-1],
        "best_eval_return": max(returns),
        "evaluations": len(evals),
        "eval_episodes": eval_episodes,
        "actor_update_period": update_period,
        "weight_updates": times.updates,
        "weights_version": channel.version,  # the learner step of the last published weights, as on Ray
        "payload_bytes": channel.payload_bytes,
        "payload_bytes_fp32": fp32_bytes,
        "payload_compression": round(fp32_bytes / max(1, channel.payload_bytes), 3),
        "runtime": times.summary(),
        "table": {k: v for k, v in table.info().items() if isinstance(v, (int, float, str))},
        "energy": energy_result,
    }
    if fp32_actor is not None:
        summary["final_eval_return_fp32"] = evals[-1]["return_fp32"]
    # The trained fp32 policy, for offline analysis (`python -m launch.ptq --checkpoint LOGDIR`).
    summary["policy_file"] = save_policy(
        logdir, spec, final_params, task=task, agent=summary["agent"], steps=int(learner.steps),
        extra={"seed": seed, "precision": prec, "final_eval_return": returns[-1]}).name
    summary["experiment"] = config.to_dict()
    write_json_atomic(logdir / "summary.json", summary)
    return summary


def _crossed(before: int, after: int, period: int) -> bool:
    """Whether a multiple of `period` lies in (before, after]: periodic work keyed on env-step counts that
    advance K at a time (with K=1, `after % period == 0`)."""
    return after // period > before // period


def _exploration(actor: Any) -> float:
    """The actor's current exploration setting: epsilon (DQN) or Gaussian sigma (D4PG); NaN if neither."""
    for name in ("epsilon", "sigma"):
        value = getattr(actor, name, None)
        if isinstance(value, (int, float, np.floating)):
            return round(float(value), 5)
    return math.nan


def _insert(table: Any, transitions: Any, learn: Callable[[], None]) -> None:
    """Stacks the adder's transitions into columns and inserts them, letting the learner catch up first if
    the rate limiter would block (it cannot in this loop, but a stuck insert must never hang a run)."""
    items = transitions if isinstance(transitions, (list, tuple)) else [transitions]
    if len(items) == 1:  # the common case: a leading axis is a view, not a copy
        batch = {k: np.asarray(v)[None] for k, v in items[0].items()}
    else:
        batch = {k: np.stack([np.asarray(t[k]) for t in items]) for k in items[0]}
    if not table.can_insert(len(items)):
        learn()
    table.insert(batch, timeout=60.0)
