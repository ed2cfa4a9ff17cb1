"""The caller's W3C trace context, sent so that the gateway's spans join the caller's trace.

The client depends on no tracing library: a caller with a current span has imported
OpenTelemetry already, so nothing is imported unless it is loaded, and without
``opentelemetry-api`` (or without a current span) nothing is sent.
"""

from __future__ import annotations

import sys

W3C_FIELDS = ("traceparent", "tracestate")


def trace_headers() -> dict[str, str]:
    """The global propagator's headers (``traceparent``, ``tracestate``, any other it is set to
    send) for the caller's current span; empty without one."""
    if "opentelemetry.trace" not in sys.modules:
        return {}
    try:
        from opentelemetry import propagate, trace
    except ImportError:  # a half-installed package: tracing is the caller's, not ours to fail
        return {}
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def trace_fields() -> dict[str, str]:
    """:func:`trace_headers`' W3C trace context alone, for a WebSocket message."""
    return {key: value for key, value in trace_headers().items() if key in W3C_FIELDS}
