"""The port's requests and answers as they cross the network between a gateway and a node.

Each is a pydantic model built from kernel_pool's own serializable models. An execution's
answer is a stream of :class:`Frame` lines (JSON, one per line): the node's acceptance first
(so the gateway knows the execution holds its place in the session's queue), then its events,
the last one ``done``. An error travels as :class:`ErrorOut` and becomes, on the gateway's
side, the same kernel_pool exception class with the same message (:func:`error_from`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Base64Bytes, BaseModel, Field

from kernel_pool import (
    CommandResult,
    Event,
    KernelPoolError,
    NetworkPolicy,
    Profile,
    PtySize,
    SessionState,
    Transfer,
    WatchEvent,
)
from kernel_pool import exceptions as pool_errors

__all__ = ["SessionState"]  # (the session's facts: declared once, in kernel_pool.state)

PREFIX = "/port/v1"
"""Where a node serves the port (its other path is ``/healthz``)."""


class TemplateImage(BaseModel):
    """A custom template's profile, as the gateway that placed a session of it knows it: a
    node that lacks the profile adds it, and loads its image from the bundle store's ``key``
    first if its engine lacks it."""

    profile: Profile
    key: str


class CreateSession(BaseModel):
    profile: str = "default"
    env: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    session_id: str | None = None
    lost: str | None = None
    """Why a session known before starts again here on a fresh kernel (its node was lost)."""
    template: TemplateImage | None = None
    """Set when ``profile`` is a custom template's (added to the gateway while it runs)."""


class ForkSession(BaseModel):
    count: int = Field(ge=1)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Submit(BaseModel):
    code: str
    timeout_s: float | None = None
    execution_id: str
    language: str | None = None
    context_id: str | None = None
    origin: str | None = None
    """Who submitted it: its events are not sent again to a follower of that origin."""


class RunCommand(BaseModel):
    """A shell command to run beside the kernel (``SessionPort.run_command``)."""

    command: str
    command_id: str
    timeout_s: float | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    stdin: bool = False
    pty: PtySize | None = None


class Relay(BaseModel):
    """One raw Jupyter request (``SessionPort.relay``)."""

    msg_type: str
    content: dict[str, Any]
    channel: str = "shell"


class Relayed(BaseModel):
    """A message a relayed request caused: its channel, the parsed message without its
    buffers, and the buffers."""

    channel: str
    message: dict[str, Any]
    buffers: list[Base64Bytes] = Field(default_factory=list)


class Started(BaseModel):
    """An execution of the session began (its events follow as :class:`Executed`)."""

    execution_id: str
    code: str
    timeout_s: float
    language: str
    context_id: str


class Executed(BaseModel):
    """One event of an execution, for those following the session."""

    execution_id: str
    event: Event


class Frame(BaseModel):
    """One line of a stream (an execution's, a command's, a relayed request's, or what a
    session's followers hear): exactly one field is set."""

    accepted: SessionState | None = None
    event: Event | None = None
    command: CommandResult | None = None
    """A command's end (its stream's last line)."""
    command_started: str | None = None
    """A command runs (its id): from now a kill by that id reaches it."""
    relayed: Relayed | None = None
    started: Started | None = None
    executed: Executed | None = None
    created: SessionState | None = None
    """A session made (on the channel, a ``create``'s answer)."""
    transfer: Transfer | None = None
    watched: WatchEvent | None = None
    """A watched folder's event (``SessionPort.watch_dir``'s stream; ``sync``: a marker)."""
    error: ErrorOut | None = None


class ErrorOut(BaseModel):
    """A kernel_pool error: its class's name and its message."""

    error: str
    detail: str


class Interrupted(BaseModel):
    interrupted: bool


class Written(BaseModel):
    size: int


class Killed(BaseModel):
    killed: bool


class Made(BaseModel):
    made: bool


class Move(BaseModel):
    source: str
    destination: str


class CreateContext(BaseModel):
    language: str | None = None
    cwd: str | None = None


class NodeInfo(BaseModel):
    """What a node says of itself (``GET /port/v1/info``)."""

    id: str
    profiles: list[Profile]
    stats: dict[str, int]
    image: str


def error_from(out: ErrorOut) -> KernelPoolError:
    """The node's error as the gateway raises it: the same class (so the gateway answers the
    same status and code that test for the class still work) with the node's message."""
    kind = getattr(pool_errors, out.error, None)
    if not (isinstance(kind, type) and issubclass(kind, KernelPoolError)):
        kind = KernelPoolError
    error = kind.__new__(kind)
    Exception.__init__(error, out.detail)
    return error


Frame.model_rebuild()


class SecretAsk(BaseModel):
    """The node's egress broker needs a secret for one request of ``session_id``: asked of a
    gateway on its channel (docs/secrets.md), which answers for sessions placed on that node
    whose rules name the secret, and for no other."""

    ask: int
    session_id: str
    name: str


class SecretAnswer(BaseModel):
    """A gateway's answer to :class:`SecretAsk` ``ask``: the value (None: no such secret), or
    why it is not given. The value is used for the one request and kept nowhere."""

    ask: int
    value: str | None = Field(None, repr=False)
    refused: str | None = None


class ChannelRequest(BaseModel):
    """What a gateway sends on a node's channel (one kept WebSocket per gateway and node): an
    execution to queue in ``session_id`` (``submit``) or a session to make (``create``), the
    two hot paths. ``stream`` names its frames among those of the others in flight."""

    stream: int
    session_id: str | None = None
    submit: Submit | None = None
    create: CreateSession | None = None
    trace: dict[str, str] = {}
    """The W3C trace context of the gateway's span for the hop (``traceparent``), if any."""
    answer: SecretAnswer | None = None
    """The answer to a node's :class:`SecretAsk` (alone in its message; ``stream`` 0)."""


def stream_of(raw: str | bytes) -> int | None:
    """The stream number a channel message that failed validation names, if it has one: its
    answer goes there, and the other streams in flight are not its concern."""
    try:
        stream = json.loads(raw).get("stream")
    except (ValueError, AttributeError):
        return None
    return stream if isinstance(stream, int) and not isinstance(stream, bool) else None


class ChannelFrame(BaseModel):
    """A frame of one request's stream on the channel; ``end`` on its last (or alone, after
    it)."""

    stream: int
    frame: Frame | None = None
    end: bool = False
    ask: SecretAsk | None = None
    """A node's question to the gateway (alone in its message; ``stream`` 0)."""


class SetNetwork(BaseModel):
    """A session's network policy, set on the node that runs it (its proxy runs there)."""

    policy: NetworkPolicy | None = None
