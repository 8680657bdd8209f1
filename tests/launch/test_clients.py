"""Node clients typed by a Protocol per node (`launch.distributed.clients`, `launch.program.graph.connect`): every
method a Protocol declares exists on its node class with the same parameters, no module of launch/ names a node
method in a string (`handle.call("name", ...)`), and the proxy calls through, checks names and submits."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Protocol

import pytest

from launch.distributed import clients
from launch.distributed.nodes.actor import ActorNode
from launch.distributed.nodes.base import NodeBase
from launch.distributed.nodes.evaluator import Evaluator
from launch.distributed.nodes.learner import LearnerNode
from launch.distributed.nodes.rollout_actor import RolloutActorClient, RolloutActorNode
from launch.distributed.nodes.rollout_learner import RolloutLearnerNode
from launch.distributed.nodes.services import Counter, ReplayServer, WeightServer
from launch.program.graph import NodeControl, WorkerControl, connect, protocol_methods, submit
from launch.program.local_runner import DaemonPool, LocalNodeHandle

REPO = Path(__file__).resolve().parents[2]

# Each client Protocol -> the node classes that answer it.
ANSWERED_BY: dict[type, tuple[type, ...]] = {
    NodeControl: (NodeBase,),
    WorkerControl: (ActorNode, LearnerNode, RolloutLearnerNode, Evaluator, RolloutActorNode),
    clients.ServiceClient: (NodeBase,),
    clients.CounterClient: (Counter,),
    clients.ReplayClient: (ReplayServer,),
    clients.WeightServerClient: (WeightServer,),
    clients.LearnerClient: (LearnerNode, RolloutLearnerNode),
    clients.EvaluatorClient: (Evaluator,),
    RolloutActorClient: (RolloutActorNode,),
}


def _parameters(fn: object) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def test_every_protocol_method_exists_on_its_nodes_with_the_same_parameters():
    declared = {v for v in vars(clients).values()
                if isinstance(v, type) and issubclass(v, Protocol) and v.__module__ == clients.__name__}
    assert declared <= set(ANSWERED_BY), f"client Protocols without nodes here: {declared - set(ANSWERED_BY)}"
    for protocol, nodes in ANSWERED_BY.items():
        methods = protocol_methods(protocol)
        assert methods, protocol.__name__
        for node in nodes:
            for name in methods:
                # the most derived declaration of the method in the Protocol's bases
                declared_fn = next(vars(k)[name] for k in protocol.__mro__ if name in vars(k))
                node_fn = getattr(node, name, None)
                assert callable(node_fn), f"{node.__name__} has no {name}() ({protocol.__name__} declares it)"
                if protocol is WorkerControl and name == "stop":
                    continue  # workers' stop() may take arguments; their own Protocols declare them
                assert _parameters(node_fn) == _parameters(declared_fn), \
                    f"{node.__name__}.{name} and {protocol.__name__}.{name} take different parameters"


def test_no_launch_module_names_a_node_method_in_a_string():
    found = []
    for path in sorted((REPO / "launch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("call", "submit") and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, f"node methods named in strings (use connect(handle, XClient)): {found}"


def test_client_calls_checks_names_and_submits():
    pool = DaemonPool(2, thread_name_prefix="test-client")
    try:
        counter = connect(LocalNodeHandle(Counter(), pool), clients.CounterClient)
        assert counter.increment(actor_steps=3)["actor_steps"] == 3
        assert submit(counter).increment(actor_steps=2).result(timeout=10)["actor_steps"] == 5
        assert counter.get()["actor_steps"] == 5
        with pytest.raises(AttributeError, match="CounterClient declares no method 'incremnt'"):
            counter.incremnt(actor_steps=1)  # type: ignore[attr-defined]
        with pytest.raises(AttributeError, match="declares no method 'sample_stacked'"):
            submit(counter).sample_stacked(1, 1)
        with pytest.raises(TypeError, match="client made by connect"):
            submit(LocalNodeHandle(Counter(), pool))
    finally:
        pool.shutdown()
