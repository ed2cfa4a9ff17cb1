"""E2B's files API beyond ``/home/user``, through the unmodified SDK: the sandbox's own file
system as its user sees it (``/tmp``, ``/etc``, ``/proc``), reached in its container, under the
gateway's file limits (100 kB here)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import docker
import pytest
from e2b import NotFoundException, Sandbox, SandboxException
from e2b.sandbox.filesystem.filesystem import FileType

from tests.conftest import running_gateway

LIMIT = 100_000


@pytest.fixture(scope="module")
def sandbox(docker_client: docker.DockerClient) -> Iterator[Sandbox]:
    with running_gateway(docker_client, max_upload_bytes=str(LIMIT),
                         max_download_bytes=str(LIMIT)) as gateway:
        env = {"E2B_API_URL": f"{gateway.url}/e2b",
               "E2B_SANDBOX_URL": f"{gateway.url}/e2b/sandbox",
               "E2B_API_KEY": gateway.keys["alpha"]}
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        sandbox = Sandbox.create()
        try:
            yield sandbox
        finally:
            sandbox.kill()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def test_files_under_tmp_are_written_read_listed_and_removed(sandbox: Sandbox) -> None:
    written = sandbox.files.write("/tmp/test-git/repo/README.md", "hello\n")
    assert written.path == "/tmp/test-git/repo/README.md"
    assert sandbox.files.read("/tmp/test-git/repo/README.md") == "hello\n"
    assert sandbox.files.exists("/tmp/test-git/repo/README.md")
    assert not sandbox.files.exists("/tmp/test-git/nothing")
    # what the sandbox's code sees, owned by its user
    run = sandbox.commands.run("stat -c '%U %s' /tmp/test-git/repo/README.md")
    assert run.stdout.strip() == "sandbox 6"
    sandbox.files.write("/tmp/test-git/repo/data.bin", io.BytesIO(b"\x00\x01" * 1000))
    assert sandbox.files.read("/tmp/test-git/repo/data.bin", format="bytes") == (
        b"\x00\x01" * 1000)
    sandbox.files.make_dir("/tmp/test-git/repo/src")
    listed = sandbox.files.list("/tmp/test-git/repo")
    assert [(e.name, e.type) for e in listed] == [
        ("README.md", FileType.FILE), ("data.bin", FileType.FILE), ("src", FileType.DIR)]
    info = sandbox.files.get_info("/tmp/test-git/repo/data.bin")
    assert (info.size, info.owner, info.path) == (2000, "user", "/tmp/test-git/repo/data.bin")
    sandbox.files.rename("/tmp/test-git/repo/data.bin", "/home/user/data.bin")
    assert sandbox.files.read("data.bin", format="bytes") == b"\x00\x01" * 1000
    sandbox.files.remove("/tmp/test-git")
    assert not sandbox.files.exists("/tmp/test-git/repo")
    sandbox.files.remove("/tmp/test-git")  # nothing there: no error, as E2B's


def test_system_files_are_read_as_the_sandbox_sees_them(sandbox: Sandbox) -> None:
    hostname = sandbox.commands.run("cat /etc/hostname").stdout
    assert sandbox.files.read("/etc/hostname") == hostname
    boot_id = sandbox.files.read("/proc/sys/kernel/random/boot_id")
    assert boot_id.strip() == sandbox.commands.run(
        "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert sandbox.files.get_info("/etc").owner == "root"
    assert "hostname" in [e.name for e in sandbox.files.list("/etc")]


def test_what_the_sandboxs_user_may_not_do_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match=r"(?i)permission denied|read-only"):
        sandbox.files.write("/etc/replgate-x", "no")
    with pytest.raises(SandboxException, match=r"(?i)permission denied"):
        sandbox.files.read("/etc/shadow")
    with pytest.raises(SandboxException, match=r"(?i)permission denied|read-only"):
        sandbox.files.make_dir("/usr/replgate-x")
    with pytest.raises(NotFoundException):
        sandbox.files.read("/tmp/no-such-file")
    with pytest.raises(SandboxException, match="is a folder"):
        sandbox.files.read("/etc")


def test_files_over_the_limits_are_refused(sandbox: Sandbox) -> None:
    sandbox.commands.run(f"head -c {LIMIT + 1} /dev/zero > /tmp/big.bin")
    with pytest.raises(SandboxException, match="over the download limit"):
        sandbox.files.read("/tmp/big.bin", format="bytes")
    with pytest.raises(SandboxException, match=r"(?i)upload"):
        sandbox.files.write("/tmp/huge.bin", io.BytesIO(b"x" * (LIMIT + 1)))
    assert not sandbox.files.exists("/tmp/huge.bin")  # nothing half-written is left
    with pytest.raises(SandboxException, match=r"(?i)upload"):
        sandbox.files.write("/tmp/huge.txt", "x" * (LIMIT + 1))


def test_an_upload_refused_before_its_body_is_read_is_told_every_time(sandbox: Sandbox) -> None:
    # Refused from its Content-Length, the body unread: the connection closed under a client
    # still sending it was reset, and the SDK raised a ReadError, about 1 upload in 20 here.
    for _ in range(60):
        with pytest.raises(SandboxException, match=r"(?i)upload"):
            sandbox.files.write("/tmp/huge.txt", "x" * (LIMIT + 1))
