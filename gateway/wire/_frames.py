"""WebSocket server frames: what the gateway sends on the session and watch sockets. An
execution's events are kernel_pool's models, each carried flat with the execution's id
(:class:`EventFrame`).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from kernel_pool import CommandDone, Event, StreamEvent

EVENT_TYPES: frozenset[str] = frozenset(
    kind for model in get_args(get_args(Event)[0])
    for kind in get_args(model.model_fields["type"].annotation))
"""Every event ``type`` (``stdout``, ..., ``done``); a client skips frames of other types,
which a newer gateway may send."""


class Frame(BaseModel):
    """A message the gateway sends on a WebSocket."""

    def text(self) -> str:
        """The frame as the socket carries it: one JSON text message."""
        return self.model_dump_json()


class EventFrame(Frame):
    """An execution's event: the event's own fields plus ``execution_id`` (flat on the wire)."""

    execution_id: str
    event: Event

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, value: Any) -> Any:
        if isinstance(value, dict) and "event" not in value:
            fields = dict(value)
            return {"execution_id": fields.pop("execution_id", None), "event": fields}
        return value

    @model_serializer(mode="wrap")
    def _flatten(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        nested = handler(self)
        return {**nested["event"], "execution_id": nested["execution_id"]}


class CommandFrame(Frame):
    """A shell command's event on the session socket, flat: ``stdout``/``stderr`` or its
    ``done`` (with ``exit_code``), plus the command's id as ``execution_id`` and ``command_id``."""

    command_id: str
    event: StreamEvent | CommandDone

    @model_serializer(mode="wrap")
    def _flatten(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        nested = handler(self)
        return {**nested["event"], "execution_id": self.command_id,
                "command_id": self.command_id}


class CommandKilledFrame(Frame):
    """The answer to ``{"type": "kill_command", "id"}``: whether that command was running."""

    type: Literal["command_killed"] = "command_killed"
    execution_id: str
    command_id: str
    killed: bool


class RejectedFrame(Frame):
    """A request on the session socket that was refused instead of run; ``status_code`` is
    what the HTTP API would have answered."""

    type: Literal["rejected"] = "rejected"
    execution_id: str | None
    status_code: int
    detail: Any


class InterruptedFrame(Frame):
    """The answer to ``{"type": "interrupt"}``: whether something was running."""

    type: Literal["interrupted"] = "interrupted"
    execution_id: None = None
    interrupted: bool


class ExecutionStartFrame(Frame):
    """On the watch socket: an execution began (its events follow as :class:`EventFrame`)."""

    type: Literal["execution"] = "execution"
    execution_id: str
    code: str
    started_at: str | None


class HistoryEndFrame(Frame):
    """On the watch socket: the history is sent; what follows is live."""

    type: Literal["history_end"] = "history_end"


class LaggedFrame(Frame):
    """On the watch socket: the watcher fell behind and is disconnected; reconnect."""

    type: Literal["lagged"] = "lagged"
    detail: str


class TransferFrame(Frame):
    """On the session and watch sockets: a pause or resume of the session moving its
    variables, for a progress bar. Sent as it starts, at most every 250 ms while its bytes
    advance, and once at its end (``state`` done or failed)."""

    type: Literal["transfer"] = "transfer"
    execution_id: str | None = Field(
        None, description="the execution whose start resumed the paused session (its output "
        "follows); null for a pause, or a resume asked by itself")
    operation: Literal["pause", "resume"]
    state: Literal["running", "done", "failed"] = Field(
        description="done: every byte moved (done_bytes == total_bytes); failed: the session "
        "runs on, or stays paused, restorable (its reason says why)")
    done_bytes: int
    total_bytes: int = Field(description="as the Session's transfer says; 0 when not known")
