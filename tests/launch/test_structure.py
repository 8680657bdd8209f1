"""launch/ stays small and acyclic: no module imports (directly or through others) a module that imports it
back, and no module grows past MAX_LINES. Imports are read with ast, so lazy imports inside functions count."""
from __future__ import annotations

import ast
from pathlib import Path

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
MAX_LINES = 420


def _launch_imports(path: Path) -> set[str]:
    """The launch.* modules `path` imports, at any depth of the file (function-level imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        out.update(n.split(".")[1] for n in names if n.startswith("launch.") and n.count(".") >= 1)
    return out


def _graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in LAUNCH.glob("*.py")}
    return {name: {m for m in _launch_imports(p) if m in modules and m != name} for name, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path of module names, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_sees_a_cycle_and_a_clean_graph():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_are_read_including_lazy_ones(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import launch.cli\nfrom launch import program\ndef g():\n    from launch.ptq import main\n")
    assert _launch_imports(f) >= {"cli", "program", "ptq"}


def test_launch_has_no_import_cycle():
    graph = _graph()
    assert "grid_cluster" in graph and "reproduce" in graph
    assert _cycle(graph) is None, f"import cycle in launch/: {' -> '.join(_cycle(graph) or [])}"


def test_no_launch_module_is_over_the_line_limit():
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in LAUNCH.glob("*.py")}
    assert not {n: s for n, s in sizes.items() if s > MAX_LINES}, f"split these: {sizes}"
