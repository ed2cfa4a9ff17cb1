"""No import circles among the first-party modules.

The graph counts every import a module makes, wherever it stands: at module level, inside a
function and under ``TYPE_CHECKING``. A lazy or type-only import hides a circle from Python at
run time, not from a reader: two modules that name each other are one concept split in two,
or a definition in the wrong room. ``from package import name`` counts as importing the
submodule ``package.name`` when there is one, and the package (its ``__init__``) otherwise.
Importing a submodule is not counted as importing its parent packages: Python runs their
``__init__`` first, but that is the packaging's doing, not the module's.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("kernel_pool", "gateway", "node", "replgate", "bench", "common")


def _modules() -> dict[str, Path]:
    """Every first-party module by dotted name (a package by its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The first-party modules ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            # `import a.b.c` of a name that is not a module (rare) lands on its nearest module.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: set(_imported(name, path, modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep chain of imports cannot reach the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def _edges_within(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    members = set(component)
    return [f"{module} -> {target}" for module in component
            for target in sorted(graph[module] & members)]


def test_graph_sees_every_kind_of_import() -> None:
    graph = _graph()
    assert len(graph) > 100
    assert "kernel_pool._allowlist" in graph["kernel_pool.config"]  # inside a function
    assert "kernel_pool._kernel" in graph["kernel_pool._snapshot"]  # under TYPE_CHECKING
    assert "gateway.client._errors" in graph["gateway.client._tools"]  # relative
    assert "gateway.local" in graph["gateway.cli"]  # a submodule named by a from-import
    assert "gateway" not in graph["gateway.cli"]


def test_cycles_are_found_with_their_members() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    report = "\n\n".join("\n".join(_edges_within(component, graph)) for component in cycles)
    assert cycles == [], f"{len(cycles)} import circle(s):\n{report}"
