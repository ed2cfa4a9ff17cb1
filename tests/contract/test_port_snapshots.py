"""Saved snapshots through the host: a session saved while it goes on, sessions made from the
snapshot (each its own copy, with the variables and files of the moment it was taken), a
snapshot of files alone, another tenant's snapshot absent, and a deleted snapshot that leaves
the sessions made from it as they are; the same on one machine and on nodes."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import docker
import pytest

from kernel_pool import SessionHost, SessionPort, SessionStatus, SnapshotNotFound
from tests.contract.support import local_host, remote_host


@pytest.fixture(scope="module", params=["local", "remote"])
async def host(request: pytest.FixtureRequest,
               docker_client: docker.DockerClient) -> AsyncIterator[SessionHost]:
    """The contract's hosts; the node's with a bundle store, where snapshots are kept on
    nodes (a node without one refuses them)."""
    started = (local_host(docker_client) if request.param == "local"
               else remote_host(docker_client, bundle_store=True))
    async for made in started:
        yield made


def _snapshot_id() -> str:
    return f"snap_{secrets.token_hex(8)}"


async def _printed(session: SessionPort, code: str) -> str:
    return (await session.submit(code).result()).stdout


async def test_sessions_made_from_a_snapshot_are_copies_of_its_moment(
        host: SessionHost) -> None:
    source = await host.create_session(tenant="t-snap", env={"GREETING": "hi"})
    snapshot_id = _snapshot_id()
    made: list[SessionPort] = []
    try:
        await source.submit("y = 'kept'").result()
        await source.write_file("notes/a.txt", b"from the source")
        saved = await host.snapshot_session(source.id, snapshot_id, tenant="t-snap")
        assert (saved.snapshot_id, saved.session_id, saved.profile) == (
            snapshot_id, source.id, "default")
        assert saved.memory and "y" in saved.kept and saved.size_bytes > 0
        assert saved.env == {"GREETING": "hi"}
        # the source goes on, and changes nothing of the snapshot
        assert source.state().status is not SessionStatus.PAUSED
        await source.submit("y = 'changed'").result()
        await source.write_file("notes/a.txt", b"changed")

        for _ in range(2):
            made.append(await host.create_from_snapshot(
                snapshot_id, tenant="t-snap", profile=saved.profile, env=saved.env))
        first, second = made
        assert first.id != second.id and first.state().tenant == "t-snap"
        assert await host.tenant_of(first.id) == "t-snap"
        for copy in made:
            assert await _printed(copy, "print(y)") == "kept\n"
            assert await copy.read_file("notes/a.txt", 1000) == b"from the source"
        await first.write_file("notes/a.txt", b"first's own")
        await first.submit("y = 'first'").result()
        assert await second.read_file("notes/a.txt", 1000) == b"from the source"
        assert await _printed(second, "print(y)") == "kept\n"

        # deleted, the snapshot makes no more sessions; those made from it go on
        await host.delete_snapshot("t-snap", snapshot_id)
        await host.delete_snapshot("t-snap", snapshot_id)  # nothing left: no error
        with pytest.raises(SnapshotNotFound, match=snapshot_id):
            await host.create_from_snapshot(snapshot_id, tenant="t-snap", profile="default")
        assert await _printed(first, "print(y)") == "first\n"
        assert await second.read_file("notes/a.txt", 1000) == b"from the source"
    finally:
        for session in (*made, source):
            await host.delete_session(session.id)


async def test_a_files_only_snapshot_starts_its_sessions_on_a_fresh_kernel(
        host: SessionHost) -> None:
    source = await host.create_session(tenant="t-snap")
    snapshot_id = _snapshot_id()
    try:
        await source.submit("y = 'in memory'").result()
        await source.write_file("data.txt", b"on disk")
        saved = await host.snapshot_session(source.id, snapshot_id, tenant="t-snap",
                                            memory=False)
        assert not saved.memory and saved.kept == [] and "variables" in saved.not_kept
        copy = await host.create_from_snapshot(snapshot_id, tenant="t-snap",
                                               profile=saved.profile)
        try:
            assert await copy.read_file("data.txt", 100) == b"on disk"
            assert await _printed(copy, "print('y' in globals())") == "False\n"
        finally:
            await host.delete_session(copy.id)
        assert await _printed(source, "print(y)") == "in memory\n"
    finally:
        await host.delete_snapshot("t-snap", snapshot_id)
        await host.delete_session(source.id)


async def test_another_tenants_snapshot_is_absent(host: SessionHost) -> None:
    source = await host.create_session(tenant="t-snap")
    snapshot_id = _snapshot_id()
    try:
        await host.snapshot_session(source.id, snapshot_id, tenant="t-snap")
        with pytest.raises(SnapshotNotFound, match=snapshot_id):
            await host.create_from_snapshot(snapshot_id, tenant="t-other", profile="default")
        with pytest.raises(SnapshotNotFound, match="snap_none"):
            await host.create_from_snapshot("snap_none", tenant="t-snap", profile="default")
    finally:
        await host.delete_snapshot("t-snap", snapshot_id)
        await host.delete_session(source.id)
