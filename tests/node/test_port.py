"""The port over the network: a real pool served by a node's app (uvicorn, real HTTP), and
RemoteSessions on the gateway's side doing what the gateway does with local ones.

Mutual TLS is tested by tests/node/test_tls.py and by the cluster test; here the transport is
plain HTTP on 127.0.0.1, so what is tested is the port's own behaviour.
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
    ContextNotFound,
    DoneEvent,
    Event,
    ExecutionHandle,
    ExecutionStatus,
    FileMissing,
    InvalidRequest,
    KernelPool,
    PathOutsideWorkspace,
    PoolSettings,
    Profile,
    SessionNotFound,
    SessionPort,
    StreamEvent,
    Transfer,
    UnknownLanguage,
)
from node.channel import NodeChannel, NodeUnreachable
from node.remote import NodeClient, RemoteSession
from node.server import create_node_app
from node.wire import (
    PREFIX,
    ChannelFrame,
    ChannelRequest,
    CreateSession,
    ErrorOut,
    ForkSession,
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
            frames = []
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


async def test_commands_stream_and_are_killed_through_another_handle(node: NodeClient) -> None:
    session = await _session(node)
    # Another gateway's view of the same session: a kill from it reaches the node.
    other = RemoteSession(node, await node.state(session.id))
    seen: list[StreamEvent] = []
    try:
        result = await session.run_command("echo out; echo err >&2; exit 3", emit=seen.append)
        assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
        assert result.status is CommandStatus.OK
        # Each stream's output in its order (the two pipes are read apart: no order between them).
        assert sorted((e.type, e.text) for e in seen) == [("stderr", "err\n"), ("stdout", "out\n")]
        up = asyncio.Event()
        running = asyncio.ensure_future(session.run_command(
            "echo up; sleep 100", command_id="c-long", emit=lambda _e: up.set()))
        await up.wait()
        assert await other.kill_command("c-long") is True
        killed = await running
        assert killed.status is CommandStatus.KILLED and killed.exit_code is None
        assert await other.kill_command("c-long") is False, "none runs under that id now"
        timed = await session.run_command("sleep 30", timeout_s=1)
        assert timed.status is CommandStatus.TIMEOUT and "timeout_s=1" in (timed.reason or "")
        with pytest.raises(InvalidRequest, match="cmd is empty"):
            await session.run_command("  ")
        in_folder = await session.run_command("mkdir -p d && cd d && pwd")
        assert (await session.run_command("pwd", cwd="/home/user/d")).stdout == \
            in_folder.stdout
    finally:
        await session.close()


async def test_a_command_whose_caller_goes_away_is_stopped_on_the_node(
        node: NodeClient) -> None:
    session = await _session(node)
    up = asyncio.Event()
    try:
        running = asyncio.ensure_future(session.run_command(
            "echo up; sleep 5; touch /home/user/survived", emit=lambda _e: up.set()))
        await up.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await asyncio.sleep(6)
        assert not any(f.path == "survived" for f in await session.list_files()), \
            "the command went on running after its caller had gone"
    finally:
        await session.close()


async def test_the_filesystem_service_over_the_port(node: NodeClient) -> None:
    session = await _session(node)
    try:
        assert await session.make_dir("r/2026") is True
        assert await session.make_dir("r/2026") is False
        await session.write_file("r/2026/a.txt", b"abc")
        assert (await session.stat_path("r/2026/a.txt")).size == 3
        listed = {e.path: e.kind for e in await session.list_dir("", depth=3)}
        assert listed == {"r": "dir", "r/2026": "dir", "r/2026/a.txt": "file"}
        assert [e.path for e in await session.list_dir("r")] == ["r/2026"]
        moved = await session.move_path("r/2026/a.txt", "s/b.txt")
        assert moved.path == "s/b.txt" and moved.size == 3
        await session.remove_path("r")
        assert {e.path for e in await session.list_dir("")} == {"s"}
        with pytest.raises(FileMissing):
            await session.stat_path("r")
        with pytest.raises(PathOutsideWorkspace):
            await session.list_dir("../etc")
    finally:
        await session.close()


async def test_raw_jupyter_requests_are_relayed_until_idle(node: NodeClient) -> None:
    session = await _session(node)
    try:
        await session.submit("import json\nvalue_one = 1").result()
        seen = [(channel, msg) async for channel, msg in session.relay(
            "kernel_info_request", {}, channel="control")]
        kinds = [(channel, msg["msg_type"]) for channel, msg in seen]
        assert ("control", "kernel_info_reply") in kinds
        # The reply and the idle status come on two sockets, in either order.
        assert {"execution_state": "idle"} in [m["content"] for c, m in seen if c == "iopub"]
        info = next(msg for _, msg in seen if msg["msg_type"] == "kernel_info_reply")
        assert info["content"]["language_info"]["name"] == "python"
        assert all(isinstance(msg["buffers"], list) for _, msg in seen)
        replies = [msg async for channel, msg in session.relay(
            "complete_request", {"code": "value_o", "cursor_pos": 7}) if channel == "shell"]
        assert "value_one" in replies[0]["content"]["matches"]
    finally:
        await session.close()
    with pytest.raises(SessionNotFound):
        async for _ in session.relay("kernel_info_request", {}):
            pass


async def test_code_contexts_of_other_languages_over_the_port(node: NodeClient) -> None:
    session = await _session(node)
    other = RemoteSession(node, await node.state(session.id))
    try:
        assert "bash" in session.languages
        result = await session.submit("X=7; echo $X", language="bash").result()
        assert result.status is ExecutionStatus.OK and result.stdout.strip() == "7"
        made = await session.create_context("bash")
        # Made through one gateway, used through another that has not heard of it.
        ran = await other.submit("echo ${X:-unset}", context_id=made.id).result()
        assert ran.stdout.strip() == "unset", "a new context has variables of its own"
        assert {c.id for c in await other.list_contexts()} == {"python", "bash", made.id}
        await other.restart_context("bash")
        again = await session.submit("echo ${X:-gone}", language="bash").result()
        assert again.stdout.strip() == "gone"
        await session.remove_context(made.id)
        missing = await other.submit("echo hi", context_id=made.id).result()
        assert missing.status is ExecutionStatus.DIED and made.id in (missing.reason or "")
        with pytest.raises(ContextNotFound):
            await session.remove_context(made.id)
        with pytest.raises(UnknownLanguage, match="bash"):
            session.submit("1", language="cobol")
        with pytest.raises(InvalidRequest, match="runs python"):
            session.submit("1", language="bash", context_id="python")
        assert await session.interrupt("bash") is False
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
        assert follower.execution_count == 1
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


async def test_a_context_made_with_a_folder_over_the_port(node: NodeClient) -> None:
    session = await _session(node)
    try:
        made = await session.create_context("bash", cwd="/tmp")
        assert made.cwd == "/tmp"
        here = await session.submit("pwd", context_id=made.id).result()
        assert here.stdout == "/tmp\n", here
        with pytest.raises(InvalidRequest, match="does not exist"):
            await session.create_context("bash", cwd="/nowhere")
    finally:
        await session.close()
