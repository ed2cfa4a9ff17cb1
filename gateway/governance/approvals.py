"""Human approval: executions held until a person with an approver key decides, or expiry.

An approver key (``REPLGATE_APPROVER_KEYS=tenant:name:key,...``) belongs to one tenant and acts
only on that tenant's executions. Approvals live in memory: a gateway restart ends every wait
(the held executions end with the gateway, recorded as interrupted).
"""

from __future__ import annotations

import asyncio
import hmac
import re
import uuid
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from gateway.auth import hash_api_key
from gateway.errors import Conflict, Forbidden, NotFound
from gateway.wire import Approval, ApprovalStatus

__all__ = [
    "Approval",
    "ApprovalBook",
    "ApprovalDecided",
    "ApprovalNotFound",
    "Approver",
    "ApproverKeys",
    "Forbidden",
    "parse_approver_keys",
]

DECIDED_KEPT = 1000
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # as REPLGATE_API_KEYS' tenants

class ApprovalNotFound(NotFound):
    """No approval of that id for this tenant."""


class ApprovalDecided(Conflict):
    """The approval is no longer pending."""


class Approver(BaseModel):
    tenant: str
    name: str


def parse_approver_keys(value: str | None) -> list[tuple[Approver, str]]:
    """``tenant:name:key,...`` -> [(approver, key)]; ValueError names the entry (never the key)."""
    found: list[tuple[Approver, str]] = []
    if not value or not value.strip():
        return found
    for position, raw in enumerate(value.split(","), start=1):
        where = f"REPLGATE_APPROVER_KEYS entry {position}"
        parts = raw.strip().split(":", 2)
        if len(parts) != 3:
            raise ValueError(f"{where}: write it as tenant:name:key")
        tenant, name, key = parts
        if not _TENANT.fullmatch(tenant.strip()):
            raise ValueError(f"{where}: invalid tenant {tenant.strip()!r}: use 1 to 64 letters, "
                             "digits, '.', '_' or '-', starting with a letter or digit")
        if not _NAME.fullmatch(name.strip()):
            raise ValueError(f"{where}: the approver name {name.strip()!r} must be 1 to 64 "
                             "letters, digits or '._@+-'")
        key = key.strip()
        if len(key) < 16 or any(ch.isspace() for ch in key):
            raise ValueError(f"{where}: the key must be at least 16 characters, no spaces")
        found.append((Approver(tenant=tenant.strip(), name=name.strip()), key))
    keys = [key for _, key in found]
    if len(set(keys)) != len(keys):
        raise ValueError("REPLGATE_APPROVER_KEYS gives one key to two approvers")
    return found


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
    """Pending approvals (with their waiters) and the latest decided ones, per tenant."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._pending: dict[str, tuple[Approval, asyncio.Future[None]]] = {}
        self._decided: OrderedDict[str, Approval] = OrderedDict()

    def __repr__(self) -> str:
        return f"<ApprovalBook {len(self._pending)} pending, {len(self._decided)} decided>"

    def open(self, *, tenant: str, session_id: str, execution_id: str, code: str,
             rules: list[dict[str, Any]]) -> Approval:
        now = _now()
        approval = Approval(
            approval_id=uuid.uuid4().hex, tenant=tenant, session_id=session_id,
            execution_id=execution_id, code=code, rules=rules, created_at=now.isoformat(),
            expires_at=(now + timedelta(seconds=self.timeout_s)).isoformat())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[approval.approval_id] = (approval, future)
        return approval

    async def wait(self, approval: Approval) -> Approval:
        """Until decided or expired; a cancelled wait withdraws the approval."""
        _, future = self._pending[approval.approval_id]
        try:
            await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            self._close(approval, "expired", None, None)
        except BaseException:
            self._close(approval, "withdrawn", None, None)
            raise
        return approval

    def _close(self, approval: Approval, status: ApprovalStatus, by: str | None,
               comment: str | None) -> None:
        entry = self._pending.pop(approval.approval_id, None)
        if entry is None:
            return
        approval.status = status
        approval.decided_by = by
        approval.decided_at = _now().isoformat()
        approval.comment = comment
        self._decided[approval.approval_id] = approval
        while len(self._decided) > DECIDED_KEPT:
            self._decided.popitem(last=False)
        if not entry[1].done():
            entry[1].set_result(None)

    def get(self, approval_id: str, tenant: str) -> Approval:
        """The tenant's approval, pending or decided; another tenant's is as absent."""
        entry = self._pending.get(approval_id)
        approval = entry[0] if entry else self._decided.get(approval_id)
        if approval is None or approval.tenant != tenant:
            raise ApprovalNotFound(f"approval {approval_id} not found")
        return approval

    def pending(self, tenant: str) -> list[Approval]:
        return sorted((a for a, _ in self._pending.values() if a.tenant == tenant),
                      key=lambda a: a.created_at)

    def decide(self, approval_id: str, approver: Approver, approve: bool,
               comment: str | None) -> Approval:
        approval = self.get(approval_id, approver.tenant)
        if approval.status != "pending":
            raise ApprovalDecided(f"approval {approval_id} is already {approval.status}")
        self._close(approval, "approved" if approve else "rejected", approver.name, comment)
        return approval
