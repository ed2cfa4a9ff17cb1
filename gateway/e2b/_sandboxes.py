"""E2B's view of replgate sessions: access tokens, lifetimes and descriptions.

Each E2B sandbox is one replgate session with the same id. Its envd access token is derived
from the id with a key kept in the state directory (HMAC-SHA256), so it needs no storage and
stays valid when the gateway restarts and takes its sessions back. The E2B timeout (the
sandbox's end) is a timer per session that deletes it, as E2B kills a sandbox at its end; such
timers live in the gateway process, so after a restart a session lives by replgate's own idle
TTL and maximum lifetime until the next ``set_timeout`` or ``connect``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio.to_thread

from gateway.e2b._errors import E2BError
from gateway.e2b._models import ListedSandbox, SandboxDetail, SandboxOut
from gateway.service import Gateway
from kernel_pool import KernelPoolError, SessionPort, parse_size

logger = logging.getLogger(__name__)

KEY_FILE = "e2b_token_key"


def _load_key(state_dir: Path) -> bytes:
    path = state_dir / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


class Sandboxes:
    """Tokens, E2B lifetimes and descriptions of the gateway's sessions."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._key: bytes | None = None
        self._ends: dict[str, tuple[datetime, asyncio.TimerHandle]] = {}
        self._paused: set[str] = set()
        gateway.pool.on_session_closed.append(lambda session, _reason: self._forget(session.id))

    async def start(self) -> None:
        """Read (or make) the token key; call once before the first request is served."""
        self._key = await anyio.to_thread.run_sync(_load_key, self.gateway.settings.state_dir)

    # -- tokens ------------------------------------------------------------------------------

    def token(self, session_id: str) -> str:
        """The sandbox's envd access token (also its traffic token)."""
        assert self._key is not None, "Sandboxes.start() was not awaited"
        digest = hmac.new(self._key, session_id.encode(), hashlib.sha256).digest()
        return "rgt_" + base64.urlsafe_b64encode(digest).decode().rstrip("=")

    async def owner(self, session_id: str, token: str | None) -> str:
        """The tenant of the session ``token`` opens; 401 for a wrong token, and E2B's 502
        "was not found" (what its proxy answers) for a sandbox that does not exist."""
        tenant = await self.gateway.owner(session_id)
        if tenant is None:
            raise E2BError(502, f"The sandbox {session_id} was not found")
        if not token or not hmac.compare_digest(token, self.token(session_id)):
            raise E2BError(401, "missing or wrong access token for this sandbox: send the "
                                "envdAccessToken its create or connect answered as X-Access-Token")
        return tenant

    # -- lifetimes ---------------------------------------------------------------------------

    def check_timeout(self, seconds: int) -> None:
        """E2B's 400 for a sandbox timeout past replgate's maximum session lifetime."""
        limit = self.gateway.settings.pool.max_lifetime_s
        if seconds > limit:
            raise E2BError(400, f"timeout must be at most {limit:g} seconds "
                                "(REPLGATE_MAX_LIFETIME_S)")

    def set_timeout(self, tenant: str, session: SessionPort, seconds: int) -> None:
        """The sandbox ends (is deleted) ``seconds`` from now, as E2B's timeout does."""
        self.check_timeout(seconds)
        self._cancel_timer(session.id)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(seconds, self._expire, tenant, session.id)
        self._ends[session.id] = (datetime.now(UTC) + timedelta(seconds=seconds), timer)

    def extend(self, tenant: str, session: SessionPort, seconds: int) -> None:
        """Connect's rule: the sandbox ends ``seconds`` from now unless it already ends later
        (a sandbox with no timer, after a restart or a pause, gets one)."""
        ended = self._ends.get(session.id)
        if ended is None or ended[0] < datetime.now(UTC) + timedelta(seconds=seconds):
            self.set_timeout(tenant, session, seconds)

    def paused(self, session: SessionPort) -> None:
        """The SDK paused the sandbox: it does not expire, as on E2B (its timer is dropped
        until a connect resumes it with a new one), and it is not running until then."""
        self._cancel_timer(session.id)
        self._paused.add(session.id)

    def resumed(self, session: SessionPort) -> None:
        self._paused.discard(session.id)

    def held(self, session: SessionPort) -> bool:
        """Paused by the SDK and not resumed since: E2B's proxy answers such a sandbox as not
        running. (A session replgate paused for idleness, or that running code resumed, is
        running for E2B's purposes: its next use resumes it, as E2B's auto-resume does.)"""
        return session.paused and session.id in self._paused

    def _expire(self, tenant: str, session_id: str) -> None:
        self._ends.pop(session_id, None)
        logger.info("E2B sandbox %s reached its timeout; deleting it", session_id)
        task = asyncio.get_running_loop().create_task(self._delete(tenant, session_id))
        task.add_done_callback(lambda t: None if t.cancelled() else t.exception())

    async def _delete(self, tenant: str, session_id: str) -> None:
        with contextlib.suppress(KernelPoolError):
            await self.gateway.delete_session(tenant, session_id)

    def _forget(self, session_id: str) -> None:
        self._paused.discard(session_id)
        self._cancel_timer(session_id)

    def _cancel_timer(self, session_id: str) -> None:
        ended = self._ends.pop(session_id, None)
        if ended is not None:
            ended[1].cancel()

    def end_at(self, session: SessionPort) -> datetime:
        ended = self._ends.get(session.id)
        if ended is not None:
            return ended[0]
        created = datetime.fromisoformat(session.created_at)
        return created + timedelta(seconds=self.gateway.settings.pool.max_lifetime_s)

    # -- descriptions ------------------------------------------------------------------------

    def created(self, session: SessionPort) -> SandboxOut:
        token = self.token(session.id)
        return SandboxOut(templateID=session.profile.name, sandboxID=session.id,
                          alias=session.profile.name, envdAccessToken=token,
                          trafficAccessToken=token)

    def listed(self, session: SessionPort) -> ListedSandbox:
        profile = session.profile
        return ListedSandbox(
            templateID=profile.name, sandboxID=session.id, alias=profile.name,
            startedAt=session.created_at, endAt=self.end_at(session).isoformat(),
            cpuCount=max(1, round(profile.cpus)), memoryMB=parse_size(profile.memory) >> 20,
            diskSizeMB=parse_size(profile.workspace_size) >> 20,
            state="paused" if session.status.value == "paused" else "running",
            metadata=session.metadata)

    def detail(self, session: SessionPort) -> SandboxDetail:
        return SandboxDetail(**self.listed(session).model_dump(),
                             envdAccessToken=self.token(session.id))
