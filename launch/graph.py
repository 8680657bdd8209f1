"""The ActorQ run configuration and its program graph: counter, replay server, weight server, fp32 learner (it
quantizes each weights version once and publishes the bytes), N quantized
actors and an evaluator (see `launch.program` for what a program is, `launch.nodes` for the node classes)."""
from __future__ import annotations

import os
from typing import Any, Sequence

from launch import nodes
from launch.agent_spec import AgentSpec, derive_seed, table_spec
from launch.devices import ACCELERATOR_BY_DEVICE, CPU_ONLY_ENV, learner_env
from launch.program import SINGLE_THREAD_ENV, Node, Program
from launch.experiment_config import ExperimentConfig


LEARNER_STREAM, ACTOR_STREAM, EVAL_STREAM, REPLAY_STREAM = 0, 1, 2, 3
# What each ActorQ service/worker is called in messages ("replay server ('replay') died ..."); actors are "actor_<i>".
NODE_ROLES: dict[str, str] = {"replay": "replay server", "counter": "counter", "weights": "weight server",
                              "learner": "learner", "evaluator": "evaluator"}


def node_role(name: str) -> str:
    """What messages call node `name` of the ActorQ graph, e.g. "replay server"."""
    return NODE_ROLES.get(name, "actor" if name.startswith("actor_") else "node")


def build_actorq_program(config: ExperimentConfig, node_classes: Any = None) -> Program:
    """The ActorQ graph for `config`. `node_classes` (a module or namespace with the node classes) lets tests
    substitute instrumented nodes; by default `launch.nodes`."""
    nc = nodes if node_classes is None else node_classes
    spec = AgentSpec(config.agent, config.task, dict(config.overrides))
    builder, env_spec = spec.builder(), spec.env_spec()
    logdir = os.path.abspath(config.logdir)
    program = Program("actorq")
    near_learner = dict(config.distributed.learner_resources)  # learner, services and evaluator: on one machine
    # Only the learner may see a GPU (launch.devices): services, actors and the evaluator run JAX on the CPU.
    cpu = dict(CPU_ONLY_ENV)
    counter = program.add(Node("counter", nc.Counter, {"resume": config.distributed.resume, "logdir": logdir},
                               max_concurrency=8, env_vars=cpu, resources=near_learner))
    replay = program.add(Node(
        "replay", nc.ReplayServer,
        {"table": table_spec(builder, env_spec), "seed": derive_seed(config.seed, REPLAY_STREAM),
         "resume": config.distributed.resume, "logdir": logdir},
        max_concurrency=max(8, 2 * config.distributed.num_actors + config.distributed.prefetch + 4), env_vars=cpu, resources=near_learner))
    weights = program.add(Node(
        "weights", nc.WeightServer, {"precision": config.precision, "logdir": logdir},
        max_concurrency=max(4, config.distributed.num_actors + 3), env_vars=cpu, resources=near_learner))
    program.add(Node(
        "learner", nc.LearnerNode,
        {"spec": spec, "seed": derive_seed(config.seed, LEARNER_STREAM), "replay": replay, "counter": counter,
         "weights": weights, "logdir": logdir, "precision": config.precision, "publish_period": config.distributed.publish_period,
         "prefetch": config.distributed.prefetch, "checkpoint_every": config.distributed.checkpoint_every, "resume": config.distributed.resume,
         "run_config": config.to_dict(), "log_every_s": config.distributed.log_every_s,
         "steps_per_call": config.distributed.learner_steps_per_call, "publish_min_interval_s": config.distributed.publish_min_interval_s},
        kind="worker", num_cpus=1, accelerator=ACCELERATOR_BY_DEVICE[config.learner_device], max_concurrency=4,
        env_vars=learner_env(config.learner_device), resources=near_learner))
    for i in range(config.distributed.num_actors):
        program.add(Node(
            f"actor_{i}", nc.ActorNode,
            {"spec": spec, "actor_id": i, "num_actors": config.distributed.num_actors,
             "seed": derive_seed(config.seed, ACTOR_STREAM, i), "precision": config.precision,
             "backend": config.backend, "kernel_form": config.kernel_form, "replay": replay, "counter": counter, "weights": weights,
             "logdir": logdir, "max_actor_steps": config.max_actor_steps, "insert_batch": config.distributed.insert_batch,
             "envs_per_actor": config.envs_per_actor, "pin": config.distributed.pin_actors},
            kind="worker", num_cpus=1, max_concurrency=3, max_restarts=3, env_vars=SINGLE_THREAD_ENV,
            resources=dict(config.distributed.actor_resources)))
    program.add(Node(
        "evaluator", nc.Evaluator,
        {"spec": spec, "seed": derive_seed(config.seed, EVAL_STREAM), "precision": config.precision,
         "backend": config.backend, "kernel_form": config.kernel_form, "weights": weights, "counter": counter,
         "logdir": logdir, "eval_every": config.eval_every, "episodes": config.eval_episodes},
        kind="worker", num_cpus=1, max_concurrency=3, env_vars=SINGLE_THREAD_ENV, resources=near_learner))
    return program


def actor_names(program: Program) -> Sequence[str]:
    return program.names(kind="worker", prefix="actor_")
