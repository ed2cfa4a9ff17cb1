"""The one staircase: the gateway reaches kernel_pool through its package face only.

ARCHITECTURE.md's rule, checked on the source: a gateway module imports ``kernel_pool`` (its
``__all__``), never one of its modules, except the one adapter onto the Docker backend
(``gateway/doctor.py``); and no gateway code reaches through a session into its kernel or
sandbox.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
ADAPTER = GATEWAY / "doctor.py"


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
