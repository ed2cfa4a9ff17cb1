"""The Docker backend's hardening, observed from inside the sandbox by the code it runs."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import stat
import threading
import time
from pathlib import Path

import docker
import docker.errors
import pytest
from kp_support import (
    OWNER,
    SESSION_ENV,
    engine_actions,
    is_mounted,
    make_settings,
    run_ok,
    sandbox_gone,
)

from kernel_pool import BackendError, KernelPool, Session
from kernel_pool.backends.base import SandboxSpec
from kernel_pool.backends.docker import LABEL_OWNER, LABEL_SANDBOX, DockerBackend
from kernel_pool.backends.docker._containers import HOSTS
from kernel_pool.backends.docker._docker import read_connection_file
from kernel_pool.config import Profile


async def observe(session: Session, code: str) -> dict[str, object]:
    """Run ``code`` that prints one JSON object; that object."""
    output = await run_ok(session, code)
    value = json.loads(output.strip().splitlines()[-1])
    assert isinstance(value, dict)
    return value


def container_of(docker_client: docker.DockerClient, session: Session) -> dict[str, object]:
    attrs = docker_client.api.inspect_container(session.kernel.sandbox.info.container_id)
    assert isinstance(attrs, dict)
    return attrs


async def test_network_unreachable_from_sandbox(shared_session: Session) -> None:
    seen = await observe(shared_session, """
import json, socket
found = {"interfaces": [name for _, name in socket.if_nameindex()]}
try:
    with socket.create_connection(("1.1.1.1", 53), timeout=3):
        found["connect"] = "connected"
except OSError as exc:
    found["connect"] = type(exc).__name__ + ": " + str(exc)
try:
    socket.getaddrinfo("example.com", 443)
    found["dns"] = "resolved"
except OSError as exc:
    found["dns"] = type(exc).__name__ + ": " + str(exc)
print(json.dumps(found))
""")
    assert seen["interfaces"] == ["lo"]
    assert seen["connect"] != "connected" and "unreachable" in str(seen["connect"]).lower()
    assert seen["dns"] != "resolved"


async def test_root_filesystem_read_only(shared_session: Session) -> None:
    seen = await observe(shared_session, """
import asyncio
import json
found = {}
for path in ("/usr/replgate-probe", "/etc/passwd", "/opt/venv/probe"):
    try:
        with open(path, "a") as f:
            f.write("x")
        found[path] = "written"
    except OSError as exc:
        found[path] = exc.errno
print(json.dumps(found))
""")
    assert "written" not in seen.values(), seen
    assert seen["/usr/replgate-probe"] == 30  # EROFS


async def test_sandbox_runs_without_privileges(shared_session: Session) -> None:
    seen = await observe(shared_session, """
import json, os, resource
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print(json.dumps({
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
    "caps": {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
    "no_new_privs": status["NoNewPrivs"].strip(),
    "core": resource.getrlimit(resource.RLIMIT_CORE),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
    "docker_sock": any(os.path.exists(p) for p in ("/var/run/docker.sock", "/run/docker.sock")),
}))
""")
    assert seen["uid"] != 0 and seen["euid"] != 0 and seen["gid"] != 0
    assert seen["caps"] == dict.fromkeys(["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"],
                                         "0000000000000000")
    assert seen["no_new_privs"] == "1"
    assert seen["core"] == [0, 0]
    assert seen["nofile"] == [1024, 1024]
    assert seen["docker_sock"] is False


async def test_sandbox_mounts_no_host_path_but_its_own(shared_session: Session) -> None:
    seen = await observe(shared_session, """
import asyncio
import json
mounts = {m[1]: [m[2], m[3]] for m in (line.split() for line in open("/proc/self/mounts"))}
try:
    open("/run/criu.kdat", "rb").read()
    mounts["kdat readable"] = True
except OSError as exc:
    mounts["kdat readable"] = type(exc).__name__
print(json.dumps(mounts))
""")
    tmp_type, tmp_options = seen["/tmp"]  # type: ignore[misc]
    assert tmp_type == "tmpfs" and "size=32768k" in tmp_options
    assert seen["/"][0] == "overlay" and seen["/"][1].startswith("ro,")  # type: ignore[index]
    # Beside the image's own root, /tmp, Docker's kernel filesystems (/proc, /sys, /dev) and its
    # resolv.conf, hostname and hosts files: only the session's workspace and socket folder
    # (and under runc, read-only, its own boot id, also over /proc's, and CRIU's cache of the
    # kernel's features, which its user cannot read: docs/security.md).
    standard = {"/", "/tmp", "/etc/resolv.conf", "/etc/hostname", "/etc/hosts"}
    gvisor = shared_session.profile.runtime == "gvisor"
    extra = {path for path in seen if path not in standard and path != "kdat readable"
             and not path.startswith(("/proc", "/sys", "/dev"))}
    host_files = (set() if gvisor else {"/run/replgate/boot_id", "/proc/sys/kernel/random/boot_id",
                                        "/run/criu.kdat"})
    assert extra == {"/home/user", "/kernel"} | (host_files - {"/proc/sys/kernel/random/boot_id"})
    read_only = {path for path in host_files if seen[path][1].startswith("ro,")}  # type: ignore[index]
    assert read_only == host_files
    assert seen["kdat readable"] == ("FileNotFoundError" if gvisor else "PermissionError")


async def test_environment_has_only_image_and_session_variables(
        shared_session: Session, docker_client: docker.DockerClient) -> None:
    seen = await observe(shared_session, """
import json, os, subprocess
child = dict(line.split("=", 1) for line in
             subprocess.run(["env"], capture_output=True, text=True).stdout.splitlines()
             if "=" in line)
print(json.dumps({"kernel": dict(os.environ), "child": child}))
""")
    kernel_env: dict[str, str] = seen["kernel"]  # type: ignore[assignment]
    image_env = dict(item.split("=", 1) for item in
                     docker_client.images.get(shared_session.profile.image).attrs["Config"]["Env"])
    # ipykernel sets these for every kernel it runs (pagers and colours), whatever the host.
    ipykernel_env = {"PYDEVD_USE_FRAME_EVAL", "TERM", "CLICOLOR", "FORCE_COLOR",
                     "CLICOLOR_FORCE", "PAGER", "GIT_PAGER"}
    unexpected = set(kernel_env) - set(image_env) - ipykernel_env - set(SESSION_ENV) - {"HOSTNAME"}
    assert not unexpected, unexpected
    leaked = {k for k, v in os.environ.items()
              if kernel_env.get(k) == v and image_env.get(k) != v}
    assert not leaked, f"host variables reached the sandbox: {leaked}"
    assert kernel_env["HOSTNAME"] != os.uname().nodename
    for name, value in SESSION_ENV.items():
        assert kernel_env[name] == value
        assert seen["child"][name] == value  # type: ignore[index]


def test_container_created_with_limits(shared_session: Session,
                                       docker_client: docker.DockerClient) -> None:
    attrs = container_of(docker_client, shared_session)
    host = attrs["HostConfig"]
    assert isinstance(host, dict)
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Privileged"] is False
    assert host["Memory"] == 1024**3 and host["MemorySwap"] == 1024**3
    assert host["NanoCpus"] == 1_000_000_000
    assert host["PidsLimit"] == 128
    labels = attrs["Config"]["Labels"]  # type: ignore[index]
    assert labels[LABEL_OWNER] == OWNER
    assert labels[LABEL_SANDBOX] == shared_session.kernel.id


async def test_pids_limit_stops_thread_and_process_bombs(session: Session) -> None:
    seen = await observe(session, """
import json, subprocess, threading
found = {}
release = threading.Event()
threads = []
try:
    for _ in range(1000):
        thread = threading.Thread(target=release.wait)
        thread.start()
        threads.append(thread)
except RuntimeError as exc:
    found["threads"] = [len(threads), str(exc)]
release.set()
for thread in threads:
    thread.join()
children = []
try:
    for _ in range(1000):
        children.append(subprocess.Popen(["sleep", "60"]))
except OSError as exc:
    found["processes"] = [len(children), exc.errno]
for child in children:
    child.kill()
    child.wait()
print(json.dumps(found))
""")
    threads, processes = seen["threads"], seen["processes"]
    assert isinstance(threads, list) and isinstance(processes, list)
    assert 0 < threads[0] < 128
    assert 0 < processes[0] < 128 and processes[1] == 11  # EAGAIN
    assert await run_ok(session, "print(6 * 7)") == "42\n"


async def test_memory_limit_kills_kernel_then_session_recovers(small_session: Session) -> None:
    result = await small_session.execute(
        "import numpy as np\nblocks = [np.ones(32 * 2**20 // 8) for _ in range(64)]",
        timeout_s=60)
    assert result.status == "died"
    assert result.restarted is True
    assert result.reason is not None and "out of memory" in result.reason
    assert "384m" in result.reason
    assert await run_ok(small_session, "print('alive')") == "alive\n"


async def test_tmp_is_capped(shared_session: Session) -> None:
    seen = await observe(shared_session, """
import json, os
written = 0
try:
    with open("/tmp/fill", "wb") as f:
        for _ in range(64):
            f.write(b"x" * 2**20)
            f.flush()
            written += 1
    found = {"error": None}
except OSError as exc:
    found = {"error": exc.errno}
finally:
    os.unlink("/tmp/fill")
found["written_mib"] = written
print(json.dumps(found))
""")
    assert seen["error"] == 28  # ENOSPC
    assert isinstance(seen["written_mib"], int) and seen["written_mib"] <= 32


async def test_close_removes_container_and_workspace(
        pool: KernelPool, docker_client: docker.DockerClient) -> None:
    session = await pool.create_session()
    await run_ok(session, "open('kept.txt', 'w').write('data')")
    info = session.kernel.sandbox.info
    assert session.kernel.sandbox.workspace.read_bytes("kept.txt", limit=10) == b"data"
    assert await asyncio.to_thread(is_mounted, Path(info.workspace))

    await pool.delete_session(session.id)

    assert await asyncio.to_thread(sandbox_gone, docker_client, info) == []


async def test_a_removal_ends_the_container_from_the_host_before_the_engine_removes_it(
        pool: KernelPool, docker_client: docker.DockerClient) -> None:
    # Every signal the engine sends is a `runc kill`: one more start of a Go program, for its
    # stop at a removal and for a kernel's launch (SIGUSR1 to PID 1). Both go from the host:
    # the engine logs the container's death (die) and its removal (destroy), but no kill.
    session = await pool.create_session()
    await run_ok(session, "import subprocess; subprocess.Popen(['sleep', '600'])")
    container_id = session.kernel.sandbox.info.container_id
    since = time.time() - 1

    await pool.delete_session(session.id)

    actions = await asyncio.to_thread(engine_actions, docker_client, container_id, since)
    assert "die" in actions and "destroy" in actions, actions
    assert not [action for action in actions if action.startswith("kill")], actions


async def test_connection_file_replaced_by_a_fifo_is_refused_without_blocking(
        session: Session) -> None:
    # The socket folder is the sandbox's. A FIFO at the kernel's connection file would block
    # the thread reading it for good: a gateway taking the sandbox back, or a memory pause.
    name = session.kernel.sandbox.info.kernel_name
    await run_ok(session, f"import os\nos.unlink('/kernel/{name}.json')\n"
                          f"os.mkfifo('/kernel/{name}.json')")
    path = Path(session.kernel.sandbox.info.socket_dir) / f"{name}.json"
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(read_connection_file(path))
        except Exception as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    await asyncio.to_thread(reader.join, 10)
    blocked = reader.is_alive()
    if blocked:  # let it go (a writer that closes at once): the test has failed already
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        await asyncio.to_thread(reader.join, 10)
    assert not blocked, "reading the planted FIFO blocked"
    assert len(outcome) == 1 and isinstance(outcome[0], BackendError), outcome


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_a_kernel_that_dies_at_start_leaves_the_end_of_its_stderr(
        state_root: Path, runtime: str) -> None:
    """Started by PID 1 (runc) or by ``docker exec`` (gVisor), a kernel whose Python cannot
    start (no standard library under ``PYTHONHOME``) exits at once; what it wrote to stderr
    is there for the error, its last lines only."""
    profile = Profile(name="broken", runtime=runtime, min_idle=0)
    backend = DockerBackend(make_settings(state_root / f"broken-{runtime}",
                                          profiles={"broken": profile}))
    sandbox = await backend.create(SandboxSpec(
        sandbox_id=f"err{secrets.token_hex(4)}", profile=profile,
        env={"PYTHONHOME": "/nonexistent"}))
    try:
        await sandbox.launch_kernel()
        assert await asyncio.wait_for(sandbox.wait(), 60) == 1
        written = await sandbox.start_errors()
        assert written is not None and "No module named 'encodings'" in written, written
        assert len(written.splitlines()) <= 20 and "Fatal Python error" in written, written
    finally:
        await sandbox.kill()
        await sandbox.cleanup()
        await backend.close()


async def test_a_changed_hosts_file_is_written_again_for_the_next_sandbox(
        pool: KernelPool) -> None:
    # Sandboxes bind the gateway's /etc/hosts read-only; one changed (or removed) on the host
    # is written again, whole, before the next sandbox binds it.
    hosts = pool.settings.state_dir / "hosts"
    planted = hosts.with_name("planted")
    planted.write_text("203.0.113.9\tlocalhost\n")
    os.replace(planted, hosts)
    session = await pool.create_session("small")  # no warm kernel: a sandbox made now
    try:
        assert await run_ok(session, "print(open('/etc/hosts').read(), end='')") == HOSTS
        assert hosts.read_text() == HOSTS and stat.S_IMODE(hosts.stat().st_mode) == 0o644
    finally:
        await pool.delete_session(session.id)
