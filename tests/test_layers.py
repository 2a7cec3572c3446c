"""The package's layers: every import points downwards, and no module imports itself round a circle.

Imports are read with ast (inside functions too, where a circle can hide); blocks under
``if TYPE_CHECKING:`` never run and are left out. The layers are documented in docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "distdoctor"

# What each layer may import (besides the standard library and third-party packages).
# The top level (distdoctor/*.py: the ways in and public helpers) may import every layer.
ALLOWED = {
    "core": {"core"},
    "machine": {"core", "machine"},
    "checks": {"core", "machine", "checks"},
    "diagnosis": {"core", "diagnosis"},
    "timeline": {"core", "diagnosis", "timeline"},
    "explain": {"core", "diagnosis", "explain"},
    "lint": {"core", "lint"},
    "world": {"core", "machine", "checks", "world"},
    "embedded": {"core", "machine", "checks", "world", "diagnosis", "timeline", "embedded"},
    "stacks": {"core", "machine", "diagnosis", "stacks"},
    "bench": {"core", "machine", "checks", "world", "bench"},
}
# The command line (distdoctor/cli/: the app and its commands in __init__, their helpers beside them)
# is a way in like the top level: it may import every layer.
ALLOWED["cli"] = set(ALLOWED) | {"cli"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    """'core' for distdoctor.core.x; None for the top level (distdoctor, distdoctor.cli, ...)."""
    parts = module.split(".")
    if len(parts) >= 2 and (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(node: ast.AST, here: str, is_package: bool, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "distdoctor"]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = here.split(".") if is_package else here.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "distdoctor":
        return []
    # `from pkg import mod` imports the submodule pkg.mod when there is one.
    subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
    return subs or [target]


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
                   for n in ast.walk(node)}
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            for target in _imported(node, name, path.name == "__init__.py", known):
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    # Package __init__ modules re-exporting their own submodules are not circles of concern:
    # importing a.b always runs a/__init__ first, so an edge a.b -> a is implied anyway.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if node.startswith(nxt + ".") or nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_circles():
    circle = find_circle(import_graph())
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_every_import_points_down():
    upward = []
    for module, targets in import_graph().items():
        layer = layer_of(module)
        if layer is None:
            continue
        assert layer in ALLOWED, f"{module}: layer {layer!r} is not in the test's table"
        for target in targets:
            target_layer = layer_of(target)
            if target_layer is None and layer == "cli":
                continue  # the command line, a way in, uses the top level's dispatch
            if target_layer is None or target_layer not in ALLOWED[layer]:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(upward))


def test_top_level_holds_only_the_ways_in():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "dispatch", "fakes", "pytest_plugin", "testing"]
    assert (PACKAGE / "cli" / "__init__.py").is_file()  # the command line: a package of its own


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    graph = {"distdoctor.core.a": {"distdoctor.world.b"}, "distdoctor.world.b": {"distdoctor.core.a"}}
    assert find_circle(graph) == ["distdoctor.core.a", "distdoctor.world.b", "distdoctor.core.a"]
    assert "world" not in ALLOWED["core"]


@pytest.mark.parametrize("module", ["distdoctor.cli"])
def test_cli_import_loads_no_torch_and_no_world(module):
    import subprocess
    import sys

    code = (f"import sys, {module}; bad = [m for m in sys.modules if m == 'torch' or m.startswith('distdoctor.world')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
