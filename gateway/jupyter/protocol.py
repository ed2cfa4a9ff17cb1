"""Jupyter's kernel messages on a WebSocket: framing, building and bounding them.

Two framings, as jupyter_server speaks them (``services/kernels/connection/base.py``):

- the legacy JSON form: one text frame per message, ``{"header", "parent_header", "metadata",
  "content", "buffers", "channel", "msg_id", "msg_type"}``; a message with binary buffers goes
  as a binary frame (``!I`` count, ``!I`` offsets, the JSON, the buffers);
- the ``v1.kernel.websocket.jupyter.org`` subprotocol: every message a binary frame of
  little-endian u64 offsets, then the channel name, then header, parent header, metadata and
  content as JSON, then the buffers.

Nothing the client or the kernel sends is passed on as bytes: a frame is parsed into a
:class:`Message` of plain JSON values, size-bounded, and messages going out are built afresh
(new ``msg_id``, the gateway's ``session``, the client's header as ``parent_header``). Messages
on the WebSocket are not signed, as with jupyter_server.
"""

from __future__ import annotations

import json
import struct
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gateway.wire import (
    ClearOutputEvent,
    DisplayEvent,
    DoneEvent,
    ErrorEvent,
    ExecutionStatus,
    OutputEvent,
    StreamEvent,
    UpdateDisplayEvent,
)

__all__ = [
    "CHANNELS",
    "PROTOCOL_VERSION",
    "V1_SUBPROTOCOL",
    "Message",
    "ProtocolError",
    "decode",
    "encode",
    "execute_reply",
    "from_kernel",
    "output_message",
]

PROTOCOL_VERSION = "5.3"
V1_SUBPROTOCOL = "v1.kernel.websocket.jupyter.org"
CHANNELS = frozenset({"shell", "control", "iopub", "stdin"})
MAX_FIELD_CHARS = 256
"""Longest header value kept (ids, types, names); a longer msg_id or msg_type is refused."""
MAX_PARTS = 64
"""Most buffers a client frame may carry (they are dropped; the count only bounds parsing)."""
MAX_KERNEL_CONTENT_BYTES = 8 * 1024 * 1024
MAX_KERNEL_METADATA_BYTES = 64 * 1024
MAX_KERNEL_BUFFER_BYTES = 1024 * 1024
"""Buffers of one relayed kernel message, in all; above it they are dropped."""
_HEADER_FIELDS = ("msg_id", "msg_type", "session", "username", "version", "subshell_id")


class ProtocolError(ValueError):
    """A frame that is not a well-formed Jupyter message."""


@dataclass
class Message:
    """One Jupyter message, every part plain JSON values (buffers aside)."""

    channel: str
    header: dict[str, Any]
    parent_header: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    content: dict[str, Any] = field(default_factory=dict)
    buffers: list[bytes] = field(default_factory=list)

    @property
    def msg_type(self) -> str:
        return str(self.header.get("msg_type", ""))

    @property
    def msg_id(self) -> str:
        return str(self.header.get("msg_id", ""))


def now_iso() -> str:
    """The time as Jupyter writes it in headers: ISO 8601, UTC, ``Z``."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def new_message(msg_type: str, content: dict[str, Any], *, channel: str,
                parent: dict[str, Any], session: str,
                metadata: dict[str, Any] | None = None,
                buffers: list[bytes] | None = None) -> Message:
    """A fresh message from the gateway, in reply to (or caused by) ``parent``."""
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": session,
              "username": "replgate", "date": now_iso(), "version": PROTOCOL_VERSION}
    return Message(channel=channel, header=header, parent_header=parent,
                   metadata=metadata or {}, content=content, buffers=buffers or [])


# -- framing -----------------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def encode(message: Message, binary: bool) -> str | bytes:
    """The WebSocket frame for ``message``: v1 binary when ``binary``, else legacy JSON."""
    parts = [_dumps(message.header).encode(), _dumps(message.parent_header).encode(),
             _dumps(message.metadata).encode(), _dumps(message.content).encode(),
             *message.buffers]
    if binary:
        channel = message.channel.encode()
        offsets = [8 * (1 + 1 + len(parts) + 1), 0]
        offsets[1] = offsets[0] + len(channel)
        for part in parts:
            offsets.append(offsets[-1] + len(part))
        head = b"".join(n.to_bytes(8, "little") for n in (len(offsets), *offsets))
        return b"".join([head, channel, *parts])
    body = {"header": message.header, "msg_id": message.msg_id, "msg_type": message.msg_type,
            "parent_header": message.parent_header, "metadata": message.metadata,
            "content": message.content, "buffers": [], "channel": message.channel}
    if not message.buffers:
        return _dumps(body)
    frames = [_dumps(body).encode(), *message.buffers]
    offsets = [4 * (len(frames) + 1)]
    for frame in frames[:-1]:
        offsets.append(offsets[-1] + len(frame))
    return struct.pack(f"!{len(frames) + 1}I", len(frames), *offsets) + b"".join(frames)


def decode(frame: str | bytes, binary: bool) -> Message:
    """Parse a client's frame; :class:`ProtocolError` when it is malformed.

    Buffers the client sends are dropped: no request the gateway relays takes them.
    """
    if binary:
        if not isinstance(frame, bytes):
            raise ProtocolError("the v1 protocol sends binary frames only")
        channel, parts = _split_v1(frame)
        header, parent, metadata, content = (_loads(part) for part in parts[:4])
    else:
        if isinstance(frame, bytes):
            frame = _first_legacy_part(frame)
        body = _loads(frame)
        if not isinstance(body, dict):
            raise ProtocolError("a message is a JSON object")
        channel = body.get("channel", "shell")
        header, parent = body.get("header"), body.get("parent_header") or {}
        metadata, content = body.get("metadata") or {}, body.get("content") or {}
    if channel not in CHANNELS:
        raise ProtocolError(f"unknown channel {str(channel)[:MAX_FIELD_CHARS]!r}")
    for name, value in (("header", header), ("parent_header", parent),
                        ("metadata", metadata), ("content", content)):
        if not isinstance(value, dict):
            raise ProtocolError(f"{name} must be a JSON object")
    return Message(channel=channel, header=clean_header(header), parent_header=parent,
                   metadata=metadata, content=content)


def _loads(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None


def _split_v1(frame: bytes) -> tuple[str, list[bytes]]:
    if len(frame) < 8:
        raise ProtocolError("frame too short")
    count = int.from_bytes(frame[:8], "little")
    if not 6 <= count <= 6 + MAX_PARTS or len(frame) < 8 * (count + 1):
        raise ProtocolError("bad offset table")
    offsets = [int.from_bytes(frame[8 * (i + 1):8 * (i + 2)], "little") for i in range(count)]
    if offsets != sorted(offsets) or offsets[0] < 8 * (count + 1) or offsets[-1] > len(frame):
        raise ProtocolError("bad offsets")
    try:
        channel = frame[offsets[0]:offsets[1]].decode()
    except UnicodeDecodeError:
        raise ProtocolError("channel is not text") from None
    return channel, [frame[offsets[i]:offsets[i + 1]] for i in range(1, count - 1)]


def _first_legacy_part(frame: bytes) -> bytes:
    if len(frame) < 8:
        raise ProtocolError("frame too short")
    (count,) = struct.unpack("!I", frame[:4])
    if not 1 <= count <= 1 + MAX_PARTS or len(frame) < 4 * (count + 1):
        raise ProtocolError("bad offset table")
    offsets = [*struct.unpack(f"!{count}I", frame[4:4 * (count + 1)]), len(frame)]
    if offsets != sorted(offsets) or offsets[0] < 4 * (count + 1):
        raise ProtocolError("bad offsets")
    return frame[offsets[0]:offsets[1]]


def clean_header(header: dict[str, Any]) -> dict[str, Any]:
    """The header fields the gateway understands, bounded; what it echoes as parent_header."""
    clean: dict[str, Any] = {}
    for name in _HEADER_FIELDS:
        value = header.get(name)
        if isinstance(value, str):
            clean[name] = value[:MAX_FIELD_CHARS]
    for name in ("msg_id", "msg_type"):
        value = header.get(name)
        if not isinstance(value, str) or not value or len(value) > MAX_FIELD_CHARS:
            raise ProtocolError(f"header.{name} must be a string of 1 to {MAX_FIELD_CHARS} chars")
    date = header.get("date")
    if isinstance(date, str):
        clean["date"] = date[:64]
    elif isinstance(date, int | float) and not isinstance(date, bool):
        clean["date"] = date  # jupyter_server's GatewayKernelClient sends a timestamp
    clean.setdefault("version", PROTOCOL_VERSION)
    return clean


# -- the kernel's replies, rebuilt ---------------------------------------------------------------


def _bounded_json(value: Any, limit: int) -> dict[str, Any] | None:
    """A fresh JSON copy of a dict, or None when it is not one or is over ``limit`` bytes."""
    if not isinstance(value, dict):
        return None
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    if len(text.encode()) > limit:
        return None
    copy: dict[str, Any] = json.loads(text)
    return copy


def from_kernel(msg: dict[str, Any], *, channel: str, parent: dict[str, Any],
                session: str) -> Message:
    """A message of the kernel (already signature-checked and parsed) rebuilt for the client.

    Only its type, content, metadata and small buffers are kept; an oversized content becomes
    an error reply naming the limit.
    """
    header = msg.get("header") if isinstance(msg.get("header"), dict) else {}
    assert isinstance(header, dict)
    msg_type = str(header.get("msg_type") or msg.get("msg_type") or "")[:MAX_FIELD_CHARS]
    content = _bounded_json(msg.get("content"), MAX_KERNEL_CONTENT_BYTES)
    if content is None:
        content = {"status": "error", "ename": "ReplyTooLarge",
                   "evalue": f"the kernel's reply was over {MAX_KERNEL_CONTENT_BYTES} bytes "
                             "or not a JSON object; the gateway dropped it",
                   "traceback": []}
    metadata = _bounded_json(msg.get("metadata"), MAX_KERNEL_METADATA_BYTES) or {}
    buffers = [bytes(b) for b in msg.get("buffers") or [] if isinstance(b, bytes | memoryview)]
    if sum(len(b) for b in buffers) > MAX_KERNEL_BUFFER_BYTES:
        buffers = []
    return new_message(msg_type, content, channel=channel, parent=parent, session=session,
                       metadata=metadata, buffers=buffers)


# -- the engine's events, as Jupyter messages -------------------------------------------------


def output_message(event: OutputEvent, *, parent: dict[str, Any], session: str,
                   execution_count: int) -> Message:
    """The iopub message for one (already capped) output event of an execution."""
    msg_type: str
    content: dict[str, Any]
    if isinstance(event, StreamEvent):
        msg_type, content = "stream", {"name": event.type, "text": event.text}
    elif isinstance(event, DisplayEvent) and event.type == "result":
        msg_type = "execute_result"
        content = {"data": event.data, "metadata": event.metadata,
                   "execution_count": execution_count}
    elif isinstance(event, DisplayEvent):
        msg_type = "display_data"
        content = {"data": event.data, "metadata": event.metadata,
                   "transient": {"display_id": event.display_id} if event.display_id else {}}
    elif isinstance(event, UpdateDisplayEvent):
        msg_type = "update_display_data"
        content = {"data": event.data, "metadata": event.metadata,
                   "transient": {"display_id": event.display_id}}
    elif isinstance(event, ClearOutputEvent):
        msg_type, content = "clear_output", {"wait": event.wait}
    else:
        assert isinstance(event, ErrorEvent)
        msg_type = "error"
        content = {"ename": event.ename, "evalue": event.evalue, "traceback": event.traceback}
    return new_message(msg_type, content, channel="iopub", parent=parent, session=session)


ABNORMAL_ENAMES = {
    ExecutionStatus.TIMEOUT: "TimeoutError",
    ExecutionStatus.INTERRUPTED: "KeyboardInterrupt",
    ExecutionStatus.DIED: "DeadKernelError",
}


def execute_reply(done: DoneEvent, error: ErrorEvent | None,
                  execution_count: int) -> dict[str, Any]:
    """``execute_reply`` content for an execution's ``done`` (and its last error, if any)."""
    if done.status == ExecutionStatus.OK:
        return {"status": "ok", "execution_count": execution_count, "user_expressions": {},
                "payload": []}
    if error is None:
        error = abnormal_error(done)
    return {"status": "error", "execution_count": execution_count, "ename": error.ename,
            "evalue": error.evalue, "traceback": error.traceback}


def abnormal_error(done: DoneEvent) -> ErrorEvent:
    """An error for an execution that ended without one of its own (timeout, crash)."""
    ename = ABNORMAL_ENAMES.get(done.status, "ExecutionError")
    reason = done.reason or f"the execution ended with status {done.status.value}"
    return ErrorEvent(ename=ename, evalue=reason, traceback=[f"{ename}: {reason}"])
