"""The session's workspace: a size-capped folder shared by the host API and the kernel."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kp_support import mounts_under, run_ok

from kernel_pool import PathOutsideWorkspace, Session, WorkspaceError
from kernel_pool._workspace import SANDBOX_UID, Workspace


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    made = Workspace.create(tmp_path / "ws", 16 * 2**20)
    yield made
    made.destroy()


def test_create_mounts_a_capped_filesystem(workspace: Workspace) -> None:
    assert os.path.ismount(workspace.root)
    stats = os.statvfs(workspace.root)
    assert stats.f_blocks * stats.f_frsize <= 16 * 2**20
    assert workspace.root.stat().st_uid == SANDBOX_UID
    assert list(workspace.root.iterdir()) == []  # no lost+found for the user to trip on


def test_files_round_trip_with_relative_paths(workspace: Workspace) -> None:
    assert workspace.write_bytes("data/in.bin", b"\x00\x01") == 2
    workspace.write_bytes("top.txt", b"hello")
    assert workspace.read_bytes("data/in.bin", limit=10) == b"\x00\x01"
    listed = {f.path: f.size for f in workspace.list_files()}
    assert listed == {"data/in.bin": 2, "top.txt": 5}
    assert (workspace.root / "data" / "in.bin").stat().st_uid == SANDBOX_UID


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b", "", "a\\b", "x\x00y"])
def test_paths_leaving_the_workspace_are_refused(workspace: Workspace, path: str) -> None:
    with pytest.raises(PathOutsideWorkspace):
        workspace.write_bytes(path, b"x")


def test_symlinks_out_are_refused(workspace: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host")
    os.symlink(outside, workspace.root / "link")
    os.symlink(outside / "secret", workspace.root / "file-link")
    with pytest.raises(PathOutsideWorkspace):
        workspace.read_bytes("link/secret", limit=100)
    with pytest.raises(WorkspaceError):
        workspace.read_bytes("file-link", limit=100)
    with pytest.raises(WorkspaceError):
        workspace.write_bytes("file-link", b"overwrite")
    assert (outside / "secret").read_text() == "host"
    assert [f.path for f in workspace.list_files()] == []


def test_read_refuses_files_over_the_limit(workspace: Workspace) -> None:
    workspace.write_bytes("big", b"x" * 100)
    with pytest.raises(WorkspaceError, match="limit"):
        workspace.read_bytes("big", limit=10)


def test_destroy_leaves_nothing(tmp_path: Path) -> None:
    made = Workspace.create(tmp_path / "gone", 16 * 2**20)
    made.write_bytes("f", b"x")
    made.destroy()
    assert not made.root.exists()
    assert made.image is not None and not made.image.exists()
    assert mounts_under(tmp_path) == []


async def test_host_and_kernel_see_the_same_files(shared_session: Session) -> None:
    workspace = shared_session.kernel.sandbox.workspace
    workspace.write_bytes("shared/from-host.txt", b"from the host")
    output = await run_ok(shared_session, """
import os
print(os.getcwd())
print(open('shared/from-host.txt').read())
open('shared/from-kernel.txt', 'w').write('from the kernel')
""")
    assert output == "/workspace\nfrom the host\n"
    assert workspace.read_bytes("shared/from-kernel.txt", limit=100) == b"from the kernel"
    assert {"shared/from-host.txt", "shared/from-kernel.txt"} <= {
        f.path for f in workspace.list_files()}


async def test_write_fails_when_workspace_full(small_session: Session) -> None:
    output = await run_ok(small_session, """
import json, os
written = 0
try:
    with open("fill.bin", "wb") as f:
        for _ in range(128):
            f.write(b"x" * 2**20)
            f.flush()
            os.fsync(f.fileno())
            written += 1
    found = {"error": None}
except OSError as exc:
    found = {"error": exc.errno}
found["written_mib"] = written
print(json.dumps(found))
""")
    seen = json.loads(output)
    assert seen["error"] == errno.ENOSPC
    assert seen["written_mib"] <= 64
    # The host's files API hits the same cap, with a message naming the setting.
    with pytest.raises(WorkspaceError, match="workspace_size"):
        small_session.kernel.sandbox.workspace.write_bytes("more.bin", b"y" * 2**20)
    await run_ok(small_session, "import os\nos.remove('fill.bin')")
    assert await run_ok(small_session, "open('ok.txt', 'w').write('fits again')\n"
                        "print(open('ok.txt').read())") == "fits again\n"


def test_folder_operations_never_follow_a_link_out(workspace: Workspace,
                                                   tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host")
    os.symlink(outside, workspace.root / "link")
    workspace.write_bytes("a/b.txt", b"x")
    listed = {entry.path: entry.kind for entry in workspace.list_dir("", depth=5)}
    assert listed == {"a": "dir", "a/b.txt": "file", "link": "symlink"}
    assert workspace.stat("link").target == str(outside)
    for escape in (lambda: workspace.list_dir("link"), lambda: workspace.stat("link/secret.txt"),
                   lambda: workspace.move("link/secret.txt", "stolen.txt"),
                   lambda: workspace.remove("link/secret.txt"),
                   lambda: workspace.make_dir("link/new")):
        with pytest.raises(WorkspaceError):
            escape()
    workspace.remove("link")  # the link goes, what it pointed to stays
    assert (outside / "secret.txt").read_text() == "host"


def test_make_dir_move_and_remove_a_tree(workspace: Workspace) -> None:
    assert workspace.make_dir("r/2026")
    assert not workspace.make_dir("r/2026")
    workspace.write_bytes("r/draft.txt", b"d")
    moved = workspace.move("r/draft.txt", "r/2026/final/draft.txt")
    assert (moved.path, moved.kind, moved.size) == ("r/2026/final/draft.txt", "file", 1)
    workspace.remove("r")
    assert workspace.list_dir("") == []
    with pytest.raises(WorkspaceError):
        workspace.remove("")
