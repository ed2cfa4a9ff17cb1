"""Human approval: executions held until a person with an approver key decides, or expiry.

An approver key (``REPLGATE_APPROVER_KEYS=tenant:name:key,...``) belongs to one tenant and acts
only on that tenant's executions. Approvals live in the database, so that any gateway lists and
decides them; the wait of a held execution lives in the gateway that holds it, and ends with it
(the held execution ends with that gateway, recorded as interrupted; its approval, left pending,
shows as expired once its time is up).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from common.keys import Approver, hash_api_key
from common.store import stored_time
from gateway.errors import DATABASE_AWAY, Conflict, Forbidden, NotFound
from gateway.store import Store
from gateway.wire import Approval, ApprovalStatus

__all__ = [
    "Approval",
    "ApprovalBook",
    "ApprovalDecided",
    "ApprovalNotFound",
    "ApproverKeys",
    "Forbidden",
]

logger = logging.getLogger(__name__)

POLL_S = 0.25
"""How often a gateway holding approvals asks a shared database which were decided."""


class ApprovalNotFound(NotFound):
    """No approval of that id for this tenant."""


class ApprovalDecided(Conflict):
    """The approval is no longer pending."""


class ApproverKeys:
    """The approver keys, kept hashed and compared in constant time."""

    def __init__(self, entries: list[tuple[Approver, str]]) -> None:
        self._hashes = [(hash_api_key(key), approver) for approver, key in entries]

    def __len__(self) -> int:
        return len(self._hashes)

    def find(self, token: str | None) -> Approver | None:
        if not token:
            return None
        candidate = hash_api_key(token)
        found = None
        for digest, approver in self._hashes:
            if hmac.compare_digest(candidate, digest):
                found = approver
        return found


def _now() -> datetime:
    return datetime.now(UTC)


class ApprovalBook:
    """Approvals in the database (any gateway lists and decides them) and the waits of the
    executions this gateway holds.

    A decision made through this gateway wakes its held execution at once. One made through
    another gateway is seen by a poll: while this gateway holds any, it asks the database every
    :data:`POLL_S` which of them were decided (PostgreSQL only; on SQLite this gateway is the
    only one). A poll rather than LISTEN/NOTIFY: a person's decision does not need better than
    a quarter of a second, a poll needs no connection of its own kept open, and it misses
    nothing across a database restart, where a notification sent meanwhile would be lost.
    """

    def __init__(self, store: Store, timeout_s: float) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self._held: dict[str, tuple[Approval, asyncio.Future[None]]] = {}
        self._polling: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<ApprovalBook {len(self._held)} held here>"

    async def open(self, *, tenant: str, session_id: str, execution_id: str, code: str,
                   rules: list[dict[str, Any]]) -> Approval:
        """Record a new pending approval, held by this gateway until :meth:`wait` ends."""
        now = _now()
        approval = Approval(
            approval_id=uuid.uuid4().hex, tenant=tenant, session_id=session_id,
            execution_id=execution_id, code=code, rules=rules, created_at=stored_time(now),
            expires_at=stored_time(now + timedelta(seconds=self.timeout_s)))
        await self.store.add_approval(approval)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held[approval.approval_id] = (approval, future)
        if self.store.database.shared and (self._polling is None or self._polling.done()):
            self._polling = asyncio.create_task(self._poll(), name="approvals-poll")
        return approval

    async def wait(self, approval: Approval) -> Approval:
        """Until decided (here or through another gateway) or expired; a cancelled wait
        withdraws the approval. ``approval`` then tells what became of it."""
        _, future = self._held[approval.approval_id]
        try:
            await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            await self._close(approval, "expired")
        except BaseException:
            # Recorded before the withdrawn execution's end is told: a client told
            # "interrupted" no longer finds it pending.
            withdrawing = asyncio.ensure_future(self._close(approval, "withdrawn"))
            with contextlib.suppress(Exception):
                await asyncio.shield(withdrawing)
            raise
        finally:
            self._held.pop(approval.approval_id, None)
        return approval

    async def _close(self, approval: Approval, status: ApprovalStatus) -> None:
        """End a wait as expired or withdrawn, unless a decision was recorded first (then
        that decision stands)."""
        closed = await self.store.close_approval(approval.approval_id, status, stored_time(_now()))
        if closed is None:
            closed = await self.store.get_approval(approval.approval_id)
        if closed is not None:
            self._settle(closed)

    def _settle(self, decided: Approval) -> None:
        """A decision reached this gateway: its held execution (if here) learns it."""
        entry = self._held.get(decided.approval_id)
        if entry is None:
            return
        approval, future = entry
        approval.status = decided.status
        approval.decided_by = decided.decided_by
        approval.decided_at = decided.decided_at
        approval.comment = decided.comment
        if not future.done():
            future.set_result(None)

    async def _poll(self) -> None:
        while self._held:
            await asyncio.sleep(POLL_S)
            try:
                decided = await self.store.decided_approvals(list(self._held))
            except DATABASE_AWAY as exc:  # away a moment: polled again next time
                logger.warning("approvals not polled: %s", type(exc).__name__)
                continue
            for approval in decided:
                self._settle(approval)

    async def get(self, approval_id: str, tenant: str) -> Approval:
        """The tenant's approval, pending or decided; another tenant's is as absent. One left
        pending past its expiry (its gateway went away) shows as expired."""
        held = self._held.get(approval_id)
        approval = held[0] if held else await self.store.get_approval(approval_id)
        if approval is None or approval.tenant != tenant:
            raise ApprovalNotFound(f"approval {approval_id} not found")
        if approval.status == "pending" and approval.expires_at <= stored_time(_now()):
            approval = approval.model_copy(update={"status": "expired"})
        return approval

    async def pending(self, tenant: str) -> list[Approval]:
        """The tenant's pending approvals, held by any gateway, oldest first."""
        return await self.store.pending_approvals(tenant, stored_time(_now()))

    async def decide(self, approval_id: str, approver: Approver, approve: bool,
                     comment: str | None) -> Approval:
        """Approve or reject a pending approval of the approver's tenant (404 for none,
        409 once it is decided, expired or withdrawn)."""
        decided = await self.store.close_approval(
            approval_id, "approved" if approve else "rejected", stored_time(_now()),
            by=approver.name, comment=comment, tenant=approver.tenant)
        if decided is None:
            current = await self.get(approval_id, approver.tenant)
            raise ApprovalDecided(f"approval {approval_id} is already {current.status}")
        self._settle(decided)
        return decided

    async def close(self) -> None:
        """Stop polling (the gateway is stopping)."""
        if self._polling is not None:
            self._polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._polling
