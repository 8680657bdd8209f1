"""The house rules, enforced: the packages import downwards only, no module imports itself back, the library and the
agents never import Ray, and no module grows past MAX_LINES.

Layers, lowest first: `quarl` (the library) < `agents` < `analysis` < `launch` < `bench`. Inside `quarl`, `launch` and
`bench` the sub-packages are tiered too (`TIERS`): a module may import its own sub-package and lower tiers, never a
sibling of its own tier or anything above. Imports are read with ast, so lazy imports inside functions count;
sub-packages are walked, and a package's `__init__` counts as a module of its own.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("quarl", "agents", "analysis", "launch", "bench")
MAX_LINES = 400
# Sub-package tiers, lowest first; a top-level module of a package (launch's CLIs) is that package's top tier.
TIERS: dict[str, list[tuple[str, ...]]] = {
    "quarl": [("quarl.ops", "quarl.policy", "quarl.envs", "quarl.replay"), ("quarl.quant", "quarl.nets"),
              ("quarl.runtimes",), ("quarl.acting",)],
    "launch": [("launch.program",), ("launch.experiments",), ("launch.distributed",), ("launch.grid",)],
    "bench": [("bench.harness",), ("bench.micro", "bench.system", "bench.learning", "bench.peers")],
}
NO_RAY = ("quarl", "agents")  # the library and the agents run anywhere, Ray or not
# Untyped values: the lines of these packages that name `Any` (as `grep -rnw Any` counts them), an alias of Any
# (`X: TypeAlias = Any`, `X = Any`) and its uses counting as Any, stay within this budget (issue 46).
TYPED = ("quarl", "agents", "launch")
MAX_ANY_LINES = 40
_ALIAS_OF_ANY = re.compile(r"^\s*(\w+)\s*(?::\s*(?:typing\.)?TypeAlias\s*)?=\s*(?:typing\.)?Any\s*(?:#.*)?$")


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


def _graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = _modules(root, packages)
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




def _place(module: str) -> tuple[int, int, str]:
    """(package layer, tier inside the package, sub-package) of a module; a package's own top-level modules (and
    its `__init__`) sit above its tiers."""
    top = module.split(".")[0]
    for tier, group in enumerate(TIERS.get(top, [])):
        for sub in group:
            if module == sub or module.startswith(sub + "."):
                return PACKAGES.index(top), tier, sub
    return PACKAGES.index(top), len(TIERS.get(top, [])), top


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up a layer, up a tier, or sideways to a sibling sub-package of the same tier."""
    out = []
    for module, imported in sorted(graph.items()):
        here = _place(module)
        for other in sorted(imported):
            there = _place(other)
            if there[:2] > here[:2] or (there[:2] == here[:2] and there[2] != here[2]):
                out.append(f"{module} -> {other}")
    return out


def _third_party(path: Path, name: str) -> bool:
    """Whether the file imports top-level package `name` anywhere (lazy imports included)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n == name or n.startswith(name + ".") for n in names):
            return True
    return False


def _any_lines(root: Path, packages: tuple[str, ...] = TYPED) -> dict[str, int]:
    """{file: lines naming Any or an alias of Any as a word} over `packages` (files with none left out)."""
    texts = {path: path.read_text(encoding="utf-8").splitlines()
             for package in packages for path in sorted((root / package).rglob("*.py"))}
    aliases = {m.group(1) for lines in texts.values() for line in lines if (m := _ALIAS_OF_ANY.match(line))}
    word = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted({"Any", *aliases}))) + r")\b")
    counts = {str(path.relative_to(root)): sum(1 for line in lines if word.search(line))
              for path, lines in texts.items()}
    return {name: n for name, n in counts.items() if n}


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
    graph = _graph(tmp_path, ("launch", "agents"))
    assert set(graph) == {"launch", "launch.cli", "launch.ptq", "launch.pkg", "launch.pkg.core", "launch.pkg.local",
                          "agents"}
    assert graph["launch.pkg.local"] == {"launch.cli", "launch.pkg", "launch.pkg.core", "launch.ptq"}


def test_layer_rules_see_upward_and_sideways_imports():
    graph = {"quarl.ops.io": set(), "quarl.quant.payload": {"quarl.ops.io"}, "agents.dqn": {"quarl.quant.payload"},
             "quarl.policy.spec": {"quarl.quant.payload"}, "quarl.envs.vector": {"quarl.replay.table"},
             "launch.experiments.x": {"launch.distributed.y"}, "launch.actorq": {"launch.distributed.y"},
             "bench.micro.a": {"bench.harness.m", "bench.learning.b"}, "analysis.runs": {"launch.actorq"}}
    assert _upward(graph) == ["analysis.runs -> launch.actorq", "bench.micro.a -> bench.learning.b",
                              "launch.experiments.x -> launch.distributed.y", "quarl.envs.vector -> quarl.replay.table",
                              "quarl.policy.spec -> quarl.quant.payload"]


def test_no_import_cycle():
    graph = _graph()
    assert {"quarl.replay", "agents.learner_base", "analysis.schema", "launch.cli", "bench.harness.machine"} <= set(graph)
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_imports_go_down_the_layers():
    assert _upward(_graph()) == []


def test_library_and_agents_do_not_import_ray():
    offenders = [name for name, path in _modules(REPO, NO_RAY).items() if _third_party(path, "ray")]
    assert not offenders, f"Ray belongs in launch/: {offenders}"


def test_no_module_is_over_the_line_limit():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in _modules(REPO).items()}
    over = {n: s for n, s in sizes.items() if s > MAX_LINES}
    assert not over, f"split these (lines): {over}"


def test_any_counter_counts_aliases_of_any_and_their_uses(tmp_path):
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "a.py").write_text(
        "from typing import Any, TypeAlias\nBlob: TypeAlias = Any\nLoose = Any  # untyped\n"
        "def f(x: Blob) -> Loose: ...\nAnyway = 1\nBlobs = 2\n")
    (tmp_path / "launch" / "b.py").write_text("def g(y: Blob) -> int: ...\n")
    assert _any_lines(tmp_path) == {"launch/a.py": 4, "launch/b.py": 1}


def test_few_values_are_untyped():
    counts = _any_lines(REPO)
    listed = ", ".join(f"{name}: {n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    assert sum(counts.values()) <= MAX_ANY_LINES, (
        f"{sum(counts.values())} lines of {'/, '.join(TYPED)}/ name Any or an alias of it (at most {MAX_ANY_LINES}): "
        f"{listed}")
