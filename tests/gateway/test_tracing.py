"""OpenTelemetry traces from a real gateway process, configured by the OTEL_* variables alone,
exported over OTLP/HTTP to a real receiver (tests/otlp_receiver.py) and decoded there."""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
from collections.abc import AsyncIterator, Iterator

import docker
import httpx
import httpx2
import pytest
import websockets
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from opentelemetry import metrics, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from common.tracing import Tracing
from gateway.client import AsyncSandbox
from tests.conftest import GatewayProcess, make_gateway, running_gateway
from tests.gateway.test_mcp import stdio_config
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

SERVER = 2  # SpanKind.SERVER in OTLP


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as otlp:
        yield otlp


@pytest.fixture(scope="module")
def traced(docker_client: docker.DockerClient, receiver: OtlpReceiver,
           ) -> Iterator[GatewayProcess]:
    process = make_gateway(log_json="true")
    process.env.update({
        # The protocol as docs/observability.md writes it (it once stopped the gateway).
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "replgate-test",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test"})
    with running_gateway(docker_client, process) as gateway:
        yield gateway


@pytest.fixture
async def client(traced: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=traced.url, headers=traced.headers(),
                                 timeout=120) as http:
        yield http


@pytest.fixture
async def session_id(client: httpx.AsyncClient) -> AsyncIterator[str]:
    answer = await client.post("/v1/sessions", json={})
    assert answer.status_code == 201, answer.text
    yield answer.json()["id"]
    await client.delete(f"/v1/sessions/{answer.json()['id']}")


def new_trace() -> tuple[str, str, str]:
    """A caller's trace id, span id and W3C ``traceparent`` (sampled)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def only(spans: list[ReceivedSpan], name: str, **where: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name
             and all(getattr(s, key) == value for key, value in where.items())]
    assert len(found) == 1, (name, where, [(s.name, s.parent_span_id) for s in spans])
    return found[0]


def within(child: ReceivedSpan, parent: ReceivedSpan) -> bool:
    return parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns


async def test_execution_spans_continue_the_callers_trace(
        receiver: OtlpReceiver, client: httpx.AsyncClient, session_id: str) -> None:
    trace_id, caller, traceparent = new_trace()
    code = "x = 6 * 7\nprint(x)"
    answer = await client.post(f"/v1/sessions/{session_id}/execute", json={"code": code},
                               headers={"traceparent": traceparent})
    assert answer.json()["stdout"] == "42\n"

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = {s.name for s in spans if s.trace_id == trace_id}
        return {"replgate.execute", "replgate.queue", "replgate.kernel.run",
                "POST /v1/sessions/{session_id}/execute"} <= names

    spans = [s for s in await receiver.wait_for(complete) if s.trace_id == trace_id]
    request = only(spans, "POST /v1/sessions/{session_id}/execute", kind=SERVER)
    assert request.parent_span_id == caller  # the client's trace, continued
    assert request.resource["service.name"] == "replgate-test"
    assert request.resource["deployment.environment.name"] == "test"
    execute = only(spans, "replgate.execute")
    assert execute.parent_span_id == request.span_id
    assert within(execute, request)
    assert execute.attributes["replgate.session_id"] == session_id
    assert execute.attributes["replgate.tenant"] == "alpha"
    assert execute.attributes["replgate.status"] == "ok"
    assert execute.attributes["replgate.language"] == "python"
    assert execute.attributes["replgate.code.bytes"] == len(code)
    assert execute.attributes["replgate.code.sha256"] == hashlib.sha256(code.encode()).hexdigest()
    assert execute.attributes["replgate.stdout.bytes"] == 3
    queue = only(spans, "replgate.queue")
    run = only(spans, "replgate.kernel.run")
    for child in (queue, run):
        assert child.parent_span_id == execute.span_id
        assert within(child, execute)
    assert queue.end_ns <= run.start_ns
    # The execution's recording (history, audit) is in the trace too: SQLAlchemy's spans.
    assert any(s.scope.endswith("sqlalchemy") for s in spans), {s.scope for s in spans}


async def test_execution_on_a_paused_session_shows_the_resume_it_caused(
        receiver: OtlpReceiver, client: httpx.AsyncClient, session_id: str) -> None:
    await client.post(f"/v1/sessions/{session_id}/execute", json={"code": "kept = 1"})
    pause_trace, _, pause_parent = new_trace()
    answer = await client.post(f"/v1/sessions/{session_id}/pause",
                               headers={"traceparent": pause_parent})
    assert answer.json()["status"] == "paused"
    trace_id, _, traceparent = new_trace()
    answer = await client.post(f"/v1/sessions/{session_id}/execute",
                               json={"code": "print(kept)"}, headers={"traceparent": traceparent})
    assert answer.json()["stdout"] == "1\n"

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = {(s.trace_id, s.name) for s in spans}
        return {(trace_id, "replgate.resume"), (pause_trace, "replgate.pause"),
                (pause_trace, "POST /v1/sessions/{session_id}/pause")} <= names

    spans = await receiver.wait_for(complete)
    pause = only(spans, "replgate.pause", trace_id=pause_trace)
    assert pause.attributes["replgate.session_id"] == session_id
    assert pause.parent_span_id == only(spans, "POST /v1/sessions/{session_id}/pause",
                                        trace_id=pause_trace).span_id
    execute = only(spans, "replgate.execute", trace_id=trace_id)
    resume = only(spans, "replgate.resume", trace_id=trace_id)
    assert resume.parent_span_id == execute.span_id
    assert within(resume, execute)
    assert execute.attributes["replgate.caused"][0] == "resume"
    run = only(spans, "replgate.kernel.run", trace_id=trace_id)
    assert resume.end_ns <= run.start_ns  # the code ran once the session was back
    for restore in [s for s in spans if s.trace_id == trace_id and s.name == "replgate.restore"]:
        assert restore.parent_span_id == resume.span_id  # a memory pause's image, in its resume


async def test_python_client_sends_the_current_span_over_websocket_and_http(
        receiver: OtlpReceiver, traced: GatewayProcess) -> None:
    trace_id, caller, _ = new_trace()
    context = SpanContext(int(trace_id, 16), int(caller, 16), is_remote=False,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED))
    sandbox = await AsyncSandbox.create(base_url=traced.url, api_key=traced.keys["alpha"])
    try:
        untraced = await sandbox.run_code("1 + 1")  # no current span: no traceparent sent
        assert untraced.status == "ok"
        with trace.use_span(NonRecordingSpan(context)):  # opentelemetry-api alone
            execution = await sandbox.run_code("2 + 2")
            await sandbox.files.write("traced.txt", b"written")
        assert execution.status == "ok"
    finally:
        await sandbox.close()

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = {s.name for s in spans if s.trace_id == trace_id}
        sockets = any(s.name.endswith("/v1/sessions/{session_id}/ws") for s in spans)
        return sockets and {"replgate.execute",
                            "PUT /v1/sessions/{session_id}/files/{path:path}"} <= names

    spans = await receiver.wait_for(complete)
    execute = only(spans, "replgate.execute", trace_id=trace_id)
    assert execute.parent_span_id == caller  # the WebSocket message's own trace context
    upload = only(spans, "PUT /v1/sessions/{session_id}/files/{path:path}", trace_id=trace_id)
    assert upload.parent_span_id == caller
    executions = [s for s in spans if s.name == "replgate.execute"
                  and s.attributes["replgate.session_id"] == sandbox.session_id]
    assert len(executions) == 2
    first = next(s for s in executions if s.trace_id != trace_id)
    socket = next(s for s in spans if s.span_id == first.parent_span_id)
    assert socket.kind == SERVER and socket.name.endswith("/v1/sessions/{session_id}/ws")


async def test_no_span_carries_code_output_files_env_headers_or_keys(
        receiver: OtlpReceiver, traced: GatewayProcess, client: httpx.AsyncClient) -> None:
    canary = {name: f"CANARY{name}{secrets.token_hex(6)}"
              for name in ("code", "output", "file", "env", "header")}
    answer = await client.post("/v1/sessions", json={"env": {"SECRET_VALUE": canary["env"]}},
                               headers={"X-Canary": canary["header"]})
    sid = answer.json()["id"]
    try:
        # The output's canary is made by the code, so the code holds it only reversed.
        code = (f"import os\nprint({canary['output'][::-1]!r}[::-1], "
                f"os.environ['SECRET_VALUE'])\nnote = {canary['code']!r}")
        trace_id, _, traceparent = new_trace()
        answer = await client.post(f"/v1/sessions/{sid}/execute", json={"code": code},
                                   headers={"traceparent": traceparent,
                                            "X-Canary": canary["header"]})
        assert canary["output"] in answer.json()["stdout"]
        assert canary["env"] in answer.json()["stdout"]
        await client.put(f"/v1/sessions/{sid}/files/notes.txt", content=canary["file"].encode(),
                         headers={"X-Canary": canary["header"]})
        assert (await client.get(f"/v1/sessions/{sid}/files/notes.txt")).text == canary["file"]
        # A browser's WebSocket sends the key in the URL.
        url = (f"{traced.url.replace('http', 'ws')}/v1/sessions/{sid}/ws"
               f"?token={traced.keys['alpha']}")
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "execute", "id": "canary-ws", "code": code}))
            while json.loads(await ws.recv()).get("type") != "done":
                pass
    finally:
        await client.delete(f"/v1/sessions/{sid}")

    def complete(spans: list[ReceivedSpan]) -> bool:
        ids = {s.attributes.get("replgate.execution_id") for s in spans}
        socket = [s for s in spans if "token=REDACTED" in json.dumps(s.attributes)]
        return (any(s.trace_id == trace_id and s.name == "replgate.execute" for s in spans)
                and "canary-ws" in ids and bool(socket)
                and any("DELETE" in s.name for s in spans))

    await receiver.wait_for(complete)
    exported = b"".join(receiver.bodies)
    for name, value in canary.items():
        assert value.encode() not in exported, f"the {name} canary was exported"
    for key in traced.keys.values():
        assert key.encode() not in exported, "an API key was exported"


async def test_json_log_lines_carry_the_trace_and_span_ids(
        receiver: OtlpReceiver, traced: GatewayProcess, client: httpx.AsyncClient,
        session_id: str) -> None:
    trace_id, _, traceparent = new_trace()
    # A daemon the code leaves behind is killed after it, and the gateway logs that.
    answer = await client.post(f"/v1/sessions/{session_id}/execute",
                               json={"code": "import os\nos.system('sleep 300 &')"},
                               headers={"traceparent": traceparent})
    assert answer.json()["reaped"] == 1, answer.json()
    spans = await receiver.wait_for(lambda spans: any(
        s.trace_id == trace_id and s.kind == SERVER for s in spans))
    ids = {s.span_id for s in spans if s.trace_id == trace_id}
    lines = [json.loads(line) for line in traced.log_path.read_text().splitlines()
             if line.startswith("{")]
    reaped = [line for line in lines if "left behind" in line["message"]
              and line.get("trace_id") == trace_id]
    assert reaped, lines[-5:]
    assert all(line["span_id"] in ids for line in reaped)


@pytest.mark.parametrize("carried_by", ["http_header", "meta", "stdio_meta"])
async def test_an_mcp_tool_call_continues_the_callers_trace(
        receiver: OtlpReceiver, traced: GatewayProcess, carried_by: str) -> None:
    trace_id, caller, traceparent = new_trace()
    meta = None if carried_by == "http_header" else {"traceparent": traceparent}
    async with contextlib.AsyncExitStack() as stack:
        if carried_by == "stdio_meta":  # the stdio server calls the gateway with the client
            opened = Client(StdioServerParameters(**stdio_config(traced)))
        else:
            headers = traced.headers() | ({"traceparent": traceparent} if meta is None else {})
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)))
            opened = Client(streamable_http_client(f"{traced.url}/mcp", http_client=http))
        client = await stack.enter_async_context(opened)
        result = await client.call_tool("execute_python", {"code": "6 * 7"}, meta=meta)
    assert not result.is_error and "42" in str(result.content), result

    def complete(spans: list[ReceivedSpan]) -> bool:
        return any(s.name == "replgate.execute" and s.trace_id == trace_id for s in spans)

    spans = await receiver.wait_for(complete)
    # (from stdio: the client's WebSocket message carries the caller's span, as sent)
    assert only(spans, "replgate.execute", trace_id=trace_id).parent_span_id == caller


def test_instrumentations_measure_nothing_unless_metrics_are_exported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK's configurator sets a meter with no reader even then: measuring on it is work
    # for nobody (a pool checkout and checkin per SQL connection).
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    assert isinstance(Tracing(TracerProvider()).meter_provider, metrics.NoOpMeterProvider)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert isinstance(Tracing(TracerProvider()).meter_provider, metrics.NoOpMeterProvider)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    assert Tracing(TracerProvider()).meter_provider is metrics.get_meter_provider()
