"""envd's ``process.Process`` messages in their ProtoJSON form (``bytes`` fields are base64)."""

from __future__ import annotations

from pydantic import Field

from gateway.e2b._connect import Empty, ProtoJSON


class ProcessConfig(ProtoJSON):
    cmd: str = ""
    args: list[str] = Field(default_factory=list)
    envs: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class ProcessSelector(ProtoJSON):
    pid: int | None = None
    tag: str | None = None


class PtySizeMessage(ProtoJSON):
    cols: int = 0
    rows: int = 0


class Pty(ProtoJSON):
    size: PtySizeMessage | None = None


class StartRequest(ProtoJSON):
    process: ProcessConfig = ProcessConfig()
    pty: Pty | None = None
    tag: str | None = None
    stdin: bool | None = None


class ConnectRequest(ProtoJSON):
    process: ProcessSelector = ProcessSelector()


class SignalRequest(ProtoJSON):
    process: ProcessSelector = ProcessSelector()
    signal: str | int = "SIGNAL_UNSPECIFIED"


class UpdateRequest(ProtoJSON):
    process: ProcessSelector = ProcessSelector()
    pty: Pty | None = None


class ProcessInput(ProtoJSON):
    stdin: str | None = None
    pty: str | None = None


class SendInputRequest(ProtoJSON):
    process: ProcessSelector = ProcessSelector()
    input: ProcessInput = ProcessInput()


class CloseStdinRequest(ProtoJSON):
    process: ProcessSelector = ProcessSelector()


class StreamInputStart(ProtoJSON):
    process: ProcessSelector = ProcessSelector()


class StreamInputData(ProtoJSON):
    input: ProcessInput = ProcessInput()


class StreamInputRequest(ProtoJSON):
    start: StreamInputStart | None = None
    data: StreamInputData | None = None
    keepalive: Empty | None = None


class StartEvent(ProtoJSON):
    pid: int


class DataEvent(ProtoJSON):
    """One chunk of output."""

    stdout: str | None = None
    stderr: str | None = None
    pty: str | None = None


class EndEvent(ProtoJSON):
    exit_code: int
    exited: bool
    status: str
    error: str | None = None


class ProcessEvent(ProtoJSON):
    start: StartEvent | None = None
    data: DataEvent | None = None
    end: EndEvent | None = None
    keepalive: Empty | None = None


class EventResponse(ProtoJSON):
    """``StartResponse`` and ``ConnectResponse`` alike."""

    event: ProcessEvent


class ProcessInfo(ProtoJSON):
    config: ProcessConfig
    pid: int
    tag: str | None = None


class ListResponse(ProtoJSON):
    processes: list[ProcessInfo]
