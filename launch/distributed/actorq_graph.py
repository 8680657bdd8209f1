"""The ActorQ program graph: counter, replay server, weight server, fp32 learner (it quantizes each weights version
once and publishes the bytes), N quantized actors and an evaluator (see `launch.program.graph` for what a program is).

    Counter       run-wide counters (actor/learner steps, episodes, actor starts) and the wall clock
    ReplayServer  the replay table (quarl.replay.table.Table, Reverb semantics); blocking insert/sample calls, so
                  it must be served by several threads (Node.max_concurrency) or one blocked call stalls all
    WeightServer  hands out the latest published payload (a reference: on Ray an object-store object the
                  learner put once), or "not modified"
    LearnerNode   fp32 learner: prefetches blocks of K sampled batches to the device, trains K steps per
                  call, and every `publish_period` steps hands its policy to a publisher thread that quantizes
                  + encodes it at the actors' precision, once, and publishes the bytes; reports priorities,
                  checkpoints
    ActorNode     K environments (`envs_per_actor`, default 1) and one quantized policy executor called once
                  per step on the K observations (`launch.experiments.acting`); pulls weights every
                  actor_update_period env steps (an unchanged version costs one small round trip and no
                  payload), sends n-step transitions in batches, and times every stage of its loop
    Evaluator     greedy episodes at the deployed precision every `eval_every` actor steps and at the end

An on-policy agent (PPO, A2C) has no replay: its graph is counter, weight server, N `RolloutActorNode`s (the same
acting loop with the rollout sink, handing out fixed-length rollouts with the behaviour log-probs and the weights
version they were collected with), the `RolloutLearnerNode` that takes their rollouts (synchronous PPO, or
asynchronous with a staleness bound: `launch.distributed.nodes.rollout_learner`) and the evaluator.

Nodes talk only through clients typed by each callee's Protocol (`launch.distributed.clients`, made by
`launch.program.graph.connect` over `NodeHandle.call/submit`) with plain values: NumPy arrays,
dicts, and `launch.distributed.nodes.shared_blob.Blob` for weight payloads (msgpack with a checksum, `quarl.quant.payload`): no fp32
tree crosses a process boundary for acting. What went wrong, and what was done about it (an actor restarted,
a payload rejected, the final policy saved, a node lost) is appended to `<logdir>/events.log`, one line per
event, by whichever process saw it."""
from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from agents.base import ReplayBuilder
from launch.distributed.nodes.actor import ActorNode
from launch.distributed.nodes.evaluator import Evaluator
from launch.distributed.nodes.learner import LearnerNode
from launch.distributed.nodes.rollout_actor import RolloutActorNode
from launch.distributed.nodes.rollout_learner import RolloutLearnerNode
from launch.distributed.nodes.services import Counter, ReplayServer, WeightServer
from launch.experiments.agent_spec import AgentSpec, derive_seed, table_spec
from launch.experiments.config import ExperimentConfig
from launch.program.devices import ACCELERATOR_BY_DEVICE, CPU_ONLY_ENV, learner_env
from launch.program.graph import SINGLE_THREAD_ENV, Handle, Node, Program


LEARNER_STREAM, ACTOR_STREAM, EVAL_STREAM, REPLAY_STREAM = 0, 1, 2, 3
# What each ActorQ service/worker is called in messages ("replay server ('replay') died ..."); actors are "actor_<i>".
NODE_ROLES: dict[str, str] = {"replay": "replay server", "counter": "counter", "weights": "weight server",
                              "learner": "learner", "evaluator": "evaluator"}


def node_role(name: str) -> str:
    """What messages call node `name` of the ActorQ graph, e.g. "replay server"."""
    return NODE_ROLES.get(name, "actor" if name.startswith("actor_") else "node")


@dataclasses.dataclass(frozen=True)
class NodeClasses:  # pylint: disable=invalid-name  (the fields are class names)
    """The node classes the ActorQ graph is built from; tests substitute instrumented subclasses with
    `dataclasses.replace(NodeClasses(), LearnerNode=...)`."""

    Counter: type[Counter] = Counter
    ReplayServer: type[ReplayServer] = ReplayServer
    WeightServer: type[WeightServer] = WeightServer
    LearnerNode: type[LearnerNode] = LearnerNode
    ActorNode: type[ActorNode] = ActorNode
    Evaluator: type[Evaluator] = Evaluator
    RolloutActorNode: type[RolloutActorNode] = RolloutActorNode
    RolloutLearnerNode: type[RolloutLearnerNode] = RolloutLearnerNode


def build_actorq_program(config: ExperimentConfig, node_classes: NodeClasses | None = None) -> Program:
    """The ActorQ graph for `config`, its nodes made of `node_classes` (by default the real ones)."""
    nc = NodeClasses() if node_classes is None else node_classes
    spec = AgentSpec(config.agent, config.task, dict(config.overrides))
    builder, env_spec = spec.builder(), spec.env_spec()
    if not isinstance(builder, ReplayBuilder):  # on-policy: no replay server, rollouts go to the learner
        return _on_policy_program(config, spec, nc)
    logdir = os.path.abspath(config.logdir)
    program = Program("actorq")
    dist = config.distributed
    near_learner = dict(dist.learner_resources)  # learner, services and evaluator: on one machine
    # Only the learner may see a GPU (launch.program.devices): services, actors and the evaluator run JAX on the CPU.
    cpu = dict(CPU_ONLY_ENV)
    counter = program.add(Node("counter", nc.Counter, {"resume": dist.resume, "logdir": logdir},
                               max_concurrency=8, env_vars=cpu, resources=near_learner))
    replay = program.add(Node(
        "replay", nc.ReplayServer,
        {"table": table_spec(builder, env_spec), "seed": derive_seed(config.seed, REPLAY_STREAM),
         "resume": dist.resume, "logdir": logdir},
        max_concurrency=max(8, 2 * dist.num_actors + dist.prefetch + 4), env_vars=cpu, resources=near_learner))
    weights = program.add(Node(
        "weights", nc.WeightServer, {"precision": config.precision, "logdir": logdir},
        max_concurrency=max(4, dist.num_actors + 3), env_vars=cpu, resources=near_learner))
    learner = program.add(Node(
        "learner", nc.LearnerNode,
        {"spec": spec, "seed": derive_seed(config.seed, LEARNER_STREAM), "replay": replay, "counter": counter,
         "weights": weights, "logdir": logdir, "precision": config.precision, "publish_period": dist.publish_period,
         "prefetch": dist.prefetch, "checkpoint_every": dist.checkpoint_every, "resume": dist.resume,
         "run_config": config.to_dict(), "log_every_s": dist.log_every_s,
         "steps_per_call": dist.learner_steps_per_call, "publish_min_interval_s": dist.publish_min_interval_s},
        kind="worker", num_cpus=1, accelerator=ACCELERATOR_BY_DEVICE[config.learner_device], max_concurrency=4,
        env_vars=learner_env(config.learner_device), resources=near_learner))
    for i in range(dist.num_actors):
        program.add(Node(
            f"actor_{i}", nc.ActorNode,
            {"spec": spec, "actor_id": i, "num_actors": dist.num_actors,
             "seed": derive_seed(config.seed, ACTOR_STREAM, i), "precision": config.precision,
             "backend": config.backend, "kernel_form": config.kernel_form, "replay": replay, "counter": counter, "weights": weights,
             "logdir": logdir, "max_actor_steps": config.max_actor_steps, "insert_batch": dist.insert_batch,
             "envs_per_actor": config.envs_per_actor, "pin": dist.pin_actors},
            kind="worker", num_cpus=1, max_concurrency=3, max_restarts=3, env_vars=SINGLE_THREAD_ENV,
            resources=dict(dist.actor_resources)))
    _add_evaluator(program, config, spec, nc, weights, counter, learner, near_learner)
    return program


def _add_evaluator(program: Program, config: ExperimentConfig, spec: AgentSpec, nc: NodeClasses, weights: Handle,
                   counter: Handle, learner: Handle, near_learner: dict[str, float]) -> None:
    program.add(Node(
        "evaluator", nc.Evaluator,
        {"spec": spec, "seed": derive_seed(config.seed, EVAL_STREAM), "precision": config.precision,
         "backend": config.backend, "kernel_form": config.kernel_form, "weights": weights, "counter": counter,
         "learner": learner, "logdir": os.path.abspath(config.logdir), "eval_every": config.eval_every,
         "episodes": config.eval_episodes},
        kind="worker", num_cpus=1, max_concurrency=3, env_vars=SINGLE_THREAD_ENV,
        resources=dict(near_learner)))


def _on_policy_program(config: ExperimentConfig, spec: AgentSpec, nc: NodeClasses) -> Program:
    """The on-policy graph: counter, weight server, rollout actors, the rollout learner, the evaluator (no replay).
    Synchronous actors wait for each new version after a rollout; asynchronous ones keep one rollout ready."""
    logdir = os.path.abspath(config.logdir)
    program = Program("actorq")
    dist = config.distributed
    near_learner, cpu = dict(dist.learner_resources), dict(CPU_ONLY_ENV)
    counter = program.add(Node("counter", nc.Counter, {"resume": None, "logdir": logdir},
                               max_concurrency=8, env_vars=cpu, resources=near_learner))
    weights = program.add(Node(
        "weights", nc.WeightServer, {"precision": config.precision, "logdir": logdir},
        max_concurrency=max(4, dist.num_actors + 3), env_vars=cpu, resources=near_learner))
    sync = dist.rollout_mode == "sync"
    # One finished rollout waits per actor: an asynchronous actor acts on while the learner trains, at most one
    # rollout ahead, which bounds how stale its data can get.
    actors = add_rollout_actors(program, config, counter, weights, nc, sync=sync, outbox_size=1)
    learner = program.add(Node(
        "learner", nc.RolloutLearnerNode,
        {"spec": spec, "seed": derive_seed(config.seed, LEARNER_STREAM), "actors": actors, "counter": counter,
         "weights": weights, "logdir": logdir, "precision": config.precision, "mode": dist.rollout_mode,
         "max_staleness": dist.staleness_bound(), "max_actor_steps": config.max_actor_steps,
         "envs_per_actor": config.envs_per_actor, "run_config": config.to_dict(), "log_every_s": dist.log_every_s,
         "publish_min_interval_s": dist.publish_min_interval_s},
        kind="worker", num_cpus=1, accelerator=ACCELERATOR_BY_DEVICE[config.learner_device], max_concurrency=4,
        env_vars=learner_env(config.learner_device), resources=near_learner))
    _add_evaluator(program, config, spec, nc, weights, counter, learner, near_learner)
    return program


def actor_names(program: Program) -> Sequence[str]:
    return program.names(kind="worker", prefix="actor_")


def add_rollout_actors(program: Program, config: ExperimentConfig, counter: Handle, weights: Handle,
                       node_classes: NodeClasses | None = None, **node_kwargs: object) -> list[Handle]:
    """Adds `config.distributed.num_actors` on-policy actors ("actor_<i>", `RolloutActorNode`) pulling weights
    from `weights` and counting into `counter`, placed as ActorQ's actors are; returns their handles.
    `node_kwargs` go to each node (e.g. `outbox_size`, `sync`)."""
    nc = NodeClasses() if node_classes is None else node_classes
    spec = AgentSpec(config.agent, config.task, dict(config.overrides))
    dist = config.distributed
    return [program.add(Node(
        f"actor_{i}", nc.RolloutActorNode,
        {"spec": spec, "actor_id": i, "num_actors": dist.num_actors, "seed": derive_seed(config.seed, ACTOR_STREAM, i),
         "precision": config.precision, "backend": config.backend, "kernel_form": config.kernel_form,
         "counter": counter, "weights": weights, "logdir": os.path.abspath(config.logdir),
         "max_actor_steps": config.max_actor_steps, "envs_per_actor": config.envs_per_actor, **node_kwargs},
        kind="worker", num_cpus=1, max_concurrency=3, max_restarts=3, env_vars=SINGLE_THREAD_ENV,
        resources=dict(dist.actor_resources))) for i in range(dist.num_actors)]
