"""The two hosts the contract suite runs against, started and stopped (a module of its own:
conftest is not importable).

``local``: a :class:`~kernel_pool.KernelPool` in this process, as a gateway of one machine
holds it. ``remote``: a real ``replgate node`` subprocess (mutual TLS, its own pool and
containers, a PostgreSQL database of its own as the cluster tests' nodes have) and, in this
process, the :class:`~node.placement.RemoteNodes` a gateway of many machines holds (with the
records the gateway writes beside it: :class:`RecordingNodes`), so every call crosses HTTPS
and the node's channel WebSocket. Both run with the same limits; after
either stops, no container or mount of it may remain.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker

from common.store import RecordNotFound, SessionRecord, Store
from kernel_pool import KernelPool, PoolSettings, Profile, SessionHost, SessionPort
from node.local import stop_group
from node.placement import RemoteNodes
from node.records import SessionRecords
from node.registry import Registry
from node.remote import RemoteSession
from node.tls import client_context, make_cluster_certs
from tests.conftest import (
    TEMPLATE_DIR,
    TEST_RUNTIME,
    containers_of,
    create_database,
    drop_database,
    unmount_all,
)
from tests.node.cluster_support import make_node

MAX_QUEUED = 3
"""Executions a session may hold waiting, on both legs (small: QueueFull is quick to reach)."""

LIMITS = {"memory": "1g", "workspace_size": "64m", "tmp_size": "32m", "min_idle": "1",
          "default_timeout_s": "30", "max_timeout_s": "120"}
"""The default profile's limits, the same on both legs (the node reads them as settings)."""
POOL = {"max_kernels": "4", "interrupt_grace_s": "10", "pause_after_s": "0",
        "max_queued_executions": str(MAX_QUEUED)}
"""The pool's limits, the same on both legs (no idle pause: a test's session stays as it is;
an interrupted kernel has 10 s to stop before it is restarted: on a loaded machine 2 s was
missed now and then on both legs, and the variables went with the restart)."""

SESSION_ENV = {"GREETING": "hi"}
"""The environment each test's session is made with."""


class RecordingNodes(RemoteNodes):
    """The nodes as a gateway holds them, with the records it writes beside them: a session
    made (from a snapshot too) or forked is recorded in the shared database
    (Gateway.create_session and fork write the same fields), a deleted one is marked so.
    Nodes find, list and count sessions by these records: a session no gateway recorded is
    not theirs to find."""

    async def create_session(self, profile: str = "default", **options: Any) -> RemoteSession:
        session = await super().create_session(profile, **options)
        await self._record(session)
        return session

    async def fork_session(self, parent_id: str, count: int = 1,
                           metadata: dict[str, Any] | None = None) -> list[RemoteSession]:
        children = await super().fork_session(parent_id, count, metadata)
        for child in children:
            await self._record(child)
        return children

    async def create_from_snapshot(self, snapshot_id: str, **options: Any) -> RemoteSession:
        session = await super().create_from_snapshot(snapshot_id, **options)
        await self._record(session)
        return session

    async def delete_session(self, session_id: str) -> None:
        await super().delete_session(session_id)
        with contextlib.suppress(RecordNotFound):  # (its node may have marked it first)
            await self.records.store.mark_deleted(session_id)

    async def _record(self, session: SessionPort) -> None:
        state = session.state()
        await self.records.store.create_session(SessionRecord(
            id=session.id, tenant=state.tenant, profile=state.profile.name,
            status=state.status.value, created_at=state.created_at,
            last_active_at=state.last_active_at, execution_count=0, metadata=state.metadata,
            env=state.env, sandbox=state.sandbox.model_dump(mode="json"), node=state.node,
            epoch=self.first_epoch))


def pool_settings(state_dir: Path, owner: str) -> PoolSettings:
    """The local pool's settings, and the profiles the remote host checks requests against."""
    profile = Profile(name="default", runtime=TEST_RUNTIME, **LIMITS)
    return PoolSettings(state_dir=state_dir, owner=owner, profiles={"default": profile},
                        template_dir=TEMPLATE_DIR, **POOL)


async def local_host(docker_client: docker.DockerClient) -> AsyncIterator[SessionHost]:
    """A pool in this process, one kernel warm."""
    owner = f"contract-{secrets.token_hex(4)}"
    root = Path(tempfile.mkdtemp(prefix="rg-ct-", dir="/tmp"))
    pool = KernelPool(pool_settings(root, owner))
    try:
        await pool.start()
        await pool.wait_ready(timeout_s=120)
        yield pool
    finally:
        await pool.close()
        left = containers_of(docker_client, owner)
        for container_id in left:
            docker_client.api.remove_container(container_id, force=True, v=True)
        mounted = unmount_all(root)
        shutil.rmtree(root, ignore_errors=True)
        assert not left and not mounted, (left, mounted)


async def remote_host(docker_client: docker.DockerClient, *,
                      bundle_store: bool = False) -> AsyncIterator[SessionHost]:
    """A node subprocess, one kernel warm, and the gateway's RemoteNodes reaching it;
    ``bundle_store``: the node keeps bundles (paused sessions, saved snapshots) in a folder
    of its own (``file://``)."""
    database_url = await asyncio.to_thread(create_database)
    certs_dir = Path(tempfile.mkdtemp(prefix="rg-ct-certs-", dir="/tmp"))
    certs = make_cluster_certs(certs_dir)
    store = {"REPLGATE_BUNDLE_STORE": (certs_dir / "bundles").as_uri()} if bundle_store else {}
    node = make_node(f"contract-{secrets.token_hex(4)}", database_url, certs,
                     {f"REPLGATE_{name.upper()}": value for name, value in {
                         **LIMITS, **POOL}.items()} | store)
    try:
        node.start()
        await asyncio.to_thread(node.wait_registered, database_url)
        async with Store.open(database_url) as store:
            nodes = RecordingNodes(
                pool_settings(node.state_dir, node.node_id),
                Registry(store.database, heartbeat_timeout_s=30),
                client_context(certs.gateway_cert, certs.gateway_key, certs.ca),
                SessionRecords(store))
            listening = asyncio.create_task(nodes.records.listen())
            try:
                yield nodes
            finally:
                listening.cancel()
                await asyncio.gather(listening, return_exceptions=True)
                await nodes.close()
    finally:
        if node.process is not None:
            await asyncio.to_thread(stop_group, node.process)
            node.process = None
        left = containers_of(docker_client, node.node_id)
        for container_id in left:
            docker_client.api.remove_container(container_id, force=True, v=True)
        mounted = unmount_all(node.state_dir)
        shutil.rmtree(node.state_dir, ignore_errors=True)
        shutil.rmtree(certs_dir, ignore_errors=True)
        await asyncio.to_thread(drop_database, database_url)
        assert not left and not mounted, (left, mounted, node.log())


