"""Sessions through the host and the port: made, found, listed, forked and deleted; paused,
resumed and restarted, with what each says of itself before and after, the same wherever it
runs."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from kernel_pool import (
    ExecutionStatus,
    ProfileNotFound,
    SessionHost,
    SessionNotFound,
    SessionPort,
    SessionStatus,
    Transfer,
)


async def test_a_session_is_made_found_listed_and_deleted(host: SessionHost) -> None:
    closed: list[tuple[str, str]] = []
    host.on_session_closed.append(lambda s, reason: closed.append((s.id, reason)))
    try:
        made = await host.create_session(env={"GREETING": "hello"},
                                         metadata={"purpose": "contract"})
        assert host.get_session(made.id).id == made.id
        assert made.id in host.sessions
        assert made.profile.name == "default"
        state = made.state()
        assert (state.id, state.profile.name) == (made.id, "default")
        assert (state.env, state.metadata) == ({"GREETING": "hello"}, {"purpose": "contract"})
        assert state.created_at and state.last_active_at
        assert state.status is SessionStatus.IDLE and state.execution_count == 0
        assert (state.pending, made.pending, made.closed, made.current) == (0, 0, False, None)
        assert state.pause_info is None and state.reason is None and state.transfer is None

        await host.delete_session(made.id)
    finally:
        host.on_session_closed.pop()

    assert made.closed
    assert made.id not in host.sessions
    assert (made.id, "deleted") in closed
    with pytest.raises(SessionNotFound, match=f"session {made.id} not found"):
        host.get_session(made.id)
    with pytest.raises(SessionNotFound, match=f"session {made.id} not found"):
        await host.delete_session(made.id)


async def test_a_session_made_under_a_given_id_has_it(host: SessionHost) -> None:
    wanted = f"contract-{secrets.token_hex(4)}"
    made = await host.create_session(session_id=wanted)
    try:
        assert made.id == wanted and host.get_session(wanted) is not None
    finally:
        await host.delete_session(made.id)


async def test_an_unknown_profile_or_session_is_named(host: SessionHost) -> None:
    with pytest.raises(ProfileNotFound, match="nope"):
        await host.create_session("nope")
    with pytest.raises(SessionNotFound, match="session nope not found"):
        host.get_session("nope")


async def test_forks_start_from_the_parents_state_and_go_their_own_way(
        host: SessionHost, session: SessionPort) -> None:
    await session.submit("y = 'kept'").result()
    children = await host.fork_session(session.id, 2, metadata={"fork": "yes"})
    try:
        assert len(children) == 2 and len({c.id for c in children} | {session.id}) == 3
        for child in children:
            assert child.id in host.sessions and child.state().metadata == {"fork": "yes"}
            assert (await child.submit("print(y)").result()).stdout == "kept\n"
        await children[0].submit("y = 'changed'").result()
        assert (await children[1].submit("print(y)").result()).stdout == "kept\n"
        assert (await session.submit("print(y)").result()).stdout == "kept\n"
    finally:
        for child in children:
            await host.delete_session(child.id)
    with pytest.raises(SessionNotFound):
        await host.fork_session("nope")


async def test_pause_and_resume_keep_the_state_and_say_so(session: SessionPort) -> None:
    moved: list[Transfer] = []
    ended = asyncio.Event()

    def transferred(_s: SessionPort, transfer: Transfer) -> None:
        moved.append(transfer)
        if transfer.state != "running":
            ended.set()

    session.transfer_listeners.append(transferred)
    await session.submit("y = 'kept'").result()
    info = await session.pause()

    paused = session.state()
    assert paused.status is SessionStatus.PAUSED and paused.pause_info == info
    assert info.paused_with in ("memory", "variables")
    assert "y" in info.kept or info.paused_with == "memory"
    await asyncio.wait_for(ended.wait(), 30)
    assert moved[0].operation == "pause" and moved[-1].state == "done", moved

    ended.clear()
    await session.resume()
    resumed = session.state()
    assert resumed.status is SessionStatus.IDLE and resumed.pause_info is None
    result = await session.submit("print(y)").result()
    assert result.stdout == "kept\n" and not result.restarted
    await asyncio.wait_for(ended.wait(), 30)
    assert {t.operation for t in moved} == {"pause", "resume"}, moved
    session.transfer_listeners.remove(transferred)


async def test_code_submitted_to_a_paused_session_resumes_it(session: SessionPort) -> None:
    await session.submit("y = 'kept'").result()
    await session.pause()
    result = await session.submit("print(y)").result()

    assert result.status is ExecutionStatus.OK and result.stdout == "kept\n"
    await session.refresh()
    assert session.state().status is SessionStatus.IDLE


async def test_restart_forgets_the_variables_and_the_count(session: SessionPort) -> None:
    await session.submit("y = 'gone'").result()
    assert session.state().execution_count == 1
    await session.restart()

    restarted = session.state()
    assert restarted.execution_count == 0 and restarted.status is SessionStatus.IDLE
    result = await session.submit("'y' in dir()").result()
    assert result.outputs[-1].data["text/plain"] == "False"
    assert result.execution_count == 1 == session.state().execution_count
