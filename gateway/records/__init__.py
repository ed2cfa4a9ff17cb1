"""The gateway's records, one module per aggregate, each a :class:`common.store.Store` with its
tables' methods; :class:`gateway.store.Store` is all of them together."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["in_list"]


def in_list(values: Sequence[str]) -> tuple[str, dict[str, str]]:
    """An ``IN (...)`` list of named parameters for ``values`` (not empty), and their values."""
    names = {f"v{index}": value for index, value in enumerate(values)}
    return ", ".join(":" + name for name in names), names
