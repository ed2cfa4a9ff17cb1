"""Egress for allowlist profiles: a filtering HTTP proxy per sandbox, on a Unix socket.

A sandbox stays ``--network none``: it has no route and no DNS. For a profile with
``egress_allow``, the gateway process serves an HTTP proxy on ``<socket_dir>/egress.sock``
(``/kernel/egress.sock`` inside the container); the kernel launcher forwards the container's own
``127.0.0.1:3128`` to it and sets ``HTTP_PROXY``/``HTTPS_PROXY``. A connection that arrives on
a sandbox's socket is that sandbox's, so every attempt is attributed to its sandbox and session
without trusting anything the sandbox says.

The proxy speaks ``CONNECT host:port`` (HTTPS and other TLS) and absolute-form plain HTTP
(``GET http://host/path``). It lets through only hosts on the list (exact names, ``*.`` wildcards,
IP literals; an entry without a port allows 80 and 443), resolves names itself, refuses raw IP
addresses that are not listed, and refuses a name that resolves to a link-local, metadata,
loopback, unspecified or multicast address unless that address is listed literally (DNS tricks
aimed at the cloud metadata service or the gateway host). Everything else gets a 403 naming the
reason; every attempt, allowed or not, is logged and kept (bounded) on :attr:`EgressProxy.attempts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from opentelemetry import trace
from pydantic import BaseModel

from kernel_pool._allowlist import EgressRules, parse_port, split_host_port
from kernel_pool._broker import Broker, SecretLookup, copy_stream
from kernel_pool._broker_rules import SecretRule
from kernel_pool._network import NetworkRules
from kernel_pool._sandbox_ca import SandboxCA

logger = logging.getLogger(__name__)

SOCKET_NAME = "egress.sock"
HEAD_LIMIT = 16 * 1024
HEAD_TIMEOUT_S = 15.0
CONNECT_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 300.0
MAX_CONNECTIONS = 64
ATTEMPTS_KEPT = 200
CHUNK = 64 * 1024

_tracer = trace.get_tracer("replgate.egress")

_HOP_HEADERS = {"proxy-connection", "proxy-authorization", "connection", "keep-alive", "te",
                "trailer", "upgrade"}


class EgressAttempt(BaseModel):
    """One connection attempt through a sandbox's proxy."""

    time: str
    sandbox_id: str
    session_id: str | None
    method: str
    host: str
    port: int | None
    allowed: bool
    reason: str
    """Which entry allowed it, or why it was refused."""
    address: str | None = None
    """The address connected to (the proxy's own resolution)."""


class EgressProxy:
    """The proxy of one sandbox, listening on a Unix socket in the sandbox's socket folder."""

    def __init__(self, socket_path: Path, allow: Sequence[str] | EgressRules | NetworkRules,
                 sandbox_id: str, *, owner_uid: int | None = None,
                 owner_gid: int | None = None) -> None:
        self.socket_path = socket_path
        self.rules = allow if isinstance(allow, EgressRules | NetworkRules) else EgressRules(allow)
        """What decides each attempt: a profile's allowlist, or a session's policy within its
        profile's bound. Replaced on a live proxy, it decides every later attempt."""
        self.sandbox_id = sandbox_id
        self.session_id: str | None = None
        """Set when the sandbox is handed to a session (log lines and attempts carry it)."""
        self._owner = (owner_uid, owner_gid)
        self._server: asyncio.Server | None = None
        self._inode: int | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._attempts: deque[EgressAttempt] = deque(maxlen=ATTEMPTS_KEPT)
        self.broker: Broker | None = None
        """The session's secret rules, when it has any (HTTPS to their hosts is terminated)."""
        self._ca: SandboxCA | None = None

    def __repr__(self) -> str:
        state = "serving" if self._server else "stopped"
        return f"<EgressProxy {self.sandbox_id} {state} {len(self._handlers)} open, {self.rules}>"

    @property
    def attempts(self) -> list[EgressAttempt]:
        """The latest attempts (at most ``ATTEMPTS_KEPT``), oldest first."""
        return list(self._attempts)

    async def set_broker(self, rules: Sequence[SecretRule], lookup: SecretLookup, *,
                         upstream_cafile: Path | None = None,
                         ca: SandboxCA | None = None) -> None:
        """Put secrets into the requests ``rules`` match (none: stop); the sandbox's CA is made
        on first use and its bundle placed beside the socket (``/kernel/egress-ca.pem``, the
        file :data:`kernel_pool._sandbox_ca.TRUST_ENV` names), unless ``ca`` was made and
        its bundle placed ahead. Applies to new connections."""
        if not rules:
            self.broker = None
            return
        if self._ca is None and ca is not None:
            self._ca = ca
        if self._ca is None:
            ca = await asyncio.to_thread(SandboxCA, self.sandbox_id)
            await asyncio.to_thread(ca.write_bundle, self.socket_path.parent, self._owner)
            self._ca = ca
        self.broker = Broker(rules, lookup, self._ca, upstream_cafile=upstream_cafile)
        logger.info("egress broker for sandbox %s: %r", self.sandbox_id, self.broker)

    # -- lifecycle ---------------------------------------------------------------------------

    def _bound(self) -> bool:
        try:
            return self._server is not None and os.stat(self.socket_path).st_ino == self._inode
        except OSError:
            return False

    async def ensure(self) -> None:
        """Serve on the socket; idempotent, and re-binds if the socket file went away.

        The socket folder is writable by the sandbox, which could swap a symlink in at any
        moment; so the socket is bound, owned and chmod-ed in a private folder beside it (the
        gateway's alone) and then renamed into place, and no path in the sandbox's folder is
        ever followed.
        """
        if self._bound():
            return
        await self._stop_server()
        private = self.socket_path.parent.with_name(f".{self.socket_path.parent.name}.egress")
        private.mkdir(mode=0o700, exist_ok=True)
        staged = private / SOCKET_NAME
        staged.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._handle, path=str(staged),
                                                       limit=HEAD_LIMIT)
        try:
            uid, gid = self._owner
            if uid is not None and os.geteuid() == 0:
                os.chown(staged, uid, gid if gid is not None else -1)
                os.chmod(staged, 0o600)
            else:
                os.chmod(staged, 0o666)
            self._inode = os.stat(staged).st_ino
            os.rename(staged, self.socket_path)
        except BaseException:
            await self._stop_server()
            raise
        finally:
            staged.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                private.rmdir()
        logger.info("egress proxy for sandbox %s on %s: %s", self.sandbox_id, self.socket_path,
                    self.rules)

    async def _stop_server(self, drop_connections: bool = False) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if drop_connections:
            # Before the server's wait: that waits for its connections to end, and one the
            # sandbox keeps alive (the broker's keep-alive) would hold a close for minutes.
            for task in list(self._handlers):
                task.cancel()
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def close(self) -> None:
        """Stop listening and drop every open connection."""
        await self._stop_server(drop_connections=True)
        for task in list(self._handlers):
            with contextlib.suppress(BaseException):
                await task
        if self._inode is not None:
            with contextlib.suppress(OSError):
                if os.stat(self.socket_path).st_ino == self._inode:
                    self.socket_path.unlink()
        self._inode = None
        if self._ca is not None:
            self._ca.close()

    # -- one connection ----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            if len(self._handlers) > MAX_CONNECTIONS:
                await _answer(writer, 503, f"more than {MAX_CONNECTIONS} open connections")
                return
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Closing: a TLS connection the broker terminated would otherwise wait up to 30 s
            # for the sandbox's goodbye, which a client holding it open never sends.
            writer.transport.abort()
            raise
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.LimitOverrunError, ValueError):
            await _answer(writer, 431, "request head too large")
            return
        except TimeoutError:
            await _answer(writer, 408, "no request head in time")
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _answer(writer, 400, "not an HTTP/1.x proxy request")
            return
        method, target, version = parts
        try:
            host, port, path = _target(method, target)
        except ValueError as exc:
            self._log(method, target, None, False, str(exc))
            await _answer(writer, 400, str(exc))
            return
        address, reason = await self.rules.decide(host, port)
        self._log(method, host, port, address is not None, reason, address)
        if address is None:
            await _answer(writer, 403, f"replgate egress refused {host}:{port}: {reason}")
            return
        broker = self.broker
        if method == "CONNECT" and broker is not None and broker.covers(host, port):
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await broker.serve(reader, writer, host, port, address, self._log)
            return
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                up_reader, up_writer = await asyncio.open_connection(address, port, limit=CHUNK)
        except (OSError, TimeoutError) as exc:
            await _answer(writer, 502, f"replgate egress could not reach {host}:{port}: "
                                       f"{exc or 'timed out'}")
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_writer.write(_origin_head(method, path, version, lines[1:], host, port))
            await writer.drain()
            await _pipe(reader, writer, up_reader, up_writer)
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await up_writer.wait_closed()

    def _log(self, method: str, host: str, port: int | None, allowed: bool, reason: str,
             address: str | None = None) -> None:
        attempt = EgressAttempt(time=datetime.now(UTC).isoformat(), sandbox_id=self.sandbox_id,
                                session_id=self.session_id, method=method, host=host[:300],
                                port=port, allowed=allowed, reason=reason, address=address)
        self._attempts.append(attempt)
        # One span per decision (a no-op unless the process exports traces): ids, host, port
        # and the verdict; never a path, header or body.
        _tracer.start_span("replgate.egress", attributes={
            "replgate.sandbox.id": self.sandbox_id, "replgate.session.id": self.session_id or "",
            "replgate.egress.method": method[:16], "replgate.egress.host": attempt.host,
            "replgate.egress.port": port or 0, "replgate.egress.allowed": allowed,
            "replgate.egress.reason": reason[:300]}).end()
        logger.info("egress sandbox=%s session=%s %s %s:%s %s: %s", self.sandbox_id,
                    self.session_id or "-", method[:16], attempt.host, port,
                    "allowed" if allowed else "refused", reason)


def _target(method: str, target: str) -> tuple[str, int, str]:
    """(host, port, origin-form path) of a proxy request; ValueError when malformed."""
    if method == "CONNECT":
        host, port_text = split_host_port(target)
        if not host or port_text is None:
            raise ValueError(f"CONNECT needs host:port, got {target[:100]!r}")
        return host, parse_port(port_text, "CONNECT"), ""
    if not target.lower().startswith("http://"):
        raise ValueError("send absolute-form http:// requests, or CONNECT for https")
    url = urlsplit(target)
    try:
        port = url.port or 80
    except ValueError:
        raise ValueError(f"bad port in {target[:100]!r}") from None
    if not url.hostname:
        raise ValueError(f"no host in {target[:100]!r}")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    return url.hostname, port, path


def _origin_head(method: str, path: str, version: str, header_lines: list[str], host: str,
                 port: int) -> bytes:
    """The request head as the origin server gets it: origin-form, no proxy headers, close."""
    kept = [line for line in header_lines
            if line and line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS]
    if not any(line.split(":", 1)[0].strip().lower() == "host" for line in kept):
        kept.append(f"Host: {host}" + ("" if port == 80 else f":{port}"))
    lines = [f"{method} {path} {version}", *kept, "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
    await asyncio.gather(copy_stream(reader, up_writer), copy_stream(up_reader, writer))


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    phrases = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout",
               431: "Request Header Fields Too Large", 502: "Bad Gateway",
               503: "Service Unavailable"}
    body = (reason + "\n").encode("utf-8", "replace")
    writer.write(f"HTTP/1.1 {status} {phrases.get(status, 'Error')}\r\n"
                 f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
                 f"X-Replgate-Egress: refused\r\nConnection: close\r\n\r\n".encode() + body)
    with contextlib.suppress(OSError):
        await writer.drain()
