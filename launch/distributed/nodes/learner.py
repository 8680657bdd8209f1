"""The fp32 learner node: trains on sampled batches, K SGD steps per call, and publishes weight versions
(version = learner step) through a publisher thread."""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Mapping

import jax
import numpy as np
from chex import ArrayTree

from agents.base import Learner, replay_builder
from agents.learner_base import Metrics, to_numpy
from agents.loops import loop_form_record, use_loop_form
from launch.experiments import checkpoint as ckpt
from launch.experiments.acting import crossed  # the one cadence rule: log, publish and checkpoint as steps advance by K
from launch.distributed.nodes.base import (
    POLL_S, NodeBase, counter_totals, csv_logger, energy_tracker, log_event, replay_saver,
)
from launch.distributed.nodes.kept_versions import KeptVersions
from launch.distributed.nodes.learner_feed import (  # noqa: F401  (K's defaults, re-exported for the program)
    STEPS_PER_CALL_BY_PLATFORM, STEPS_PER_CALL_OTHER, BlockFeed, PriorityUpdates, default_steps_per_call,
)
from launch.distributed.nodes.publisher import PublishTimes, Publisher
from launch.distributed.nodes.shared_blob import Blob
from launch.experiments.agent_spec import AgentSpec
from launch.experiments.summary import FinalPolicy, final_policy_record
from launch.distributed.clients import CounterClient, ReplayClient, WeightServerClient
from launch.program.graph import NodeHandle, connect, submit
from quarl.ops.carbon import stop_tracking
from quarl.ops.logs import Logger
from quarl.quant import policy_io
from quarl.quant.calibration import learner_observations, needs_calibration, with_activation_ranges
from quarl.quant.device import quantize_params_on_device
from quarl.quant.payload import encode_payload, fp32_payload_nbytes
from quarl.quant.precision import Precision, parse_precision
from quarl.quant.quantization import quantize_params

if TYPE_CHECKING:
    from quarl.envs.spec import EnvSpec

FINAL_PUBLISH_TIMEOUT_S = 60.0
INT8 = parse_precision("int8")  # the actors' precision unless the run says otherwise
# What the training thread hands the publisher: the policy's device snapshot, the observations that calibrate
# an int conv policy's activations (empty for every other policy) and the agent's payload extras of that version.
Offered = tuple[ArrayTree, tuple[np.ndarray, ...], dict[str, np.ndarray]]

# Blocks dispatched but not yet run that the training thread allows. XLA lets tens of calls queue up: the
# publisher's snapshot then waited for all of them (2.7-7 s per 2048x3 version on the 2-core EPYC), so actors got
# weights older than their version, and the step count ran ahead of the device. Two keep the device busy.
MAX_BLOCKS_IN_FLIGHT = 2


def _import_orbax() -> None:
    with contextlib.suppress(Exception):  # a failure here is the checkpoint's to report
        import orbax.checkpoint  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import


class LearnerNode(NodeBase):
    """The fp32 learner and the source of weight versions (version = learner step at publication).

    The training thread runs blocks of `steps_per_call` SGD steps (by default chosen per device) that `BlockFeed`
    threads sampled and moved to the device ahead of time; every `publish_period` steps (at most once per
    `publish_min_interval_s` seconds) it hands a device snapshot of the policy to the `Publisher` thread, which
    quantizes, encodes and publishes it. `precision`: the actors' (a name still parses)."""

    LOG_FIELDS = ["learner_steps", "wall_clock_s", "steps_per_s", "weights_version",
                  "sample_wait_frac", "loss", "critic_loss", "policy_loss", "q_mean", "td_abs_mean",
                  "grad_norm"]

    def __init__(self, spec: AgentSpec, seed: int, replay: NodeHandle, counter: NodeHandle,
                 weights: NodeHandle, logdir: str, precision: Precision = INT8, publish_period: int = 10,
                 prefetch: int = 2, checkpoint_every: int = 0, resume: str | None = None,
                 run_config: Mapping[str, object] | None = None, log_every_s: float = 1.0,
                 steps_per_call: int | None = None, publish_min_interval_s: float = 0.0, publish: bool = True):
        self._spec = spec
        self._builder = spec.builder()
        env_spec = spec.env_spec()
        self._policy_spec = self._builder.policy_spec(env_spec)
        use_loop_form(str((run_config or {}).get("learner_loop", "auto")))  # read when the update is traced
        self._learner: Learner = self._make_learner(env_spec, seed)
        self._replay = replay  # a handle (None: on-policy): the feed and the priority updates connect to it
        self._counter, self._weights = connect(counter, CounterClient), connect(weights, WeightServerClient)
        self._precision = parse_precision(precision)
        self._spec_hash = self._policy_spec.digest()
        self._fp32_nbytes = 0
        self.publish_times = PublishTimes()
        self._logdir = logdir
        self._publish_period = max(1, int(publish_period))
        self._publish_enabled = bool(publish)  # False: only benchmarks (bench.system.learner_in_program) turn it off
        self._prefetch = max(1, int(prefetch))
        # None: K chosen for the learner's device (`default_steps_per_call`); the run's summary records it.
        self._steps_per_call = max(1, int(default_steps_per_call() if steps_per_call is None else steps_per_call))
        self._checkpoint_every = int(checkpoint_every)
        self._run_config = dict(run_config or {})
        self._log_every_s = float(log_every_s)
        self._stop = threading.Event()
        # The learner state vs. other threads. Held only for O(1) work (a dispatch, reading references), never
        # across a device wait: the training thread takes it for every block and every handoff. (`checkpoint`
        # copies the state to the host under it, which a donating update must not race; the training thread
        # calls it itself.)
        self._lock = threading.Lock()
        # (steps, an output of the last dispatched block): when that output is ready, `steps` steps have run.
        self._dispatched: tuple[int, jax.Array | None] = (int(self._learner.steps), None)
        self._version = -1
        self._kept = KeptVersions()  # versions evaluations pinned: a solved run ends on its solving one
        self._final_version: int | None = None
        self.final_policy: FinalPolicy | None = None  # which version the final policy is, and why
        self._publisher: Publisher[Offered] = Publisher(self._publish_version, publish_min_interval_s, name="publisher")
        self.resumed_from: int | None = None
        if resume:
            directory = ckpt.find_checkpoint(resume)
            manifest = ckpt.read_manifest(directory)
            state = ckpt.restore_learner(directory / ckpt.LEARNER_DIR, self._learner.get_state())
            self._learner.restore(state)
            self.resumed_from = int(manifest["learner_steps"])

    def _make_learner(self, env_spec: EnvSpec, seed: int) -> Learner:
        """The agent's learner (a subclass may size it to the run: `RolloutLearnerNode`)."""
        return self._builder.make_learner(env_spec, seed)

    # -------------------------------------------------------------- control

    def stop(self, final_version: int | None = None) -> None:
        """Ends `run()`. `final_version`: the run is solved by evaluations of that weights version; it becomes the
        final policy (saved, and nothing newer published) if it was pinned, else the learner's newest weights do."""
        self._final_version = None if final_version is None else int(final_version)
        self._stop.set()

    def pin(self, version: int) -> bool:
        """Keeps version `version`'s fp32 snapshot for a solved run's final policy; False: no longer held."""
        return self._kept.pin(version)

    def steps(self) -> int:
        return int(self._learner.steps)

    def synced_steps(self) -> int:
        """Learner steps completed on the device (waits for those dispatched when called): for rate measurements.

        Waits outside the lock, on an output of the last dispatched block, so training and the publisher handoff go
        on meanwhile. Holding the lock through the wait stalled the training thread for the whole device queue:
        one 2048x3 handoff took 0.9 s on the 2-core EPYC, the 49 ms average bench.system.learner_in_program reported."""
        with self._lock:
            steps, marker = self._dispatched
            if marker is None:  # no block yet, or its outputs all came to the host: nothing of it is in flight
                self._learner.wait()
                return int(self._learner.steps)
        jax.block_until_ready(marker)
        return steps

    # -------------------------------------------------------------- main loop

    def run(self) -> dict[str, object]:
        # orbax takes seconds to import: do it now, off the training thread, not in the final checkpoint
        # (which after Ctrl-C has a few seconds at most).
        threading.Thread(target=_import_orbax, name="import-orbax", daemon=True).start()
        tracker = energy_tracker(self._logdir, "learner")
        log = csv_logger(self._logdir, "learner", self.LOG_FIELDS, "learner_steps")
        prioritized = self.sampler_is_prioritized()
        feed = BlockFeed(self._replay, self._learner.prepare, int(self._builder.config.batch_size),
                         self._steps_per_call, threads=self._prefetch).start()
        try:
            self.publish_now()  # the first version, before any training (actors wait for it)
        except BaseException:
            feed.close()
            self._publisher.close()
            log.close()
            stop_tracking(tracker)
            raise
        t_origin = time.monotonic() - counter_totals(self._counter)["wall_clock_s"]
        start_steps = reported = self.steps()
        wait_s = step_s = 0.0
        t_first: float | None = None  # first learner step (after replay reached its minimum size)
        last_log = (time.monotonic(), start_steps, 0.0)
        priorities = PriorityUpdates(self._replay)
        in_flight: collections.deque[jax.Array] = collections.deque()  # one device array per dispatched block
        counter_future = None
        publish_owed = False
        last_report = 0.0
        policy_file: str | None = None
        metrics: Metrics = {}
        try:
            while not self._stop.is_set():
                self._publisher.check()  # a failed publication stops the learner with its error
                t0 = time.perf_counter()
                block = feed.get(timeout=POLL_S)
                if block is None:
                    wait_s += time.perf_counter() - t0
                    continue
                t1 = time.perf_counter()
                with self._lock:
                    before = int(self._learner.steps)
                    metrics = self._learner.run_block(block)
                    steps = int(self._learner.steps)
                    self._dispatched = (steps, self._done_marker(metrics))
                self._bound_in_flight(in_flight, metrics)
                step_s += time.perf_counter() - t1
                now = time.monotonic()
                if t_first is None:
                    t_first, last_log = now, (now, before, wait_s)
                else:
                    wait_s += t1 - t0
                if prioritized and "priorities" in metrics:  # each sampled batch's own priorities, in order
                    prios = np.reshape(np.asarray(metrics["priorities"]), block.keys.shape)
                    priorities.add(block.keys.reshape(-1), prios.reshape(-1))
                priorities.poll()
                publish_owed = publish_owed or crossed(before, steps, self._publish_period)
                if publish_owed and self._publish_enabled and self._publisher.due():
                    self._offer()
                    publish_owed = False
                if now - last_report >= POLL_S and (counter_future is None or counter_future.done()):
                    counter_future = submit(self._counter).increment(learner_steps=steps - reported)
                    reported, last_report = steps, now
                if now - last_log[0] >= self._log_every_s:
                    self._log_row(log, metrics, steps, now - t_origin, last_log, now, wait_s)
                    last_log = (now, steps, wait_s)
                if self._checkpoint_every and crossed(before, steps, self._checkpoint_every):
                    self.checkpoint()
            feed.close()
            if t_first is not None and self.steps() > last_log[1]:  # the last (partial) window
                now = time.monotonic()
                self._log_row(log, metrics, self.steps(), now - t_origin, last_log, now, wait_s)
            # Final weights for the final evaluation; final checkpoint.
            priorities.flush(timeout=10)
            if counter_future is not None:
                counter_future.result(timeout=10)
            self._counter.increment(learner_steps=self.steps() - reported)
            policy_file = self.save_final_policy()  # first: the cheapest and most useful thing to have after Ctrl-C
            self.checkpoint()  # the training state at its newest step (what --resume continues from)
        except BaseException as e:
            self._stopped_by(e, policy_file)
            raise
        finally:
            self._stop.set()
            feed.close()
            self._publisher.close()
            log.close()
            energy = stop_tracking(tracker)
        return self._result(start_steps, t_first, step_s, wait_s, policy_file, energy)

    def _stopped_by(self, error: BaseException, policy_file: str | None) -> None:
        """A run ended by `error`: the policy is saved if it was not yet (the learner itself may be fine, e.g. a
        lost replay server) and events.log says why."""
        if policy_file is None:
            try:
                self.save_policy()
            except Exception:  # pylint: disable=broad-except
                pass  # e.g. non-finite weights: the original error is the one to report
        log_event(self._logdir, "learner", f"stopped by an error: {type(error).__name__}: "
                                           f"{str(error).splitlines()[0] if str(error) else ''}", logging.WARNING)

    def _result(self, start_steps: int, t_first: float | None, step_s: float, wait_s: float,
                policy_file: str | None, energy: object) -> dict[str, object]:
        """What `run` returns (summary.json's learner section): steps, rates and where the time went."""
        trained = self.steps() - start_steps
        training_s = time.monotonic() - t_first if t_first is not None else 0.0
        return {"learner_steps": self.steps(), "steps_this_run": trained, "training_s": training_s,
                "steps_per_s": trained / training_s if training_s > 0 else 0.0,
                "step_s": step_s, "step_s_mean": step_s / trained if trained else 0.0, "sample_wait_s": wait_s,
                "steps_per_call": self._steps_per_call, "weights_version": self._version,
                "resumed_from": self.resumed_from, "policy_file": policy_file, "final_policy": self.final_policy,
                "publish": self.publish_times.summary(), "publish_handoff": self.publish_times.handoff(),
                "energy": energy, "loop_form": loop_form_record()}

    @staticmethod
    def _done_marker(metrics: Metrics) -> jax.Array | None:
        """One device output of a block (ready once the block has run: outputs of one call become ready
        together), or None when its metrics were all brought to the host."""
        return next((v for v in metrics.values() if isinstance(v, jax.Array)), None)

    @classmethod
    def _bound_in_flight(cls, in_flight: collections.deque[jax.Array], metrics: Metrics) -> None:
        """Waits until at most `MAX_BLOCKS_IN_FLIGHT` dispatched blocks have not yet run on the device."""
        done = cls._done_marker(metrics)
        if done is not None:
            in_flight.append(done)
        while len(in_flight) > MAX_BLOCKS_IN_FLIGHT:
            jax.block_until_ready(in_flight.popleft())

    def save_final_policy(self) -> str:
        """The run's final policy, saved and published for the final evaluation: the newest weights, or, when the run
        stopped because evaluations of a pinned version solved it, that version (already published; nothing newer
        goes out). `self.final_policy` records which, for summary.json. Returns the policy file's path."""
        solved, trained_to = self._final_version, self.steps()
        kept = self._kept.pinned(solved)
        if kept is not None:
            path = self.save_policy((solved, kept))
            log_event(self._logdir, "learner", f"final policy: weights version {solved}, the one that solved the run")
        else:
            path = self.save_policy()
            self.publish_now()
        self.final_policy = final_policy_record(self._version if kept is None else solved, trained_to, solved)
        return path

    def save_policy(self, version_params: tuple[int, ArrayTree] | None = None) -> str:
        """The current fp32 policy (or `version_params`: a kept version and its snapshot) as
        `<logdir>/policy_fp32.qrlp` (+ sidecar), what `launch.ptq --checkpoint LOGDIR` reads (see
        quarl.quant.policy_io). Returns the file's path."""
        if version_params is None:
            with self._lock:  # a snapshot (a reference or an asynchronous device copy); the host copy after
                snapshot = self._learner.policy_snapshot()
                steps = int(self._learner.steps)
        else:
            steps, snapshot = version_params
        params = to_numpy(snapshot)
        run = self._run_config
        extra = {"source": "launch.actorq", "seed": run.get("seed"), "actor_precision": run.get("precision"),
                 "num_actors": (run.get("distributed") or {}).get("num_actors")}
        path = policy_io.save_policy(self._logdir, self._policy_spec, params, task=self._spec.task, agent=self._spec.agent,
                           steps=steps, extra=extra)
        log_event(self._logdir, "learner", f"saved the fp32 policy at learner step {steps} to {path.name}")
        return str(path)

    def sampler_is_prioritized(self) -> bool:
        return replay_builder(self._builder).table_config().get("sampler") == "prioritized"

    # -------------------------------------------------------------- publishing

    def _offer(self) -> None:
        """The training thread's whole share of a publication: a device snapshot of the policy (an asynchronous
        copy, no host transfer) handed to the publisher thread."""
        t0 = time.perf_counter()
        with self._lock:
            params = self._learner.policy_snapshot()
            version = int(self._learner.steps)
            # int conv actors' calibration: references to the last sampled observations, concatenated by the
            # publisher thread (quarl.quant.calibration); empty for every other policy.
            observations = self._calibration_batches()
            extras = self._builder.payload_extras(self._learner)
        self._publisher.offer(version, (params, observations, extras))
        self.publish_times.offered += 1
        self.publish_times.handoff_s += time.perf_counter() - t0

    def publish_now(self, timeout: float = FINAL_PUBLISH_TIMEOUT_S) -> None:
        """Publishes the current weights and waits until they are out (the first and the last version)."""
        self._offer()
        self._publisher.flush(timeout)

    def _calibration_batches(self) -> tuple[np.ndarray, ...]:
        if not needs_calibration(self._policy_spec, self._precision.name):
            return ()
        batches = getattr(self._learner, "calibration_batches", None)
        if batches is not None:  # replay learners: references to their last sampled batches
            return tuple(batches())
        observations = learner_observations(self._learner)  # on-policy learners: their last rollout's
        return () if observations is None else (observations,)

    def _publish_version(self, version: int, offered: Offered) -> None:
        """Publisher thread: quantizes the policy at the actors' precision (integer codes computed on the learner's
        device, only they come to the host), encodes the bytes once, and publishes them (a `Blob`: on Ray one
        object-store object that every actor reads) to the weight server. Non-finite weights fail here: the
        learner stops with that error."""
        params, observations, extras = offered
        t_offered = time.perf_counter()
        jax.block_until_ready(params)  # the steps dispatched before the snapshot: timed apart (no CPU spent)
        t0 = time.perf_counter()
        qparams = (quantize_params_on_device(params, self._precision.name) if self._precision.is_int
                   else quantize_params(params, self._precision))
        qparams = with_activation_ranges(self._policy_spec, qparams,
                                         np.concatenate(observations) if observations else None)
        data = encode_payload(qparams, version=version, spec_hash=self._spec_hash, extras=extras)
        t1 = time.perf_counter()
        blob = Blob.put(data)
        t2 = time.perf_counter()
        if not self._fp32_nbytes:
            self._fp32_nbytes = fp32_payload_nbytes(params, version=version, spec_hash=self._spec_hash)
        self._weights.publish(version, blob, self._fp32_nbytes)
        self.publish_times.add(quantize_encode_s=t1 - t0, put_s=t2 - t1, nbytes=blob.nbytes,
                               ready_wait_s=t0 - t_offered)
        self._version = max(self._version, version)
        self._kept.published(version, params)

    def _log_row(self, log: Logger, metrics: Metrics, steps: int, wall_clock_s: float,
                 last: tuple[float, int, float], now: float, wait_s: float) -> None:
        """One learner.csv row; a block's stacked metrics are logged at its last step (the only host read)."""
        window = max(now - last[0], 1e-9)
        row = {"learner_steps": steps, "wall_clock_s": wall_clock_s, "steps_per_s": (steps - last[1]) / window,
               "weights_version": self._version, "sample_wait_frac": min(1.0, (wait_s - last[2]) / window)}
        row.update({k: float(np.asarray(v).reshape(-1)[-1]) for k, v in metrics.items()
                    if k in self.LOG_FIELDS and np.ndim(v) <= 1})
        log.write(row)

    # -------------------------------------------------------------- checkpoints

    def checkpoint(self) -> str:
        """Learner state + replay snapshot + manifest (see launch.experiments.checkpoint); returns the directory."""
        with self._lock:
            state = self._learner.get_state()
            step = int(self._learner.steps)
        counts = counter_totals(self._counter)
        manifest = {"run_config": self._run_config, "agent_config": ckpt.agent_config_dict(self._builder.config),
                    "weights_version": self._version,
                    "counts": {k: v for k, v in counts.items() if not k.endswith("_starts")}, "saved_at": time.time()}
        save_replay = replay_saver(connect(self._replay, ReplayClient))
        return str(ckpt.write_checkpoint(self._logdir, step=step, learner_state=state, save_replay_to=save_replay,
                                         manifest=manifest))
