"""A workspace file's metadata: short text pairs kept as extended attributes ``user.e2b.<key>``.

The namespace is E2B's (its envd keeps upload metadata there), so code in the sandbox that sets
or reads ``user.e2b.*`` attributes itself sees the same pairs as the API. Keys are HTTP header
tokens (they travel as ``X-Metadata-<key>`` headers), lowercased as HTTP does; values are
printable ASCII. Linux keeps ``user.*`` attributes on regular files and folders only, and ext4
(the workspace's file system as root) holds all of one file's attributes in one 4 KiB block:
the bounds keep a full set well inside it.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping

from kernel_pool.exceptions import InvalidRequest, WorkspaceError, WorkspaceFull

PREFIX = "user.e2b."
MAX_KEYS = 32
MAX_KEY_LENGTH = 128
MAX_VALUE_LENGTH = 1024
MAX_TOTAL_LENGTH = 2048
"""Keys and values of one file together, in bytes."""

_KEY = re.compile(r"\A[A-Za-z0-9!#$%&'*+\-.^_`|~]+\Z")
_VALUE = re.compile(r"\A[\x20-\x7e]*\Z")


def check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    """``metadata`` with its keys lowercased, or :class:`InvalidRequest` naming what is wrong;
    None for none."""
    if not metadata:
        return None
    if len(metadata) > MAX_KEYS:
        raise InvalidRequest(f"{len(metadata)} metadata keys: a file takes at most {MAX_KEYS}")
    checked: dict[str, str] = {}
    for key, value in metadata.items():
        if not _KEY.match(key) or len(key) > MAX_KEY_LENGTH:
            raise InvalidRequest(
                f"invalid metadata key {key!r}: 1 to {MAX_KEY_LENGTH} characters, letters, "
                "digits and !#$%&'*+-.^_`|~ only (an HTTP header name)")
        if not _VALUE.match(value) or len(value) > MAX_VALUE_LENGTH:
            raise InvalidRequest(
                f"invalid metadata value for key {key!r}: at most {MAX_VALUE_LENGTH} printable "
                "ASCII characters (no line breaks)")
        checked[key.lower()] = value
    total = sum(len(key) + len(value) for key, value in checked.items())
    if total > MAX_TOTAL_LENGTH:
        raise InvalidRequest(f"metadata of {total} bytes (keys and values): a file takes at "
                             f"most {MAX_TOTAL_LENGTH}")
    return checked


def read_metadata(dir_fd: int, name: str) -> dict[str, str] | None:
    """The ``user.e2b.*`` attributes of ``name`` in the folder ``dir_fd`` (a link is not
    followed), the prefix dropped; None when it has none or cannot have any."""
    # The folder's descriptor names it through /proc: listxattr takes no dir_fd, and the
    # descriptor was opened without following links, so nothing outside can be reached.
    path = f"/proc/self/fd/{dir_fd}/{name}"
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return None
    found: dict[str, str] = {}
    for attribute in sorted(names):
        if not attribute.startswith(PREFIX) or len(found) >= MAX_KEYS:
            continue
        try:
            value = os.getxattr(path, attribute, follow_symlinks=False)
        except OSError:
            continue  # removed meanwhile
        found[attribute.removeprefix(PREFIX)] = value.decode("utf-8", "backslashreplace")
    return found or None


def replace_metadata(fd: int, metadata: Mapping[str, str] | None, path: str) -> None:
    """Make ``metadata`` (checked) the open file's only ``user.e2b.*`` attributes: a write
    without metadata clears what an earlier one left."""
    try:
        stale = [name for name in os.listxattr(fd) if name.startswith(PREFIX)]
    except OSError as exc:
        if metadata and exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise _unsupported(path) from exc
        return  # a file system without attributes has none to clear
    try:
        for name in stale:
            os.removexattr(fd, name)
        for key, value in (metadata or {}).items():
            os.setxattr(fd, PREFIX + key, value.encode("ascii"))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise WorkspaceFull() from exc
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise _unsupported(path) from exc
        raise WorkspaceError(f"{path!r}: its metadata cannot be set: {exc.strerror}") from exc


def _unsupported(path: str) -> WorkspaceError:
    return WorkspaceError(f"{path!r}: the workspace's file system keeps no metadata (extended "
                          "attributes); write the file without metadata")


# -- copies: a fork's workspace, a bundle's ---------------------------------------------------
# Copied as raw bytes, whatever the sandbox's code set, and best-effort: a copy must not fail
# for an attribute its target cannot hold (the attributes go, the file is whole).

PAX_PREFIX = "SCHILY.xattr."
"""How GNU tar and libarchive name an extended attribute in a PAX header."""


def _raw(path: str) -> dict[str, bytes]:
    try:
        names = sorted(n for n in os.listxattr(path, follow_symlinks=False) if n.startswith(PREFIX))
    except OSError:
        return {}
    found: dict[str, bytes] = {}
    for name in names[:MAX_KEYS]:
        try:
            found[name] = os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
    return found


def _set_raw(path: str, attributes: Mapping[str, bytes]) -> None:
    for name, value in attributes.items():
        if name.startswith(PREFIX) and len(value) <= 64 * 1024:
            try:
                os.setxattr(path, name, value, follow_symlinks=False)
            except OSError:
                continue


def copy_metadata(src_dir_fd: int, name: str, dst_dir_fd: int) -> None:
    """Give ``name`` in ``dst_dir_fd`` the ``user.e2b.*`` attributes of ``name`` in
    ``src_dir_fd`` (neither followed if a link)."""
    _set_raw(f"/proc/self/fd/{dst_dir_fd}/{name}", _raw(f"/proc/self/fd/{src_dir_fd}/{name}"))


def pax_metadata(dir_fd: int, name: str) -> dict[str, str]:
    """The ``user.e2b.*`` attributes of ``name`` as a tar entry's PAX headers."""
    return {PAX_PREFIX + key: value.decode("utf-8", "surrogateescape")
            for key, value in _raw(f"/proc/self/fd/{dir_fd}/{name}").items()}


def restore_pax_metadata(dir_fd: int, name: str, headers: Mapping[str, str]) -> None:
    """Set on ``name`` the ``user.e2b.*`` attributes a tar entry's PAX headers carry."""
    _set_raw(f"/proc/self/fd/{dir_fd}/{name}", {
        key.removeprefix(PAX_PREFIX): value.encode("utf-8", "surrogateescape")
        for key, value in list(headers.items())[:4 * MAX_KEYS]
        if key.startswith(PAX_PREFIX)})
