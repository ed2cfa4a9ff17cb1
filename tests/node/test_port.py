"""The port over the network, where it is more than the port: a real pool served by a node's
app (uvicorn, real HTTP), its channel's frames as sent, bad frames either way, an unreachable
node, a watch whose node goes mid-stream, and two gateways' RemoteSessions of one session (a
kill, a context, executions and transfers made through one, seen through the other).

What a session does through the port, wherever it runs, is tests/contract/'s (both legs: a
pool in process, a node over mutual TLS). Mutual TLS is tested by tests/node/test_tls.py and
by the cluster test; here the transport is plain HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
import uvicorn
import websockets
import websockets.asyncio.server

from kernel_pool import (
    CommandStatus,
    DoneEvent,
    Event,
    ExecutionHandle,
    ExecutionStatus,
    KernelPool,
    NodeUnreachable,
    PoolSettings,
    Profile,
    SessionPort,
    StreamEvent,
    Transfer,
    WatchEvent,
)
from node.channel import NodeChannel
from node.client import NodeClient
from node.remote import RemoteSession
from node.remote_watch import RemoteWatch
from node.server import create_node_app
from node.wire import (
    PREFIX,
    ChannelFrame,
    ChannelRequest,
    CreateSession,
    ErrorOut,
    Frame,
    Submit,
)
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


async def test_a_bad_channel_request_is_answered_on_its_stream_and_the_channel_goes_on(
        node: NodeClient) -> None:
    """A request the node cannot read ends its own stream with an error; one that names no
    stream is dropped; either way the channel serves the next request."""
    url = f"ws://{node.address}{PREFIX}/channel"
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"stream": 7, "session_id": "x", "submit": "not a body"}))
        error = ChannelFrame.model_validate_json(await ws.recv())
        assert error.stream == 7 and error.frame is not None and error.frame.error is not None
        assert error.frame.error.error == "InvalidRequest"
        assert "bad channel request" in error.frame.error.detail
        assert error.end  # the error is its stream's last frame, and says so
        await ws.send("not json at all")
        await ws.send(ChannelRequest(stream=8, session_id="nope",
                                     submit=Submit(code="1", execution_id="e1")).model_dump_json())
        missing = ChannelFrame.model_validate_json(await ws.recv())
        assert missing.stream == 8 and missing.frame is not None
        assert missing.frame.error is not None and missing.frame.error.error == "SessionNotFound"
        assert missing.end


async def test_an_execution_on_the_channel_is_accepted_then_its_events_done_last(
        node: NodeClient) -> None:
    """An execution's frames on the channel: ``accepted``, its events, and ``done`` marked
    as the stream's end (no message of its own)."""
    session = await _session(node)
    try:
        async with websockets.connect(f"ws://{node.address}{PREFIX}/channel") as ws:
            await ws.send(ChannelRequest(stream=3, session_id=session.id, submit=Submit(
                code="print('hi')\n1+1", execution_id="e-raw")).model_dump_json())
            frames: list[ChannelFrame] = []
            while not frames or not frames[-1].end:
                frames.append(ChannelFrame.model_validate_json(
                    await asyncio.wait_for(ws.recv(), 60)))
    finally:
        await session.close()
    assert {f.stream for f in frames} == {3}
    assert all(f.frame is not None for f in frames)
    accepted, *events = [f.frame for f in frames if f.frame is not None]
    assert accepted.accepted is not None and accepted.accepted.id == session.id
    kinds = [e.event.type if e.event is not None else None for e in events]
    assert kinds == ["stdout", "result", "done"], kinds
    assert [f.end for f in frames] == [False] * (len(frames) - 1) + [True]


async def test_a_bad_frame_from_a_node_ends_its_stream_alone() -> None:
    """The gateway's side: a frame it cannot read ends that stream with an error naming the
    node; the channel stays up for the streams after it (a node that answers them, here a
    WebSocket server that answers each request's stream with one frame)."""
    async def answer(ws: websockets.asyncio.server.ServerConnection) -> None:
        async for raw in ws:
            stream = json.loads(raw)["stream"]
            if stream == 1:
                await ws.send(json.dumps({"stream": 1, "frame": {"event": {"type": "nope"}}}))
            else:
                await ws.send(ChannelFrame(stream=stream, frame=Frame(
                    created=None, error=ErrorOut(error="SessionNotFound",
                                                 detail="session 'x' not found"))
                ).model_dump_json())
                await ws.send(ChannelFrame(stream=stream, end=True).model_dump_json())

    async with websockets.asyncio.server.serve(answer, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        channel = NodeChannel("node-odd", f"ws://127.0.0.1:{port}", None)
        try:
            async with channel.stream("x", submit=Submit(code="1", execution_id="e1")) as frames:
                got = [frame async for frame in frames]
            assert len(got) == 1 and got[0].error is not None
            assert "cannot read" in got[0].error.detail
            async with channel.stream("x", submit=Submit(code="1", execution_id="e1")) as frames:
                again = [frame async for frame in frames]
            assert again[0].error is not None and again[0].error.error == "SessionNotFound"
        finally:
            await channel.close()


async def test_an_unreachable_node_is_named_in_the_error() -> None:
    lost = NodeClient("node-gone", f"127.0.0.1:{free_port()}", None)
    try:
        with pytest.raises(NodeUnreachable, match="node-gone"):
            await lost.info()
    finally:
        await lost.close()


async def test_a_command_is_killed_through_another_gateways_handle(node: NodeClient) -> None:
    session = await _session(node)
    # Another gateway's view of the same session: a kill from it reaches the node.
    other = RemoteSession(node, await node.state(session.id))
    try:
        up = asyncio.Event()
        running = asyncio.ensure_future(session.run_command(
            "echo up; sleep 100", command_id="c-long", emit=lambda _e: up.set()))
        await up.wait()
        assert await other.kill_command("c-long") is True
        killed = await running
        assert killed.status is CommandStatus.KILLED and killed.exit_code is None
        assert await other.kill_command("c-long") is False, "none runs under that id now"
    finally:
        await session.close()


async def test_a_context_made_through_one_gateway_is_used_through_another(
        node: NodeClient) -> None:
    session = await _session(node)
    other = RemoteSession(node, await node.state(session.id))
    try:
        await session.submit("X=7", language="bash").result()
        made = await session.create_context("bash")
        # Used through another gateway's view that has not heard of it.
        ran = await other.submit("echo ${X:-unset}", context_id=made.id).result()
        assert ran.stdout.strip() == "unset", "a new context has variables of its own"
        assert {c.id for c in await other.list_contexts()} == {"python", "bash", made.id}
        await other.restart_context("bash")
        again = await session.submit("echo ${X:-gone}", language="bash").result()
        assert again.stdout.strip() == "gone"
        await session.remove_context(made.id)
        # The other view cannot know it is gone before its node says so.
        missing = await other.submit("echo hi", context_id=made.id).result()
        assert missing.status is ExecutionStatus.DIED and made.id in (missing.reason or "")
    finally:
        await session.close()


async def test_a_follower_hears_executions_and_transfers_from_another_gateway(
        node: NodeClient) -> None:
    session = await _session(node)
    follower = RemoteSession(node, await node.state(session.id))
    heard: list[tuple[str, Event | None]] = []
    moved: list[Transfer] = []
    ended = asyncio.Event()

    def listener(_s: SessionPort, handle: ExecutionHandle, event: Event | None) -> None:
        heard.append((handle.id, event))
        if isinstance(event, DoneEvent):
            ended.set()

    def transferred(_s: SessionPort, transfer: Transfer) -> None:
        moved.append(transfer)
        if transfer.state != "running":
            ended.set()

    follower.listeners.append(listener)
    try:
        follower.transfer_listeners.append(transferred)
        await asyncio.wait_for(follower.followed.wait(), 30)
        elsewhere = session.submit("print('elsewhere')\n6 * 7")
        await asyncio.wait_for(ended.wait(), 60)
        assert {hid for hid, _ in heard} == {elsewhere.id}
        assert heard[0][1] is None, "the start is told first, as a local session tells it"
        assert [e.text for _, e in heard if isinstance(e, StreamEvent)] == ["elsewhere\n"]
        assert follower.state().execution_count == 1
        ended.clear()
        mine = follower.submit("1")
        await mine.result()
        assert [hid for hid, e in heard if e is None] == [elsewhere.id, mine.id], \
            "an execution submitted through the follower itself is told once"
        ended.clear()
        await session.pause()
        await asyncio.wait_for(ended.wait(), 60)
        assert moved[0].operation == "pause" and moved[-1].state == "done"
        follower.transfer_listeners.remove(transferred)
        assert not follower.followed.is_set(), "no one listens: the node is not followed"
    finally:
        await session.close()


async def test_a_watch_ends_cleanly_when_its_node_goes() -> None:
    """A node that answers a watch, sends one change and then drops the connection (it went
    away mid-stream): the gateway's watch yields the change, then an ``end`` naming the
    node, never an error."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        change = Frame(watched=WatchEvent(type="create", path="a.txt", name="a.txt"))
        line = change.model_dump_json().encode() + b"\n"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
                     b"transfer-encoding: chunked\r\n\r\n"
                     + f"{len(line):x}\r\n".encode() + line + b"\r\n")
        await writer.drain()
        writer.transport.abort()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = NodeClient("node-going", f"127.0.0.1:{port}", None)
    try:
        watch = RemoteWatch(client, "s1", "", True)
        await watch.start()
        async with asyncio.timeout(10):
            events = [event async for event in watch]
        assert [(e.type, e.name) for e in events] == [("create", "a.txt"), ("end", "")]
        assert events[-1].reason is not None and "node-going" in events[-1].reason
    finally:
        await client.close()
        server.close()
