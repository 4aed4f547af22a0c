"""The layering of docs/reference.md §0, enforced by reading every module's imports (no
execution)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"core", "sim", "backends", "server"}
IO_ASYNC_ARRAY = {
    "asyncio",
    "trio",
    "anyio",
    "threading",
    "multiprocessing",
    "concurrent",
    "socket",
    "subprocess",
    "time",
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "numpy",
    "cupy",
    "pyopencl",
    "select",
    "selectors",
    "signal",
    "random",
    "datetime",
    "urllib",
    "http",
    "httpx",
    "hypercorn",
}


def imports(path: Path) -> set[str]:
    """Top-level module names imported by ``path`` (including inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def full_imports(path: Path) -> set[str]:
    """Dotted module names imported by ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_imports_no_project_io_async_or_arrays(path: Path) -> None:
    found = imports(path)
    assert not (found & (PROJECT - {"core"})), f"{path} imports {found & PROJECT}"
    assert not (found & IO_ASYNC_ARRAY), f"{path} imports {found & IO_ASYNC_ARRAY}"


@pytest.mark.parametrize("path", modules("backends"), ids=lambda p: str(p.relative_to(ROOT)))
def test_backends_import_only_core(path: Path) -> None:
    found = imports(path) & PROJECT
    assert found <= {"core", "backends"}, f"{path} imports {found}"


@pytest.mark.parametrize("path", modules("server"), ids=lambda p: str(p.relative_to(ROOT)))
def test_server_never_imports_sim_at_module_level(path: Path) -> None:
    tree = ast.parse(path.read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top.add(node.module.split(".")[0])
    assert "sim" not in top, f"{path} imports sim at module level (only the CLI may, lazily)"
    if path.name != "cli.py":
        assert "sim" not in imports(path), f"{path} imports sim"


@pytest.mark.parametrize(
    "path",
    [p for p in modules("server") if "runtime" in p.relative_to(ROOT).parts or p.stem == "runtime"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_server_runtime_imports_only_core(path: Path) -> None:
    found = imports(path) & PROJECT
    dotted = {m for m in full_imports(path) if m.split(".")[0] == "server"}
    assert found <= {"core", "server"}, f"{path} imports {found}"
    assert all(m.startswith("server.runtime") for m in dotted), f"{path} imports {dotted}"
    assert not (imports(path) & {"numpy", "cupy", "pyopencl"}), (
        "the runtime must run without array libraries"
    )


@pytest.mark.parametrize("path", modules("sim"), ids=lambda p: str(p.relative_to(ROOT)))
def test_sim_imports_core_and_runtime_only(path: Path) -> None:
    found = imports(path) & PROJECT
    dotted = {m for m in full_imports(path) if m.split(".")[0] == "server"}
    assert found <= {"core", "server", "sim"}, f"{path} imports {found}"
    assert all(m.startswith("server.runtime") for m in dotted), f"{path} imports {dotted}"


def test_the_rules_see_every_package() -> None:
    assert modules("core"), "core has modules"
    assert modules("backends"), "backends has modules"


def module_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (anywhere, TYPE_CHECKING blocks
    included: a cycle hidden behind TYPE_CHECKING is still two modules that need each other).
    ``from pkg import sub`` depends on the submodule ``pkg.sub``, not on ``pkg``."""
    modules: dict[str, Path] = {}
    for package in sorted(PROJECT):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [s for s in subs if s in modules] or [node.module]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative order)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    graph = module_graph()
    assert len(graph) > 50, "the graph sees every module"
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
