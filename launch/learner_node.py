"""The fp32 learner node: trains on sampled batches and publishes weight versions (version = learner step)."""
from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Mapping

import numpy as np

from launch import checkpoint as ckpt
from launch.agent_spec import AgentSpec
from launch.node_base import POLL_S, NodeBase, csv_logger, energy_tracker, log_event, wait_or_stop
from launch.program import NodeHandle
from launch.shared_blob import Blob
from quarl.carbon import stop_tracking
from quarl.payload import encode_payload, fp32_payload_nbytes
from quarl.calibration import learner_observations, quantize_for_actors
from quarl.quantization import parse_precision
from quarl import policy_io
from quarl.replay import TableClosed


@dataclasses.dataclass
class PublishTimes:
    """The learner's side of the weight channel: seconds quantizing + encoding, and publishing the bytes."""

    versions: int = 0
    quantize_encode_s: float = 0.0
    put_s: float = 0.0
    payload_bytes: int = 0

    def add(self, quantize_encode_s: float, put_s: float, nbytes: int) -> None:
        self.versions += 1
        self.quantize_encode_s += quantize_encode_s
        self.put_s += put_s
        self.payload_bytes = int(nbytes)

    def summary(self) -> dict[str, float]:
        n = max(self.versions, 1)
        return {**dataclasses.asdict(self), "quantize_encode_ms_per_version": 1e3 * self.quantize_encode_s / n,
                "put_ms_per_version": 1e3 * self.put_s / n}


def _import_orbax() -> None:
    try:
        import orbax.checkpoint  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except Exception:  # pylint: disable=broad-except
        pass  # the checkpoint itself will report it


class LearnerNode(NodeBase):
    """The fp32 learner and the source of weight versions (version = learner step at publication)."""

    LOG_FIELDS = ["learner_steps", "wall_clock_s", "steps_per_s", "weights_version",
                  "sample_wait_frac", "loss", "critic_loss", "policy_loss", "q_mean", "td_abs_mean",
                  "grad_norm"]

    def __init__(self, spec: AgentSpec, seed: int, replay: NodeHandle, counter: NodeHandle,
                 weights: NodeHandle, logdir: str, precision: str = "int8", publish_period: int = 10,
                 prefetch: int = 2, checkpoint_every: int = 0, resume: str | None = None,
                 run_config: Mapping[str, Any] | None = None, log_every_s: float = 1.0):
        self._spec = spec
        self._builder = spec.builder()
        env_spec = spec.env_spec()
        self._policy_spec = self._builder.policy_spec(env_spec)
        self._learner = self._builder.make_learner(env_spec, seed)
        self._replay, self._counter, self._weights = replay, counter, weights
        self._precision = parse_precision(precision).name
        self._spec_hash = self._policy_spec.digest()
        self._fp32_nbytes = 0
        self.publish_times = PublishTimes()
        self._logdir = logdir
        self._publish_period = max(1, int(publish_period))
        self._prefetch = max(1, int(prefetch))
        self._checkpoint_every = int(checkpoint_every)
        self._run_config = dict(run_config or {})
        self._log_every_s = float(log_every_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # learner state vs. checkpoint/publish from other threads
        self._version = -1
        self.resumed_from: int | None = None
        if resume:
            directory = ckpt.find_checkpoint(resume)
            manifest = ckpt.read_manifest(directory)
            state = ckpt.restore_learner(directory / ckpt.LEARNER_DIR, self._learner.get_state())
            self._learner.restore(state)
            self.resumed_from = int(manifest["learner_steps"])

    # -------------------------------------------------------------- control

    def stop(self) -> None:
        self._stop.set()

    def steps(self) -> int:
        return int(self._learner.steps)

    # -------------------------------------------------------------- main loop

    def run(self) -> dict[str, Any]:
        # orbax takes seconds to import: do it now, off the training thread, not in the final checkpoint
        # (which after Ctrl-C has a few seconds at most).
        threading.Thread(target=_import_orbax, name="import-orbax", daemon=True).start()
        tracker = energy_tracker(self._logdir, "learner")
        log = csv_logger(self._logdir, "learner", self.LOG_FIELDS, "learner_steps")
        batches: queue.Queue = queue.Queue(maxsize=self._prefetch)
        errors: list[BaseException] = []
        batch_size = int(self._builder.config.batch_size)
        prioritized = self.sampler_is_prioritized()
        threads = [threading.Thread(target=self._prefetch_loop, args=(batches, batch_size, errors),
                                    name=f"prefetch-{i}", daemon=True) for i in range(self._prefetch)]
        for t in threads:
            t.start()
        self._publish(wait=True)
        t_origin = time.monotonic() - self._counter.call("get")["wall_clock_s"]
        start_steps = reported = self.steps()
        wait_s = step_s = 0.0
        t_first: float | None = None  # first learner step (after replay reached its minimum size)
        last_log = (time.monotonic(), start_steps, 0.0)
        pending: collections.deque = collections.deque()  # priority updates in flight
        publish_future = counter_future = None
        last_report = 0.0
        policy_file: str | None = None
        try:
            while not self._stop.is_set():
                if errors:
                    raise errors[0]
                t0 = time.perf_counter()
                try:
                    sample = batches.get(timeout=POLL_S)
                except queue.Empty:
                    wait_s += time.perf_counter() - t0
                    continue
                t1 = time.perf_counter()
                with self._lock:
                    metrics = self._learner.step(sample)
                    steps = int(self._learner.steps)
                step_s += time.perf_counter() - t1
                now = time.monotonic()
                if t_first is None:
                    t_first, last_log = now, (now, steps - 1, wait_s)
                else:
                    wait_s += t1 - t0
                if prioritized and "priorities" in metrics:
                    pending.append(self._replay.submit("update_priorities", sample.keys,
                                                       np.asarray(metrics["priorities"])))
                while pending and pending[0].done():
                    pending.popleft().result()
                if steps % self._publish_period == 0 and (publish_future is None or publish_future.done()):
                    if publish_future is not None:
                        publish_future.result()  # surfaces a rejected (non-finite) publication
                    publish_future = self._publish(wait=False)
                if now - last_report >= POLL_S and (counter_future is None or counter_future.done()):
                    counter_future = self._counter.submit("increment", learner_steps=steps - reported)
                    reported, last_report = steps, now
                if now - last_log[0] >= self._log_every_s:
                    self._log_row(log, metrics, steps, now - t_origin, last_log, now, wait_s)
                    last_log = (now, steps, wait_s)
                if self._checkpoint_every and steps % self._checkpoint_every == 0:
                    self.checkpoint()
            if t_first is not None and self.steps() > last_log[1]:  # the last (partial) window
                now = time.monotonic()
                self._log_row(log, metrics, self.steps(), now - t_origin, last_log, now, wait_s)
            # Final weights for the final evaluation; final checkpoint.
            for fut in pending:
                fut.result(timeout=10)
            if counter_future is not None:
                counter_future.result(timeout=10)
            self._counter.call("increment", learner_steps=self.steps() - reported)
            policy_file = self.save_policy()  # first: the cheapest and most useful thing to have after Ctrl-C
            self._publish(wait=True)
            self.checkpoint()
        except BaseException as e:
            if policy_file is None:  # the learner itself may be fine (a lost replay server): keep its policy
                try:
                    policy_file = self.save_policy()
                except Exception:  # pylint: disable=broad-except
                    pass  # e.g. non-finite weights: the original error is the one to report
            log_event(self._logdir, "learner", f"stopped by an error: {type(e).__name__}: "
                                               f"{str(e).splitlines()[0] if str(e) else ''}", logging.WARNING)
            raise
        finally:
            self._stop.set()
            log.close()
            energy = stop_tracking(tracker)
        trained = self.steps() - start_steps
        training_s = time.monotonic() - t_first if t_first is not None else 0.0
        return {"learner_steps": self.steps(), "steps_this_run": trained, "training_s": training_s,
                "steps_per_s": trained / training_s if training_s > 0 else 0.0,
                "step_s": step_s, "step_s_mean": step_s / trained if trained else 0.0, "sample_wait_s": wait_s,
                "weights_version": self._version, "resumed_from": self.resumed_from, "policy_file": policy_file,
                "publish": self.publish_times.summary(), "energy": energy}

    def save_policy(self) -> str:
        """The current fp32 policy as `<logdir>/policy_fp32.qrlp` (+ sidecar), what `launch.ptq --checkpoint
        LOGDIR` reads (see quarl.policy_io). Returns the file's path."""
        with self._lock:
            params = self._learner.policy_params()
            steps = int(self._learner.steps)
        run = self._run_config
        extra = {"source": "launch.actorq", "seed": run.get("seed"), "actor_precision": run.get("precision"),
                 "num_actors": run.get("num_actors")}
        path = policy_io.save_policy(self._logdir, self._policy_spec, params, task=self._spec.task, agent=self._spec.agent,
                           steps=steps, extra=extra)
        log_event(self._logdir, "learner", f"saved the fp32 policy at learner step {steps} to {path.name}")
        return str(path)

    def _log_row(self, log: Any, metrics: Mapping[str, Any], steps: int, wall_clock_s: float,
                 last: tuple[float, int, float], now: float, wait_s: float) -> None:
        window = max(now - last[0], 1e-9)
        row = {"learner_steps": steps, "wall_clock_s": wall_clock_s, "steps_per_s": (steps - last[1]) / window,
               "weights_version": self._version, "sample_wait_frac": min(1.0, (wait_s - last[2]) / window)}
        row.update({k: float(v) for k, v in metrics.items() if k in self.LOG_FIELDS and np.ndim(v) == 0})
        log.write(row)

    def sampler_is_prioritized(self) -> bool:
        return self._builder.table_config().get("sampler") == "prioritized"

    def _prefetch_loop(self, batches: queue.Queue, batch_size: int, errors: list[BaseException]) -> None:
        """Keeps one sample call in flight per prefetch thread, so the learner never waits on a round trip."""
        try:
            while not self._stop.is_set():
                finished, sample = wait_or_stop(self._replay.submit("sample", batch_size), self._stop)
                if not finished:
                    return
                while not self._stop.is_set():
                    try:
                        batches.put(sample, timeout=POLL_S)
                        break
                    except queue.Full:
                        continue
        except TableClosed:
            return
        except BaseException as e:  # pylint: disable=broad-except
            if not self._stop.is_set():
                errors.append(e)

    def _publish(self, wait: bool) -> Any:
        """Quantizes and encodes the current policy at the actors' precision, once, here, and publishes the bytes
        (a `Blob`: on Ray one object-store object that every actor reads) to the weight server. Non-finite
        weights fail here (quantize_params refuses them): the learner stops with that error."""
        with self._lock:
            params = self._learner.policy_params()
            version = int(self._learner.steps)
            observations = learner_observations(self._learner)  # int conv actors' calibration (quarl.calibration)
        t0 = time.perf_counter()
        qparams = quantize_for_actors(self._policy_spec, params, self._precision, observations)
        data = encode_payload(qparams, version=version, spec_hash=self._spec_hash)
        t1 = time.perf_counter()
        blob = Blob.put(data)
        t2 = time.perf_counter()
        if not self._fp32_nbytes:
            self._fp32_nbytes = fp32_payload_nbytes(params, version=version, spec_hash=self._spec_hash)
        self.publish_times.add(quantize_encode_s=t1 - t0, put_s=t2 - t1, nbytes=blob.nbytes)
        self._version = version
        future = self._weights.submit("publish", version, blob, self._fp32_nbytes)
        if wait:
            future.result()
            return None
        return future

    # -------------------------------------------------------------- checkpoints

    def checkpoint(self) -> str:
        """Learner state + replay snapshot + manifest (see launch.checkpoint); returns the directory."""
        with self._lock:
            state = self._learner.get_state()
            step = int(self._learner.steps)
        counts = self._counter.call("get")
        manifest = {
            "run_config": self._run_config,
            "agent_config": ckpt.agent_config_dict(self._builder.config),
            "weights_version": self._version,
            "counts": {k: v for k, v in counts.items() if not k.endswith("_starts")},
            "saved_at": time.time(),
        }
        path = ckpt.write_checkpoint(self._logdir, step=step, learner_state=state,
                                     save_replay_to=lambda p: self._replay.call("save", p), manifest=manifest)
        return str(path)
