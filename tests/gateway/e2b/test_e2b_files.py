"""E2B's files as its envd does them, through the unmodified SDK (sync and async) and raw HTTP:
depth-first listing, idempotent remove, links followed inside /home/user only, gzip both
ways with the size cap on the inflated file, and metadata kept as ``user.e2b.*`` xattrs."""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator

import httpx
import pytest
from e2b import FileType, InvalidArgumentException, SandboxException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.conftest import GatewayProcess

pytestmark = pytest.mark.usefixtures("e2b_env")


@pytest.fixture(scope="module")
def sandbox(e2b_env: dict[str, str]) -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


def envd(sandbox: Sandbox, gateway: GatewayProcess) -> httpx.Client:
    """envd's HTTP API of the sandbox, as the SDK reaches it."""
    return httpx.Client(base_url=f"{gateway.url}/e2b/sandbox", timeout=60, headers={
        "E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sandbox._envd_access_token or ""})


def test_list_is_depth_first_by_name(sandbox: Sandbox) -> None:
    for folder in ("tree/b/b1", "tree/a/a2", "tree/a/a1"):
        sandbox.files.make_dir(folder)
    sandbox.files.write("tree/a/file.txt", "x")
    listed = [entry.path.removeprefix("/home/user/tree/")
              for entry in sandbox.files.list("tree", depth=2)]
    assert listed == ["a", "a/a1", "a/a2", "a/file.txt", "b", "b/b1"]


def test_removing_what_is_not_there_succeeds(sandbox: Sandbox) -> None:
    sandbox.files.remove("never-was.txt")
    sandbox.files.remove("no/such/folder/file.txt")
    # Beyond the workspace, the sandbox's own files: what its user may not remove stays.
    with pytest.raises(SandboxException, match="PERMISSION_DENIED"):
        sandbox.files.remove("/etc/passwd")


def test_get_info_follows_a_link_inside_home_user(sandbox: Sandbox) -> None:
    sandbox.files.write("links/real.txt", "hello")
    sandbox.commands.run("ln -s real.txt links/rel && ln -s /home/user/links links/folder",
                         cwd="/home/user")
    info = sandbox.files.get_info("links/rel")
    assert (info.type, info.size, info.symlink_target) == (
        FileType.FILE, 5, "/home/user/links/real.txt")
    assert info.path == "/home/user/links/rel" and info.permissions == "-rw-r--r--"
    folder = sandbox.files.get_info("links/folder")
    assert (folder.type, folder.symlink_target) == (FileType.DIR, "/home/user/links")
    listed = {e.name: (e.type, e.symlink_target) for e in sandbox.files.list("links")}
    assert listed == {"folder": (FileType.DIR, "/home/user/links"),
                      "real.txt": (FileType.FILE, None),
                      "rel": (FileType.FILE, "/home/user/links/real.txt")}
    sandbox.files.write("links/rel", "bye")  # through the link, which stays one
    assert sandbox.files.read("links/real.txt") == "bye"
    assert sandbox.files.get_info("links/rel").symlink_target == "/home/user/links/real.txt"


def test_a_link_out_of_home_user_is_described_as_itself(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkdir -p out && ln -sfn /etc/passwd out/passwd && "
                         "ln -sfn ../../.. out/up && ln -sfn gone out/dangling",
                         cwd="/home/user")
    for name, target in (("passwd", "/etc/passwd"), ("up", "/"),
                         ("dangling", "/home/user/out/gone")):
        info = sandbox.files.get_info(f"out/{name}")
        assert (info.type, info.symlink_target) == (FileType.SYMLINK, target), name
        assert info.permissions.startswith("l")
    # nothing of /etc/passwd itself: its size is the link's own
    assert sandbox.files.get_info("out/passwd").size == len("/etc/passwd")
    with pytest.raises(SandboxException):
        sandbox.files.read("out/passwd")
    with pytest.raises(SandboxException):
        sandbox.files.write("out/passwd", "owned")


def test_gzip_uploads_and_downloads(sandbox: Sandbox, gateway: GatewayProcess) -> None:
    text = "compressible line\n" * 5000
    written = sandbox.files.write("gz/one.txt", text, gzip=True)
    assert written.path == "/home/user/gz/one.txt"
    assert sandbox.files.read("gz/one.txt") == text
    assert sandbox.files.read("gz/one.txt", gzip=True) == text
    sandbox.files.write("gz/stream.bin", io.BytesIO(text.encode()), use_octet_stream=True,
                        gzip=True)
    assert bytes(sandbox.files.read("gz/stream.bin", format="bytes", gzip=True)) == text.encode()
    with envd(sandbox, gateway) as client:
        # several gzip members, as `cat a.gz b.gz` makes, are one file
        two = gzip.compress(b"first ") + gzip.compress(b"second")
        answer = client.post("/files", params={"path": "gz/two.txt"}, content=two, headers={
            "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
        assert answer.status_code == 200, answer.text
        raw = client.get("/files", params={"path": "gz/one.txt"},
                         headers={"Accept-Encoding": "gzip"})
        assert raw.headers["content-encoding"] == "gzip"
        assert int(raw.headers["content-length"]) < len(text) // 10
        plain = client.get("/files", params={"path": "gz/two.txt"},
                           headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers and plain.content == b"first second"


def test_a_gzip_bomb_is_refused_without_filling_memory(sandbox: Sandbox,
                                                       gateway: GatewayProcess) -> None:
    limit = int(gateway.env.get("REPLGATE_MAX_UPLOAD_BYTES", 100 * 2**20))
    # limit + 1 MiB of zeros compresses to about a thousandth of it
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(squeeze.compress(b"\x00" * 2**20) for _ in range(limit // 2**20 + 1))
    bomb += squeeze.flush()
    assert len(bomb) < limit // 100
    with envd(sandbox, gateway) as client:
        answer = client.post("/files", params={"path": "bomb.bin"}, content=bomb, headers={
            "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
        assert answer.status_code == 413, answer.text
        assert answer.json()["message"] == f"upload is over the limit of {limit} bytes"
        for body, encoding in ((b"not gzip at all", "gzip"), (gzip.compress(b"x" * 100)[:20],
                                                               "gzip"), (b"x", "br")):
            answer = client.post("/files", params={"path": "bad.bin"}, content=body, headers={
                "Content-Type": "application/octet-stream", "Content-Encoding": encoding})
            assert answer.status_code == 400, answer.text
    assert not sandbox.files.exists("bomb.bin") and not sandbox.files.exists("bad.bin")


def test_metadata_is_set_surfaced_moved_and_cleared(sandbox: Sandbox) -> None:
    written = sandbox.files.write("meta/a.txt", "1", metadata={"Author": "mish", "n": "1"})
    assert written.metadata == {"author": "mish", "n": "1"}
    assert sandbox.files.get_info("meta/a.txt").metadata == {"author": "mish", "n": "1"}
    moved = sandbox.files.rename("meta/a.txt", "meta/b.txt")
    assert moved.metadata == {"author": "mish", "n": "1"}
    assert [e.metadata for e in sandbox.files.list("meta")] == [{"author": "mish", "n": "1"}]
    assert sandbox.files.write("meta/b.txt", "2").metadata is None
    assert sandbox.files.get_info("meta/b.txt").metadata is None
    # set in the sandbox itself, read through the API
    sandbox.commands.run("python3 -c \"import os; os.setxattr('meta/b.txt', 'user.e2b.by', "
                         "b'code')\"", cwd="/home/user")
    assert sandbox.files.get_info("meta/b.txt").metadata == {"by": "code"}
    many = sandbox.files.write_files([{"path": "meta/c.txt", "data": "c"},
                                      {"path": "meta/d.txt", "data": "d"}],
                                     metadata={"batch": "1"})
    assert [w.metadata for w in many] == [{"batch": "1"}] * 2
    assert sandbox.files.get_info("meta/d.txt").metadata == {"batch": "1"}


def test_metadata_over_its_bounds_is_refused_and_writes_nothing(
        sandbox: Sandbox, gateway: GatewayProcess) -> None:
    with pytest.raises(InvalidArgumentException, match="metadata"):
        sandbox.files.write("meta-big.txt", "x", metadata={"k": "v" * 2000})
    with envd(sandbox, gateway) as client:
        answer = client.post("/files", params={"path": "meta-big.txt"}, content=b"x", headers={
            "Content-Type": "application/octet-stream", "X-Metadata-Key": "é".encode()})
        assert answer.status_code == 400 and "metadata" in answer.json()["message"]
    assert not sandbox.files.exists("meta-big.txt")


async def test_the_async_sdk_gets_the_same(e2b_env: dict[str, str]) -> None:
    sandbox = await AsyncSandbox.create()
    try:
        await sandbox.files.write("x/a/1.txt", "one", gzip=True, metadata={"k": "v"})
        await sandbox.files.make_dir("x/b")
        await sandbox.commands.run("ln -s a/1.txt x/link", cwd="/home/user")
        listed = [(e.name, e.type, e.metadata) for e in await sandbox.files.list("x", depth=2)]
        assert listed == [("a", FileType.DIR, None), ("1.txt", FileType.FILE, {"k": "v"}),
                          ("b", FileType.DIR, None), ("link", FileType.FILE, {"k": "v"})]
        info = await sandbox.files.get_info("x/link")
        assert info.symlink_target == "/home/user/x/a/1.txt"
        assert await sandbox.files.read("x/link", gzip=True) == "one"
        await sandbox.files.remove("x/nothing-here")
    finally:
        await sandbox.kill()
