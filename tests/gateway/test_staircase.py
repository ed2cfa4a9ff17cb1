"""The one staircase: the gateway reaches kernel_pool through its package face only.

ARCHITECTURE.md's rule, checked on the source: a gateway module imports ``kernel_pool`` (its
``__all__``), never one of its modules, except the one adapter onto the Docker backend
(``gateway/doctor.py``); no gateway code reaches through a session into its kernel or
sandbox; and the gateway holds its sessions through the port without asking which kind it
holds: only the modules that choose the host (``app.py``, ``cli.py``) import ``node`` or test a
port object's type.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
ADAPTER = GATEWAY / "doctor.py"
CHOOSERS = {GATEWAY / "app.py", GATEWAY / "cli.py"}
"""Where the host is chosen: the only gateway modules that may know which one it is."""
PORT_TYPES = {"KernelPool", "Session", "RemoteSession", "RemoteNodes"}
"""The implementations behind the port (``SessionPort``, ``SessionHost``)."""


def _deep_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [f"{path.relative_to(GATEWAY.parent)}:{node.lineno} {name}"
                  for name in names if name.startswith("kernel_pool.")]
    return found


def test_gateway_imports_only_kernel_pools_package_face() -> None:
    modules = sorted(GATEWAY.rglob("*.py"))
    assert len(modules) > 30
    deep = [hit for path in modules if path != ADAPTER for hit in _deep_imports(path)]
    assert deep == []
    # The adapter is the one exception, and only for the Docker backend package.
    assert [hit.split()[-1] for hit in _deep_imports(ADAPTER)] == ["kernel_pool.backends.docker"]


def test_no_gateway_code_reaches_into_a_sessions_kernel() -> None:
    reach = re.compile(r"session\w*\.(kernel|sandbox)\.")
    hits = [f"{path.relative_to(GATEWAY.parent)}:{number}"
            for path in sorted(GATEWAY.rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if reach.search(line)]
    assert hits == []


def _names(node: ast.expr) -> set[str]:
    """The class names an ``isinstance`` second argument names (``A``, ``m.A``, ``(A, B)``,
    ``A | B``)."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    if isinstance(node, ast.BinOp):
        return _names(node.left) | _names(node.right)
    return set()


def _branches_on_port(path: Path) -> list[str]:
    return [f"{path.relative_to(GATEWAY.parent)}:{node.lineno}"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2
            and _names(node.args[1]) & PORT_TYPES]


def _node_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [f"{path.relative_to(GATEWAY.parent)}:{node.lineno} {name}"
                  for name in names if name == "node" or name.startswith("node.")]
    return found


def test_the_gateway_never_asks_which_port_it_holds() -> None:
    hits = [hit for path in sorted(GATEWAY.rglob("*.py")) if path not in CHOOSERS
            for hit in _branches_on_port(path)]
    assert hits == []


def test_the_gateway_imports_node_only_where_it_chooses_the_host() -> None:
    hits = [hit for path in sorted(GATEWAY.rglob("*.py")) if path not in CHOOSERS
            for hit in _node_imports(path)]
    assert hits == []
