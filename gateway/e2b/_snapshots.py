"""E2B's snapshots as replgate's saved snapshots (``docs/snapshots.md``).

- ``POST /sandboxes/{id}/snapshots`` (``name``, ``memory``): ``create_snapshot``; 201 with
  ``snapshotID`` (replgate's ``snap_...`` id) and ``names`` (the name, when given).
- ``GET /snapshots`` (``sandboxID``, ``name``, ``limit``, ``nextToken``): ``list_snapshots``,
  newest first, one page at a time (``X-Next-Token`` while more follow).
- ``DELETE /templates/{id}``: ``delete_snapshot`` (E2B keeps snapshots as templates); 204, or
  404 for no snapshot of that id or name, which the SDKs read as ``False``.
- ``POST /sandboxes`` with a ``templateID`` that names a snapshot (its id, or its name with
  E2B's optional ``namespace/`` and ``:tag``): a sandbox made from it
  (:func:`sandbox_from_snapshot`, called by :mod:`._control`'s create).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status
from pydantic import Field

from gateway.e2b._errors import E2BError, E2BRoute
from gateway.e2b._lifecycle import asked as lifecycle_asked
from gateway.e2b._models import DEFAULT_TEMPLATES, Lenient, NewSandbox, SandboxOut
from gateway.e2b._sandboxes import Sandboxes
from gateway.e2b._tenant import TenantDep
from gateway.records.snapshots import SnapshotRecord
from gateway.snapshots import ID_PREFIX, Snapshots

router = APIRouter(prefix="/e2b", tags=["e2b"], route_class=E2BRoute)

TAG = ":default"
"""The tag E2B's snapshot names carry; replgate's snapshots have one version each."""


async def get_snapshots(request: Request) -> Snapshots:
    snapshots: Snapshots = request.app.state.snapshots
    return snapshots


SnapshotsDep = Annotated[Snapshots, Depends(get_snapshots)]


class SnapshotRequest(Lenient):
    """E2B's ``SandboxSnapshotRequest``."""

    name: str | None = None
    memory: bool = True


class SnapshotInfo(Lenient):
    """E2B's ``SnapshotInfo``."""

    snapshot_id: str = Field(alias="snapshotID")
    names: list[str]


def _info(record: SnapshotRecord) -> SnapshotInfo:
    return SnapshotInfo(snapshot_id=record.id, names=[record.name] if record.name else [])


def _name(template: str, tenant: str) -> str:
    """A snapshot name as E2B writes one (``namespace/name:tag``), bare."""
    name = template.removesuffix(TAG)
    return name.removeprefix(f"{tenant}/")


async def snapshot_for(snapshots: Snapshots, tenant: str,
                       template: str) -> SnapshotRecord | None:
    """The tenant's snapshot a create's ``templateID`` names, if it names one: a snapshot id;
    else, unless it is a profile or one of E2B's default templates, a snapshot's name."""
    if template.startswith(ID_PREFIX):
        found = await snapshots.find(tenant, template.removesuffix(TAG))
        if found is None:
            raise E2BError(404, f"snapshot {template!r} not found")
        return found
    if template in DEFAULT_TEMPLATES or template in {
            profile.name for profile in snapshots.gateway.profiles()}:
        return None
    return await snapshots.find(tenant, _name(template, tenant))


async def sandbox_from_snapshot(snapshot: SnapshotRecord, body: NewSandbox, tenant: str,
                                lifetime_s: int, snapshots: Snapshots,
                                sandboxes: Sandboxes) -> SandboxOut:
    """A sandbox made from the snapshot: its files and variables (which come back at its
    first use), the create's ``envVars`` over the snapshot's, ending ``lifetime_s`` seconds
    from now as its create's lifecycle asks (:mod:`._lifecycle`)."""
    sandboxes.check_timeout(lifetime_s)
    policy = lifecycle_asked(body, lifetime_s)
    session = await snapshots.start_session(tenant, snapshot, env=body.env_vars,
                                            metadata=dict(body.metadata))
    await sandboxes.set_lifecycle(tenant, session, policy)
    await sandboxes.set_timeout(tenant, session, lifetime_s)
    return sandboxes.created(session)


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=status.HTTP_201_CREATED)
async def create_snapshot(sandbox_id: str, tenant: TenantDep, snapshots: SnapshotsDep,
                          body: SnapshotRequest | None = None) -> SnapshotInfo:
    """``create_snapshot()``: the sandbox saved (it keeps running), its files and, unless
    ``memory`` is false, its variables."""
    body = body or SnapshotRequest()
    return _info(await snapshots.take(tenant, sandbox_id, name=body.name,
                                      memory=body.memory))


@router.get("/snapshots")
async def list_snapshots(
        response: Response, tenant: TenantDep, snapshots: SnapshotsDep,
        sandbox_id: Annotated[str | None, Query(alias="sandboxID")] = None,
        name: str | None = None, limit: Annotated[int, Query(ge=1, le=100)] = 100,
        next_token: Annotated[str | None, Query(alias="nextToken")] = None,
) -> list[SnapshotInfo]:
    """``list_snapshots()``: the tenant's snapshots, newest first, by sandbox or name;
    ``X-Next-Token`` (the last one's id) while more follow."""
    found = await snapshots.list(tenant, session_id=sandbox_id,
                                 name=None if name is None else _name(name, tenant))
    if next_token is not None:
        ids = [record.id for record in found]
        found = found[ids.index(next_token) + 1:] if next_token in ids else []
    if len(found) > limit:
        response.headers["X-Next-Token"] = found[limit - 1].id
    return [_info(record) for record in found[:limit]]


@router.delete("/templates/{template_id:path}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_snapshot(template_id: str, tenant: TenantDep,
                          snapshots: SnapshotsDep) -> Response:
    """``delete_snapshot()``: 204, or 404 when no snapshot has that id or name (replgate
    has no other templates to delete)."""
    found = (await snapshots.find(tenant, template_id.removesuffix(TAG))
             if template_id.startswith(ID_PREFIX)
             else await snapshots.find(tenant, _name(template_id, tenant)))
    if found is None or not await snapshots.delete(tenant, found.id):
        raise E2BError(404, f"template {template_id!r} not found: on replgate the templates "
                            "to delete are snapshots")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
