"""Every code name docs/ARCHITECTURE.md cites exists in the code (issue 46, item 7).

The document is the contract a maintainer reads first; a name that drifted (a field that moved to another
class, a method that was renamed) makes it lie quietly. This test reads every `backticked` token, and checks:
- a dotted path that starts with a package (`quarl.ops.io.write_json_atomic`): the module, then the name in it,
  then attributes of the class it names (inherited ones included);
- `Class.attr` / `Class`: a class of that name, with that attribute (methods, fields, `self.attr` assignments);
- `function(...)`: a function or method of that name somewhere in the packages;
- `python -m module`: the module.
It reads the code with `ast` (nothing is imported), so it is fast and sees no runtime-made names.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

from tests.test_structure import PACKAGES, _modules

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
MAX_LINES = 250
_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass
class Module:
    names: set[str] = field(default_factory=set)


@dataclass
class Index:
    modules: dict[str, Module] = field(default_factory=dict)
    classes: dict[str, set[str]] = field(default_factory=dict)  # class name -> its attributes (all classes of the name)
    bases: dict[str, set[str]] = field(default_factory=dict)
    functions: dict[str, list[set[str]]] = field(default_factory=dict)  # name -> each definition's parameters
    all_attrs: set[str] = field(default_factory=set)

    def class_attrs(self, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        attrs = set(self.classes.get(name, ()))
        for base in self.bases.get(name, ()):
            if base not in seen:
                attrs |= self.class_attrs(base, seen | {name})
        return attrs


def _target_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for elt in node.elts for n in _target_names(elt)]
    return []


def _class_attrs(cls: ast.ClassDef) -> set[str]:
    attrs: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            attrs.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            attrs.update(n for t in stmt.targets for n in _target_names(t))
        elif isinstance(stmt, ast.AnnAssign):
            attrs.update(_target_names(stmt.target))
    for node in ast.walk(cls):  # self.x = ... / self.x: T = ... in any method
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                attrs.add(t.attr)
    return attrs


@lru_cache(maxsize=1)
def index() -> Index:
    idx = Index()
    for name, path in _modules(ROOT).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        mod = idx.modules.setdefault(name, Module())
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                mod.names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                mod.names.update(n for t in stmt.targets for n in _target_names(t))
            elif isinstance(stmt, ast.AnnAssign):
                mod.names.update(_target_names(stmt.target))
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                mod.names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                idx.classes.setdefault(node.name, set()).update(_class_attrs(node))
                idx.bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                    if isinstance(b, (ast.Name, ast.Attribute)))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p}
                idx.functions.setdefault(node.name, []).append(params)
    idx.all_attrs = {a for attrs in idx.classes.values() for a in attrs}
    return idx


def _cited_params(token: str) -> set[str]:
    """The parameter names a cited call spells out: `f(a, b: T, *, c=1)` -> {a, b, c} (depth-0 commas)."""
    inner = token[token.index("(") + 1:token.rindex(")")] if ")" in token else ""
    args, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            args, cur = args + [cur], ""
        else:
            cur += ch
    names = set()
    for arg in args + [cur]:
        name = re.split(r"[:=]", arg, maxsplit=1)[0].strip()
        if re.fullmatch(r"[a-z_]\w*", name) and name not in ("self",):
            names.add(name)
    return names


def problem(token: str, idx: Index) -> str | None:
    """Why `token` names nothing in the code, or None (found, or not a code name this test can check)."""
    token = token.strip()
    if token.startswith("python -m "):
        module = token.split()[2]
        return None if module in idx.modules else f"no module {module}"
    called = "(" in token
    path = token.split("(", 1)[0].strip()
    if re.fullmatch(r"\.[a-z_]\w*", path):  # `.attr`: an attribute some class has
        return None if path[1:] in idx.all_attrs or path[1:] in idx.functions else f"no class has {path}"
    if not _PATH.match(path):
        return None
    parts = path.split(".")
    if parts[0] in PACKAGES:
        cut = max((k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in idx.modules), default=0)
        if cut == 0:
            return f"no module {parts[0]}"
        rest, module = parts[cut:], idx.modules[".".join(parts[:cut])]
        if not rest:
            return None
        if rest[0] not in module.names:
            return f"{'.'.join(parts[:cut])} has no {rest[0]}"
        owner = rest[0]
        for attr in rest[1:]:
            if owner not in idx.classes:
                return None  # an imported value, a module-level instance: not followed
            if attr not in idx.class_attrs(owner):
                return f"{owner} has no attribute {attr}"
            owner = attr
        return None
    if parts[0][:1].isupper() and parts[0] in idx.classes:
        return next((f"{parts[0]} has no attribute {a}" for a in parts[1:2] if a not in idx.class_attrs(parts[0])),
                    None)
    if parts[0][:1].isupper() and len(parts) > 1 and parts[0] not in idx.classes and not parts[0].isupper():
        return f"no class {parts[0]}"
    name = parts[-1]
    if called and len(parts) == 1 and name not in idx.functions and name not in idx.classes:
        return f"no function {name}"
    if called and name in idx.functions and "=" not in token.split("(", 1)[0]:
        cited = _cited_params(token)
        if cited and not any(cited <= params for params in idx.functions[name]):
            return f"no {name} takes ({', '.join(sorted(cited))})"
    return None


def cited_tokens(text: str) -> list[str]:
    code_blocks = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", code_blocks)


def test_architecture_doc_names_only_what_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    idx = index()
    missing = sorted({f"`{t}`: {why}" for t in cited_tokens(text) if (why := problem(t, idx))})
    assert not missing, "docs/ARCHITECTURE.md cites names the code does not have:\n" + "\n".join(missing)


def test_architecture_doc_is_short() -> None:
    lines = DOC.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"docs/ARCHITECTURE.md has {lines} lines; contracts only, <= {MAX_LINES}"


@pytest.mark.parametrize("token, found", [
    ("quarl.ops.io.write_json_atomic", True), ("quarl.ops.io.no_such_function", False),
    ("ExperimentConfig.learner_loop", True), ("ExperimentConfig.no_such_field", False),
    ("make_executor(spec)", True), ("no_such_function(x)", False), ("python -m launch.train", True),
    ("python -m launch.no_such_cli", False), ("NoSuchClass.attr", False),
    ("quarl.ops.io.write_json_atomic(path, obj)", True), ("write_json_atomic(path, key)", False),
    (".restore", True), (".no_such_attribute", False),
])
def test_the_checker_tells_real_names_from_drifted_ones(token: str, found: bool) -> None:
    assert (problem(token, index()) is None) is found
