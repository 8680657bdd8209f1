"""The on-policy learner node (PPO, A2C): the fp32 learner trained on the rollouts its quantized actors hand out,
with no replay in between.

Rollouts come through a `RolloutInbox`: one thread per actor waits for that actor's next rollout and puts it into
one bounded queue, so the training thread waits on the queue, never on one actor's round trip.

Two modes (`DistributedConfig.rollout_mode`):

    sync   the learner waits for one rollout of its current weights version from every live actor, joins them
           along the environment axis ([T, N*K]) and runs one update on them: PPO with N*K environments, exactly
           (each actor waits for the new version before it acts again).
    async  IMPALA-style: each rollout is one update as it comes, unless its weights are more than `max_staleness`
           versions older than the learner's: then it is dropped and counted. Actors keep acting meanwhile.

The version published after update u is u (learner steps are updates), so a rollout's lag is the learner's step
count when it trains on the rollout minus the version the rollout was acted with. How the update corrects for the
gap between the fp32 learner and the quantized (and, async, stale) behaviour policy is the agent's `correction`
(`agents.ppo.learning`); the mismatch it saw is logged with every update (learner.csv) and summed up in
summary.json's `learner.on_policy`.

No rollout is dropped at a stop: the learner takes what its actors still hold and trains on it before it saves
and publishes its final policy (a synchronous learner then trains on the part of the set that came). The run has
no checkpoint to resume from: an on-policy learner's state is its weights, saved as policy_fp32.qrlp.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Mapping, Sequence, cast

import numpy as np

from launch.distributed.nodes.base import POLL_S, NodeRecord, counter_totals, csv_logger, energy_tracker, log_event
from launch.distributed.nodes.learner import INT8, LearnerNode
from launch.distributed.nodes.rollout_actor import HandedRollout, RolloutActorClient
from launch.experiments.agent_spec import AgentSpec
from launch.experiments.config import ROLLOUT_MODES
from launch.program.graph import CallFuture, NodeHandle, NodeLost, connect, result_as, submit
from quarl.ops.carbon import stop_tracking
from quarl.ops.io import JSONValue
from quarl.ops.logs import Logger
from quarl.quant.precision import Precision
from quarl.replay.items import Rollout, concat_rollouts

if TYPE_CHECKING:
    from agents.base import Learner
    from quarl.envs.spec import EnvSpec

DRAIN_S = 3.0  # at a stop: how long the learner keeps taking what its (stopped) actors still hold


def merge_rollouts(items: Sequence[HandedRollout]) -> Rollout:
    """One rollout from several actors' [T, K, ...] rollouts, joined along the environment axis ([T, sum K, ...]) in
    the order given: what a single process stepping all those environments in lock-step would have collected."""
    return concat_rollouts([it["rollout"] for it in items])


class FairSlots:
    """A counting semaphore that serves its waiters first come, first served. `threading.Semaphore` is not fair:
    a thread that releases and at once acquires again wins over one already waiting, so one busy inbox thread
    could keep the only slot of an asynchronous learner for minutes while another actor's rollout waited."""

    def __init__(self, value: int):
        self._free = int(value)
        self._waiting: collections.deque[object] = collections.deque()
        self._cond = threading.Condition()

    def acquire(self, timeout: float) -> bool:
        ticket = object()
        with self._cond:
            self._waiting.append(ticket)
            try:
                got = self._cond.wait_for(lambda: self._free > 0 and self._waiting[0] is ticket, max(0.0, timeout))
                if got:
                    self._free -= 1
                return got
            finally:
                self._waiting.remove(ticket)
                self._cond.notify_all()  # the next in line may go now

    def release(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()


class RolloutInbox:
    """One thread per actor taking its finished rollouts into one queue, at most `capacity` taken and not yet
    handed to the learner: a thread claims a slot only once its actor has a rollout ready, and slots go first
    come, first served (`FairSlots`), so with `capacity` 1 an asynchronous learner trains on rollouts in the order
    they became ready, each of which waited in its actor's outbox and nowhere else (fresh data), and with one slot
    per actor a synchronous learner gets every actor's rollout at once.

    `lost` holds the actors whose process is gone for good (their calls raise `NodeLost`), `finished` those whose
    run has ended with nothing left to take; an actor that is restarting (Ray refuses calls meanwhile) is neither,
    and is asked again."""

    def __init__(self, actors: Sequence[NodeHandle], capacity: int = 1, logdir: str | None = None):
        self._actors = [connect(a, RolloutActorClient) for a in actors]
        self._queue: queue.Queue[HandedRollout] = queue.Queue()
        self._slots = FairSlots(max(1, int(capacity)))
        self._stop = threading.Event()
        self._logdir = logdir
        self.lost: set[int] = set()
        self.finished: set[int] = set()
        self._threads = [threading.Thread(target=self._loop, args=(i,), name=f"inbox-{i}", daemon=True)
                         for i in range(len(self._actors))]

    def start(self) -> "RolloutInbox":
        for t in self._threads:
            t.start()
        return self

    @property
    def live(self) -> set[int]:
        """Actors that may still hand out rollouts."""
        return set(range(len(self._actors))) - self.lost - self.finished

    def get(self, timeout: float = POLL_S) -> HandedRollout | None:
        try:
            item = self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        self._slots.release()
        return item

    def empty(self) -> bool:
        return self._queue.empty()

    def close(self, timeout: float = 2.0) -> list[HandedRollout]:
        """Stops the threads and returns the rollouts still queued (in arrival order)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        left = []
        while True:
            try:
                left.append(self._queue.get_nowait())
            except queue.Empty:
                return left

    def _loop(self, i: int) -> None:
        actor, name = self._actors[i], f"actor_{i}"
        while not self._stop.is_set():
            holding = False
            try:
                if not actor.ready(POLL_S):  # wait for the actor holding no slot
                    (self.finished.add if actor.finished() else self.finished.discard)(i)
                    continue
                if not self._slots.acquire(POLL_S):
                    continue
                holding = True
                item = actor.take(0.0)
            except NodeLost as e:
                if holding:
                    self._slots.release()
                self.lost.add(i)
                log_event(self._logdir, "learner", f"{name} is lost ({e}); learning goes on with the other actors",
                          logging.WARNING)
                return
            except Exception:  # pylint: disable=broad-except  (restarting: Ray refuses calls until it is back)
                if holding:
                    self._slots.release()
                self._stop.wait(POLL_S)
                continue
            if item is None:  # taken from under us by a restart: ask again
                self._slots.release()
                continue
            self.finished.discard(i)
            self._queue.put(cast(HandedRollout, result_as(dict, item, f"{name}.take")))


class RolloutLearnerNode(LearnerNode):
    """The on-policy learner; see the module docstring. `actors` are the run's `RolloutActorNode`s, in id order;
    `precision` the actors' (a name still parses)."""

    def __init__(self, spec: AgentSpec, seed: int, actors: Sequence[NodeHandle], counter: NodeHandle,
                 weights: NodeHandle, logdir: str, precision: Precision = INT8, mode: str = "sync",
                 max_staleness: int = 4, max_actor_steps: int = 0, envs_per_actor: int = 1,
                 run_config: Mapping[str, JSONValue] | None = None, log_every_s: float = 1.0,
                 publish_min_interval_s: float = 0.0):
        if mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {', '.join(ROLLOUT_MODES)}, got {mode!r}")
        if int(max_staleness) < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness!r}")
        self._actors = list(actors)
        self._mode, self._max_staleness = mode, int(max_staleness)
        self._max_actor_steps, self._envs_per_actor = int(max_actor_steps), int(envs_per_actor)
        super().__init__(spec, seed, None, counter, weights, logdir, precision, publish_period=1, prefetch=1,
                         run_config=run_config, log_every_s=log_every_s, steps_per_call=1,
                         publish_min_interval_s=0.0 if mode == "sync" else publish_min_interval_s)
        self.stats: dict[str, float] = {"rollouts_trained": 0, "stale_dropped": 0, "lag_sum": 0, "lag_max": 0,
                                        "wait_s": 0.0, "update_s": 0.0}
        self._mismatch: dict[str, list[float]] = {}
        self._held: list[HandedRollout] = []  # a synchronous set a stop cut short: trained on at the drain
        self._counts: collections.deque[CallFuture] = collections.deque()  # learner-step reports in flight

    def _make_learner(self, env_spec: EnvSpec, seed: int) -> Learner:
        """Sized to the run, so `anneal_lr` ends at the run's last update: a synchronous update takes one rollout
        of every actor, an asynchronous one a single rollout."""
        envs = self._builder.num_envs(self._envs_per_actor)
        if self._mode == "sync":
            envs *= max(1, len(self._actors))
        return self._builder.make_learner(env_spec, seed, max_actor_steps=self._max_actor_steps, num_envs=envs)

    def run(self) -> NodeRecord:
        tracker = energy_tracker(self._logdir, "learner")
        log = csv_logger(self._logdir, "learner", None, "learner_steps")
        inbox = RolloutInbox(self._actors, len(self._actors) if self._mode == "sync" else 1, self._logdir).start()
        t_origin = time.monotonic() - counter_totals(self._counter)["wall_clock_s"]
        start_steps = self.steps()
        t_first: float | None = None
        started_at: float | None = None
        policy_file: str | None = None
        try:
            self._compile()
            self.publish_now()  # the first version, before any training (actors wait for it)
            started_at = time.monotonic() - t_origin
            while not self._stop.is_set():
                self._publisher.check()  # a failed publication stops the learner with its error
                t0 = time.perf_counter()
                items = self._next_sync(inbox) if self._mode == "sync" else self._next_async(inbox)
                if t_first is not None:  # waiting for rollouts once training runs (the first takes an actor start)
                    self.stats["wait_s"] += time.perf_counter() - t0
                if items:
                    t_first = t_first or time.monotonic()
                    self._train(items, log, t_origin)
            # A stop: train on what the actors still hold, then the final policy.
            for items in self._drain(inbox):
                self._train(items, log, t_origin)
            policy_file = self.save_final_policy()
            for future in self._counts:  # every update counted before the run's totals are read
                future.result(timeout=10)
        except BaseException as e:
            self._stopped_by(e, policy_file)
            raise
        finally:
            self._stop.set()
            inbox.close()
            self._publisher.close()
            log.close()
            energy = stop_tracking(tracker)
        result = self._result(start_steps, t_first, self.stats["update_s"], self.stats["wait_s"], policy_file, energy)
        training_s = result["training_s"]
        assert isinstance(training_s, float)  # `_result`'s
        result["on_policy"] = {**self.on_policy_summary(training_s, inbox), "started_at_s": started_at}
        return result

    def _compile(self) -> None:
        """Compiles the update for the rollouts to come before the first version goes out, so the actors' first
        rollout does not wait for compilation (3.5 s for CartPole's PPO on 2 cores): a synchronous update takes
        [T, N*K] steps, an asynchronous one [T, K]."""
        env_spec = self._spec.env_spec()
        steps = int(self._builder.config.num_steps)
        envs = self._builder.num_envs(self._envs_per_actor) * (len(self._actors) if self._mode == "sync" else 1)
        obs = np.zeros((steps, envs, *env_spec.observation_shape), np.float32)
        shape, dtype = self._builder.action_column(env_spec)
        flat = np.zeros((steps, envs), np.float32)
        self._learner.compile(Rollout(observation=obs, action=np.zeros((steps, envs, *shape), dtype), reward=flat,
                                      discount=flat, last=flat, next_observation=obs, behaviour_logp=flat))

    def on_policy_summary(self, training_s: float, inbox: RolloutInbox) -> dict[str, object]:
        """What summary.json records under learner.on_policy: the mode, the correction, the rollouts trained on
        and dropped, their lag, the learner's share of time spent waiting for rollouts, and the mismatch
        between the learner's and the behaviour policy over the run (means of the per-update figures). `run`
        adds `started_at_s`: the run clock when the first version went out, i.e. when acting could begin (what
        a peer's clock that starts at its first training iteration compares with)."""
        config = self._builder.config
        trained = int(self.stats["rollouts_trained"])
        return {"mode": self._mode, "correction": getattr(config, "correction", "none"),
                "is_cap": getattr(config, "is_cap", None),
                "vtrace_rho_bar": getattr(config, "vtrace_rho_bar", None),
                "vtrace_c_bar": getattr(config, "vtrace_c_bar", None),
                "max_staleness": self._max_staleness if self._mode == "async" else 0,
                "rollouts_trained": trained, "stale_dropped": int(self.stats["stale_dropped"]),
                "lag_mean": self.stats["lag_sum"] / trained if trained else None, "lag_max": int(self.stats["lag_max"]),
                "wait_frac": min(1.0, self.stats["wait_s"] / training_s) if training_s > 0 else None,
                "actors_lost": sorted(f"actor_{i}" for i in inbox.lost),
                "mismatch": {k: float(np.mean(v)) for k, v in self._mismatch.items() if v}}

    # -------------------------------------------------------------- taking rollouts

    def _fresh(self, item: HandedRollout) -> bool:
        """Whether `item` may be trained on now (else it is counted as stale and dropped)."""
        lag = self.steps() - int(item["weights_version"])
        limit = 0 if self._mode == "sync" else self._max_staleness
        if 0 <= lag <= limit:
            return True
        self.stats["stale_dropped"] += 1
        return False

    def _next_sync(self, inbox: RolloutInbox) -> list[HandedRollout]:
        """One rollout of the current version from every live actor (fewer if actors finished or were lost
        meanwhile); [] when stopped first."""
        got: dict[int, HandedRollout] = {}
        while not self._stop.is_set():
            item = inbox.get(0.02 if got else POLL_S)
            if item is not None:
                if self._fresh(item):
                    got[int(item["actor_id"])] = item  # a restarted actor's newer rollout replaces its older one
                continue
            if got and inbox.empty() and inbox.live <= set(got):
                break
        if self._stop.is_set():
            self._held = list(got.values())
            return []
        return [got[i] for i in sorted(got)]

    def _next_async(self, inbox: RolloutInbox) -> list[HandedRollout]:
        item = inbox.get(POLL_S)
        return [item] if item is not None and self._fresh(item) else []

    def _drain(self, inbox: RolloutInbox) -> list[list[HandedRollout]]:
        """At a stop: the updates still owed on what the actors hold (taken for at most DRAIN_S), fresh rollouts
        only. Sync: one partial set of the current version; async: one update per rollout."""
        held, self._held = self._held, []
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and (inbox.live or not inbox.empty()):
            item = inbox.get(0.05)
            if item is not None:
                held.append(item)
        held += inbox.close()
        fresh = [it for it in held if self._fresh(it)]
        if self._mode == "async":
            return [[it] for it in fresh]
        by_actor = {int(it["actor_id"]): it for it in fresh}
        return [[by_actor[i] for i in sorted(by_actor)]] if by_actor else []

    # -------------------------------------------------------------- training

    def _train(self, items: Sequence[HandedRollout], log: Logger, t_origin: float) -> None:
        """One update on `items` (one set in sync mode, one rollout in async mode), then its weights version."""
        t0 = time.perf_counter()
        with self._lock:
            before = self.steps()
            metrics = self._learner.step(merge_rollouts(items))
            steps = self.steps()
        values = {k: float(np.asarray(v).reshape(-1)[-1]) for k, v in metrics.items() if np.ndim(v) <= 1}
        self.stats["update_s"] += time.perf_counter() - t0
        lags = [before - int(it["weights_version"]) for it in items]
        self.stats["rollouts_trained"] += len(items)
        self.stats["lag_sum"] += sum(lags)
        self.stats["lag_max"] = max(self.stats["lag_max"], *lags)
        for key in ("is_ratio_mean", "is_ratio_std", "is_ratio_max", "is_truncated_frac", "kl_learner_behaviour"):
            if key in values:
                self._mismatch.setdefault(key, []).append(values[key])
        if self._mode == "sync":
            self.publish_now()  # the actors wait for it
        elif self._publisher.due():
            self._offer()
        self._counts.append(submit(self._counter).increment(learner_steps=steps - before))
        while self._counts and self._counts[0].done():
            self._counts.popleft().result()
        log.write({"learner_steps": steps, "wall_clock_s": round(time.monotonic() - t_origin, 3),
                   "weights_version": self._version, "rollouts": len(items), "lag_mean": float(np.mean(lags)),
                   "stale_dropped": int(self.stats["stale_dropped"]), **values})
