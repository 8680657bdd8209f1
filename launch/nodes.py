"""The ActorQ nodes as plain Python classes (no Ray here: `launch.ray_runner` wraps them in Ray actors,
`launch.local_runner` calls them directly).

    Counter       run-wide counters (actor/learner steps, episodes, actor starts) and the wall clock
    ReplayServer  the replay table (quarl.replay.Table, Reverb semantics); blocking insert/sample calls, so
                  it must be served by several threads (Node.max_concurrency) or one blocked call stalls all
    Quantizer     holds the learner's latest fp32 weights and turns them into the actor payload once per
                  version, lazily (on the first request for that version), whatever the number of actors
    LearnerNode   fp32 learner: prefetches sampled batches, trains, publishes a new weights version every
                  `publish_period` steps, reports priorities, checkpoints
    ActorNode     K environments (`envs_per_actor`, default 1) and one quantized policy executor called once
                  per step on the K observations; pulls weights every actor_update_period env steps (a pull
                  with an unchanged version costs one small round trip and no payload), sends
                  n-step transitions in batches, and times every stage of its loop
    Evaluator     greedy episodes at the deployed precision every `eval_every` actor steps and at the end

Nodes talk only through `NodeHandle.call/submit` (see `launch.program`) with plain values: NumPy arrays,
dicts, and `bytes` for weight payloads (msgpack with a checksum, `quarl.payload`).

What went wrong, and what was done about it (an actor restarted, a payload rejected, the final policy saved,
a node lost) is appended to `<logdir>/events.log`, one line per event, by whichever process saw it.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np

from launch import checkpoint as ckpt
from launch.program import AgentSpec, NodeHandle, derive_seed
from quarl.carbon import start_tracking, stop_tracking

POLL_S = 0.25  # how long a blocked wait lasts before a node re-checks its stop flag
ACTOR_ENV_STREAM, EVAL_ENV_STREAM = 10, 11
EVENTS_FILE = "events.log"
_log = logging.getLogger("launch.nodes")


def log_event(logdir: str | os.PathLike | None, node: str, message: str, level: int = logging.INFO) -> None:
    """Appends `<UTC time> <node>: <message>` to the run's events.log, and to Python logging at `level`
    (WARNING for faults, which then also reach the node's stderr: Ray's worker log, or the terminal with the
    local runner). One O_APPEND write per line, so lines from several processes never interleave. Never
    raises: losing an event line must not take a node down."""
    line = " ".join(f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}Z {node}: {message}".split())
    _log.log(level, "%s", line)
    if not logdir:
        return
    try:
        os.makedirs(logdir, exist_ok=True)
        fd = os.open(os.path.join(logdir, EVENTS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass


class NodeBase:
    """What every node answers, whatever its job."""

    def pid(self) -> int:
        """The process the node runs in (tests kill actors by pid)."""
        return os.getpid()

    def ping(self) -> bool:
        return True

    def _track_energy(self, logdir: str | None, name: str) -> None:
        """Service nodes (no run()) measure from construction until `energy()` is called."""
        self._energy_tracker = _energy_tracker(logdir, name) if logdir else None

    def energy(self) -> dict[str, Any] | None:
        """Stops this node's energy tracker and returns its report (None when nothing was measured)."""
        tracker, self._energy_tracker = getattr(self, "_energy_tracker", None), None
        return stop_tracking(tracker)


def _wait(future: Any, stop: threading.Event, poll_s: float = POLL_S) -> tuple[bool, Any]:
    """Waits for `future` until it finishes or `stop` is set: (finished, result). Errors propagate."""
    while True:
        try:
            return True, future.result(timeout=poll_s)
        except TimeoutError:
            if stop.is_set():
                return False, None


def _energy_tracker(logdir: str, node: str) -> Any:
    """The node's energy tracker, reports under LOGDIR/energy (None where tracking cannot run)."""
    return start_tracking(os.path.join(logdir, "energy"), node)


def _logger(logdir: str, name: str, fieldnames: list[str], step_key: str) -> Any:
    from quarl.logs import Logger  # pylint: disable=import-outside-toplevel

    return Logger(os.path.join(logdir, f"{name}.csv"), os.path.join(logdir, "tb"), name=name,
                  fieldnames=fieldnames, step_key=step_key)


# ------------------------------------------------------------------------------------------------------
# Counter
# ------------------------------------------------------------------------------------------------------


class Counter(NodeBase):
    """Run-wide counts. `increment` returns the new totals, so a node learns "the run is done" for free.

    `wall_clock_s` is seconds since the run started (continued across `--resume`)."""

    def __init__(self, resume: str | None = None, logdir: str | None = None):
        self._track_energy(logdir, "counter")
        self._lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()
        elapsed = 0.0
        if resume:
            manifest = ckpt.read_manifest(ckpt.find_checkpoint(resume), verify=False)
            counts = dict(manifest["counts"])
            elapsed = float(counts.pop("wall_clock_s", 0.0))
            self._counts.update({k: int(v) for k, v in counts.items() if not k.endswith("_starts")})
        self._t0 = time.monotonic() - elapsed

    def increment(self, **deltas: int) -> dict[str, float]:
        with self._lock:
            for key, value in deltas.items():
                self._counts[key] += int(value)
            return self._snapshot()

    def get(self) -> dict[str, float]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, float]:
        out: dict[str, float] = dict(self._counts)
        out.setdefault("actor_steps", 0)
        out.setdefault("learner_steps", 0)
        out.setdefault("episodes", 0)
        out["wall_clock_s"] = time.monotonic() - self._t0
        return out


# ------------------------------------------------------------------------------------------------------
# Replay
# ------------------------------------------------------------------------------------------------------


class ReplayServer(NodeBase):
    """The agent's replay table behind blocking calls (Reverb semantics, incl. the samples-per-insert limiter:
    `insert` waits while actors are too far ahead, `sample` while the learner is). Calls block until done or
    until `close()`, which makes every waiting and later call raise `quarl.replay.TableClosed`."""

    def __init__(self, table: Mapping[str, Any], seed: int | None = None, resume: str | None = None,
                 logdir: str | None = None):
        from quarl.replay import table_from_config  # pylint: disable=import-outside-toplevel

        signature = {k: (tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in table["signature"].items()}
        self._table = table_from_config(signature, table["config"], seed=seed)
        if resume:
            directory = ckpt.find_checkpoint(resume)
            manifest = ckpt.read_manifest(directory, verify=False)
            state = ckpt.load_replay(directory / ckpt.REPLAY_FILE, manifest["checksums"][ckpt.REPLAY_FILE])
            self._table.load_state_dict(state)
        self._track_energy(logdir, "replay")

    def insert(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
               timeout: float | None = None, force: bool = False) -> int:
        """Inserts the batch; returns how many of its leading items went in (fewer only after `timeout`
        seconds held back by the rate limiter). `force` bypasses the limiter (an actor's flush at a stop)."""
        from quarl.replay import RateLimiterTimeout  # pylint: disable=import-outside-toplevel

        try:
            return self._table.insert(batch, priorities, timeout=timeout, force=force)
        except RateLimiterTimeout as e:
            return int(e.inserted)

    def sample(self, batch_size: int) -> Any:
        return self._table.sample(batch_size)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        return self._table.update_priorities(keys, priorities)

    def info(self) -> dict[str, Any]:
        return self._table.info()

    def save(self, path: str) -> dict[str, Any]:
        """Snapshot of the table as npz at `path` (see launch.checkpoint); returns its checksum and size."""
        return ckpt.save_replay(path, self._table.state_dict())

    def close(self) -> None:
        self._table.close()


# ------------------------------------------------------------------------------------------------------
# Quantizer (variable source for actors)
# ------------------------------------------------------------------------------------------------------


class Quantizer(NodeBase):
    """Learner weights in, actor payloads out: quantize + encode at most once per weights version.

    `publish(version, params)` replaces the latest fp32 weights (the learner pushes them every
    `publish_period` steps). `get_payload(have_version)` returns the payload bytes of the latest version, or
    None when the caller already has it (or nothing was published yet). Quantization happens lazily on the
    first request for a version, under a lock, so N actors asking at once share one quantization and versions
    no one asked for cost nothing."""

    def __init__(self, policy_spec: Mapping[str, Any], precision: str, logdir: str | None = None):
        from quarl.policy import PolicySpec  # pylint: disable=import-outside-toplevel
        from quarl.quantization import parse_precision  # pylint: disable=import-outside-toplevel

        self._policy_spec = PolicySpec.from_dict(policy_spec)
        self._precision = parse_precision(precision).name
        self._lock = threading.Lock()
        self._latest: tuple[int, dict] | None = None
        self._cached: tuple[int, bytes] | None = None
        self._stats: collections.Counter = collections.Counter()
        self._quantize_s = 0.0
        self._versions_quantized: list[int] = []
        self._payload_nbytes = 0
        self._fp32_nbytes = 0
        self._track_energy(logdir, "quantizer")

    def publish(self, version: int, params: Mapping[str, Any]) -> int:
        """Stores `params` as weights version `version` (older versions than the latest are ignored)."""
        for leaf in _leaves(params):
            if not np.all(np.isfinite(leaf)):
                raise ValueError(f"learner published non-finite weights (version {version})")
        with self._lock:
            if self._latest is None or version > self._latest[0]:
                self._latest = (int(version), params)
            self._stats["published"] += 1
            return self._latest[0]

    def latest_version(self) -> int:
        with self._lock:
            return -1 if self._latest is None else self._latest[0]

    def get_payload(self, have_version: int = -1) -> bytes | None:
        from quarl.payload import encode_payload, fp32_payload_nbytes  # pylint: disable=import-outside-toplevel
        from quarl.quantization import quantize_params  # pylint: disable=import-outside-toplevel

        with self._lock:
            self._stats["requests"] += 1
            if self._latest is None or self._latest[0] <= have_version:
                self._stats["not_modified"] += 1
                return None
            version, params = self._latest
            if self._cached is None or self._cached[0] != version:
                t0 = time.perf_counter()
                data = encode_payload(quantize_params(params, self._precision), version=version,
                                      spec=self._policy_spec)
                self._quantize_s += time.perf_counter() - t0
                self._cached = (version, data)
                self._versions_quantized.append(version)
                self._payload_nbytes = len(data)
                if not self._fp32_nbytes:
                    self._fp32_nbytes = fp32_payload_nbytes(params)
            self._stats["served"] += 1
            return self._cached[1]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            quantized = len(self._versions_quantized)
            return {
                "precision": self._precision,
                "published": self._stats["published"],
                "requests": self._stats["requests"],
                "not_modified": self._stats["not_modified"],
                "payloads_served": self._stats["served"],
                "quantize_calls": quantized,
                "distinct_versions_quantized": len(set(self._versions_quantized)),
                "quantize_s_per_version": self._quantize_s / quantized if quantized else 0.0,
                "payload_bytes": self._payload_nbytes,
                "fp32_payload_bytes": self._fp32_nbytes,
            }


def _import_orbax() -> None:
    try:
        import orbax.checkpoint  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except Exception:  # pylint: disable=broad-except
        pass  # the checkpoint itself will report it


def _leaves(tree: Any) -> list[np.ndarray]:
    if isinstance(tree, Mapping):
        return [leaf for v in tree.values() for leaf in _leaves(v)]
    return [np.asarray(tree)]


# ------------------------------------------------------------------------------------------------------
# Learner
# ------------------------------------------------------------------------------------------------------


class LearnerNode(NodeBase):
    """The fp32 learner and the source of weight versions (version = learner step at publication)."""

    LOG_FIELDS = ["learner_steps", "wall_clock_s", "steps_per_s", "weights_version",
                  "sample_wait_frac", "loss", "critic_loss", "policy_loss", "q_mean", "td_abs_mean",
                  "grad_norm"]

    def __init__(self, spec: AgentSpec, seed: int, replay: NodeHandle, counter: NodeHandle,
                 quantizer: NodeHandle, logdir: str, publish_period: int = 10, prefetch: int = 2,
                 checkpoint_every: int = 0, resume: str | None = None, run_config: Mapping[str, Any] | None = None,
                 log_every_s: float = 1.0):
        self._spec = spec
        self._builder = spec.builder()
        env_spec = spec.env_spec()
        self._policy_spec = self._builder.policy_spec(env_spec)
        self._learner = self._builder.make_learner(env_spec, seed)
        self._replay, self._counter, self._quantizer = replay, counter, quantizer
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
        tracker = _energy_tracker(self._logdir, "learner")
        log = _logger(self._logdir, "learner", self.LOG_FIELDS, "learner_steps")
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
                "step_s_mean": step_s / trained if trained else 0.0, "sample_wait_s": wait_s,
                "weights_version": self._version, "resumed_from": self.resumed_from, "policy_file": policy_file,
                "energy": energy}

    def save_policy(self) -> str:
        """The current fp32 policy as `<logdir>/policy_fp32.qrlp` (+ sidecar), what `launch.ptq --checkpoint
        LOGDIR` reads (see quarl.policy_io). Returns the file's path."""
        from quarl.policy_io import save_policy  # pylint: disable=import-outside-toplevel

        with self._lock:
            params = self._learner.policy_params()
            steps = int(self._learner.steps)
        run = self._run_config
        extra = {"source": "launch.actorq", "seed": run.get("seed"), "actor_precision": run.get("precision"),
                 "num_actors": run.get("num_actors")}
        path = save_policy(self._logdir, self._policy_spec, params, task=self._spec.task, agent=self._spec.agent,
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
        from quarl.replay import TableClosed  # pylint: disable=import-outside-toplevel

        try:
            while not self._stop.is_set():
                finished, sample = _wait(self._replay.submit("sample", batch_size), self._stop)
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
        with self._lock:
            params = self._learner.policy_params()
            version = int(self._learner.steps)
        self._version = version
        future = self._quantizer.submit("publish", version, params)
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


# ------------------------------------------------------------------------------------------------------
# Actors
# ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ActorTimes:
    """Where an actor's time goes (the paper's runtime breakdown). Seconds, summed over the run."""

    env_step_s: float = 0.0
    policy_s: float = 0.0
    pull_s: float = 0.0  # weight requests, including the cheap "not modified" ones
    deserialize_s: float = 0.0
    load_s: float = 0.0  # building / refreshing the executor with new weights
    insert_s: float = 0.0  # replay inserts, including time blocked by the rate limiter
    pulls: int = 0
    updates: int = 0  # pulls that brought a new version
    payload_bytes: int = 0

    def summary(self) -> dict[str, float]:
        d = dataclasses.asdict(self)
        n = max(self.updates, 1)
        for key in ("pull_s", "deserialize_s", "load_s"):
            d[f"{key[:-2]}_ms_per_update"] = 1e3 * getattr(self, key) / n
        d["update_ms"] = d["pull_ms_per_update"] + d["deserialize_ms_per_update"] + d["load_ms_per_update"]
        return d


class _PolicyClient:
    """An actor's side of the weight channel: fetch only when the version changed, timing each stage, and
    refuse anything that is not a usable policy.

    A payload is accepted only if it decodes (checksum, format version, structure, finite values: see
    `quarl.payload`), is newer than the current version, has the expected precision and policy spec, and
    `apply` (building or updating the policy executor) accepts its tree. Anything else is rejected: counted,
    logged (once per distinct payload: the quantizer serves the same bytes again at every pull until a newer
    version exists), and the caller keeps acting with its last good policy."""

    def __init__(self, quantizer: NodeHandle, times: ActorTimes, *, spec: Any = None, precision: str | None = None,
                 logdir: str | None = None, node: str = "actor"):
        self._quantizer = quantizer
        self._times = times
        self._spec = None if spec is None else spec.to_dict()
        self._precision = precision
        self._logdir, self._node = logdir, node
        self.version = -1
        self.rejected = 0
        self.last_rejection: str | None = None
        self._last_rejected_digest = b""

    def fetch(self, stop: threading.Event | None = None,
              apply: Callable[[Any], Any] | None = None) -> Any:
        """The newest payload if it is newer than ours and valid (decoded, and `apply(payload)` done), else
        None (nothing new, or rejected)."""
        from quarl.payload import decode_payload  # pylint: disable=import-outside-toplevel

        t0 = time.perf_counter()
        data = self._quantizer.call("get_payload", self.version)
        t1 = time.perf_counter()
        self._times.pull_s += t1 - t0
        self._times.pulls += 1
        if data is None:
            return None
        try:
            payload = decode_payload(data)
            self._check(payload)
        except ValueError as e:  # PayloadError is a ValueError
            self._times.deserialize_s += time.perf_counter() - t1
            self._reject(str(e), data)
            return None
        t2 = time.perf_counter()
        self._times.deserialize_s += t2 - t1
        if apply is not None:
            try:
                apply(payload)
            except ValueError as e:  # the tree does not fit the spec/executor (quarl.runtimes validates it)
                self._times.load_s += time.perf_counter() - t2
                self._reject(f"payload version {payload.version} does not fit the policy: {e}", data)
                return None
            self._times.load_s += time.perf_counter() - t2
        self._times.payload_bytes += len(data)
        self._times.updates += 1
        self.version = payload.version
        return payload

    def _check(self, payload: Any) -> None:
        if payload.version <= self.version:
            raise ValueError(f"stale payload: version {payload.version} is not newer than the current "
                             f"version {self.version}")
        if self._precision is not None and payload.precision != self._precision:
            raise ValueError(f"payload version {payload.version} holds {payload.precision} weights, this actor "
                             f"runs {self._precision}")
        if self._spec is not None and payload.spec is not None and payload.spec.to_dict() != self._spec:
            raise ValueError(f"payload version {payload.version} is for another policy spec")

    def _reject(self, reason: str, data: bytes) -> None:
        import hashlib  # pylint: disable=import-outside-toplevel

        self.rejected += 1
        first_line = str(reason).splitlines()[0] if str(reason) else "invalid payload"
        self.last_rejection = first_line
        digest = hashlib.sha256(data).digest()
        if digest != self._last_rejected_digest:
            self._last_rejected_digest = digest
            log_event(self._logdir, self._node, f"rejected a weight payload ({first_line}); keeps acting with "
                                                f"weights version {self.version}", logging.WARNING)

    def first(self, stop: threading.Event, apply: Callable[[Any], Any] | None = None) -> Any:
        """Waits for the first valid published weights (the learner publishes version 0 when it starts)."""
        while not stop.is_set():
            payload = self.fetch(apply=apply)
            if payload is not None:
                return payload
            stop.wait(0.05)
        return None


def _precision_name(precision: str) -> str:
    """The canonical precision name payloads carry ("8" -> "int8")."""
    from quarl.quantization import parse_precision  # pylint: disable=import-outside-toplevel

    return parse_precision(precision).name


class _StoppedEarly(Exception):
    """Stopped before the first weights arrived."""


class ActorNode(NodeBase):
    """One acting process: environment + quantized policy + n-step adder; see the module docstring."""

    LOG_FIELDS = ["actor_steps", "wall_clock_s", "episode", "return", "length", "steps_per_s",
                  "weights_version", "total_actor_steps"]

    def __init__(self, spec: AgentSpec, actor_id: int, num_actors: int, seed: int, precision: str,
                 backend: str, replay: NodeHandle, counter: NodeHandle, quantizer: NodeHandle, logdir: str,
                 max_actor_steps: int, insert_batch: int = 64, envs_per_actor: int = 1):
        self._spec = spec
        self._id, self._num_actors = int(actor_id), int(num_actors)
        self._seed = int(seed)
        self._precision, self._backend = precision, backend
        self._replay, self._counter, self._quantizer = replay, counter, quantizer
        self._logdir = logdir
        self._max_steps = int(max_actor_steps)
        self._insert_batch = int(insert_batch)
        self._num_envs = int(envs_per_actor)
        self._stop = threading.Event()
        self._builder = spec.builder()
        self._env_spec = spec.env_spec()
        self.times = ActorTimes()
        self.inserted = 0  # transitions this actor put into replay (this process)

    def stop(self) -> None:
        self._stop.set()

    def _make_environment(self, seed: int) -> Any:
        """The actor's K environments (a separate method so tests can wrap it, e.g. to make an actor slow)."""
        from quarl.vector_env import make_vector_environment  # pylint: disable=import-outside-toplevel

        return make_vector_environment(self._spec.task, seed, self._num_envs)

    def run(self) -> dict[str, Any]:
        from quarl.adders import TransitionBuffer  # pylint: disable=import-outside-toplevel
        from quarl.env_loop import VectorEnvLoop  # pylint: disable=import-outside-toplevel

        name = f"actor_{self._id}"
        start = self._counter.call("increment", **{f"{name}_starts": 1})
        attempt = int(start[f"{name}_starts"])  # > 1 after a crash: fresh env seed, resume latest weights
        t_origin = time.monotonic() - start["wall_clock_s"]
        tracker = _energy_tracker(self._logdir, name)
        log = _logger(self._logdir, name, self.LOG_FIELDS, "total_actor_steps")
        times = self.times = ActorTimes()
        client = _PolicyClient(
            self._quantizer, times, spec=self._builder.policy_spec(self._env_spec),
            precision=_precision_name(self._precision), logdir=self._logdir, node=name)
        env = self._make_environment(derive_seed(self._seed, ACTOR_ENV_STREAM, attempt))
        update_period = int(self._builder.config.actor_update_period)
        built: list[Any] = []
        first_version = None
        try:
            payload = client.first(self._stop, apply=lambda p: built.append(self._builder.make_actor(
                self._env_spec, p.params, seed=derive_seed(self._seed, attempt), actor_id=self._id,
                evaluation=False, backend=self._backend, num_actors=self._num_actors, batch_size=self._num_envs)))
            if payload is None:
                raise _StoppedEarly
            actor = built[-1]
            first_version = client.version
            if attempt > 1:
                log_event(self._logdir, name, f"restarted (start #{attempt}: the previous process died); acting "
                                              f"again with the latest weights, version {first_version}, after "
                                              f"{int(start.get(f'{name}_steps', 0))} steps of its own so far",
                          logging.WARNING)
            loop = VectorEnvLoop(env, self._builder.make_adder)
            buffer = TransitionBuffer(self._insert_batch, self._builder.transition_signature(self._env_spec))
            steps = episodes = 0
            unreported_steps = unreported_episodes = 0
            total = int(start["actor_steps"])
            t_run = time.monotonic()
            times.env_step_s += loop.reset()
            ep_start = [time.monotonic()] * self._num_envs
            try:
                while not self._stop.is_set() and total < self._max_steps:
                    out = loop.step(actor.select_actions)
                    times.policy_s += out.policy_s
                    times.env_step_s += out.env_s
                    prev, steps = steps, steps + self._num_envs
                    unreported_steps += self._num_envs
                    for batch in buffer.extend(out.transitions):
                        self._insert(batch)
                        totals = self._counter.call("increment", actor_steps=unreported_steps,
                                                    episodes=unreported_episodes,
                                                    **{f"{name}_steps": unreported_steps})
                        unreported_steps = unreported_episodes = 0
                        total = int(totals["actor_steps"])
                    for episode in out.episodes:
                        episodes += 1
                        unreported_episodes += 1
                        now = time.monotonic()
                        log.write({"actor_steps": steps, "wall_clock_s": now - t_origin, "episode": episodes,
                                   "return": episode.episode_return, "length": episode.length,
                                   # the actor's env steps/s over this episode (its K environments step together)
                                   "steps_per_s": self._num_envs * episode.length
                                                  / max(now - ep_start[episode.env_index], 1e-9),
                                   "weights_version": client.version, "total_actor_steps": total})
                        ep_start[episode.env_index] = now
                    if steps // update_period > prev // update_period:
                        client.fetch(apply=lambda p: actor.update(p.params))
            except Exception as e:
                self._flush_after_error(buffer, loop.adders, name, e)
                raise
            self._flush(buffer, loop.adders)
            if unreported_steps or unreported_episodes:
                self._counter.call("increment", actor_steps=unreported_steps, episodes=unreported_episodes,
                                   **{f"{name}_steps": unreported_steps})
            elapsed = time.monotonic() - t_run
            result = {"actor_id": self._id, "attempt": attempt, "actor_steps": steps, "episodes": episodes,
                      "envs_per_actor": self._num_envs,
                      "elapsed_s": elapsed, "steps_per_s": steps / elapsed if elapsed > 0 else 0.0,
                      "backend": getattr(actor, "backend", self._backend), "weights_version": client.version,
                      "transitions_inserted": self.inserted, "times": times.summary()}
        except _StoppedEarly:
            result = {"actor_id": self._id, "attempt": attempt, "actor_steps": 0, "times": times.summary()}
        finally:
            log.close()
            env.close()
            energy = stop_tracking(tracker)
        return {**result, "first_weights_version": first_version, "payloads_rejected": client.rejected,
                "last_payload_rejection": client.last_rejection, "energy": energy}

    def _insert(self, batch: Mapping[str, np.ndarray]) -> None:
        """One batched insert, whole: waits while the rate limiter holds actors back, re-checking the stop flag
        every POLL_S; once stopped, the rest goes in past the limiter (the learner that would release it is
        stopping too), so no transition in hand is lost."""
        n = len(next(iter(batch.values())))
        done = 0
        t0 = time.perf_counter()
        try:
            while done < n:
                part = batch if done == 0 else {k: v[done:] for k, v in batch.items()}
                k = int(self._replay.call("insert", part, None, POLL_S, self._stop.is_set()))
                done += k
                self.inserted += k
        finally:
            self.times.insert_s += time.perf_counter() - t0

    def _flush_after_error(self, buffer: Any, adders: Any, name: str, error: BaseException) -> None:
        """`_flush` on the way out of a failed loop (e.g. the counter is gone but the replay server is not);
        never masks `error`: when the flush fails too, the loss is logged with its size."""
        held = len(buffer) + sum(adder.pending for adder in adders)
        try:
            self._flush(buffer, adders)
        except Exception as flush_error:  # pylint: disable=broad-except
            log_event(self._logdir, name, f"stopped by {type(error).__name__}; {held} transitions held by this "
                                          f"actor could not be inserted ({type(flush_error).__name__})",
                      logging.WARNING)

    def _flush(self, buffer: Any, adders: Any) -> None:
        """Inserts everything still held on this side: the buffer's partial batch and every adder's open n-step
        windows (as truncated transitions). Called on every way out of the acting loop."""
        for batch in buffer.extend([t for adder in adders for t in adder.flush()]):
            self._insert(batch)
        rest = buffer.flush()
        if rest is not None:
            self._insert(rest)


# ------------------------------------------------------------------------------------------------------
# Evaluator
# ------------------------------------------------------------------------------------------------------


class Evaluator(NodeBase):
    """Greedy episodes with the deployed (quantized) policy, every `eval_every` actor steps and at the end."""

    LOG_FIELDS = ["actor_steps", "wall_clock_s", "return", "return_std", "episodes", "learner_steps",
                  "weights_version"]

    def __init__(self, spec: AgentSpec, seed: int, precision: str, backend: str, quantizer: NodeHandle,
                 counter: NodeHandle, logdir: str, eval_every: int, episodes: int):
        self._spec = spec
        self._seed = int(seed)
        self._precision, self._backend = precision, backend
        self._quantizer, self._counter = quantizer, counter
        self._logdir = logdir
        self._eval_every = int(eval_every)
        self._episodes = int(episodes)
        self._stop = threading.Event()
        self._final = threading.Event()
        self._builder = spec.builder()
        self._env_spec = spec.env_spec()
        self._results: list[dict[str, Any]] = []

    def stop(self, final_eval: bool = False) -> None:
        """Ends `run()`; with `final_eval`, after one last evaluation of the newest weights."""
        if final_eval:
            self._final.set()
        self._stop.set()

    def results(self) -> list[dict[str, Any]]:
        return list(self._results)

    def run(self) -> dict[str, Any]:
        from quarl.envs import make_environment  # pylint: disable=import-outside-toplevel

        tracker = _energy_tracker(self._logdir, "evaluator")
        log = _logger(self._logdir, "evaluator", self.LOG_FIELDS, "actor_steps")
        times = ActorTimes()
        client = _PolicyClient(self._quantizer, times, spec=self._builder.policy_spec(self._env_spec),
                               precision=_precision_name(self._precision), logdir=self._logdir,
                               node="evaluator")
        env = make_environment(self._spec.task, derive_seed(self._seed, EVAL_ENV_STREAM))
        actor = None
        try:
            totals = self._counter.call("get")
            next_eval = (int(totals["actor_steps"]) // self._eval_every + 1) * self._eval_every
            while not self._stop.is_set():
                totals = self._counter.call("get")
                if totals["actor_steps"] < next_eval:
                    self._stop.wait(POLL_S)
                    continue
                actor = self._evaluate(client, actor, env, totals, log, final=False)
                next_eval = (int(totals["actor_steps"]) // self._eval_every + 1) * self._eval_every
            if self._final.is_set():
                actor = self._evaluate(client, actor, env, self._counter.call("get"), log, final=True)
        finally:
            log.close()
            env.close()
            energy = stop_tracking(tracker)
        final = self._results[-1] if self._results else None
        return {"evaluations": len(self._results), "final": final, "energy": energy}

    def _evaluate(self, client: _PolicyClient, actor: Any, env: Any, totals: Mapping[str, float], log: Any,
                  final: bool) -> Any:
        def apply(payload: Any) -> None:
            nonlocal actor
            if actor is None:
                actor = self._builder.make_actor(self._env_spec, payload.params, seed=self._seed, actor_id=0,
                                                 evaluation=True, backend=self._backend)
            else:
                actor.update(payload.params)

        client.fetch(apply=apply)
        if actor is None:
            return None
        returns = []
        for _ in range(self._episodes):
            timestep = env.reset()
            total = 0.0
            while not timestep.last():
                if self._stop.is_set() and not final:
                    return actor
                timestep = env.step(actor.select_action(timestep.observation))
                total += float(timestep.reward or 0.0)
            returns.append(total)
        row = {"actor_steps": int(totals["actor_steps"]), "wall_clock_s": float(totals["wall_clock_s"]),
               "return": float(np.mean(returns)), "return_std": float(np.std(returns)),
               "episodes": len(returns), "learner_steps": int(totals["learner_steps"]),
               "weights_version": client.version}
        log.write(row)
        self._results.append(row)
        return actor
