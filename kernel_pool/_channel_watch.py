"""Noticing that a kernel's output channel broke, which ZMQ itself never reports to a reader.

The host subscribes to the kernel's iopub (PUB) socket. A message over the host's size limit
(``MAXMSGSIZE``: one huge display, or one forged by the code) makes ZMQ drop the connection as a
protocol error, and it does not reconnect after one: the subscriber just stops receiving, and
every later output is lost while the kernel keeps answering on its other channels. The socket's
monitor (a ZMQ event stream about its connections) is the one place that says so.
"""

from __future__ import annotations

import contextlib

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

STALL_S = 5.0
"""After the kernel's reply, how long the output channel may stay silent before it is taken for
stalled (its ``idle`` status never came): the channel is then re-established and the execution
is not ``ok``. Every output that arrives meanwhile starts the wait again."""


async def wait_disconnect(socket: zmq.asyncio.Socket) -> str:
    """Return, as a sentence, once ``socket``'s connection to the kernel has dropped."""
    monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                return ("the kernel's output channel broke (a message over the host's size "
                        "limit, or the connection dropped)")
    finally:
        with contextlib.suppress(zmq.ZMQError):
            socket.disable_monitor()
        monitor.close(linger=0)
