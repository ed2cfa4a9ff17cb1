"""The port's routes for sessions that move between nodes through the bundle store, and the
gateway's calls to them.

- ``POST /port/v1/restores``: make a session paused on this node from its bundle (another
  node paused it); no bundle is an answer (``missing``), not an error, for the gateway to
  place the session otherwise.
- ``POST /port/v1/sessions/{id}/keep``: pause the session into the bundle store (a drain).
- ``POST /port/v1/sessions/{id}/moved``: the session was placed on another node: its copy here
  goes, and neither its record nor its bundle with it.
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from kernel_pool import KernelPool, SnapshotError
from kernel_pool.bundles import BundleCorrupt, BundleNotFound
from node.bundles import BundleKeeper
from node.client import NodeClient
from node.wire import PREFIX, SessionState

router = APIRouter(prefix=PREFIX)

MOVING_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
"""A bundle moves the session's whole snapshot and files: minutes for gigabytes, at worst."""
MOVED = "moved"
"""The reason a session's copy is removed from a node it no longer runs on."""


class RestoreSession(BaseModel):
    """A session to make again from its bundle, as the shared database knows it."""

    tenant: str
    session_id: str
    profile: str = "default"
    env: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: str | None = None
    execution_count: int = Field(0, ge=0)
    lost: str | None = None
    """Why it was running, not paused, when its node was lost: its next execution says so
    (``restarted``, ``reason``), as it resumes from its last pause."""


class Restored(BaseModel):
    """The restored session, or why there is nothing to restore it from."""

    state: SessionState | None = None
    missing: str | None = None
    """No bundle (or no bundle store on the node)."""
    refused: str | None = None
    """A bundle that does not open or read back as written: nothing of it was restored."""


class NotRestored(Exception):
    """Nothing to restore a session from: no bundle, or one refused (``refused``). Not a
    failure of the node or of the store, which raise as themselves (to be tried again)."""

    def __init__(self, why: str, *, refused: bool) -> None:
        self.refused = refused
        super().__init__(why)


def _keeper(request: Request) -> BundleKeeper | None:
    keeper: BundleKeeper | None = getattr(request.app.state, "bundles", None)
    return keeper


def _pool(request: Request) -> KernelPool:
    pool: KernelPool = request.app.state.pool
    return pool


@router.post("/restores")
async def restore(request: Request, body: RestoreSession) -> Restored:
    keeper = _keeper(request)
    if keeper is None:
        return Restored(missing="this node has no bundle store (REPLGATE_BUNDLE_STORE)")
    held = _pool(request).sessions.get(body.session_id)
    if held is not None:  # restored already, for another gateway asking at the same time
        return Restored(state=held.state())
    try:
        session = await keeper.restore(
            body.tenant, body.session_id, profile=body.profile, env=body.env,
            metadata=body.metadata, created_at=body.created_at,
            execution_count=body.execution_count, lost=body.lost)
    except BundleNotFound as exc:
        return Restored(missing=str(exc))
    except BundleCorrupt as exc:
        return Restored(refused=str(exc))
    return Restored(state=session.state())


@router.post("/sessions/{session_id}/keep")
async def keep(request: Request, session_id: str) -> SessionState:
    keeper = _keeper(request)
    if keeper is None:
        raise SnapshotError("this node has no bundle store (REPLGATE_BUNDLE_STORE) to keep "
                            "paused sessions in")
    session = _pool(request).get_session(session_id)
    await keeper.keep_paused(session)
    if not keeper.kept(session_id):
        raise SnapshotError(session.reason or "the session's bundle was not written")
    return session.state()


@router.post("/sessions/{session_id}/moved", status_code=204)
async def moved(request: Request, session_id: str) -> None:
    await _pool(request).delete_session(session_id, reason=MOVED)


# -- the gateway's side ---------------------------------------------------------------------

async def restore_on(client: NodeClient, request: RestoreSession) -> Restored:
    """Ask the node of ``client`` to restore a session from its bundle."""
    restored: Restored = await client.call(
        "POST", "/restores", Restored, session_id=request.session_id, timeout=MOVING_TIMEOUT,
        content=request.model_dump_json(), headers={"content-type": "application/json"})
    return restored


async def keep_on(client: NodeClient, session_id: str) -> SessionState:
    """Pause a session of the node of ``client`` into the bundle store."""
    state: SessionState = await client.call("POST", f"/sessions/{session_id}/keep",
                                            SessionState, session_id=session_id,
                                            timeout=MOVING_TIMEOUT)
    return state


async def moved_from(client: NodeClient, session_id: str) -> None:
    """Tell the node of ``client`` that its copy of a session runs elsewhere now."""
    await client.call("POST", f"/sessions/{session_id}/moved", session_id=session_id)
