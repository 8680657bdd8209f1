"""launch/ and agents/ stay small and acyclic: no module imports (directly or through others) a module that
imports it back, and no module grows past MAX_LINES. Sub-packages are walked; imports are read with ast, so
lazy imports inside functions count, and a package's `__init__` counts as a module of its own."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("launch", "agents")
MAX_LINES = 400


def _modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under each package (a package is its `__init__`)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` (file `path`) imports, at any depth of the file."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package, `level - 1` packages up
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for imported in names:
            # `from launch.x import y`: y may be a module of package launch.x, or a name defined in launch.x
            while imported and imported not in known:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                out.add(imported)
    return out


def _graph(root: Path = REPO) -> dict[str, set[str]]:
    modules = _modules(root)
    return {name: _imports(path, name, set(modules)) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path of module names, or None (depth-first search with colours). A package's
    `__init__` importing its own sub-modules is not a cycle unless a sub-module imports the package back."""
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


def test_imports_are_read_including_lazy_and_relative_ones_in_sub_packages(tmp_path):
    for rel in ("launch/__init__.py", "launch/cli.py", "launch/ptq.py", "launch/pkg/__init__.py",
                "launch/pkg/core.py", "launch/pkg/local.py", "agents/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "launch/pkg/local.py").write_text(
        "import launch.cli\nfrom launch.pkg import core\nfrom . import core as c\nfrom .core import Node\n"
        "def f():\n    from launch.ptq import main\n")
    graph = _graph(tmp_path)
    assert set(graph) == {"launch", "launch.cli", "launch.ptq", "launch.pkg", "launch.pkg.core", "launch.pkg.local",
                          "agents"}
    assert graph["launch.pkg.local"] == {"launch.cli", "launch.pkg", "launch.pkg.core", "launch.ptq"}


def test_launch_and_agents_have_no_import_cycle():
    graph = _graph()
    assert "launch.cli" in graph and "agents.learner_base" in graph
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_no_launch_or_agents_module_is_over_the_line_limit():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in _modules(REPO).items()}
    over = {n: s for n, s in sizes.items() if s > MAX_LINES}
    assert not over, f"split these (lines): {over}"
