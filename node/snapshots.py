"""The port's routes for saved snapshots (E2B's ``create_snapshot``), and the gateway's calls to
them. A node writes and reads them in the shared bundle store (``REPLGATE_BUNDLE_STORE``), so
a snapshot taken on one node makes sessions on any other.

- ``POST /port/v1/sessions/{id}/snapshots``: save the session as a snapshot.
- ``POST /port/v1/snapshots/{id}/sessions``: a new session, a copy of the snapshot.
- ``DELETE /port/v1/snapshots/{id}?tenant=``: remove the snapshot.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from kernel_pool import KernelPool, SnapshotSaved
from node.client import NodeClient
from node.restore import MOVING_TIMEOUT
from node.wire import PREFIX, SessionState

router = APIRouter(prefix=PREFIX)


class SaveSnapshot(BaseModel):
    """A session to save as a snapshot of ``tenant``."""

    snapshot_id: str = Field(min_length=1)
    tenant: str
    memory: bool = True


class FromSnapshot(BaseModel):
    """A new session to make from a snapshot of ``tenant``."""

    tenant: str
    profile: str = "default"
    env: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


def _pool(request: Request) -> KernelPool:
    pool: KernelPool = request.app.state.pool
    return pool


@router.post("/sessions/{session_id}/snapshots")
async def save(request: Request, session_id: str, body: SaveSnapshot) -> SnapshotSaved:
    return await _pool(request).snapshot_session(session_id, body.snapshot_id,
                                                 tenant=body.tenant, memory=body.memory)


@router.post("/snapshots/{snapshot_id}/sessions")
async def made_from(request: Request, snapshot_id: str, body: FromSnapshot) -> SessionState:
    session = await _pool(request).create_from_snapshot(
        snapshot_id, tenant=body.tenant, profile=body.profile, env=body.env,
        metadata=body.metadata)
    return session.state()


@router.delete("/snapshots/{snapshot_id}", status_code=204)
async def delete(request: Request, snapshot_id: str, tenant: str) -> None:
    await _pool(request).delete_snapshot(tenant, snapshot_id)


# -- the gateway's side ---------------------------------------------------------------------

async def save_on(client: NodeClient, session_id: str, body: SaveSnapshot) -> SnapshotSaved:
    """Ask the node of ``client`` to save one of its sessions as a snapshot."""
    saved: SnapshotSaved = await client.call(
        "POST", f"/sessions/{session_id}/snapshots", SnapshotSaved, session_id=session_id,
        timeout=MOVING_TIMEOUT, content=body.model_dump_json(),
        headers={"content-type": "application/json"})
    return saved


async def make_on(client: NodeClient, snapshot_id: str, body: FromSnapshot) -> SessionState:
    """Ask the node of ``client`` for a new session made from a snapshot."""
    state: SessionState = await client.call(
        "POST", f"/snapshots/{snapshot_id}/sessions", SessionState, timeout=MOVING_TIMEOUT,
        content=body.model_dump_json(), headers={"content-type": "application/json"})
    return state


async def delete_on(client: NodeClient, tenant: str, snapshot_id: str) -> None:
    """Ask the node of ``client`` to remove a snapshot from the bundle store."""
    await client.call("DELETE", f"/snapshots/{snapshot_id}", params={"tenant": tenant})
