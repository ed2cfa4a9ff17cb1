"""What a host answers of its sessions and nodes: found, listed and counted by tenant, a
session's state as the host reports it, the nodes, drains, the languages of a profile, and a
creation the caller's own check refuses, the same on one machine and on nodes."""

from __future__ import annotations

import asyncio

import pytest

from kernel_pool import (
    NotDrainable,
    ProfileNotFound,
    SessionHost,
    SessionNotFound,
    SessionPort,
    SessionStatus,
    UnknownNode,
)
from tests.contract.support import SESSION_ENV


class Refused(Exception):
    """What a caller's check (a tenant's quota) raises to refuse a session."""


async def test_sessions_are_found_listed_and_counted_by_their_tenant(host: SessionHost) -> None:
    mine = await host.create_session(tenant="t-one")
    theirs = await host.create_session(tenant="t-two")
    try:
        assert (await host.find(mine.id)).id == mine.id
        assert (await host.find(mine.id, tenant="t-one")).id == mine.id
        with pytest.raises(SessionNotFound, match=f"session {mine.id} not found"):
            await host.find(mine.id, tenant="t-two")
        assert await host.tenant_of(mine.id) == "t-one"
        assert [s.id for s in await host.list_sessions("t-one")] == [mine.id]
        assert {s.id for s in await host.list_sessions()} >= {mine.id, theirs.id}
        assert await host.count_sessions("t-one") == 1
        assert await host.count_sessions() >= 2
        assert mine.state().tenant == "t-one"
    finally:
        await host.delete_session(theirs.id)
        await host.delete_session(mine.id)

    assert await host.tenant_of(mine.id) is None
    assert await host.count_sessions("t-one") == 0
    with pytest.raises(SessionNotFound, match=f"session {mine.id} not found"):
        await host.find(mine.id)


async def test_forks_belong_to_their_parents_tenant(host: SessionHost) -> None:
    parent = await host.create_session(tenant="t-fork")
    children = await host.fork_session(parent.id, 1)
    try:
        assert children[0].state().tenant == "t-fork"
        assert await host.tenant_of(children[0].id) == "t-fork"
        assert await host.count_sessions("t-fork") == 2
    finally:
        for made in (*children, parent):
            await host.delete_session(made.id)


async def test_the_state_a_session_reports(host: SessionHost, session: SessionPort) -> None:
    state = session.state()
    assert (state.id, state.profile.name, state.env) == (session.id, "default", SESSION_ENV)
    assert state.status is SessionStatus.IDLE and state.execution_count == 0
    assert state.pending == 0 and state.pause_info is None and state.transfer is None
    assert state.node in {node.id for node in await host.nodes()}
    assert state.sandbox.container_id == session.sandbox_info().container_id
    assert {"python", "bash"} <= set(state.languages)

    await session.submit("x = 1").result()
    await session.refresh()
    assert session.state().execution_count == 1
    assert session.state().last_active_at >= state.last_active_at

    info = await session.pause()
    paused = session.state()
    assert paused.status is SessionStatus.PAUSED and paused.pause_info == info
    await session.resume()
    await session.refresh()
    resumed = session.state()
    assert resumed.status is SessionStatus.IDLE and resumed.pause_info is None
    assert resumed.execution_count == 1


async def test_the_nodes_sessions_run_on(host: SessionHost, session: SessionPort) -> None:
    nodes = await host.nodes()

    assert len(nodes) == 1, nodes
    assert nodes[0].state == "up" and nodes[0].max_kernels == 4
    assert nodes[0].id == session.state().node
    assert host.stats()["sessions"] >= 1, "the host counts the sessions it holds"


async def test_a_node_is_drained_and_back_or_refused_as_not_drainable(
        host: SessionHost) -> None:
    """One machine has nowhere to drain to (NotDrainable); nodes drain and come back."""
    node = (await host.nodes())[0]
    with pytest.raises((UnknownNode, NotDrainable)):
        await host.drain("no-such-node", True)
    try:
        drained = await host.drain(node.id, True)
    except NotDrainable as refused:
        assert "nowhere to drain it to" in str(refused)
        return
    try:
        assert drained.state == "draining"
    finally:
        back = await host.drain(node.id, False)
    assert back.state == "up"
    made = await host.create_session()
    await host.delete_session(made.id)


async def test_the_languages_of_a_profile(host: SessionHost) -> None:
    offered = await host.languages("default")

    assert offered is None or {"python", "bash"} <= set(offered), offered
    with pytest.raises(ProfileNotFound):
        await host.languages("nope")


async def test_a_creation_the_callers_check_refuses_leaves_nothing(host: SessionHost) -> None:
    before = set(host.sessions)

    async def refuse() -> None:
        raise Refused("over the tenant's quota")

    with pytest.raises(Refused, match="over the tenant's quota"):
        await host.create_session(tenant="t-quota", admitted=asyncio.ensure_future(refuse()))
    assert set(host.sessions) == before
    assert await host.count_sessions("t-quota") == 0

    async def allow() -> None:
        await asyncio.sleep(0)

    made = await host.create_session(tenant="t-quota", admitted=asyncio.ensure_future(allow()))
    await host.delete_session(made.id)
