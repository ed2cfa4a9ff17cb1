"""E2B's paths and the workspace's: ``/home/user`` is the session's workspace.

E2B code names files absolutely under ``/home/user`` or relative to it; replgate's workspace
API takes paths relative to the workspace, which the sandbox has at ``/home/user``, so the kernel
opens the same file by either name.
"""

from __future__ import annotations

import posixpath

from gateway.e2b._errors import E2BError

HOME = "/home/user"


def to_workspace(path: str) -> str:
    """An E2B path as a workspace path (``""`` is the workspace itself)."""
    if "\x00" in path:
        raise E2BError(400, "a path cannot contain a NUL character")
    if path.startswith("~"):
        path = HOME + path[1:]
    normal = posixpath.normpath(path) if path else "."
    if normal.startswith("/"):
        if normal == HOME:
            return ""
        if not normal.startswith(HOME + "/"):
            raise E2BError(400, f"path {path!r} is outside /home/user: this call works on "
                                "the sandbox's workspace only, which is /home/user")
        return normal[len(HOME) + 1:]
    if normal == ".":
        return ""
    if normal == ".." or normal.startswith("../"):
        raise E2BError(400, f"path {path!r} leaves /home/user, the sandbox's workspace")
    return normal


def to_e2b(path: str) -> str:
    """A workspace path as the absolute E2B path."""
    return f"{HOME}/{path}" if path else HOME
