"""The ActorQ node classes, one namespace (each lives in its own module; no Ray here: `launch.ray_runner` wraps them in Ray actors,
`launch.local_runner` calls them directly).

    Counter       run-wide counters (actor/learner steps, episodes, actor starts) and the wall clock
    ReplayServer  the replay table (quarl.replay.Table, Reverb semantics); blocking insert/sample calls, so
                  it must be served by several threads (Node.max_concurrency) or one blocked call stalls all
    WeightServer  hands out the latest published payload (a reference: on Ray an object-store object the
                  learner put once), or "not modified"
    LearnerNode   fp32 learner: prefetches blocks of K sampled batches to the device, trains K steps per
                  call, and every `publish_period` steps hands its policy to a publisher thread that quantizes
                  + encodes it at the actors' precision, once, and publishes the bytes; reports priorities,
                  checkpoints
    ActorNode     K environments (`envs_per_actor`, default 1) and one quantized policy executor called once
                  per step on the K observations; pulls weights every actor_update_period env steps (a pull
                  with an unchanged version costs one small round trip and no payload), sends
                  n-step transitions in batches, and times every stage of its loop
    Evaluator     greedy episodes at the deployed precision every `eval_every` actor steps and at the end

Nodes talk only through `NodeHandle.call/submit` (see `launch.program`) with plain values: NumPy arrays,
dicts, and `launch.shared_blob.Blob` for weight payloads (msgpack with a checksum, `quarl.payload`): no fp32
tree crosses a process boundary for acting.

What went wrong, and what was done about it (an actor restarted, a payload rejected, the final policy saved,
a node lost) is appended to `<logdir>/events.log`, one line per event, by whichever process saw it.

`launch.graph.build_actorq_program` takes its node classes from here by default; tests pass a namespace with
instrumented subclasses instead.
"""
from __future__ import annotations

from launch.actor_node import ActorNode
from launch.evaluator_node import Evaluator
from launch.learner_node import LearnerNode
from launch.node_base import NodeBase, log_event
from launch.services import Counter, ReplayServer, WeightServer
from launch.stages import StageTimes
from launch.weights_client import PolicyClient

__all__ = ["ActorNode", "Counter", "Evaluator", "LearnerNode", "NodeBase", "PolicyClient", "ReplayServer",
           "StageTimes", "WeightServer", "log_event"]
