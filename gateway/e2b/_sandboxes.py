"""E2B's view of replgate sessions: access tokens, lifetimes and descriptions.

Each E2B sandbox is one replgate session with the same id. Its envd access token is derived
from the id with a key kept in the state directory (HMAC-SHA256), so it needs no storage and
stays valid when the gateway restarts and takes its sessions back. The E2B timeout (the
sandbox's end) is a time in the database (``e2b_sandboxes``); at that time the session is
deleted, as E2B kills a sandbox at its end, by whichever gateway sharing the database claims the
end first (so a sandbox ends on time after the gateway that made it is gone, or restarted); or
paused, when its create asked for that (:mod:`gateway.e2b._lifecycle`, kept beside the end).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import math
import os
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio.to_thread

from common.store import stored_time
from gateway.e2b._errors import E2BError
from gateway.e2b._lifecycle import SandboxPolicy, pause_at_timeout
from gateway.e2b._models import ListedSandbox, SandboxDetail, SandboxOut
from gateway.e2b._network import described
from gateway.service import Gateway
from kernel_pool import KernelPoolError, SessionNotFound, SessionPort, SessionStatus, parse_size

logger = logging.getLogger(__name__)

KEY_FILE = "e2b_token_key"
TOKEN_PREFIX = "rgt_"
REAP_POLL_S = 1.0
"""On a shared database: how often a gateway looks for sandboxes' ends set through others."""
CLAIM_S = 30.0
"""A gateway that claimed a sandbox's end and did not end it leaves it to be tried again after
this (it went away, or the session's node did not answer)."""


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
        self.store = gateway.store
        self._key: bytes | None = None
        self._wake = asyncio.Event()
        self._reaper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        gateway.pool.on_session_closed.append(lambda session, _reason: self._forget(session.id))

    async def start(self) -> None:
        """Read (or make) the token key and start ending sandboxes at their timeout; call once
        before the first request is served."""
        self._key = await anyio.to_thread.run_sync(_load_key, self.gateway.settings.state_dir)
        self._reaper = asyncio.create_task(self._reap_forever(), name="e2b-reaper")

    async def close(self) -> None:
        """Stop ending sandboxes (the gateway is stopping; another, or this one started
        again, ends them)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper

    # -- tokens ------------------------------------------------------------------------------

    def token(self, session_id: str) -> str:
        """The sandbox's envd access token (also its traffic token): its id, so that a request
        without the ``E2b-Sandbox-Id`` header still names it (E2B's JS SDK before 2.15 sends
        envd's HTTP calls, ``/files`` and ``/health``, without it), and the id's MAC."""
        return f"{TOKEN_PREFIX}{session_id}.{self._mac(session_id)}"

    def _mac(self, session_id: str) -> str:
        assert self._key is not None, "Sandboxes.start() was not awaited"
        digest = hmac.new(self._key, session_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def sign(self, text: str) -> str:
        """A MAC of ``text`` with the E2B face's key (template upload URLs)."""
        return self._mac(text)

    @staticmethod
    def named_by(token: str | None) -> str | None:
        """The sandbox id a token names (unchecked: :meth:`owner` checks it)."""
        if not token or not token.startswith(TOKEN_PREFIX):
            return None
        session_id, dot, _ = token.removeprefix(TOKEN_PREFIX).rpartition(".")
        return session_id if dot and session_id else None

    async def owner(self, session_id: str, token: str | None) -> str:
        """The tenant of the session ``token`` opens; 401 for a wrong token, and E2B's 502
        "was not found" (what its proxy answers) for a sandbox that does not exist."""
        tenant = await self.gateway.owner(session_id)
        if tenant is None:
            raise E2BError(502, f"The sandbox {session_id} was not found")
        # Tokens given before they named their sandbox were the MAC alone.
        if not token or not any(hmac.compare_digest(token, good) for good in (
                self.token(session_id), TOKEN_PREFIX + self._mac(session_id))):
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

    async def set_timeout(self, tenant: str, session: SessionPort, seconds: int) -> None:
        """The sandbox ends (is deleted) ``seconds`` from now, as E2B's timeout does."""
        self.check_timeout(seconds)
        await self.store.set_sandbox_end(session.id, tenant, _in(seconds))
        self._wake.set()

    async def extend(self, tenant: str, session: SessionPort, seconds: int) -> None:
        """Connect's rule: the sandbox ends ``seconds`` from now unless it already ends later
        (a sandbox with no end, paused by its SDK or made before it had one, gets one)."""
        await self.store.set_sandbox_end(session.id, tenant, _in(seconds), later_only=True)
        self._wake.set()

    async def paused(self, tenant: str, session: SessionPort) -> None:
        """The SDK paused the sandbox: it does not end, as on E2B (until a connect resumes it
        with a new timeout), and it is not running until then."""
        await self.store.set_sandbox_end(session.id, tenant, None)

    async def held(self, session: SessionPort) -> bool:
        """Paused by the SDK (through any gateway) and not resumed by a connect since: E2B's
        proxy answers such a sandbox as not running. (A session replgate paused for idleness,
        or that running code resumed, is running for E2B's purposes: its next use resumes it,
        as E2B's auto-resume does.)"""
        if session.state().status is not SessionStatus.PAUSED:
            return False
        ends = await self.store.sandbox_ends([session.id])
        return session.id in ends and ends[session.id] is None

    async def set_lifecycle(self, tenant: str, session: SessionPort,
                            policy: SandboxPolicy) -> None:
        """Keep what the sandbox's create asked of its end (before its end is first set, so
        no gateway reaches the end without it)."""
        await self.store.set_sandbox_lifecycle(session.id, tenant, policy.model_dump_json())

    async def policy(self, session_id: str) -> SandboxPolicy:
        """The sandbox's lifecycle (E2B's defaults for one made without)."""
        _, stored = (await self.store.sandbox_lifecycles([session_id])).get(
            session_id, (None, None))
        return SandboxPolicy.stored(stored)

    async def traffic(self, tenant: str, session: SessionPort) -> None:
        """A request reached the sandbox's ports: one paused by its SDK or its timeout, whose
        create turned ``autoResume`` on, is resumed and ends its create's timeout from now,
        as E2B's auto-resume does. (Only a paused session costs the database a look.)"""
        if session.state().status is not SessionStatus.PAUSED:
            return
        end, stored = (await self.store.sandbox_lifecycles([session.id])).get(
            session.id, (None, None))
        policy = SandboxPolicy.stored(stored)
        if stored is None or end is not None or not policy.auto_resume:
            return
        logger.info("E2B sandbox %s resumed by a request to it (autoResume)", session.id)
        await self.gateway.resume(tenant, session.id)
        await self.set_timeout(tenant, session, policy.timeout_s)

    def _forget(self, session_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._drop(session_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drop(self, session_id: str) -> None:
        try:
            await self.store.drop_sandbox(session_id)
        except Exception as exc:  # its end comes, finds no session, and is dropped then
            logger.warning("E2B sandbox %s: its end not forgotten: %s", session_id, exc)

    async def _reap_forever(self) -> None:
        """End each sandbox at its end: at the earliest end recorded (a new one wakes it);
        on a shared database at least every :data:`REAP_POLL_S` too, for ends set through
        other gateways. Whichever gateway claims an end first ends that sandbox."""
        while True:
            self._wake.clear()
            delay = REAP_POLL_S
            try:
                await self._reap()
                upcoming = await self.store.next_sandbox_end()
                if upcoming is None:
                    delay = math.inf
                else:
                    delay = max(0.0, (datetime.fromisoformat(upcoming)
                                      - datetime.now(UTC)).total_seconds())
            except Exception as exc:  # the database away a moment: tried again
                logger.warning("E2B sandboxes' ends not read: %s", exc)
            if self.store.database.shared:
                delay = min(delay, REAP_POLL_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(),
                                       None if delay == math.inf else delay)

    async def _reap(self) -> None:
        now = datetime.now(UTC)
        due = await self.store.due_sandboxes(stored_time(now))
        retry = stored_time(now + timedelta(seconds=CLAIM_S))
        await asyncio.gather(*(self._end(session_id, tenant, end, retry)
                               for session_id, tenant, end in due))

    async def _end(self, session_id: str, tenant: str, end: str, retry: str) -> None:
        if not await self.store.claim_sandbox(session_id, end, retry):
            return  # another gateway ends it, or its end moved
        policy = await self.policy(session_id)
        logger.info("E2B sandbox %s reached its timeout; %s", session_id,
                    "pausing it" if policy.on_timeout == "pause" else "deleting it")
        try:
            if policy.on_timeout == "pause":
                # Paused by its end: no end until a connect (or its traffic) resumes it. Set
                # first, so that it reads as paused by its end as soon as it reads paused (a
                # gateway gone mid-pause leaves it running to replgate's maximum lifetime).
                await self.store.set_sandbox_end(session_id, tenant, None)
                await pause_at_timeout(self.gateway, tenant, session_id, policy)
                return
            await self.gateway.delete_session(tenant, session_id)
        except SessionNotFound:
            pass  # gone already
        except KernelPoolError as exc:
            logger.warning("E2B sandbox %s not ended yet (tried again at %s): %s",
                           session_id, retry, exc)
            if policy.on_timeout == "pause":
                await self.store.set_sandbox_end(session_id, tenant, retry)
            return
        await self.store.drop_sandbox(session_id)

    async def _ends(self, sessions: list[SessionPort]) -> dict[str, datetime]:
        recorded = await self.store.sandbox_ends([s.id for s in sessions])
        lifetime = timedelta(seconds=self.gateway.settings.pool.max_lifetime_s)
        ends = {}
        for session in sessions:
            end = recorded.get(session.id)
            # No end (paused by its SDK, or made before E2B knew it): replgate's maximum
            # lifetime ends it.
            ends[session.id] = (datetime.fromisoformat(end) if end is not None
                                else datetime.fromisoformat(session.state().created_at)
                                + lifetime)
        return ends

    # -- descriptions ------------------------------------------------------------------------

    def created(self, session: SessionPort) -> SandboxOut:
        token = self.token(session.id)
        internet, network = described(session)
        return SandboxOut(templateID=session.profile.name, sandboxID=session.id,
                          alias=session.profile.name, envdAccessToken=token,
                          trafficAccessToken=token, domain=self.gateway.settings.e2b_domain,
                          allowInternetAccess=internet, network=network)

    async def listed(self, sessions: list[SessionPort]) -> list[ListedSandbox]:
        """The sandboxes as ``Sandbox.list()`` describes them (their ends read at once)."""
        ends = await self._ends(sessions)
        return [self._listed(session, ends[session.id]) for session in sessions]

    def _listed(self, session: SessionPort, end: datetime) -> ListedSandbox:
        profile = session.profile
        state = session.state()
        return ListedSandbox(
            templateID=profile.name, sandboxID=session.id, alias=profile.name,
            startedAt=state.created_at, endAt=end.isoformat(),
            cpuCount=max(1, round(profile.cpus)), memoryMB=parse_size(profile.memory) >> 20,
            diskSizeMB=parse_size(profile.workspace_size) >> 20,
            state="paused" if state.status.value == "paused" else "running",
            metadata=state.metadata)

    async def detail(self, session: SessionPort) -> SandboxDetail:
        (listed,) = await self.listed([session])
        policy = await self.policy(session.id)
        internet, network = described(session)
        return SandboxDetail(**listed.model_dump(), envdAccessToken=self.token(session.id),
                             domain=self.gateway.settings.e2b_domain, network=network,
                             allowInternetAccess=internet, lifecycle=policy.described())




def _in(seconds: float) -> str:
    return stored_time(datetime.now(UTC) + timedelta(seconds=seconds))
