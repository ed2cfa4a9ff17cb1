"""OpenTelemetry traces, set up by the standard ``OTEL_*`` variables alone.

Without an exporter asked for (``OTEL_TRACES_EXPORTER``, or an OTLP endpoint:
``OTEL_EXPORTER_OTLP_ENDPOINT``/``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) no SDK is set up at all:
no instrumentation wraps the app, :func:`setup_tracing` answers None and the gateway skips
every span (``OTEL_SDK_DISABLED=true`` turns it off whatever else is set). With one, the
distro's configurator reads the rest the SDK's way (endpoint, protocol, headers, sampler,
resource attributes, batch settings), and the maintained instrumentations make the request
spans (ASGI, W3C ``traceparent`` continued), the database's (SQLAlchemy) and the outgoing
HTTP ones (httpx: the context travels to whatever the gateway calls, a node's agent later).

Under a request's span each execution gets ``replgate.execute``, drawn after the fact from the
marks its handle kept: ``replgate.queue`` (submitted until its turn), ``replgate.kernel.run``
(``execute_request`` sent until the kernel is idle) and one span per lifecycle action it
caused (``replgate.resume``, ``replgate.restore``, ``replgate.restart``, ``replgate.pause``).
Attributes carry ids, sizes, counts and hashes: never code, output, file contents or keys.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.sdk.trace import TracerProvider
    from sqlalchemy.engine import Engine
    from starlette.types import ASGIApp, Receive, Scope, Send

    from kernel_pool import Execution, ExecutionHandle

_SECRET_QUERY = re.compile(r"((?:^|[?&])token=)[^&#]*")
_URL_ATTRIBUTES = ("http.url", "url.full", "http.target", "url.query")
_FAILED = {"error", "timeout", "died"}
_VERSION = version("replgate")
"""The installed distribution's version, as the tracer names it (``gateway.__version__``)."""


def tracing_asked(environ: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` variables ask for spans to be exported."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


class TracingConfigError(ValueError):
    """The ``OTEL_*`` variables ask for an exporter or protocol replgate cannot export with;
    the message names the variable and what to set instead."""


_HTTP_PROTOBUF = "http/protobuf"
_EXPORTER_BY_PROTOCOL = {_HTTP_PROTOBUF: "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_EXPORTER_PACKAGE = {"otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc"}


def trace_exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters the SDK's configurator is to add to those ``OTEL_TRACES_EXPORTER`` names.

    The configurator exports nothing unless ``OTEL_TRACES_EXPORTER`` names an exporter, and an
    ``otlp`` named here would be looked up as is (only the protocol-specific names are
    installed): so with no exporter named, OTLP is asked for by its protocol's name, and the
    specification's default protocol, http/protobuf, is the one installed. Raises
    :class:`TracingConfigError` for a protocol or exporter that is not installed, before
    anything starts.
    """
    from importlib.metadata import entry_points

    installed = {point.name for point in entry_points(group="opentelemetry_traces_exporter")}
    protocol_variable = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
                         if environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                         else "OTEL_EXPORTER_OTLP_PROTOCOL")
    protocol = (environ.get(protocol_variable) or _HTTP_PROTOBUF).strip()
    named = [name.strip() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",")
             if name.strip() and name.strip().lower() != "none"]
    wanted = named or ["otlp"]
    if "otlp" in wanted and protocol not in _EXPORTER_BY_PROTOCOL:
        raise TracingConfigError(
            f"{protocol_variable}={protocol!r} is not a protocol replgate can export "
            f"traces with: set it to {_HTTP_PROTOBUF} (the default) or leave it unset")
    resolved = [_EXPORTER_BY_PROTOCOL[protocol] if name == "otlp" else name for name in wanted]
    for name in resolved:
        if name not in installed:
            package = _EXPORTER_PACKAGE.get(name, f"the package registering {name!r}")
            raise TracingConfigError(
                f"traces exporter {name!r} is not installed (it needs {package}); replgate "
                f"exports OTLP over {_HTTP_PROTOBUF}: set OTEL_EXPORTER_OTLP_PROTOCOL="
                f"{_HTTP_PROTOBUF} or leave it unset")
    return [] if named else resolved


_tracing: Tracing | None = None


def setup_tracing() -> Tracing | None:
    """The process's tracing, set up on the first call if the environment asks for it."""
    global _tracing
    if _tracing is None and tracing_asked(os.environ):
        from opentelemetry.distro import OpenTelemetryConfigurator

        names = trace_exporter_names(os.environ)
        if not any(os.environ.get(f"OTEL_EXPORTER_OTLP{part}_PROTOCOL")
                   for part in ("", "_TRACES")):
            # The configurator, reading OTEL_TRACES_EXPORTER=otlp itself, takes gRPC for it
            # without a protocol; the specification's default is http/protobuf.
            os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = _HTTP_PROTOBUF
        OpenTelemetryConfigurator().configure(  # type: ignore[no-untyped-call]
            trace_exporter_names=names)
        provider = trace.get_tracer_provider()
        _tracing = Tracing(provider)  # type: ignore[arg-type]
        if _tracing.wanted("httpx"):
            from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

            HTTPXClientInstrumentor().instrument(tracer_provider=_tracing.provider,
                                                 meter_provider=_tracing.meter_provider)
    return _tracing


def _hide_keys(span: trace.Span, scope: dict[str, Any]) -> None:
    """Browsers' WebSockets send the API key as ``?token=``: the URL attributes lose it."""
    if b"token=" not in scope.get("query_string", b""):
        return
    attributes = getattr(span, "attributes", None) or {}
    for name in _URL_ATTRIBUTES:
        value = attributes.get(name)
        if isinstance(value, str):
            span.set_attribute(name, _SECRET_QUERY.sub(r"\1REDACTED", value))


SOCKET_SEND = "replgate.socket_send"
"""The scope key of a WebSocket's own ``send``, from outside the ASGI instrumentation."""


class _FramesPast:
    """Outermost: a WebSocket's ``send`` as the server gave it, kept in the scope under
    :data:`SOCKET_SEND` for its data frames (gateway/routers/ws.py). The instrumentation's
    wrapper sets the connection span's status code again on every frame sent, tens of
    microseconds on each event an execution streams; the accept and the close still go through
    it and set the span as they should."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            scope[SOCKET_SEND] = send
        await self.app(scope, receive, send)


def code_digest(code: str) -> str:
    """The SHA-256 of the code as the audit log records it (hex)."""
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


class Tracing:
    """The gateway's spans, on the SDK's tracer provider."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("replgate", _VERSION)
        self._disabled = {name.strip() for name in
                          os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")}
        # The instrumentations' metrics only where OTEL_METRICS_EXPORTER sends them somewhere
        # (replgate's own are Prometheus's, on /metrics): the SDK's meter with no reader
        # still does each measurement's work, four pool measurements per execution.
        exporter = os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower()
        self.meter_provider: metrics.MeterProvider = (
            metrics.get_meter_provider() if exporter not in ("", "none")
            else metrics.NoOpMeterProvider())

    def wanted(self, instrumentation: str) -> bool:
        """Whether an instrumentation is on: ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` names
        those to leave out, as for ``opentelemetry-instrument`` (``sqlalchemy``: eight
        spans fewer per execution, see docs/observability.md)."""
        return instrumentation not in self._disabled

    def instrument_app(self, app: FastAPI) -> None:
        """A span per request and WebSocket (none per message sent or received), continuing
        the caller's ``traceparent``."""
        if not self.wanted("fastapi"):
            return
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app, tracer_provider=self.provider,
                                           meter_provider=self.meter_provider,
                                           server_request_hook=_hide_keys,
                                           exclude_spans=["receive", "send"])
        instrumented = app.build_middleware_stack

        def build_middleware_stack() -> ASGIApp:
            return _FramesPast(instrumented())

        app.build_middleware_stack = build_middleware_stack  # type: ignore[method-assign]

    def instrument_engine(self, engine: Engine) -> None:
        """A span per SQL statement (its text with placeholders, never the values)."""
        if not self.wanted("sqlalchemy"):
            return
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

        # Its declared range stops below SQLAlchemy 2.1, whose engine events it hooks are
        # unchanged; the tracing tests check that its spans arrive.
        SQLAlchemyInstrumentor().instrument(engine=engine, tracer_provider=self.provider,
                                            meter_provider=self.meter_provider,
                                            skip_dep_check=True)

    def start_execution(self, tenant: str, session_id: str, code: str,
                        carrier: Mapping[str, str] | None = None) -> trace.Span:
        """``replgate.execute`` from now (its submission follows, under it: the call to a
        node that runs it is its child), under the current span, or under the trace a W3C
        ``carrier`` (``traceparent``, ``tracestate``) names."""
        parent: Context | None = propagate.extract(carrier) if carrier else None
        return self.tracer.start_span(
            "replgate.execute", context=parent,
            attributes={"replgate.session_id": session_id, "replgate.tenant": tenant,
                        "replgate.code.bytes": len(code.encode("utf-8", "replace")),
                        "replgate.code.sha256": code_digest(code)})

    @staticmethod
    def submitted(span: trace.Span, handle: ExecutionHandle) -> None:
        """What the submission made of the execution: its id, language and timeout."""
        span.set_attributes({"replgate.execution_id": handle.id,
                             "replgate.language": handle.language,
                             "replgate.timeout_s": handle.timeout_s})

    @staticmethod
    def refused(span: trace.Span, exc: BaseException) -> None:
        """The submission was refused: the span ends with the error's kind (its message
        may quote the request)."""
        span.set_status(trace.StatusCode.ERROR, type(exc).__name__)
        span.end()

    def end_execution(self, span: trace.Span, handle: ExecutionHandle,
                      execution: Execution) -> None:
        """Its outcome (sizes and counts), its child spans from the handle's marks, its end."""
        if not span.is_recording():  # sampled out: so are its children
            span.end()
            return
        status = execution.status.value
        span.set_attributes({
            "replgate.status": status,
            "replgate.execution_count": execution.execution_count or 0,
            "replgate.events": len(handle.events),
            "replgate.stdout.bytes": len(execution.stdout.encode("utf-8", "replace")),
            "replgate.stderr.bytes": len(execution.stderr.encode("utf-8", "replace")),
            "replgate.outputs": len(execution.outputs),
            "replgate.files_changed": len(execution.files),
            "replgate.truncated": execution.truncated,
            "replgate.restarted": execution.restarted,
            "replgate.caused": [action.kind for action in handle.actions]})
        if status in _FAILED:
            span.set_status(trace.StatusCode.ERROR, status)
        self.draw_run(trace.set_span_in_context(span), handle)
        span.end(end_time=handle.done_ns)

    def draw_run(self, under: Context, handle: ExecutionHandle) -> None:
        """The execution's child spans from its handle's marks, under ``under``: its queue,
        the lifecycle actions it caused and its run in the kernel (on a node, under the
        node's request span; the gateway draws what its side of the hop saw)."""
        if handle.dequeued_ns is not None:
            self._child("replgate.queue", under, handle.submitted_ns, handle.dequeued_ns)
        # Actions nest by time (a restore inside its resume, another session's pause inside
        # the resume that needed its slot): each goes under the latest one that holds it.
        opened: list[tuple[int, Context]] = []
        for action in sorted(handle.actions, key=lambda a: (a.start_ns, -a.end_ns)):
            while opened and opened[-1][0] < action.end_ns:
                opened.pop()
            child = self._child(f"replgate.{action.kind}", opened[-1][1] if opened else under,
                                action.start_ns, action.end_ns, failed=action.failed)
            opened.append((action.end_ns, trace.set_span_in_context(child)))
        run = handle.run
        if run is not None and run.sent_ns is not None:
            self._child("replgate.kernel.run", under, run.sent_ns,
                        run.idle_ns or handle.done_ns or run.sent_ns)

    def _child(self, name: str, parent: Context, start_ns: int, end_ns: int,
               failed: bool = False) -> trace.Span:
        child = self.tracer.start_span(name, context=parent, start_time=start_ns)
        if failed:
            child.set_status(trace.StatusCode.ERROR, f"{name} failed")
        child.end(end_time=max(start_ns, end_ns))
        return child

    @contextmanager
    def lifecycle(self, name: str, tenant: str, session_id: str) -> Iterator[trace.Span]:
        """A span for a pause, resume, restart or fork asked for by a request."""
        with self.tracer.start_as_current_span(
                name, attributes={"replgate.session_id": session_id,
                                  "replgate.tenant": tenant}) as span:
            yield span

    def flush(self) -> None:
        """Export what the batch holds (the gateway stops: the process may not last)."""
        self.provider.force_flush()


def log_ids() -> dict[str, str]:
    """The current span's trace and span ids (hex, as trace viewers show them), if any."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": format(context.trace_id, "032x"),
            "span_id": format(context.span_id, "016x")}
