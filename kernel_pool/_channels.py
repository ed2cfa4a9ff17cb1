"""A kernel's ZMQ channels, as the host speaks them: messages signed and bounded, routed by
their parent's id to the request that caused it.

The host side never trusts what the kernel sends: every message is signature-checked by
jupyter_client's :class:`~jupyter_client.session.Session`, size-bounded by ZMQ (``MAXMSGSIZE``
on the context) and routed only by its parent's message id to the request that caused it.
A message over that size breaks the output channel: its socket monitor notices, the requests in
flight learn it, and the kernel is subscribed to afresh (see :mod:`kernel_pool._channel_watch`).
A message with no live request behind it (a forged one, or late output of a finished cell)
is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Any

import anyio.to_thread
import zmq
import zmq.asyncio
from jupyter_client.session import Session as MessageSession

from kernel_pool._channel_watch import wait_disconnect
from kernel_pool._messages import LARGE_MESSAGE_BYTES, KernelSession, peek_parent_id
from kernel_pool.backends.base import Sandbox
from kernel_pool.exceptions import KernelStartError

logger = logging.getLogger(__name__)

ROUTE_BUFFER = 32
"""Messages buffered per request before the reader waits (and ZMQ's own limits apply)."""
KERNEL_INFO_AGAIN_S = (0.25, 2.0)
"""A start's ``kernel_info_request`` is sent again after the first of these without both its
reply and a status on iopub (a subscriber that connected after the status was sent missed it),
each wait twice the last, up to the second. Backing off matters: each request sent is answered
in turn, and a kernel slower to answer than a fixed wait (a restart on a loaded machine) would
have the wait forget each request just before its answer came, for its whole start timeout."""
STATUS_AFTER_REPLY_S = 0.02
"""How long, once a start's ``kernel_info`` reply came, its status may lag it on iopub before
the request is sent again: the kernel publishes it as it replies, so one that does not follow
was published before the subscription reached the kernel (ZMQ drops it), and the next request,
answered at once, brings one. Waiting the whole first :data:`KERNEL_INFO_AGAIN_S` instead cost
a quarter of a second in a fair share of starts from a kernel template on a busy host."""
UNANSWERED_BEFORE_RECONNECT = 3
"""A start's kernel_info requests the kernel ran (their status came on iopub) with no reply on
the channel asked, after which that channel's socket is made again."""
ENV_FILE = "env.json"
"""The session's variables, written by the gateway in the sandbox's socket folder
(``/kernel/env.json``) for the kernel to take before its next execution."""
IOPUB_HWM = 64
"""Output messages ZMQ queues on the host. Past that the backlog stays in the sandbox (its
memory, under its limit) and, in a flood the host cannot keep up with, the kernel drops output:
a stream message is at most 256 KiB, so a flood costs the host about 25 MiB at most."""


class KernelState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    DEAD = "dead"
    CLOSED = "closed"
    PAUSED = "paused"
    """No process and no container: the session's state is in a snapshot (see Session.pause)."""
    DETACHED = "detached"
    """Left running for the next gateway to take back (a shutdown that keeps sessions)."""


class KernelDied:
    """Put on a request's route when the kernel process dies under it."""

    def __init__(self, reason: str, oom: bool) -> None:
        self.reason = reason
        self.oom = oom


RouteItem = tuple[str, Any]
"""(channel, message): channel is iopub, shell, control, or 'died'/'interrupt' (signals)."""


class KernelChannels:
    """A kernel's ZMQ channels: shell and control requests, the iopub subscription and its
    recovery, and the routes that hand each message to the request it answers. The
    :class:`~kernel_pool._kernel.Kernel` it is part of owns the process's life."""

    sandbox: Sandbox
    state: KernelState
    _death: KernelDied | None
    _died: asyncio.Event
    _start_timeout_s: float

    def __init__(self, context: zmq.asyncio.Context) -> None:
        self._context = context
        self._routes: dict[str, asyncio.Queue[RouteItem]] = {}
        self._sockets: dict[str, zmq.asyncio.Socket] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._addresses: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._session: MessageSession | None = None
        self._dropped = 0
        self.channel_breaks = 0
        """How often the output channel broke (an execution compares it before and after)."""
        self._iopub_address = ""
        self._iopub_tasks: list[asyncio.Task[None]] = []
        self._recovering: asyncio.Task[None] | None = None
        self._channel_failed: str | None = None
        self.takes_env_file = False
        """Whether the kernel takes its session's variables from :data:`ENV_FILE` before each
        execution, as its ``kernel_info`` reply says (an older image's kernel does not: it is
        sent them by :meth:`set_env`); see replgate_kernel/session_env.py."""

    @property
    def id(self) -> str:
        return self.sandbox.info.sandbox_id

    @property
    def zmq_context(self) -> zmq.asyncio.Context:
        """The ZMQ context its sockets belong to (a session's other kernels share it)."""
        return self._context

    def _connect(self, connection: dict[str, Any]) -> None:
        self._session = KernelSession(key=connection["key"].encode(),
                                      signature_scheme=connection["signature_scheme"],
                                      username="replgate")
        base = connection["ip"]
        self._iopub_address = f"ipc://{base}-{connection['iopub_port']}"
        self._addresses = {channel: f"ipc://{base}-{connection[channel + '_port']}"
                           for channel in ("shell", "control")}
        self._connect_requests("shell", self._session.bsession)
        self._connect_iopub()
        self._connect_requests("control", self._session.bsession)

    def _connect_requests(self, channel: str, identity: bytes) -> None:
        """A DEALER to the kernel's ``channel`` (shell or control), and its reader."""
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.IDENTITY, identity)
        socket.connect(self._addresses[channel])
        self._sockets[channel] = socket
        self._readers[channel] = asyncio.create_task(self._read(channel, socket),
                                                     name=f"{channel}-{self.id}")
        self._tasks.append(self._readers[channel])

    def _reconnect_requests(self, channel: str) -> None:
        """Replace ``channel``'s socket by a new one, under a new identity: the kernel's
        router drops the replies to a peer it no longer routes to, and a start once heard
        the kernel answer on its output channel, never on shell, for its whole minute (a
        restart on a loaded machine; its cause not found). The old reader is cancelled;
        :meth:`_disconnect` waits for it with the others."""
        self._readers.pop(channel).cancel()
        self._sockets.pop(channel).close(linger=0)
        self._connect_requests(channel, secrets.token_hex(16).encode())

    def _connect_iopub(self) -> None:
        """Subscribe to the kernel's output, with a watch on the connection (see channel.py)."""
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.RCVHWM, IOPUB_HWM)
        watch = asyncio.create_task(self._watch_iopub(socket), name=f"iopub-watch-{self.id}")
        socket.connect(self._iopub_address)
        self._sockets["iopub"] = socket
        self._iopub_tasks = [asyncio.create_task(self._read("iopub", socket),
                                                 name=f"iopub-{self.id}"), watch]
        self._tasks.extend(self._iopub_tasks)

    async def _wait_ready(self, channel: str, watched: bool = False) -> None:
        """kernel_info until answered; iopub must also be connected (its status arrives).

        ``watched``: the death watcher runs already; learn a death from it, since a second
        waiter on the sandbox's exit would take the first one's place (one pidfd reader).
        """
        died = asyncio.create_task(self._died.wait() if watched else self.sandbox.wait())
        replied = heard = False  # over every attempt: what a timeout then reports
        unanswered = 0  # attempts in a row the kernel ran (its status came) but not answered
        again, longest = KERNEL_INFO_AGAIN_S
        try:
            async with asyncio.timeout(self._start_timeout_s):
                while True:
                    if unanswered >= UNANSWERED_BEFORE_RECONNECT:
                        logger.warning("kernel %s: it ran %d kernel_info requests on %s but "
                                       "no reply came; connecting that channel again",
                                       self.id, unanswered, channel)
                        self._reconnect_requests(channel)
                        unanswered = 0
                    msg_id, route = self.request("kernel_info_request", {}, channel)
                    try:
                        got_reply = got_iopub = False
                        while not (got_reply and got_iopub):
                            getter = asyncio.ensure_future(route.get())
                            try:
                                wait = STATUS_AFTER_REPLY_S if got_reply else again
                                done, _ = await asyncio.wait({getter, died}, timeout=wait,
                                                             return_when=asyncio.FIRST_COMPLETED)
                            finally:  # also when cancelled or timed out: no orphan task
                                if not getter.done():
                                    getter.cancel()
                            if died in done:
                                code = "" if watched else f" ({died.result()})"
                                raise KernelStartError(self.id, f"kernel exited{code}")
                            if getter not in done:
                                break
                            source, msg = getter.result()
                            if source == channel:
                                self._note_kernel_info(msg)
                            got_reply |= source == channel
                            got_iopub |= source == "iopub"
                        replied |= got_reply
                        heard |= got_iopub
                        if got_reply and got_iopub:
                            return
                        unanswered = unanswered + 1 if got_iopub and not got_reply else 0
                        again = min(again * 2, longest)
                    finally:
                        self.forget(msg_id)
        except TimeoutError:
            seen = ("it answered, but its output channel stayed silent" if replied
                    else "its output channel spoke, but no answer came" if heard
                    else "nothing came back on any channel")
            raise KernelStartError(
                self.id, f"no answer within {self._start_timeout_s}s ({seen})") from None
        finally:
            died.cancel()

    def _note_kernel_info(self, msg: Any) -> None:
        content = msg.get("content") if isinstance(msg, dict) else None
        ours = content.get("replgate") if isinstance(content, dict) else None
        self.takes_env_file = isinstance(ours, dict) and ours.get("env_file") == ENV_FILE

    async def _read(self, channel: str, socket: zmq.asyncio.Socket) -> None:
        assert self._session is not None
        session = self._session
        while True:
            try:
                frames = await socket.recv_multipart()
                _idents, parts = session.feed_identities(frames)
                if peek_parent_id(parts) not in self._routes:
                    continue  # nobody waits for it (late, stray or forged): not even checked
                if sum(map(len, parts)) > LARGE_MESSAGE_BYTES:
                    # Checking and parsing megabytes would hold the loop (every session's) for
                    # a noticeable time: do it beside the loop; small messages stay inline.
                    msg = await anyio.to_thread.run_sync(session.deserialize, parts)
                else:
                    msg = session.deserialize(parts)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a malformed or forged message: drop it
                self._dropped += 1
                if self._dropped <= 10 or self._dropped % 10_000 == 0:  # no log flood either
                    logger.warning("kernel %s: dropped a bad %s message (%d so far): %s",
                                   self.id, channel, self._dropped, exc)
                continue
            parent = msg.get("parent_header") or {}
            route = self._routes.get(parent.get("msg_id", "")) if isinstance(parent, dict) else None
            if route is not None:
                await route.put((channel, msg))

    async def _watch_iopub(self, socket: zmq.asyncio.Socket) -> None:
        reason = await wait_disconnect(socket)
        if socket is self._sockets.get("iopub") and self.state is KernelState.READY:
            self.recover_channel(reason)

    def recover_channel(self, reason: str) -> None:
        """The output channel broke or stalled: tell the requests in flight, and subscribe
        afresh (the kernel and its variables stay). :meth:`channel_ready` waits for it."""
        if self._recovering is not None and not self._recovering.done():
            return
        self.channel_breaks += 1
        logger.warning("kernel %s: %s; subscribing again", self.id, reason)
        for route in list(self._routes.values()):
            with contextlib.suppress(asyncio.QueueFull):
                route.put_nowait(("channel", reason))
        self._recovering = asyncio.create_task(self._resubscribe(reason),
                                               name=f"iopub-recover-{self.id}")
        self._tasks.append(self._recovering)

    async def _resubscribe(self, reason: str) -> None:
        old = self._iopub_tasks
        for task in old:
            task.cancel()
        if old:
            await asyncio.wait(old)
        self._tasks = [task for task in self._tasks if task not in old]
        socket = self._sockets.pop("iopub", None)
        if socket is not None:
            socket.close(linger=0)
        self._connect_iopub()
        try:
            # kernel_info on control (a busy kernel answers it there) until its status
            # arrives on the new subscription: from then on no output is lost.
            await self._wait_ready("control", watched=True)
        except (KernelStartError, OSError) as exc:
            self._channel_failed = f"{reason}, and subscribing again failed ({exc})"
            logger.warning("kernel %s: %s", self.id, self._channel_failed)

    async def channel_ready(self) -> str | None:
        """Wait for a re-subscription under way; why the channel is still broken, if it is
        (the caller then restarts the kernel)."""
        recovering = self._recovering
        if recovering is not None and not recovering.done():
            await asyncio.wait([recovering])
        return self._channel_failed

    async def _disconnect(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        try:
            if tasks:  # asyncio.wait, unlike awaiting each, lets the caller's own cancel through
                await asyncio.wait(tasks)
            for task in tasks:
                if not task.cancelled() and task.exception() is not None:
                    logger.warning("kernel %s: %s failed: %r", self.id, task.get_name(),
                                   task.exception())
        finally:
            for socket in self._sockets.values():
                socket.close(linger=0)
            self._sockets.clear()

    def request(self, msg_type: str, content: dict[str, Any],
                channel: str = "shell") -> tuple[str, asyncio.Queue[RouteItem]]:
        """Send a request; its replies and outputs arrive on the returned queue."""
        assert self._session is not None
        msg = self._session.msg(msg_type, content)
        msg_id: str = msg["header"]["msg_id"]
        route: asyncio.Queue[RouteItem] = asyncio.Queue(ROUTE_BUFFER)
        self._routes[msg_id] = route
        if self._death is not None:  # it died before this request: nothing will answer it
            route.put_nowait(("died", self._death))
        socket = self._sockets.get(channel)
        if socket is not None:  # none after a failed start
            self._session.send(socket, msg)
        return msg_id, route

    async def relay(self, msg_type: str, content: dict[str, Any], channel: str,
                    timeout_s: float) -> AsyncIterator[RouteItem]:
        """Send one request; yield its reply and the iopub messages under it, as parsed.

        Ends once both the reply and the kernel's ``idle`` status came, at ``timeout_s`` (one
        second after the reply when its idle got lost), or when the kernel dies (``death``).
        """
        reply_type = msg_type.removesuffix("_request") + "_reply"
        msg_id, route = self.request(msg_type, content, channel)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        replied = idle = False
        try:
            while not (replied and idle):
                try:
                    async with asyncio.timeout_at(deadline):
                        source, msg = await route.get()
                except TimeoutError:
                    return
                if source == "died":
                    return
                if not isinstance(msg, dict):
                    continue
                kind = msg.get("msg_type")
                if source in ("shell", "control"):
                    if kind != reply_type or replied:
                        continue
                    replied = True
                    deadline = min(deadline, loop.time() + 1.0)
                elif source == "iopub" and kind == "status":
                    status = msg.get("content")
                    idle = isinstance(status, dict) and status.get("execution_state") == "idle"
                yield source, msg
        finally:
            self.forget(msg_id)

    def forget(self, msg_id: str) -> None:
        self._routes.pop(msg_id, None)

    def route(self, msg_id: str) -> asyncio.Queue[RouteItem] | None:
        return self._routes.get(msg_id)

    def interrupt(self) -> None:
        """Ask the kernel (over the control channel) to raise KeyboardInterrupt."""
        msg_id, _route = self.request("interrupt_request", {}, channel="control")
        self.forget(msg_id)

    async def set_env(self, env: dict[str, str]) -> None:
        """Set environment variables in the kernel process (for the session's ``env``)."""
        msg_id, route = self.request("execute_request", _env_request(env))
        try:
            async with asyncio.timeout(self._start_timeout_s):
                while (await route.get())[0] != "shell":
                    pass
        finally:
            self.forget(msg_id)


def _env_request(env: dict[str, str]) -> dict[str, Any]:
    """A silent execution that sets ``env`` in the kernel process."""
    code = f"import os as _o; _o.environ.update({json.dumps(env)}); del _o"
    return {"code": code, "silent": True, "store_history": False, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": False}
