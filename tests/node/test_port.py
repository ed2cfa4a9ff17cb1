"""The port over the network: a real pool served by a node's app (uvicorn, real HTTP), and
RemoteSessions on the gateway's side doing what the gateway does with local ones.

Mutual TLS is tested by tests/node/test_tls.py and by the cluster test; here the transport is
plain HTTP on 127.0.0.1, so what is tested is the port's own behaviour.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
import uvicorn

from kernel_pool import (
    DoneEvent,
    ExecutionHandle,
    ExecutionStatus,
    FileMissing,
    InvalidRequest,
    KernelPool,
    PoolSettings,
    Profile,
    SessionNotFound,
    SessionPort,
    StreamEvent,
)
from node.remote import NodeClient, NodeUnreachable, RemoteSession
from node.server import create_node_app
from node.wire import CreateSession, ForkSession
from tests.conftest import containers_of, free_port, unmount_all

OWNER = f"porttest-{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
async def node(docker_client: docker.DockerClient) -> AsyncIterator[NodeClient]:
    """A pool with one warm kernel, served by a node app on a free port; its client."""
    root = Path(tempfile.mkdtemp(prefix="rg-port-", dir="/tmp"))
    runtime = os.environ.get("REPLGATE_TEST_RUNTIME", "runc")
    profile = Profile(name="default", min_idle=1, memory="1g", workspace_size="64m",
                      tmp_size="32m", pids=128, default_timeout_s=30, max_timeout_s=120,
                      runtime=runtime)
    pool = KernelPool(PoolSettings(state_dir=root, owner=OWNER, profiles={"default": profile},
                                   max_kernels=4, interrupt_grace_s=2.0))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_node_app(pool, "node-a", "image"),
                                           host="127.0.0.1", port=port, log_config=None))
    serving = asyncio.create_task(server.serve())
    client = NodeClient("node-a", f"127.0.0.1:{port}", None)
    try:
        await pool.start()
        await pool.wait_ready(timeout_s=120)
        while not server.started:  # noqa: ASYNC110 (uvicorn's Server has only this flag)
            await asyncio.sleep(0.02)
        yield client
    finally:
        await client.close()
        server.should_exit = True
        await serving
        await pool.close()
        left = containers_of(docker_client, OWNER)
        mounted = unmount_all(root)
        shutil.rmtree(root, ignore_errors=True)
        assert not left and not mounted, (left, mounted)


async def _session(node: NodeClient) -> RemoteSession:
    return RemoteSession(node, await node.create(CreateSession(env={"GREETING": "hi"})))


async def test_a_remote_session_runs_code_keeps_state_and_streams(node: NodeClient) -> None:
    session = await _session(node)
    seen: list[tuple[str, object]] = []
    session.listeners.append(lambda s, h, e: seen.append((h.id, e)))
    try:
        assert session.profile.name == "default" and session.env == {"GREETING": "hi"}
        first = await session.submit("import os\nx = 40\nprint(os.environ['GREETING'])").result()
        handle = session.submit("import time\nfor i in range(3):\n    print(i, flush=True)\n"
                                "    time.sleep(0.2)\nx + 2")
        events = [event async for event in handle.stream()]
        result = await handle.result()
    finally:
        await session.close()
    assert first.status is ExecutionStatus.OK and first.stdout == "hi\n"
    assert result.status is ExecutionStatus.OK and result.stdout == "0\n1\n2\n"
    assert result.outputs[-1].data["text/plain"] == "42"
    streamed = [e for e in events if isinstance(e, StreamEvent)]
    assert len(streamed) >= 2, "the prints arrived as they happened, not as one at the end"
    assert isinstance(events[-1], DoneEvent) and events[-1].execution_count == 2
    assert session.execution_count == 2
    started = [e for hid, e in seen if hid == handle.id]
    assert started[0] is None and isinstance(started[-1], DoneEvent), \
        "listeners hear the start (None) and every event, as with a local session"


async def test_executions_reach_the_node_in_submission_order(node: NodeClient) -> None:
    session = await _session(node)
    try:
        handles = [session.submit(f"print({i})") for i in range(4)]
        results = [await h.result() for h in handles]
    finally:
        await session.close()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert [r.execution_count for r in results] == [1, 2, 3, 4]


async def test_a_gate_holds_on_the_gateway_side_and_interrupt_withdraws(
        node: NodeClient) -> None:
    session = await _session(node)
    released = asyncio.Event()

    async def hold(handle: ExecutionHandle, emit: object) -> None:
        await released.wait()

    try:
        held = session.submit("print('held')", gate=hold)
        after = session.submit("print('after')")
        await asyncio.sleep(0.3)
        assert held.done is None and after.done is None, "nothing passes a held execution"
        assert await session.interrupt() is True
        withdrawn = await held.result()
        ran = await after.result()
    finally:
        await session.close()
    assert withdrawn.status is ExecutionStatus.INTERRUPTED and withdrawn.stdout == ""
    assert ran.stdout == "after\n"


async def test_interrupt_reaches_running_code_on_the_node(node: NodeClient) -> None:
    session = await _session(node)
    try:
        handle = session.submit("import time\nprint('go', flush=True)\ntime.sleep(60)")
        async for event in handle.stream():
            if isinstance(event, StreamEvent):
                break
        assert await session.interrupt() is True
        result = await handle.result()
    finally:
        await session.close()
    assert result.status is ExecutionStatus.INTERRUPTED


async def test_files_pause_resume_restart_and_fork(node: NodeClient) -> None:
    session = await _session(node)
    children: list[SessionPort] = []
    try:
        assert await session.write_file("data/a.txt", b"abc") == 3
        assert await session.read_file("data/a.txt", 100) == b"abc"
        assert [f.path for f in await session.list_files()] == ["data/a.txt"]
        with pytest.raises(FileMissing):
            await session.read_file("nope.txt", 100)
        await session.submit("y = 'kept'").result()
        info = await session.pause()
        assert session.paused and info.paused_with in ("memory", "variables")
        assert "y" in info.kept or info.paused_with == "memory"
        await session.resume()
        assert not session.paused
        assert (await session.submit("print(y)").result()).stdout == "kept\n"
        children = [RemoteSession(node, state) for state in
                    await node.fork(session.id, ForkSession(count=1))]
        assert (await children[0].submit("print(y)").result()).stdout == "kept\n"
        await session.restart()
        assert session.execution_count == 0
        assert (await session.submit("'y' in dir()").result()).outputs[-1].data[
            "text/plain"] == "False"
        usage = await session.usage()
        assert usage.memory_limit_bytes > 0
    finally:
        for child in children:
            await child.close()
        await session.close()


async def test_errors_cross_as_their_class_with_their_message(node: NodeClient) -> None:
    with pytest.raises(SessionNotFound, match="nope"):
        await node.state("nope")
    session = await _session(node)
    try:
        with pytest.raises(InvalidRequest, match="timeout_s must be above 0"):
            session.submit("1", timeout_s=10_000)
    finally:
        await session.close()
    with pytest.raises(SessionNotFound):
        await node.state(session.id)
    assert session.closed


async def test_an_unreachable_node_is_named_in_the_error() -> None:
    lost = NodeClient("node-gone", f"127.0.0.1:{free_port()}", None)
    try:
        with pytest.raises(NodeUnreachable, match="node-gone"):
            await lost.info()
    finally:
        await lost.close()
