"""The floors: each package imports only those below it.

    gateway  ->  node  ->  common  ->  kernel_pool

Every import counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``): a lazy import hides the climb from Python at run time, not from a reader.
The gateway may import the node (where it chooses the host); the node never imports the
gateway, ``common`` neither of them, and ``kernel_pool`` none of the three.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent

FORBIDDEN = {
    "node": {"gateway"},
    "common": {"gateway", "node"},
    "kernel_pool": {"common", "gateway", "node"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """The absolute names a module imports (relative imports stay inside its package), with
    their line numbers."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module))
    return found


def _climbs(package: str) -> list[str]:
    below = FORBIDDEN[package]
    return [f"{path.relative_to(REPO)}:{line} imports {name}"
            for path in sorted((REPO / package).rglob("*.py"))
            for line, name in _imports(path)
            if name.partition(".")[0] in below]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_never_imports_one_above_it(package: str) -> None:
    assert _climbs(package) == []


def test_a_lazy_import_counts_too(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from gateway.store import Store\n"
                      "def f():\n    import gateway.errors\n")

    assert [name for _, name in _imports(module)] == ["typing", "gateway.store",
                                                     "gateway.errors"]
