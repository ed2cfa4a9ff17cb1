"""The workspace's entries as E2B's filesystem API describes them: listing depth first, links
followed inside the workspace only, and metadata kept as ``user.e2b.*`` extended attributes."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from kp_support import pausing_pool, run_ok

from kernel_pool import InvalidRequest, PathOutsideWorkspace
from kernel_pool._copies import copy_workspace
from kernel_pool._workspace import Workspace


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    made = Workspace.create(tmp_path / "ws", 16 * 2**20)
    yield made
    made.destroy()


def test_list_dir_is_depth_first_by_name(workspace: Workspace) -> None:
    for folder in ("b/b1", "a/a2", "a/a1/deep"):
        workspace.make_dir(folder)
    workspace.write_bytes("a/file.txt", b"x")
    listed = [entry.path for entry in workspace.list_dir("", depth=2)]
    assert listed == ["a", "a/a1", "a/a2", "a/file.txt", "b", "b/b1"]
    assert [e.path for e in workspace.list_dir("a", depth=1)] == ["a/a1", "a/a2", "a/file.txt"]
    assert len(workspace.list_dir("", depth=3)) == 7


def test_a_link_inside_is_followed_with_its_target(workspace: Workspace) -> None:
    workspace.write_bytes("docs/real.txt", b"hello")
    os.symlink("real.txt", workspace.root / "docs" / "rel")
    os.symlink("/home/user/docs/real.txt", workspace.root / "abs")
    os.symlink("/workspace/docs", workspace.root / "folder")
    os.symlink("rel", workspace.root / "docs" / "chain")
    for path in ("docs/rel", "abs", "docs/chain"):
        entry = workspace.stat(path)
        assert (entry.path, entry.kind, entry.size, entry.resolved) == (
            path, "file", 5, "docs/real.txt")
    folder = workspace.stat("folder")
    assert (folder.kind, folder.resolved) == ("dir", "docs")
    listed = {e.path: (e.kind, e.resolved) for e in workspace.list_dir("", depth=3)}
    # a link to a folder is described as the folder, not walked into
    assert listed["folder"] == ("dir", "docs") and "folder/real.txt" not in listed
    assert listed["docs/rel"] == ("file", "docs/real.txt")
    assert [e.path for e in workspace.list_dir("folder")] == ["docs/chain", "docs/real.txt",
                                                             "docs/rel"]
    os.symlink("/home/user", workspace.root / "home")
    assert {e.path for e in workspace.list_dir("home")} == {"abs", "docs", "folder", "home"}


@pytest.mark.parametrize("target", ["/etc/passwd", "../../../../etc/passwd", "/home/user/..",
                                    "missing.txt", "loop"])
def test_a_link_leading_out_or_nowhere_is_described_as_itself(
        workspace: Workspace, tmp_path: Path, target: str) -> None:
    os.symlink(target, workspace.root / "loop" if target == "loop" else workspace.root / "link")
    name = "loop" if target == "loop" else "link"
    entry = workspace.stat(name)
    assert (entry.kind, entry.target, entry.resolved) == ("symlink", target, None)
    assert entry.size == len(target)  # the link's own, nothing of what it names
    assert [(e.kind, e.resolved) for e in workspace.list_dir("")] == [("symlink", None)]


def test_a_link_to_a_host_file_outside_reveals_nothing_of_it(workspace: Workspace,
                                                            tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.setxattr(secret, "user.e2b.key", b"host")
    os.symlink(secret, workspace.root / "link")
    entry = workspace.stat("link")
    assert (entry.kind, entry.size, entry.metadata) == ("symlink", len(str(secret)), None)


def test_metadata_is_set_kept_across_a_move_and_cleared_by_an_overwrite(
        workspace: Workspace) -> None:
    workspace.write_bytes("m.txt", b"1", metadata={"Author": "mish", "purpose": "up"})
    assert workspace.stat("m.txt").metadata == {"author": "mish", "purpose": "up"}
    assert os.getxattr(workspace.root / "m.txt", "user.e2b.author") == b"mish"
    moved = workspace.move("m.txt", "n/m.txt")
    assert moved.metadata == {"author": "mish", "purpose": "up"}
    assert [e.metadata for e in workspace.list_dir("n")] == [{"author": "mish", "purpose": "up"}]
    workspace.write_bytes("n/m.txt", b"2", metadata={"stage": "two"})
    assert workspace.stat("n/m.txt").metadata == {"stage": "two"}
    workspace.write_bytes("n/m.txt", b"3")
    assert workspace.stat("n/m.txt").metadata is None
    os.setxattr(workspace.root / "n/m.txt", "user.other", b"kept")  # not E2B's namespace
    os.setxattr(workspace.root / "n/m.txt", "user.e2b.outside", b"set in the sandbox")
    assert workspace.stat("n/m.txt").metadata == {"outside": "set in the sandbox"}
    workspace.write_bytes("n/m.txt", b"4")
    assert os.getxattr(workspace.root / "n/m.txt", "user.other") == b"kept"
    assert workspace.stat("n/m.txt").metadata is None


@pytest.mark.parametrize("metadata", [
    {"bad key": "v"}, {"": "v"}, {"k": "bad\nvalue"}, {"k": "value\n"}, {"key\n": "v"},
    {"k": "é"}, {"k" * 129: "v"}, {"k": "v" * 1025}, {f"k{i}": "v" for i in range(33)},
    {f"k{i}": "v" * 1000 for i in range(3)},
])
def test_invalid_metadata_is_refused_before_the_file_is_made(workspace: Workspace,
                                                             metadata: dict[str, str]) -> None:
    with pytest.raises(InvalidRequest, match="metadata"):
        workspace.write_bytes("never.txt", b"x", metadata=metadata)
    assert not (workspace.root / "never.txt").exists()


def test_a_read_or_write_goes_through_links_that_stay_inside(workspace: Workspace,
                                                    tmp_path: Path) -> None:
    workspace.write_bytes("docs/real.txt", b"hello")
    os.symlink("docs", workspace.root / "d")
    os.symlink("/home/user/docs/real.txt", workspace.root / "abs")
    (tmp_path / "host.txt").write_text("host")
    os.symlink(tmp_path / "host.txt", workspace.root / "out")
    os.symlink("/home/user/../../" + str(tmp_path / "host.txt"), workspace.root / "up")
    assert workspace.read_bytes("d/real.txt", 100) == b"hello"
    assert workspace.read_bytes("abs", 100) == b"hello"
    for name in ("out", "up"):
        with pytest.raises(PathOutsideWorkspace):
            workspace.read_bytes(name, 100)
        with pytest.raises(PathOutsideWorkspace):
            workspace.write_bytes(name, b"owned")
    assert (tmp_path / "host.txt").read_text() == "host"
    workspace.write_bytes("d/real.txt", b"through", metadata={"k": "v"})
    workspace.write_bytes("abs", b"again")
    assert workspace.read_bytes("docs/real.txt", 100) == b"again"
    assert os.path.islink(workspace.root / "abs")  # the link stays a link


@pytest.mark.parametrize("profile", ["default", "hostile"])
async def test_metadata_is_shared_with_the_code_under_runc_and_gvisor(
        state_root: Path, docker_client: docker.DockerClient, profile: str) -> None:
    """The workspace (an ext4 image, or a plain folder without root) keeps ``user.*``
    attributes, and the sandbox reads them through its bind mount, gVisor's gofer included;
    gVisor (runsc 20240729) refuses to set one from inside (EOPNOTSUPP) and pads a value it
    reads with NULs to the reader's buffer, docs/e2b.md says so."""
    async with pausing_pool(state_root, docker_client, f"xattr-{profile}") as pool:
        session = await pool.create_session(profile)
        try:
            await session.write_file("m.txt", b"x", {"from": "api"})
            seen = await run_ok(session, "import os\n"
                                "value = os.getxattr('m.txt', 'user.e2b.from')\n"
                                "print(value.rstrip(b'\\0').decode())\n"
                                "try:\n    os.setxattr('m.txt', 'user.e2b.by', b'code')\n"
                                "    print('set')\n"
                                "except OSError as exc:\n    print(exc.errno)")
            if profile == "default":
                assert seen == "api\nset\n"
                assert (await session.stat_path("m.txt")).metadata == {"by": "code",
                                                                      "from": "api"}
            else:
                assert seen == f"api\n{errno.EOPNOTSUPP}\n"
                assert (await session.stat_path("m.txt")).metadata == {"from": "api"}
        finally:
            await pool.delete_session(session.id)


def test_a_forks_copy_keeps_files_and_folders_metadata(workspace: Workspace,
                                                       tmp_path: Path) -> None:
    workspace.write_bytes("d/f.txt", b"x", metadata={"k": "file"})
    os.setxattr(workspace.root / "d", "user.e2b.k", b"folder")
    os.setxattr(workspace.root / "d/f.txt", "user.e2b.raw", b"\xff\x00")  # the code's own
    copy = Workspace.create(tmp_path / "copy", 16 * 2**20)
    try:
        copy_workspace(workspace, copy)
        assert copy.stat("d").metadata == {"k": "folder"}
        assert os.getxattr(copy.root / "d/f.txt", "user.e2b.raw") == b"\xff\x00"
        assert copy.stat("d/f.txt").metadata == {"k": "file", "raw": "\\xff\x00"}
    finally:
        copy.destroy()
