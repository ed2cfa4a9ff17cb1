"""A real OTLP/HTTP trace receiver on 127.0.0.1, for tests and bench/tracing.py.

The OpenTelemetry Collector cannot be installed here, so this stands in for it: it accepts
``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest`` (gzip or not), decodes it with
``opentelemetry-proto`` and keeps every span, and every raw body (to search for what must never
be exported). The tests run it in a thread of theirs; ``python -m tests.otlp_receiver`` runs it
(``names_only``) in a process of its own, as a collector runs (bench/tracing.py: a receiver
decoding spans in the measuring process would take the GIL from the client it times). That
process prints its endpoint, and when its standard input closes, the names of the spans it
decoded (JSON).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass
class ReceivedSpan:
    """One exported span, decoded (ids in hex; ``parent_span_id`` empty for a root)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    kind: int
    status_code: int
    attributes: dict[str, Any]
    events: list[str]
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""


class OtlpReceiver:
    """``with OtlpReceiver() as receiver``: its :attr:`endpoint` for
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; :attr:`spans` and :attr:`bodies` as they arrive.

    ``names_only``: each export is parsed (protobuf's C decoder) and only the span names are
    kept, in :attr:`names`, at about the cost of a collector's decoding, not of building
    Python objects for every attribute (bench/tracing.py: the receiver shares the machine's
    two cores with what it measures).
    """

    def __init__(self, names_only: bool = False) -> None:
        self.spans: list[ReceivedSpan] = []
        self.names: list[str] = []
        self.bodies: list[bytes] = []
        self.requests = 0
        self._names_only = names_only
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._keep(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test's output is for its own failures

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="otlp-receiver")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _keep(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        if self._names_only:
            names = [span.name for resource_spans in request.resource_spans
                     for scope_spans in resource_spans.scope_spans for span in scope_spans.spans]
            with self._lock:
                self.requests += 1
                self.names.extend(names)
            return
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(ReceivedSpan(
                        name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                        kind=span.kind, status_code=span.status.code,
                        attributes=_attributes(span.attributes),
                        events=[event.name for event in span.events], resource=resource,
                        scope=scope_spans.scope.name))
        with self._lock:
            self.requests += 1
            self.bodies.append(body)
            self.spans.extend(spans)
            self.names.extend(span.name for span in spans)

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    async def wait_for(self, found: Callable[[list[ReceivedSpan]], bool],
                       timeout_s: float = 20.0) -> list[ReceivedSpan]:
        """Every span so far, once ``found`` says they hold what the caller waits for."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.snapshot()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({span.name for span in spans})
                raise AssertionError(f"not exported within {timeout_s} s; spans so far: {names}")
            await asyncio.sleep(0.1)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


if __name__ == "__main__":
    with OtlpReceiver(names_only=True) as receiver:
        print(receiver.endpoint, flush=True)
        sys.stdin.read()
    print(json.dumps({"requests": receiver.requests, "names": receiver.names}), flush=True)
