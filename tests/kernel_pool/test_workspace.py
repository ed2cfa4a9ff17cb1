"""The session's workspace: a size-capped folder shared by the host API and the kernel."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kp_support import mounts_under, run_ok

from kernel_pool import PathOutsideWorkspace, Session, StateDirFull, WorkspaceError
from kernel_pool._disk import SANDBOX_UID, detach
from kernel_pool._workspace import Workspace
from tests.conftest import fill_disk, small_disk


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


def assert_nothing_left(workspace: Workspace) -> None:
    assert not workspace.root.exists()
    assert workspace.image is not None and not workspace.image.exists()
    assert mounts_under(workspace.root) == []


def test_destroy_leaves_nothing(tmp_path: Path) -> None:
    made = Workspace.create(tmp_path / "gone", 16 * 2**20)
    made.write_bytes("f", b"x")
    made.destroy()
    assert_nothing_left(made)


def test_destroy_a_parked_workspace_leaves_nothing(tmp_path: Path) -> None:
    made = Workspace.create(tmp_path / "parked", 16 * 2**20)
    made.write_bytes("f", b"x")
    made.park()
    assert not os.path.ismount(made.root)
    made.destroy()
    assert_nothing_left(made)


def test_destroy_a_workspace_whose_mount_was_removed_underneath_leaves_nothing(
        tmp_path: Path) -> None:
    made = Workspace.create(tmp_path / "unmounted", 16 * 2**20)
    subprocess.run(["umount", str(made.root)], check=True)  # someone else did it
    made.destroy()
    assert_nothing_left(made)


def test_destroy_while_a_read_holds_a_parked_workspace_mounted_is_no_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    made = Workspace.create(tmp_path / "read", 16 * 2**20)
    made.write_bytes("f", b"x")
    made.park()
    # Mounted read-only for a read, whose end would unmount it.
    with caplog.at_level("WARNING", logger="kernel_pool"), made.access():
        assert os.path.ismount(made.root)
        made.destroy()
    assert caplog.records == []
    assert_nothing_left(made)


def test_detach_of_a_mount_gone_since_it_was_seen_is_done(tmp_path: Path) -> None:
    detach(tmp_path)  # not a mount (any more): the unmount fails, and that is fine
    assert tmp_path.is_dir()


async def test_host_and_kernel_see_the_same_files(shared_session: Session) -> None:
    workspace = shared_session.kernel.sandbox.workspace
    workspace.write_bytes("shared/from-host.txt", b"from the host")
    output = await run_ok(shared_session, """
import os
import subprocess
import time
print(os.getcwd())
print(open('shared/from-host.txt').read())
open('shared/from-kernel.txt', 'w').write('from the kernel')
""")
    assert output == "/home/user\nfrom the host\n"
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


# -- parked workspaces (a paused session's) ----------------------------------------------------

def on_disk(workspace: Workspace) -> int:
    assert workspace.image is not None
    return workspace.image.stat().st_blocks * 512


def loop_devices_of(image: Path) -> list[str]:
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        if backing.read_text().strip() == str(image):
            found.append(backing.parent.parent.name)
    return found


def test_park_gives_back_all_but_the_files_and_unpark_reserves_again(tmp_path: Path) -> None:
    size = 256 * 2**20
    workspace = Workspace.create(tmp_path / "ws", size)
    try:
        data = os.urandom(2**20)
        workspace.write_bytes("data.bin", data)
        assert on_disk(workspace) >= size
        workspace.park()
        assert workspace.parked and not os.path.ismount(workspace.root)
        assert workspace.image is not None
        deadline = time.monotonic() + 10
        while loop_devices_of(workspace.image):  # the kernel detaches it after the unmount
            assert time.monotonic() < deadline, loop_devices_of(workspace.image)
            time.sleep(0.05)
        assert on_disk(workspace) < 4 * 2**20  # the file and the file system's metadata
        # Reads mount it read-only for their duration; it is parked again after.
        assert workspace.read_bytes("data.bin", 2**21) == data
        assert [f.path for f in workspace.list_files()] == ["data.bin"]
        assert not os.path.ismount(workspace.root) and on_disk(workspace) < 4 * 2**20

        workspace.unpark()
        assert os.path.ismount(workspace.root) and on_disk(workspace) >= size
        assert (workspace.root / "data.bin").read_bytes() == data
    finally:
        workspace.destroy()


def test_a_parked_workspace_whose_mount_another_namespace_holds_is_read_and_unparked(
        tmp_path: Path) -> None:
    """A process that made a mount namespace of its own while the workspace was mounted
    (``unshare -m``, ``ip netns exec``) holds a copy of the mount: the image's file system
    stays live after the park, and a read-only mount of it was refused (EBUSY) as long as that
    process lived: every read of the paused session's files, and its resume, failed."""
    workspace = Workspace.create(tmp_path / "ws", 64 * 2**20)
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "120"])
    try:
        workspace.write_bytes("kept.txt", b"kept")
        time.sleep(0.5)  # the namespace is made, with its copy of the mount
        workspace.park()
        assert workspace.image is not None and loop_devices_of(workspace.image)
        assert workspace.read_bytes("kept.txt", 100) == b"kept"
        assert not os.path.ismount(workspace.root)
        assert [f.path for f in workspace.list_files()] == ["kept.txt"]
        workspace.unpark()
        workspace.write_bytes("more.txt", b"more")
        assert (workspace.root / "kept.txt").read_bytes() == b"kept"
    finally:
        holder.kill()
        holder.wait()
        workspace.destroy()


def test_unpark_while_a_readers_loop_device_lingers_mounts_writable(tmp_path: Path) -> None:
    """A reader's read-only mount leaves its loop device (read-only) attached for a moment
    after its unmount returns. A resume that mounted the workspace then was given that device:
    mount warned "write-protected, mounted read-only" and succeeded, the sandbox started on a
    read-only workspace, and the memory image's restore failed on the file its kernel held
    open for writing (the session came back from its variables, its /tmp files lost). Here the
    lingering device is attached by hand, and let go 0.3 s into the unpark."""
    workspace = Workspace.create(tmp_path / "ws", 64 * 2**20)
    try:
        workspace.write_bytes("kept.txt", b"kept")
        workspace.park()
        assert workspace.image is not None
        deadline = time.monotonic() + 10
        while loop_devices_of(workspace.image):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        lingering = subprocess.run(
            ["losetup", "--read-only", "--find", "--show", str(workspace.image)],
            capture_output=True, text=True, check=True).stdout.strip()

        def let_go() -> None:
            time.sleep(0.3)
            subprocess.run(["losetup", "-d", lingering], check=True)

        with ThreadPoolExecutor(1) as pool:
            released = pool.submit(let_go)
            workspace.unpark()
            released.result()
        options = next(line.split()[3].split(",") for line in
                       Path("/proc/self/mounts").read_text().splitlines()
                       if line.split()[1] == str(workspace.root))
        assert "rw" in options, options
        (workspace.root / "new.txt").write_bytes(b"written")
        assert (workspace.root / "kept.txt").read_bytes() == b"kept"
    finally:
        workspace.destroy()


def test_readers_and_writers_of_a_parked_workspace_at_once_all_succeed(tmp_path: Path) -> None:
    workspace = Workspace.create(tmp_path / "ws", 64 * 2**20)
    try:
        workspace.write_bytes("shared.txt", b"shared")
        workspace.park()
        with ThreadPoolExecutor(8) as pool:
            reads = [pool.submit(workspace.read_bytes, "shared.txt", 100) for _ in range(8)]
            writes = [pool.submit(workspace.write_bytes, f"w{i}.txt", b"w") for i in range(4)]
            assert [r.result() for r in reads] == [b"shared"] * 8
            assert [w.result() for w in writes] == [1] * 4
        assert not os.path.ismount(workspace.root) and workspace.parked
        assert len(workspace.list_files()) == 5
    finally:
        workspace.destroy()


def test_a_parked_workspace_the_disk_cannot_reserve_refuses_writes_and_keeps_its_files(
        ) -> None:
    with small_disk(128) as disk:
        workspace = Workspace.create(disk / "ws", 64 * 2**20)
        workspace.write_bytes("kept.txt", b"kept")
        workspace.park()
        filler = disk / "filler"
        fill_disk(filler, leave=8 * 2**20)
        kept = on_disk(workspace)

        with pytest.raises(StateDirFull, match=r"needs .* more bytes"):
            workspace.write_bytes("new.txt", b"refused")
        with pytest.raises(StateDirFull):
            workspace.unpark()
        assert workspace.parked and not os.path.ismount(workspace.root)
        assert on_disk(workspace) == kept
        assert workspace.read_bytes("kept.txt", 100) == b"kept"
        assert [f.path for f in workspace.list_files()] == ["kept.txt"]

        filler.unlink()
        workspace.write_bytes("new.txt", b"taken")
        workspace.unpark()
        assert sorted((workspace.root / name).read_bytes() for name in ("kept.txt", "new.txt")) \
            == [b"kept", b"taken"]
        workspace.destroy()


def test_take_back_parks_a_workspace_a_previous_gateway_left_mounted(tmp_path: Path) -> None:
    left = Workspace.create(tmp_path / "ws", 64 * 2**20)
    left.write_bytes("kept.txt", b"kept")
    taken = Workspace.take_back_parked(tmp_path / "ws", 64 * 2**20)
    try:
        assert taken.parked and not os.path.ismount(taken.root)
        assert on_disk(taken) < 4 * 2**20
        assert taken.read_bytes("kept.txt", 100) == b"kept"
    finally:
        taken.destroy()
