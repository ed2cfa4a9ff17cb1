"""Each language's kernel, started by the sandbox's PID 1 in a container the Docker backend made
(no network, read-only root, uid 1000, its pids limit), reached over the ipc socket files as
the pool reaches Python's: bash, R, Deno's JavaScript/TypeScript and Java in the default image;
bash alone beside Python in the slim one (built here if missing, as ``replgate image build
--slim`` does).
"""

from __future__ import annotations

import base64
import json
import os
import queue
import secrets
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import anyio.to_thread
import docker
import pytest
from jupyter_client.asynchronous.client import AsyncKernelClient
from kp_support import make_settings

from kernel_pool import Profile
from kernel_pool._languages import KERNEL_LANGUAGES, kernel_language, offered
from kernel_pool.backends.base import SandboxSpec
from kernel_pool.backends.docker import DockerBackend, DockerSandbox, build_image, current_image
from kernel_pool.backends.docker._docker import KERNEL_DIR, kernel_connection
from kernel_pool.backends.docker._init_kernel import (
    exit_code,
    find_kernel,
    request_kernel,
    write_for_sandbox,
)

PIDS = 128
LOOPS = {"bash": "while true; do :; done", "javascript": "while (true) {}", "r": "repeat {}",
         "java": "while (true) {}"}
NOTHING = {"bash": "true", "javascript": "1", "r": "1", "java": "1"}


@dataclass
class Reply:
    status: str
    stdout: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    def add(self, message: dict[str, Any]) -> None:
        kind, content = message["msg_type"], message["content"]
        if kind == "stream" and content["name"] == "stdout":
            self.stdout += content["text"]
        elif kind in ("execute_result", "display_data"):
            self.outputs.append(content)
        elif kind == "error":
            self.errors.append(content)

    def plain(self) -> list[str]:
        return [o["data"]["text/plain"] for o in self.outputs if "text/plain" in o["data"]]


class Kernel:
    """A kernel of one language in ``sandbox``, as PID 1 starts it for the host."""

    def __init__(self, language: str, pid: int, init_pid: int,
                 client: AsyncKernelClient) -> None:
        self.language, self.pid, self.init_pid, self.client = language, pid, init_pid, client

    @classmethod
    async def start(cls, docker_client: docker.DockerClient, sandbox: DockerSandbox,
                    language: str, name: str = "k1") -> Kernel:
        socket_dir = Path(sandbox.info.socket_dir)
        config = kernel_connection(secrets.token_hex(32), f"{KERNEL_DIR}/{name}")
        write_for_sandbox(socket_dir / f"{name}.json", json.dumps(config))
        request_kernel(socket_dir, name, 1 << 20, language)
        container = docker_client.api.inspect_container(sandbox.info.container_id)
        init_pid = int(container["State"]["Pid"])
        docker_client.api.kill(sandbox.info.container_id, "SIGUSR1")
        pid, code = await anyio.to_thread.run_sync(find_kernel, socket_dir, name, init_pid, 10)
        assert pid is not None, f"no {language} kernel started (exit {code})"
        client = AsyncKernelClient()
        client.load_connection_info(cast(Any, {**config, "ip": str(socket_dir / name)}))
        client.start_channels(hb=False)
        deadline = time.monotonic() + 60
        while True:
            client.kernel_info()
            try:
                # Answered, and the output channel connected: its status message arrives
                # (output sent before the subscription is made would be lost).
                await client.get_shell_msg(timeout=1)
                await client.get_iopub_msg(timeout=1)
                break
            except queue.Empty:
                assert exit_code(socket_dir, name) is None, f"the {language} kernel exited"
                assert time.monotonic() < deadline, f"the {language} kernel never answered"
        return cls(language, pid, init_pid, client)

    async def execute(self, code: str, timeout_s: float = 60) -> Reply:
        return await self.reply(self.client.execute(code), timeout_s)

    async def reply(self, msg_id: str, timeout_s: float = 60) -> Reply:
        shell = await self.client.get_shell_msg(timeout=timeout_s)
        while shell["parent_header"]["msg_id"] != msg_id:  # a late kernel_info reply
            shell = await self.client.get_shell_msg(timeout=timeout_s)
        reply = Reply(shell["content"]["status"])
        while True:
            message = await self.client.get_iopub_msg(timeout=10)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "status":
                if message["content"]["execution_state"] != "idle":
                    continue
                if self.language == "javascript":
                    await self._late_output(msg_id, reply)
                return reply
            reply.add(message)

    async def _late_output(self, msg_id: str, reply: Reply) -> None:
        """Deno 2.9's kernel sends ``idle`` without waiting for the code's output, which a
        second task sends (ext:cli/jupyter_kernel.js, iopubDrainer): it may come just after.
        The host will have to wait for it the same way (a quiet moment after ``idle``)."""
        while True:
            try:
                message = await self.client.get_iopub_msg(timeout=0.3)
            except queue.Empty:
                return
            if message["parent_header"].get("msg_id") == msg_id:
                reply.add(message)

    def interrupt(self) -> None:
        """As the host would: a message, or SIGINT to the kernel's process group (R)."""
        if KERNEL_LANGUAGES[self.language].interrupt == "signal":
            os.killpg(self.pid, signal.SIGINT)  # the kernel leads its group (PID 1's setsid)
        else:
            self.client.control_channel.send(self.client.session.msg("interrupt_request", {}))

    def close(self) -> None:
        self.client.stop_channels()


@pytest.fixture(scope="session")
def slim(docker_client: docker.DockerClient, state_root: Path) -> str:
    return build_image(docker_client, state_dir=state_root / "images", slim=True,
                       log=lambda _: None).tag


async def _sandbox(state_root: Path, image: str | None) -> AsyncIterator[DockerSandbox]:
    profile = Profile(name="languages", memory="1g", pids=PIDS, tmp_size="64m",
                      workspace_size="64m", min_idle=0, **({"image": image} if image else {}))
    backend = DockerBackend(make_settings(state_root / "languages",
                                          profiles={"languages": profile}))
    sandbox = await backend.create(SandboxSpec(sandbox_id=f"lang{secrets.token_hex(4)}",
                                               profile=profile))
    assert isinstance(sandbox, DockerSandbox)
    try:
        yield sandbox
    finally:
        await sandbox.kill()
        await sandbox.cleanup()
        await backend.close()


@pytest.fixture
async def slim_sandbox(state_root: Path, slim: str) -> AsyncIterator[DockerSandbox]:
    async for sandbox in _sandbox(state_root, slim):
        yield sandbox


@pytest.fixture
async def default_sandbox(state_root: Path) -> AsyncIterator[DockerSandbox]:
    async for sandbox in _sandbox(state_root, None):
        yield sandbox


@pytest.fixture
def started() -> Iterator[list[Kernel]]:
    kernels: list[Kernel] = []
    yield kernels
    for kernel in kernels:
        kernel.close()


async def start(docker_client: docker.DockerClient, sandbox: DockerSandbox, language: str,
                started: list[Kernel]) -> Kernel:
    kernel = await Kernel.start(docker_client, sandbox, language)
    started.append(kernel)
    return kernel


def test_images_name_their_languages(docker_client: docker.DockerClient, slim: str) -> None:
    default = docker_client.images.get(current_image()).labels
    assert offered(default) == ["python", "bash", "r", "javascript", "java", "typescript"]
    assert offered(docker_client.images.get(slim).labels) == ["python", "bash"]
    assert offered({}) == ["python"]
    assert [kernel_language(name) for name in (None, "TS", "js", "r")] == [
        "python", "javascript", "javascript", "r"]


async def test_bash_kernel_in_the_slim_image(
        docker_client: docker.DockerClient, slim_sandbox: DockerSandbox,
        started: list[Kernel]) -> None:
    kernel = await start(docker_client, slim_sandbox, "bash", started)
    echo = await kernel.execute("echo hi")
    assert (echo.status, echo.stdout) == ("ok", "hi\n")
    failed = await kernel.execute("ls /nowhere")
    assert failed.status == "error" and failed.errors[0]["evalue"] == "2", failed


def _exit_within(socket_dir: Path, name: str, wait_s: float) -> int | None:
    deadline = time.monotonic() + wait_s
    while (code := exit_code(socket_dir, name)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return code


async def test_a_language_the_image_lacks_exits_at_once(
        docker_client: docker.DockerClient, slim_sandbox: DockerSandbox) -> None:
    socket_dir = Path(slim_sandbox.info.socket_dir)
    for name, language in (("k1", "r"), ("k2", "java"), ("k3", "cobol")):
        config = kernel_connection(secrets.token_hex(32), f"{KERNEL_DIR}/{name}")
        write_for_sandbox(socket_dir / f"{name}.json", json.dumps(config))
        request_kernel(socket_dir, name, 1 << 20, language)
        init_pid = docker_client.api.inspect_container(
            slim_sandbox.info.container_id)["State"]["Pid"]
        docker_client.api.kill(slim_sandbox.info.container_id, "SIGUSR1")
        pid, code = find_kernel(socket_dir, name, init_pid, wait_s=5)
        if language == "java":  # the relay starts, and finds no JVM to start
            assert pid is not None
            assert await anyio.to_thread.run_sync(_exit_within, socket_dir, name, 5) == 127
        else:
            assert (pid, code) == (None, 127)


async def test_r_kernel_prints_and_plots(docker_client: docker.DockerClient,
                                         default_sandbox: DockerSandbox,
                                         started: list[Kernel]) -> None:
    kernel = await start(docker_client, default_sandbox, "r", started)
    printed = await kernel.execute("print(1+1)")
    assert (printed.status, printed.stdout) == ("ok", "[1] 2\n")
    for plot in ("plot(1:10)", "library(ggplot2)\n"
                 "ggplot(data.frame(x = 1:3, y = c(2, 4, 3)), aes(x, y)) + geom_line()"):
        drawn = await kernel.execute(plot)
        assert drawn.status == "ok", drawn
        png = base64.b64decode(drawn.outputs[0]["data"]["image/png"])
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
    failed = await kernel.execute('stop("boom")')
    assert failed.status == "error" and "boom" in failed.errors[0]["evalue"]


async def test_r_kernel_does_once_what_stays_done(docker_client: docker.DockerClient,
                                                 default_sandbox: DockerSandbox,
                                                 started: list[Kernel]) -> None:
    """irkernel.R does the shadowing of readline() and the probe of the cells' depth at the
    first execution only (not observable from a cell; its cost is bench.languages'): later
    executions still find readline() shadowed and their tracebacks cut at the same depth, and
    messages built from cached parts still carry any text."""
    kernel = await start(docker_client, default_sandbox, "r", started)
    deep = "f <- function() stop('deep'); f()"
    first = await kernel.execute(deep)
    for _ in range(3):
        await kernel.execute("x <- 1")
    later = await kernel.execute(deep)
    assert first.status == later.status == "error"
    assert first.errors[0]["traceback"] == later.errors[0]["traceback"]
    assert [line for line in later.errors[0]["traceback"] if line.startswith("1. ")] == ["1. f()"]
    shadowed = await kernel.execute(
        'cat(any(grepl("input_request", deparse(body(base::readline)), fixed = TRUE)))')
    assert shadowed.stdout == "TRUE"
    text = await kernel.execute('cat("h\u00e9llo \u2713 \\"quoted\\"\\n"); "\u00e9"')
    assert text.stdout == 'h\u00e9llo \u2713 "quoted"\n'
    assert text.outputs[0]["data"]["text/plain"] == '[1] "\u00e9"'


async def test_r_kernel_splits_cells_and_replies_as_irkernel_does(
        docker_client: docker.DockerClient, default_sandbox: DockerSandbox,
        started: list[Kernel]) -> None:
    """irkernel.R's own table of a cell's expressions (evaluate's parse_all.character) runs
    each expression in order, lines between them included, and leaves what does not parse to
    evaluate; its replies' headers (UUID, date, the HMAC) are what jupyter_client accepts."""
    kernel = await start(docker_client, default_sandbox, "r", started)
    cell = await kernel.execute("a <- 1; b <- 2\n# between\n\nprint(a + b)\nf <- function() {\n"
                                "  a * 10\n}\nf(); b\n\n")
    assert (cell.status, cell.stdout, cell.plain()) == ("ok", "[1] 3\n", ["[1] 10", "[1] 2"])
    for empty in ("", "# a comment only\n", "\n\n"):
        nothing = await kernel.execute(empty)
        assert (nothing.status, nothing.stdout, nothing.outputs) == ("ok", "", []), empty
    broken = await kernel.execute("x <- 1 +")
    assert broken.status == "error" and "unexpected end of input" in broken.errors[0]["evalue"]
    drawn = await kernel.execute("plot(1:3)\nlines(3:1)")  # one plot: lines() draws on it
    assert drawn.status == "ok" and [o["data"].keys() & {"image/png"} for o in drawn.outputs] \
        == [{"image/png"}]
    msg_id = kernel.client.execute("1+1")
    headers: list[dict[str, Any]] = []
    while not headers or headers[-1]["msg_type"] != "status" or \
            headers[-1].get("execution_state") != "idle":
        message = await kernel.client.get_iopub_msg(timeout=10)
        if message["parent_header"].get("msg_id") == msg_id:
            headers.append({**message["header"], **message["content"]})
    await kernel.client.get_shell_msg(timeout=10)
    # The value of the cell's last expression is its result, as Jupyter's other kernels send it.
    assert [h["msg_type"] for h in headers] == ["status", "execute_input", "execute_result",
                                                "status"]
    for header in headers:  # parsed by jupyter_client: a date, a UUID
        assert isinstance(header["date"], datetime), header
        assert uuid.UUID(header["msg_id"]).version == 4
    assert headers[2]["data"]["text/plain"] == "[1] 2"


async def test_javascript_and_typescript_in_the_deno_kernel(
        docker_client: docker.DockerClient, default_sandbox: DockerSandbox,
        started: list[Kernel]) -> None:
    kernel = await start(docker_client, default_sandbox, "javascript", started)
    logged = await kernel.execute("console.log(2)")
    assert (logged.status, logged.stdout) == ("ok", "2\n")
    cells = {
        "1 + 1": "2",
        "await new Promise((done) => setTimeout(() => done(42), 50))": "42",
        "interface Point { x: number }\nconst p: Point = { x: 3 };\np.x * 2": "6",
        "'text'": '"text"',
    }
    for code, plain in cells.items():
        answered = await kernel.execute(code)
        assert (answered.status, answered.plain()) == ("ok", [plain]), code
    failed = await kernel.execute("throw new Error('boom')")
    assert failed.status == "error" and failed.errors[0]["evalue"] == "boom"


async def test_java_kernel_keeps_variables_in_a_bounded_jvm(
        docker_client: docker.DockerClient, default_sandbox: DockerSandbox,
        started: list[Kernel]) -> None:
    """JJava: a cell's last expression is its value, variables outlive the cell, and the JVM
    that runs it (the relay's child, alone: JShell runs the snippets in it) has a heap of a
    quarter of the sandbox's memory (1g here) at most."""
    kernel = await start(docker_client, default_sandbox, "java", started)
    answered = await kernel.execute("int x = 2;\nx * 21")
    assert (answered.status, answered.plain()) == ("ok", ["42"]), answered
    kept = await kernel.execute('System.out.println("x is " + x);\nx + 1')
    assert (kept.status, kept.stdout, kept.plain()) == ("ok", "x is 2\n", ["3"]), kept
    heap = await kernel.execute("Runtime.getRuntime().maxMemory() >> 20")
    assert heap.status == "ok" and 0 < int(heap.plain()[0]) <= 256, heap
    jvms = _processes_named(_children(kernel.pid), "java")
    assert len(jvms) == 1 and not _children(jvms[0]), "JShell started a second JVM"
    failed = await kernel.execute('throw new IllegalStateException("boom");')
    assert failed.status == "error" and "boom" in str(failed.errors), failed


@pytest.mark.parametrize("language", ["bash", "javascript", "r", "java"])
async def test_interrupt_stops_an_endless_loop(
        docker_client: docker.DockerClient, default_sandbox: DockerSandbox,
        started: list[Kernel], language: str) -> None:
    kernel = await start(docker_client, default_sandbox, language, started)
    msg_id = kernel.client.execute(LOOPS[language])
    await anyio.sleep(1.5)
    interrupted = time.monotonic()
    kernel.interrupt()
    stopped = await kernel.reply(msg_id, 10)
    assert stopped.status in ("error", "abort") and time.monotonic() - interrupted < 5
    after = await kernel.execute(NOTHING[language])
    assert after.status == "ok"


async def test_r_interrupt_stops_a_system_call(
        docker_client: docker.DockerClient, default_sandbox: DockerSandbox,
        started: list[Kernel]) -> None:
    # R ignores SIGINT while system() waits: the signal must reach the child, in its group.
    kernel = await start(docker_client, default_sandbox, "r", started)
    msg_id = kernel.client.execute('system("sleep 60")')
    await anyio.sleep(1.5)
    interrupted = time.monotonic()
    kernel.interrupt()
    # system() returns once its child is gone: the cell ends, with no error of R's.
    await kernel.reply(msg_id, 10)
    assert time.monotonic() - interrupted < 5


def _seen_from_host(pid: int) -> dict[str, Any]:
    """The process's users, privileges and network interfaces, as the host sees them."""
    text = Path(f"/proc/{pid}/status").read_text()
    status = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return {"uid": status["Uid"].split(), "no_new_privs": status["NoNewPrivs"].strip(),
            "seccomp": status["Seccomp"].strip(),
            "interfaces": [line.split(":")[0].strip() for line in lines]}


def _children(pid: int) -> list[int]:
    return [int(child) for child in
            Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _processes_named(pids: list[int], command: str) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}/comm").read_text().strip() == command]


@pytest.mark.parametrize("language", ["bash", "javascript", "r", "java"])
async def test_kernel_runs_as_the_sandbox_user_without_network(
        docker_client: docker.DockerClient, default_sandbox: DockerSandbox,
        started: list[Kernel], language: str) -> None:
    kernel = await start(docker_client, default_sandbox, language, started)
    # Deno's and Java's kernels are the relay's child: the one that runs the code is checked too.
    pids = [kernel.pid, *(_children(kernel.pid) if language in ("javascript", "java") else [])]
    for pid in pids:
        # Seccomp 2: the engine's default filter applies.
        assert _seen_from_host(pid) == {"uid": ["1000"] * 4, "no_new_privs": "1",
                                        "seccomp": "2", "interfaces": ["lo"]}
    probes = {
        "bash": "(exec 3<>/dev/tcp/1.1.1.1/53) 2>&1 | grep -q unreachable && echo refused",
        "javascript": "try { await Deno.connect({hostname: '1.1.1.1', port: 53}); 'connected' }"
                      " catch (e) { console.log(e.name) }",
        "r": 'tryCatch(socketConnection("1.1.1.1", 53, timeout = 3), error = function(e) '
             'cat("refused\\n"))',
        "java": 'try (var s = new java.net.Socket("1.1.1.1", 53)) { '
                'System.out.println("connected"); } '
                'catch (java.io.IOException e) { System.out.println("refused"); }',
    }
    probe = await kernel.execute(probes[language])
    assert probe.stdout.strip().splitlines()[-1] in ("NetworkUnreachable", "refused"), probe
    assert "connected" not in str(probe.outputs)


def _pids_cgroup(init_pid: int) -> Path:
    """The container's pids cgroup folder, under cgroup v1 (its pids hierarchy) or v2."""
    lines = [line.split(":", 2) for line in
             Path(f"/proc/{init_pid}/cgroup").read_text().splitlines()]
    for _, controllers, relative in lines:
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids", relative.lstrip("/"))
    relative = next(path for _, controllers, path in lines if controllers == "")
    return Path("/sys/fs/cgroup", relative.lstrip("/"))


def _pids(cgroup: Path) -> tuple[int, int, int]:
    """(limit, processes now, forks refused at the limit)."""
    events = dict(line.split() for line in (cgroup / "pids.events").read_text().splitlines())
    return (int((cgroup / "pids.max").read_text()), int((cgroup / "pids.current").read_text()),
            int(events["max"]))


@pytest.mark.parametrize("language", ["javascript", "r"])
async def test_fork_bomb_is_bounded_by_the_pids_limit(
        docker_client: docker.DockerClient, default_sandbox: DockerSandbox,
        started: list[Kernel], language: str) -> None:
    kernel = await start(docker_client, default_sandbox, language, started)
    bomb = {"javascript": "new Deno.Command('sh', {args: ['-c', 'b(){ b|b& }; b'], "
                          "stderr: 'null'}).spawn(); 'started'",
            "r": 'system("b(){ b|b& }; b", wait = FALSE)'}
    kernel.client.execute(bomb[language])
    cgroup = _pids_cgroup(kernel.init_pid)
    limit, current, refused = _pids(cgroup)
    deadline = time.monotonic() + 20
    while refused == 0 and time.monotonic() < deadline:
        await anyio.sleep(0.5)
        limit, current, refused = _pids(cgroup)
    assert refused > 0, "the bomb never reached the pids limit"
    assert limit == PIDS and current <= PIDS


def test_a_profile_names_the_images(slim: str) -> None:
    """``slim`` names the slim image; ``default``, and ``polyglot`` as older settings say, the
    default one; any other name is an image of the user's own."""
    assert Profile(image="slim").image == slim
    assert Profile(image="polyglot").image == Profile(image="default").image == current_image()
    assert Profile().image == current_image()
    assert Profile(image="mine:1").image == "mine:1"
