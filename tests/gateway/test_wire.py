"""The wire models: one module the server and the client share, light enough for any agent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import gateway.wire as wire
from gateway.client import SessionInfo
from kernel_pool import DoneEvent, ExecutionStatus, StreamEvent

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = {"docker", "zmq", "fastapi", "starlette", "aiosqlite", "mcp", "jupyter_client",
               "uvicorn"}


@pytest.mark.parametrize("module", ["gateway.wire", "gateway.client", "gateway.cli"])
def test_import_loads_none_of_the_servers_dependencies(module: str) -> None:
    code = f"import {module}, json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=60)
    loaded = {name.split(".")[0] for name in json.loads(done.stdout.splitlines()[-1])}
    assert loaded & SERVER_ONLY == set()


def test_core_install_pulls_none_of_the_servers_dependencies() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=\[ ]", r, maxsplit=1)[0].lower() for r in requirements}

    core = names(project["dependencies"])
    assert core & {"docker", "pyzmq", "mcp", "jupyter_client", "fastapi", "aiosqlite"} == set()
    assert {"httpx", "pydantic", "websockets"} <= core
    assert "replgate[pool,mcp]" in project["optional-dependencies"]["serve"]


def test_all_is_sorted_and_resolves() -> None:
    # isort's order, as ruff keeps it: constants, then classes, then functions
    assert wire.__all__ == sorted(wire.__all__, key=lambda name: (
        0 if name.isupper() else 1 if name[0].isupper() else 2, name))
    for name in wire.__all__:
        assert getattr(wire, name) is not None


def test_event_frame_is_the_event_flat_with_its_execution_id() -> None:
    event = StreamEvent(type="stdout", text="hi\n")

    text = wire.EventFrame(execution_id="e1", event=event).text()

    assert json.loads(text) == {"type": "stdout", "text": "hi\n", "execution_id": "e1"}
    assert wire.EventFrame.model_validate_json(text).event == event


def test_event_frame_reads_a_done_event() -> None:
    frame = wire.EventFrame.model_validate({
        "type": "done", "status": "ok", "execution_count": 3, "duration_ms": 1.5,
        "execution_id": "e2"})

    assert frame.execution_id == "e2"
    assert isinstance(frame.event, DoneEvent) and frame.event.status is ExecutionStatus.OK


def test_event_types_name_every_event() -> None:
    expected = {"stdout", "stderr", "display", "result", "update_display", "clear_output",
                "error", "done", "pending_approval", "approval"}
    assert expected == wire.EVENT_TYPES
    assert isinstance(wire.EventFrame.model_validate(
        {"type": "clear_output", "execution_id": "e"}).event, wire.ClearOutputEvent)


def test_server_frames_carry_their_type() -> None:
    frames = [wire.RejectedFrame(execution_id=None, status_code=422, detail="bad"),
              wire.InterruptedFrame(interrupted=True), wire.HistoryEndFrame(),
              wire.LaggedFrame(detail="behind"),
              wire.ExecutionStartFrame(execution_id="e", code="1", started_at=None)]

    types = [json.loads(frame.text())["type"] for frame in frames]

    assert types == ["rejected", "interrupted", "history_end", "lagged", "execution"]


def test_client_reads_sessions_with_the_servers_model() -> None:
    assert SessionInfo is wire.SessionOut
    info = SessionInfo.model_validate({
        "id": "s", "tenant": "t", "profile": "default", "status": "a-state-from-the-future",
        "execution_count": 0, "created_at": "2024-05-01T12:00:00Z",
        "last_active_at": "2024-05-01T12:00:00Z"})
    assert info.status == "a-state-from-the-future"
