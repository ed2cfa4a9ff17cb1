"""The egress broker: HTTPS to a host with secret rules, terminated, and secrets put into the
requests the rules match (docs/secrets.md).

:class:`~kernel_pool._egress.EgressProxy` hands a ``CONNECT`` it allowed to the broker when a
rule covers its host and port. The broker answers the sandbox's TLS with a certificate from
the sandbox's own CA (:mod:`kernel_pool._sandbox_ca`), connects to the host with real TLS
verification (the system's CAs and ``upstream_cafile``), and relays HTTP/1.1 (h11) request by
request (a client that chose HTTP/2 in its TLS hello: :mod:`kernel_pool._broker_h2`, each
stream decided the same way and relayed to the host over HTTP/1.1): a request a rule matches
gets the rule's headers, and the placeholders of the secrets the rule names are replaced in its
headers; the others go unchanged. A secret a request needs
but that does not exist (deleted) refuses the request with 403 and a sentence, before anything
is sent. An accepted WebSocket upgrade (101) turns the connection into a byte pipe. Values are
asked of ``lookup`` at each request (a replaced secret applies to the next one) and never
logged: log lines and attempts name the secrets, not their values. A lookup that fails (on a
node: no gateway answered) refuses the request with 503: a value is never guessed nor kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import h11

from kernel_pool._allowlist import normal_host
from kernel_pool._broker_h2 import H2Relay
from kernel_pool._broker_rules import PLACEHOLDER, SecretRule, matching_rules, secret_names
from kernel_pool._sandbox_ca import SandboxCA

logger = logging.getLogger(__name__)

__all__ = ["Broker", "Refusal", "SecretLookup", "SecretSource", "no_secrets"]

SecretLookup = Callable[[str], Awaitable[str | None]]
"""A secret's value by name, or None when there is none; raises when it cannot be had now."""
SecretSource = Callable[[str, str | None], SecretLookup]
"""The lookup of a session's secrets, by (tenant, session id): the gateway's reads its
tenant's secrets, a node's asks a gateway for those the session's rules name."""

CHUNK = 64 * 1024
IDLE_TIMEOUT_S = 300.0
CONNECT_TIMEOUT_S = 10.0
MAX_HEAD = 64 * 1024

Note = Callable[[str, str, int, bool, str], None]
"""How the broker reports a request to the proxy's log: (method, host, port, allowed, why)."""


class Refusal(NamedTuple):
    """A request the broker does not send: the status and sentence the sandbox gets."""

    status: int
    sentence: str


async def no_secrets(name: str) -> str | None:
    """A lookup that finds none (a broker whose rules are being removed)."""
    return None


@functools.cache
def upstream_context(cafile: Path | None) -> ssl.SSLContext:
    """The TLS client context of the broker's own connections to the hosts (the system's CAs,
    and ``cafile``'s): made once per file, since loading the system's CAs takes milliseconds
    and a claim with secret rules would otherwise pay them."""
    context = ssl.create_default_context()
    if cafile is not None:
        context.load_verify_locations(cafile=str(cafile))
    context.set_alpn_protocols(["http/1.1"])
    return context


class Broker:
    """A sandbox's rules, its CA, and how to get a secret's value."""

    def __init__(self, rules: Sequence[SecretRule], lookup: SecretLookup, ca: SandboxCA, *,
                 upstream_cafile: Path | None = None) -> None:
        self.rules = list(rules)
        self.lookup = lookup
        self.ca = ca
        self._upstream = upstream_context(upstream_cafile)

    def __repr__(self) -> str:
        return f"<Broker {len(self.rules)} rules, secrets {sorted(secret_names(self.rules))}>"

    def covers(self, host: str, port: int) -> bool:
        """Whether HTTPS to ``host:port`` is terminated (a rule may match its requests)."""
        name = normal_host(host)
        return any(rule.covers(name, port) for rule in self.rules)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    host: str, port: int, address: str, note: Note) -> None:
        """Serve one ``CONNECT`` the proxy allowed and answered 200 to."""
        name = normal_host(host)
        await writer.start_tls(self.ca.server_context(name))
        tls = writer.get_extra_info("ssl_object")
        if tls is not None and tls.selected_alpn_protocol() == "h2":
            await H2Relay(self, name, port, address, note, reader, writer).run()
            return
        relay = _Relay(self, name, port, address, note, reader, writer)
        try:
            await relay.run()
        except h11.ProtocolError as exc:  # a request or an answer h11 cannot relay
            note("TLS", name, port, False, f"not relayed: {exc}")
        except asyncio.CancelledError:
            # The proxy is closing: TLS's goodbye would wait up to 30 s for the host's.
            relay.abort_upstream()
            raise
        finally:
            await relay.close_upstream()

    async def connect(self, host: str, port: int, address: str,
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the host with verified TLS (OSError, TimeoutError if none)."""
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            return await asyncio.open_connection(address, port, ssl=self._upstream,
                                                 server_hostname=host, limit=CHUNK)

    async def rewrite(self, host: str, port: int, method: str, target: str,
                      headers: list[tuple[bytes, bytes]],
                      ) -> tuple[list[tuple[bytes, bytes]], Refusal | None, str]:
        """(headers to send, refusal or None, what was done) for one request."""
        rules = matching_rules(self.rules, host, port, method, target)
        if not rules:
            return headers, None, "no rule matches: sent unchanged"
        allowed = secret_names(rules)
        values: dict[str, str] = {}
        used: set[str] = set()

        async def value(secret: str) -> str | Refusal:
            if secret not in values:
                try:
                    found = await self.lookup(secret)
                except Exception as exc:  # (names the secret, never a value)
                    logger.warning("secret %s for %s:%d could not be had: %s", secret, host,
                                   port, exc)
                    return Refusal(503, f"replgate egress refused the request: the secret "
                                        f"{secret!r} could not be had ({str(exc)[:300]}); "
                                        "nothing was sent")
                if found is None:
                    return Refusal(403, _missing(secret))
                values[secret] = found
            used.add(secret)
            return values[secret]

        out: list[tuple[bytes, bytes]] = []
        set_names = {n.lower().encode() for rule in rules for n in rule.headers}
        for key, raw in headers:
            if key in set_names:
                continue
            text = raw.decode("latin-1")
            for secret in {s for s in PLACEHOLDER.findall(text) if s in allowed}:
                found = await value(secret)
                if isinstance(found, Refusal):
                    return headers, found, _not_had(secret, found)
                text = text.replace(f"{{secret:{secret}}}", found)
            out.append((key, text.encode("latin-1")))
        for rule in rules:
            for header, template in rule.headers.items():
                text = template
                for secret in set(PLACEHOLDER.findall(template)):
                    found = await value(secret)
                    if isinstance(found, Refusal):
                        return headers, found, _not_had(secret, found)
                    text = text.replace(f"{{secret:{secret}}}", found)
                out = [(k, v) for k, v in out if k != header.lower().encode()]
                out.append((header.encode(), text.encode("latin-1")))
        done = (f"rule for {rules[0].host} matched"
                + (f": secrets {', '.join(sorted(used))} put in" if used else ": no secret used"))
        return out, None, done


def _not_had(secret: str, refusal: Refusal) -> str:
    return (f"secret {secret} is not set" if refusal.status == 403
            else f"secret {secret} could not be had")


def _missing(secret: str) -> str:
    return (f"replgate egress refused the request: it needs the secret {secret!r}, which "
            "does not exist (deleted, or never stored); nothing was sent")


class _Relay:
    """One terminated connection: requests from the sandbox, answers from the host."""

    def __init__(self, broker: Broker, host: str, port: int, address: str, note: Note,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.broker, self.host, self.port, self.address = broker, host, port, address
        self.note = note
        self.reader, self.writer = reader, writer
        self.up_reader: asyncio.StreamReader | None = None
        self.up_writer: asyncio.StreamWriter | None = None
        self.client = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.upstream = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)

    async def _upstream_ready(self) -> bool:
        """A connection to the host for the next request: the last one, unless the host
        closed it meanwhile (an idle keep-alive); False (the sandbox answered 502) if none."""
        if self.up_reader is not None and not self.up_reader.at_eof() \
                and self.upstream.our_state is h11.IDLE:
            return True
        await self.close_upstream()
        try:
            self.up_reader, self.up_writer = await self.broker.connect(
                self.host, self.port, self.address)
        except (OSError, TimeoutError) as exc:
            reason = f"replgate egress could not reach {self.host}:{self.port} over TLS: {exc}"
            self.note("TLS", self.host, self.port, False, reason)
            await _refuse(self.writer, 502, reason, self.client)
            return False
        self.upstream = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        return True

    def abort_upstream(self) -> None:
        writer, self.up_reader, self.up_writer = self.up_writer, None, None
        if writer is not None:
            writer.transport.abort()

    async def close_upstream(self) -> None:
        writer, self.up_reader, self.up_writer = self.up_writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def run(self) -> None:
        while True:
            request = await self._next(self.client, self.reader)
            if not isinstance(request, h11.Request):
                return
            method = request.method.decode("latin-1")
            target = request.target.decode("latin-1")
            headers, refusal, done = await self.broker.rewrite(
                self.host, self.port, method, target, list(request.headers))
            self.note(method, self.host, self.port, refusal is None,
                      f"{target.split('?', 1)[0][:200]}: {done}")
            if refusal is not None:
                await _refuse(self.writer, refusal.status, refusal.sentence, self.client)
                return
            if not await self._upstream_ready():
                return
            self._send_up(h11.Request(method=request.method, target=request.target,
                                      headers=headers, http_version="1.1"))
            if not await self._relay_body():
                return
            if not await self._relay_answer():
                return
            if (self.client.our_state is not h11.DONE
                    or self.upstream.our_state is not h11.DONE):
                return
            self.client.start_next_cycle()
            self.upstream.start_next_cycle()

    async def _next(self, connection: h11.Connection,
                    reader: asyncio.StreamReader | None) -> object:
        assert reader is not None
        while True:
            try:
                event = connection.next_event()
            except h11.RemoteProtocolError:
                return None
            if event is not h11.NEED_DATA:
                return event
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                data = await reader.read(CHUNK)
            connection.receive_data(data)

    def _send_up(self, event: h11.Event) -> None:
        assert self.up_writer is not None
        data = self.upstream.send(event)
        if data:
            self.up_writer.write(data)

    async def _drain_up(self) -> None:
        assert self.up_writer is not None
        await self.up_writer.drain()

    def _send_down(self, event: h11.Event) -> None:
        data = self.client.send(event)
        if data:
            self.writer.write(data)

    async def _relay_body(self) -> bool:
        """The request's body to the host; False if the sandbox went away."""
        while True:
            event = await self._next(self.client, self.reader)
            if isinstance(event, h11.Data):
                self._send_up(event)
                await self._drain_up()
            elif isinstance(event, h11.EndOfMessage):
                self._send_up(event)
                await self._drain_up()
                return True
            else:
                return False

    async def _relay_answer(self) -> bool:
        """The host's answer to the sandbox; False when the connection is done with."""
        while True:
            event = await self._next(self.upstream, self.up_reader)
            if isinstance(event, h11.InformationalResponse):
                self._send_down(event)
                await self.writer.drain()
                if event.status_code == 101:
                    await self._pipe()
                    return False
            elif isinstance(event, h11.Response):
                self._send_down(event)
            elif isinstance(event, h11.Data):
                self._send_down(event)
                await self.writer.drain()
            elif isinstance(event, h11.EndOfMessage):
                self._send_down(event)
                await self.writer.drain()
                return True
            else:
                return False

    async def _pipe(self) -> None:
        """After an accepted upgrade (WebSocket): bytes both ways, unchanged."""
        assert self.up_reader is not None and self.up_writer is not None
        leftover_down = self.upstream.trailing_data[0]
        leftover_up = self.client.trailing_data[0]
        if leftover_down:
            self.writer.write(leftover_down)
        if leftover_up:
            self.up_writer.write(leftover_up)
        await asyncio.gather(copy_stream(self.reader, self.up_writer),
                             copy_stream(self.up_reader, self.writer))


async def copy_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until the end of ``reader`` (then end ``writer`` too), an error, or a silence of
    :data:`IDLE_TIMEOUT_S`, which closes ``writer``."""
    try:
        while True:
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, TimeoutError, RuntimeError):
        writer.close()


async def _refuse(writer: asyncio.StreamWriter, status: int, reason: str,
                  connection: h11.Connection | None = None) -> None:
    body = (reason + "\n").encode("utf-8", "replace")
    connection = connection or h11.Connection(h11.SERVER)
    if connection.our_state is not h11.SEND_RESPONSE:
        writer.write(f"HTTP/1.1 {status} Refused\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nX-Replgate-Egress: refused\r\n"
                     f"Connection: close\r\n\r\n".encode() + body)
    else:
        for event in (h11.Response(status_code=status, headers=[
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))), ("X-Replgate-Egress", "refused"),
                ("Connection", "close")]), h11.Data(data=body), h11.EndOfMessage()):
            writer.write(connection.send(event) or b"")
    with contextlib.suppress(OSError):
        await writer.drain()
