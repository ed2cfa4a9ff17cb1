"""Where a link in the workspace leads, read as the sandbox reads it, without leaving it.

The workspace is a folder on the host, mounted in the sandbox at ``/home/user``: a link's text
means a path in the sandbox, and the same text followed on the host would name the host's own
files. So a link is resolved here by hand, one component at a time inside the workspace: an
absolute target under ``/home/user`` (or ``/workspace``, which the image links there) is
mapped into the workspace; any other absolute target, a ``..`` above the workspace, a missing
component or a loop ends the walk with None, and the link is then described as itself.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from collections.abc import Callable

from kernel_pool.exceptions import WorkspaceError

MAX_HOPS = 40
"""Links followed in one resolution, as Linux's own limit (``ELOOP``)."""

Lookup = Callable[[list[str], str], tuple[os.stat_result, str | None]]
"""What is at ``name`` in the workspace folder ``folder`` (not followed), and the text of a
link; raises ``OSError`` or a :class:`WorkspaceError` when it cannot be reached."""


def resolve(parts: list[str], lookup: Lookup, roots: tuple[str, ...]) -> list[str] | None:
    """The components of the workspace path ``parts`` leads to, every link on the way followed
    inside the workspace (``roots``: where the sandbox has it); None if it leaves it, leads
    nowhere or loops."""
    pending = deque(parts)
    resolved: list[str] = []
    hops = 0
    while pending:
        name = pending.popleft()
        if name in ("", "."):
            continue
        if name == "..":
            if not resolved:
                return None
            resolved.pop()
            continue
        try:
            info, text = lookup(resolved, name)
        except (OSError, WorkspaceError):  # gone, not a folder, swapped for a link
            return None
        if text is None:
            if pending and not stat.S_ISDIR(info.st_mode):
                return None
            resolved.append(name)
            continue
        hops += 1
        if hops > MAX_HOPS:
            return None
        if text.startswith("/"):
            inside = _inside(text, roots)
            if inside is None:
                return None
            resolved = []
            text = inside
        pending.extendleft(reversed(text.split("/")))
    return resolved


def _inside(target: str, roots: tuple[str, ...]) -> str | None:
    """An absolute target as a path relative to the workspace, None when outside it."""
    for root in roots:
        if target == root or target.startswith(root + "/"):
            return target[len(root):].lstrip("/")
    return None
