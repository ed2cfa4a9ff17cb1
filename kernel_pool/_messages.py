"""The messages a kernel and the host exchange, as the host reads them: signed by
jupyter_client's :class:`~jupyter_client.session.Session` (with unguessable ids, parsed without
its date conversion), their parent's id peeked at before any check, and the ZMQ context that
bounds each one's size (:func:`make_context`).
"""

from __future__ import annotations

import hmac
import json
import secrets
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.adapter import adapt
from jupyter_client.session import Session as MessageSession

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
LARGE_MESSAGE_BYTES = 1024 * 1024
PARENT_HEADER_MAX_BYTES = 64 * 1024
"""Messages over this size are checked and parsed in a worker thread, off the event loop."""
RECONNECT_MS = 5
"""How often a socket of ours tries again to reach a kernel's that is not bound yet."""


class KernelSession(MessageSession):
    """jupyter_client's message session with unguessable message ids.

    Its own ids are ``session_pid_counter``: code in the sandbox, which sees the id of the
    request it runs under, could name the next one and forge its outputs ahead of time.
    """

    @property
    def msg_id(self) -> str:
        return secrets.token_hex(16)

    def deserialize(self, msg_list: Any, content: bool = True,
                    copy: bool = True) -> dict[str, Any]:
        """jupyter_client's checks (signature, replayed signature), without its date parsing.

        Its own turns every ISO date string in both headers into a ``datetime`` (dateutil:
        about a third of the cost of a small message), and nothing here reads them.
        """
        if not (content and copy) or len(msg_list) < 5:
            return super().deserialize(msg_list, content=content, copy=copy)
        if self.auth is not None:
            signature = msg_list[0]
            if not signature:
                raise ValueError("Unsigned Message")
            if signature in self.digest_history:
                raise ValueError(f"Duplicate Signature: {signature!r}")
            self._add_digest(signature)
            if not hmac.compare_digest(signature, self.sign(msg_list[1:5])):
                raise ValueError(f"Invalid Signature: {signature!r}")
        header = self.unpack(msg_list[1])
        message = {"header": header, "msg_id": header["msg_id"],
                   "msg_type": header["msg_type"], "parent_header": self.unpack(msg_list[2]),
                   "metadata": self.unpack(msg_list[3]), "content": self.unpack(msg_list[4]),
                   "buffers": [memoryview(b) for b in msg_list[5:]]}
        if str(header.get("version", "")).startswith("5."):
            return message  # the protocol spoken here: nothing to adapt
        adapted: dict[str, Any] = adapt(message)
        return adapted



def peek_parent_id(parts: list[bytes] | list[zmq.Frame]) -> str:
    """The parent's message id, read from a message's frames before any check.

    Only to drop at once what no request waits for: a message that names a waiting request is
    then checked (signature) and parsed in full, so a flood of stray or forged messages costs
    the gateway a small JSON read each, whatever their size.
    """
    frame = parts[2] if len(parts) >= 5 else b""
    raw = frame.bytes if isinstance(frame, zmq.Frame) else frame
    if not raw or len(raw) > PARENT_HEADER_MAX_BYTES:
        return ""
    try:
        parent = json.loads(raw)
    except ValueError:
        return ""
    msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
    return msg_id if isinstance(msg_id, str) else ""



def make_context() -> zmq.asyncio.Context:
    """A ZMQ context whose sockets refuse any single message over ``MAX_MESSAGE_BYTES``.

    A kernel starting binds its sockets after ours connect: ZMQ tries again every
    ``RECONNECT_IVL``, 100 ms by default, which a code context's start (bash's, about half a
    second in all) would wait half of on average. The ipc sockets are local files: trying
    every few milliseconds costs nothing."""
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    context.setsockopt(zmq.LINGER, 0)
    context.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
    return context
