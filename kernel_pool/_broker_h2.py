"""HTTP/2 on the terminated side of the egress broker (:mod:`kernel_pool._broker`).

A sandbox client that offers ``h2`` in its TLS hello (curl, httpx with ``http2=True``, gRPC's
and Go's clients) gets it: each stream is a request the broker's rules decide as an HTTP/1.1
one is (:meth:`Broker.rewrite`: headers set, placeholders replaced, a secret missing or not to
be had answered 403 or 503 on its stream before anything is sent), relayed to the host over
HTTP/1.1 with verified TLS on a connection of this sandbox connection's own small pool, and the
answer streamed back on the stream. Flow control is honoured both ways: the sandbox's window is
only opened again for data the host took, and an answer waits for the sandbox's window.
Extended CONNECT (WebSocket over HTTP/2, RFC 8441) is not offered, so clients make their
WebSockets over HTTP/1.1, which the broker relays as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h11

__all__ = ["H2Relay"]

Note = Callable[[str, str, int, bool, str], None]
IDLE_TIMEOUT_S = 300.0
CHUNK = 64 * 1024
MAX_HEAD = 64 * 1024
MAX_IDLE_UPSTREAMS = 8
_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                  b"upgrade", b"te", b"host"})
_Upstream = tuple[asyncio.StreamReader, asyncio.StreamWriter, h11.Connection]


class Refusal(Protocol):
    """What :class:`kernel_pool._broker.Refusal` carries (its shape, not an import)."""

    @property
    def status(self) -> int: ...

    @property
    def sentence(self) -> str: ...


class Broker(Protocol):
    """What a stream asks of :class:`kernel_pool._broker.Broker` (no import: it imports us)."""

    async def rewrite(self, host: str, port: int, method: str, target: str,
                      headers: list[tuple[bytes, bytes]],
                      ) -> tuple[list[tuple[bytes, bytes]], Refusal | None, str]: ...

    async def connect(self, host: str, port: int, address: str,
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...


class _Stream:
    def __init__(self) -> None:
        self.body: asyncio.Queue[tuple[bytes, int] | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.ended = False
        """Whether the sandbox has sent all of the request."""


class H2Relay:
    """One terminated connection that chose ``h2``: its streams, relayed to the host."""

    def __init__(self, broker: Broker, host: str, port: int, address: str, note: Note,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.broker, self.host, self.port, self.address = broker, host, port, address
        self.note = note
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding=None))
        self.streams: dict[int, _Stream] = {}
        self.idle: list[_Upstream] = []
        self._window = asyncio.Event()

    async def run(self) -> None:
        """Serve the connection until the sandbox closes it, goes silent, or breaks h2."""
        self.conn.initiate_connection()
        await self._flush()
        try:
            while True:
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    data = await self.reader.read(CHUNK)
                if not data:
                    return
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    self.note("TLS", self.host, self.port, False, f"HTTP/2 not relayed: {exc}")
                    await self._flush()
                    return
                for event in events:
                    self._dispatch(event)
                    if isinstance(event, h2.events.ConnectionTerminated):
                        return
                await self._flush()
        finally:
            for stream in self.streams.values():
                if stream.task is not None:
                    stream.task.cancel()
            tasks = [s.task for s in self.streams.values() if s.task is not None]
            await asyncio.gather(*tasks, return_exceptions=True)
            for _, writer, _ in self.idle:
                writer.close()
            self.idle.clear()

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            assert event.stream_id is not None and event.headers is not None
            made = self.streams[event.stream_id] = _Stream()
            ended = made.ended = event.stream_ended is not None
            if ended:
                made.body.put_nowait(None)
            made.task = asyncio.create_task(
                self._serve(event.stream_id, list(event.headers), ended))
        elif isinstance(event, h2.events.DataReceived):
            assert event.stream_id is not None and event.data is not None
            counted = event.flow_controlled_length or 0
            if (stream := self.streams.get(event.stream_id)) is not None:
                stream.body.put_nowait((event.data, counted))
            else:  # a stream already answered: its data is dropped, its window given back
                self._give_back(counted, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            if event.stream_id is not None and (s := self.streams.get(event.stream_id)):
                s.ended = True
                s.body.put_nowait(None)
        elif isinstance(event, h2.events.StreamReset):
            stream_gone = self.streams.pop(event.stream_id or 0, None)
            if stream_gone is not None and stream_gone.task is not None:
                stream_gone.task.cancel()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._window.set()
            self._window = asyncio.Event()

    def _give_back(self, counted: int, stream_id: int) -> None:
        """Open the sandbox's windows again for ``counted`` bytes it sent (sent at the next
        flush)."""
        if counted:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.conn.acknowledge_received_data(counted, stream_id)

    async def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)
            with contextlib.suppress(OSError, RuntimeError):
                await self.writer.drain()

    async def _serve(self, stream_id: int, headers: list[tuple[bytes, bytes]],
                     ended: bool) -> None:
        """One request: decided, relayed, answered; its stream is reset if the host fails
        mid-answer."""
        upstream: _Upstream | None = None
        try:
            pseudo = {k: v for k, v in headers if k.startswith(b":")}
            method = pseudo.get(b":method", b"GET").decode("latin-1")
            target = pseudo.get(b":path", b"/").decode("latin-1")
            if method == "CONNECT":
                await self._answer(stream_id, 405, "replgate egress: CONNECT over HTTP/2 is "
                                   "not offered (make WebSockets over HTTP/1.1)")
                return
            plain = _h1_headers(headers, pseudo.get(b":authority"), ended)
            out, refusal, done = await self.broker.rewrite(self.host, self.port, method,
                                                           target, plain)
            self.note(method, self.host, self.port, refusal is None,
                      f"{target.split('?', 1)[0][:200]}: {done} (HTTP/2)")
            if refusal is not None:
                await self._answer(stream_id, refusal.status, refusal.sentence)
                return
            upstream = await self._upstream(stream_id)
            if upstream is None:
                return
            if await self._relay(stream_id, method, target, out, upstream):
                self._keep(upstream)
                upstream = None
        except (OSError, TimeoutError, h11.ProtocolError, h2.exceptions.ProtocolError):
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            await self._flush()
        finally:
            left = self.streams.pop(stream_id, None)
            while left is not None and not left.body.empty():  # a body not relayed (refused)
                if (item := left.body.get_nowait()) is not None:
                    self._give_back(item[1], stream_id)
            if upstream is not None:
                upstream[1].close()
            await self._flush()

    async def _upstream(self, stream_id: int) -> _Upstream | None:
        """An idle connection to the host, else a new one; None (the stream answered 502)
        if the host cannot be reached."""
        while self.idle:
            reader, writer, connection = self.idle.pop()
            if not reader.at_eof():
                return reader, writer, connection
            writer.close()
        try:
            reader, writer = await self.broker.connect(self.host, self.port, self.address)
        except (OSError, TimeoutError) as exc:
            reason = f"replgate egress could not reach {self.host}:{self.port} over TLS: {exc}"
            self.note("TLS", self.host, self.port, False, reason)
            await self._answer(stream_id, 502, reason)
            return None
        return reader, writer, h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)

    def _keep(self, upstream: _Upstream) -> None:
        connection = upstream[2]
        if (connection.our_state is h11.DONE and connection.their_state is h11.DONE
                and len(self.idle) < MAX_IDLE_UPSTREAMS):
            connection.start_next_cycle()
            self.idle.append(upstream)
        else:
            upstream[1].close()

    async def _relay(self, stream_id: int, method: str, target: str,
                     headers: list[tuple[bytes, bytes]], upstream: _Upstream) -> bool:
        """The request to the host and its answer back; whether the connection may serve
        another."""
        reader, writer, connection = upstream
        stream = self.streams.get(stream_id)
        if stream is None:
            return False
        writer.write(connection.send(h11.Request(method=method, target=target,
                                                 headers=headers)) or b"")
        while (item := await stream.body.get()) is not None:
            data, counted = item
            writer.write(connection.send(h11.Data(data=data)) or b"")
            await writer.drain()
            self._give_back(counted, stream_id)  # the host took it: the sandbox may send more
            await self._flush()
        writer.write(connection.send(h11.EndOfMessage()) or b"")
        await writer.drain()
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    connection.receive_data(await reader.read(CHUNK))
            elif isinstance(event, h11.Response):
                self.conn.send_headers(stream_id, [
                    (b":status", str(event.status_code).encode()),
                    *((k.lower(), v) for k, v in event.headers if k.lower() not in _HOP)])
                await self._flush()
            elif isinstance(event, h11.Data):
                await self._send(stream_id, bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self.conn.end_stream(stream_id)
                await self._flush()
                return True
            elif isinstance(event, h11.ConnectionClosed):
                raise OSError(f"{self.host} closed the connection mid-answer")

    async def _send(self, stream_id: int, data: bytes) -> None:
        """Data on the stream, as the sandbox's flow-control windows let it."""
        while data:
            window = min(self.conn.local_flow_control_window(stream_id),
                         self.conn.max_outbound_frame_size)
            if window <= 0:
                opened = self._window
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    await opened.wait()
                continue
            self.conn.send_data(stream_id, data[:window])
            data = data[window:]
            await self._flush()

    async def _answer(self, stream_id: int, status: int, reason: str) -> None:
        """A refusal on the stream; a request still being sent is then told to stop, without
        error (RFC 9113, 8.1), so the rest of its body is not sent for nothing."""
        body = (reason + "\n").encode("utf-8", "replace")
        self.conn.send_headers(stream_id, [
            (b":status", str(status).encode()),
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()), (b"x-replgate-egress", b"refused")])
        await self._send(stream_id, body)
        self.conn.end_stream(stream_id)
        stream = self.streams.get(stream_id)
        if stream is not None and not stream.ended:
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
        await self._flush()


def _h1_headers(headers: list[tuple[bytes, bytes]], authority: bytes | None,
                ended: bool) -> list[tuple[bytes, bytes]]:
    """An h2 request's headers as HTTP/1.1's: ``Host`` from ``:authority``, cookies joined
    (h2 may split them), and chunked framing for a body of unsaid length."""
    plain = [(k, v) for k, v in headers if not k.startswith(b":") and k not in _HOP]
    cookies = [v for k, v in plain if k == b"cookie"]
    plain = [(k, v) for k, v in plain if k != b"cookie"]
    if cookies:
        plain.append((b"cookie", b"; ".join(cookies)))
    host = authority or next((v for k, v in headers if k == b"host"), None)
    if host:
        plain.insert(0, (b"host", host))
    if not ended and not any(k == b"content-length" for k, _ in plain):
        plain.append((b"transfer-encoding", b"chunked"))
    return plain
