"""Imports inside functions (issue 46): in launch/ and agents/ at most MAX_FUNCTION_IMPORTS, each deferring a heavy
package its module would not load anyway (start-up time: a CLI fails on a bad flag before JAX or Ray load). An import
that loads nothing new belongs at the top, where a reader looks for it and tests/test_structure.py's cycle check sees
it plainly."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.test_structure import PACKAGES, REPO, _modules


HEAVY_ROOTS = frozenset({"jax", "jaxlib", "ray", "onnxruntime", "onnx", "orbax", "haiku", "optax", "rlax", "chex", "aqt",
                         "flax", "gymnax", "pandas", "matplotlib", "torch", "dm_control", "mujoco", "envpool",
                         "codecarbon"})
FUNCTION_IMPORT_PACKAGES = ("launch", "agents")
MAX_FUNCTION_IMPORTS = 40


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)


def _top_level_imports(path: Path) -> list[str]:
    """Modules a file imports when it is imported: module-level statements, inside if/try, not TYPE_CHECKING."""
    out: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.extend([node.module] + [f"{node.module}.{alias.name}" for alias in node.names])
            elif isinstance(node, (ast.If, ast.Try)) and not _is_type_checking(node):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(node.orelse)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return out


def _heavy_loader(modules: dict[str, Path]):
    """name -> the heavy root packages importing `name` loads (through the project's module-level imports)."""
    cache: dict[str, frozenset[str]] = {}

    def heavy(name: str) -> frozenset[str]:
        root = name.split(".")[0]
        if root in HEAVY_ROOTS:
            return frozenset({root})
        if root not in PACKAGES:
            return frozenset()
        if name not in cache:
            cache[name] = frozenset()  # a cycle contributes nothing twice
            parts, found = name.split("."), set()
            for k in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
                prefix = ".".join(parts[:k])
                if prefix in modules:
                    for imported in _top_level_imports(modules[prefix]):
                        if imported != prefix:
                            found |= heavy(imported)
            cache[name] = frozenset(found)
        return cache[name]
    return heavy


def function_level_imports(root: Path = REPO) -> list[tuple[str, int, str, frozenset[str]]]:
    """(file, line, imported module, heavy roots it loads that its module does not load at import) for every
    import statement inside a function of FUNCTION_IMPORT_PACKAGES."""
    modules = _modules(root)
    heavy = _heavy_loader(modules)
    rows = []
    for name, path in _modules(root, FUNCTION_IMPORT_PACKAGES).items():
        own = heavy(name)
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                               if f"{node.module}.{a.name}" in modules]
                else:
                    continue
                new = frozenset().union(*(heavy(t) for t in targets)) - own
                rows.append((str(path.relative_to(root)), node.lineno, targets[0], new))
    return sorted(set(rows))


def test_imports_inside_functions_only_defer_heavy_packages() -> None:
    rows = function_level_imports()
    idle = [f"{f}:{line} {mod}" for f, line, mod, new in rows if not new]
    assert not idle, ("these imports inside functions load nothing heavy their module does not load already; "
                      "move them to the top:\n" + "\n".join(idle))
    assert len(rows) <= MAX_FUNCTION_IMPORTS, (
        f"{len(rows)} imports inside functions in {', '.join(FUNCTION_IMPORT_PACKAGES)} (at most "
        f"{MAX_FUNCTION_IMPORTS}): defer a heavy package once per module, behind one accessor")


def test_the_function_import_check_tells_a_deferral_from_an_idle_import(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "launch" / "light.py").write_text("import json\n")
    (tmp_path / "launch" / "cli.py").write_text(
        "import os\n\ndef main():\n    import jax\n    from launch.light import x\n")
    (tmp_path / "agents" / "heavy.py").write_text("import jax\n\ndef f():\n    import jax.numpy\n")
    rows = {(f, mod): new for f, _, mod, new in function_level_imports(tmp_path)}
    assert rows[("launch/cli.py", "jax")] == {"jax"}  # defers JAX: allowed
    assert rows[("launch/cli.py", "launch.light")] == frozenset()  # loads nothing heavy: belongs at the top
    assert rows[("agents/heavy.py", "jax.numpy")] == frozenset()  # its module loads JAX already
