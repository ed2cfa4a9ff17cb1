"""A profile's service (``start_cmd``, ``ready_cmd``: a custom template's, E2B's
``set_start_cmd``) on the real engine: started before the kernel answers, ready at once in a
booted kernel, a warm one and one restored from the kernel template (a listening socket
through CRIU's dump and restore), running once; spared by the clean-up after an execution cut
short, started again after a restart; a service that never gets ready fails the kernel's start
with both commands' output. What the service wrote in /tmp as it started is in a restored
sandbox's /tmp too. Under gVisor (no kernel template) each kernel boots with it, spared as well."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import own_session, pausing_pool, processes, run_ok

from kernel_pool import KernelPool, KernelStartError, Profile, Session
from kernel_pool.backends.docker import DockerBackend, DockerSandbox

TEMPLATE_WAIT_S = 90.0
PORT = 8080
SERVER = f"python3 -m http.server {PORT}"
START = f"echo started > /tmp/started.txt && exec {SERVER}"
READY = f"python3 -c \"import urllib.request as u; u.urlopen('http://localhost:{PORT}')\""
GET = (f"import urllib.request as u\n"
       f"print(u.urlopen('http://127.0.0.1:{PORT}', timeout=5).status)")
"""Asked once, at once: a server not listening yet would fail it (no retry)."""


def served(name: str = "default", **fields: object) -> Profile:
    return Profile.model_validate({"name": name, "workspace_size": "64m", "tmp_size": "32m",
                                   "start_cmd": START, "ready_cmd": READY, **fields})


def sandbox_of(session: Session) -> DockerSandbox:
    sandbox = session.kernel.sandbox
    assert isinstance(sandbox, DockerSandbox)
    return sandbox


async def servers(session: Session) -> int:
    """The servers running (not ``sh -c``'s command line, which names it too)."""
    return sum(cmd.startswith(SERVER) and state != "Z"
               for _, state, cmd in await processes(session))


@pytest.fixture(scope="module")
async def pool(state_root: Path, docker_client: docker.DockerClient,
               ) -> AsyncIterator[KernelPool]:
    async with pausing_pool(state_root, docker_client, "service",
                            profiles={"default": served(min_idle=0)},
                            template_dir=state_root / "service-templates") as made:
        backend = made.backend
        assert isinstance(backend, DockerBackend) and backend.templates, \
            getattr(backend, "templates_refusal", None)
        yield made


async def template_ready(pool: KernelPool) -> None:
    backend, profile = pool.backend, pool.settings.profiles["default"]
    assert isinstance(backend, DockerBackend)
    for _ in range(int(TEMPLATE_WAIT_S * 10)):
        if backend.template_for(profile) is not None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no kernel template after {TEMPLATE_WAIT_S} s")


KINDS = {
    "booted": ({"min_idle": 0}, "start_new_session=True"),
    "warm": ({"min_idle": 1}, "start_new_session=True"),
    "gvisor": ({"runtime": "gvisor", "min_idle": 0}, ""),
}
"""How a kernel of the parametrized test starts (a boot, under runc; handed out warm; a boot
by exec under gVisor, which has no kernel template), and the options of the child an
execution cut short leaves (under runc a session of its own, as the service leads one; gVisor
tells the service apart by its process table, which has no sessions)."""


@pytest.mark.parametrize("kind", KINDS)
async def test_a_kernel_answers_once_its_service_is_ready_and_a_cut_spares_it(
        state_root: Path, docker_client: docker.DockerClient, kind: str) -> None:
    """Booted, warm, or under gVisor: the kernel answers with its service ready, running
    once, and the clean-up after a timeout (which kills what the kernel's children left,
    keep_kernel_children=False) spares the service but not a child of the execution."""
    fields, child_options = KINDS[kind]
    async with pausing_pool(state_root, docker_client, f"service-{kind}",
                            profiles={"default": served(**fields)},
                            kernel_templates=False) as pool:
        if kind == "warm":
            await pool.wait_ready(timeout_s=TEMPLATE_WAIT_S)
        async with own_session(pool) as session:
            assert not sandbox_of(session).from_template
            assert await run_ok(session, GET) == "200\n"
            assert await servers(session) == 1
            # Not the kernel's: the user code's environment has no trace of the launch's
            # request.
            assert await run_ok(session, "import os\nprint(sorted(k for k in os.environ "
                                         "if k.startswith('REPLGATE_START')))") == "[]\n"
            cut = await session.execute("import subprocess, time\n"
                                        f"subprocess.Popen(['sleep', '600'], {child_options})\n"
                                        "time.sleep(30)", timeout_s=2)
            assert cut.status != "ok"
            listed = await processes(session)
            assert not [cmd for _, state, cmd in listed if cmd == "sleep 600" and state != "Z"]
            assert await run_ok(session, GET) == "200\n"
            assert await servers(session) == 1


async def test_a_kernel_restored_from_the_template_has_its_service_listening(
        pool: KernelPool) -> None:
    await template_ready(pool)
    async with own_session(pool) as session:
        assert sandbox_of(session).from_template
        assert await run_ok(session, GET) == "200\n"
        assert await servers(session) == 1
        # What it wrote in /tmp as it started is there too (E2B's snapshot holds it).
        assert await run_ok(session, "print(open('/tmp/started.txt').read())") == "started\n\n"


async def test_the_service_outlives_an_execution_cut_short_and_comes_back_after_a_restart(
        pool: KernelPool) -> None:
    async with own_session(pool) as session:
        # A timeout kills what the kernel's children left (keep_kernel_children=False): the
        # service is spared, a child the execution started in a session of its own is not.
        cut = await session.execute("import subprocess, time\n"
                                    "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
                                    "time.sleep(30)", timeout_s=2)
        assert cut.status != "ok"
        listed = await processes(session)
        assert not [cmd for _, state, cmd in listed if cmd == "sleep 600" and state != "Z"]
        assert await run_ok(session, GET) == "200\n"
        await session.restart()
        assert await run_ok(session, GET) == "200\n"
        assert await servers(session) == 1


async def test_a_service_that_never_gets_ready_fails_the_start_with_its_output(
        state_root: Path, docker_client: docker.DockerClient) -> None:
    dead = served(start_cmd="echo giving up >&2; exit 3", ready_cmd="echo not yet; false",
                  min_idle=0)
    slow = served(name="slow", start_cmd="sleep 600", ready_cmd="false", ready_timeout_s=2,
                  min_idle=0)
    async with pausing_pool(state_root, docker_client, "service-dead",
                            profiles={"default": dead, "slow": slow},
                            kernel_templates=False) as pool:
        with pytest.raises(KernelStartError) as failed:
            await pool.create_session()
        said = str(failed.value)
        assert "start_cmd exited with 3 before ready_cmd exited 0" in said, said
        assert "not yet" in said and "giving up" in said, said
        with pytest.raises(KernelStartError) as late:
            await pool.create_session("slow")
        assert "ready_cmd did not exit 0 within 2 s" in str(late.value), str(late.value)


async def test_a_paused_session_resumes_with_its_service_running_once(pool: KernelPool) -> None:
    async with own_session(pool) as session:
        await run_ok(session, "x = 41")
        info = await session.pause()
        # Whatever the pause kept (the memory, or the variables and a kernel booted again),
        # the resumed sandbox serves at once, one server.
        assert await run_ok(session, GET + "\nprint(x)") == "200\n41\n", info
        assert await servers(session) == 1
        # A running thread: only the memory keeps it (the kernel's tree, the server in it,
        # its listening socket through CRIU).
        await run_ok(session, "import threading, time\nthreading.Thread(target=time.sleep, "
                              "args=(600,), daemon=True).start()")
        info = await session.pause()
        assert info.paused_with == "memory", session.reason
        assert await run_ok(session, GET) == "200\n"
        assert await servers(session) == 1
