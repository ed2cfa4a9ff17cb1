"""Saved snapshots: ``/v1/sessions/{id}/snapshots`` and ``/v1/snapshots`` (docs/snapshots.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request, Response, status

from gateway.deps import GatewayDep, TenantDep
from gateway.errors import NotFound
from gateway.records.snapshots import SnapshotRecord
from gateway.snapshots import Snapshots
from gateway.wire import SessionOut, SnapshotCreate, SnapshotOut, SnapshotSessionCreate

router = APIRouter(tags=["snapshots"])


async def get_snapshots(request: Request) -> Snapshots:
    snapshots: Snapshots = request.app.state.snapshots
    return snapshots


SnapshotsDep = Annotated[Snapshots, Depends(get_snapshots)]


def describe(record: SnapshotRecord) -> SnapshotOut:
    return SnapshotOut(**record.model_dump(exclude={"tenant", "env"}))


@router.post("/v1/sessions/{session_id}/snapshots", status_code=status.HTTP_201_CREATED)
async def create_snapshot(session_id: str, tenant: TenantDep, snapshots: SnapshotsDep,
                          body: Annotated[SnapshotCreate | None, Body()] = None) -> SnapshotOut:
    """Save the session (running or paused; it goes on unchanged) as a new snapshot."""
    body = body or SnapshotCreate()
    return describe(await snapshots.take(tenant, session_id, name=body.name,
                                         memory=body.memory))


@router.get("/v1/snapshots")
async def list_snapshots(tenant: TenantDep, snapshots: SnapshotsDep, name: str | None = None,
                         session_id: str | None = None) -> list[SnapshotOut]:
    """The tenant's snapshots, newest first: all, of a name, or taken of a session."""
    return [describe(r) for r in await snapshots.list(tenant, name=name,
                                                       session_id=session_id)]


@router.get("/v1/snapshots/{snapshot}")
async def get_snapshot(snapshot: str, tenant: TenantDep,
                       snapshots: SnapshotsDep) -> SnapshotOut:
    """One snapshot, by id or name."""
    return describe(await snapshots.get(tenant, snapshot))


@router.delete("/v1/snapshots/{snapshot}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_snapshot(snapshot: str, tenant: TenantDep, snapshots: SnapshotsDep) -> Response:
    """Remove a snapshot (by id or name); the sessions made from it go on."""
    record = await snapshots.get(tenant, snapshot)
    if not await snapshots.delete(tenant, record.id):
        raise NotFound(f"snapshot {snapshot!r} was deleted meanwhile")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/v1/snapshots/{snapshot}/sessions", status_code=status.HTTP_201_CREATED)
async def create_session(snapshot: str, tenant: TenantDep, gateway: GatewayDep,
                         snapshots: SnapshotsDep,
                         body: Annotated[SnapshotSessionCreate | None, Body()] = None,
                         ) -> SessionOut:
    """A new session, a copy of the snapshot (by id or name): paused until its first use,
    which brings its variables back."""
    body = body or SnapshotSessionCreate()
    session = await snapshots.start_session(tenant, await snapshots.get(tenant, snapshot),
                                            env=body.env, metadata=body.metadata)
    return gateway.describe(session)
