"""The OpenTelemetry configurations users write, each set up in a process of its own (the SDK's
set-up is once per process) and exporting a span to a real OTLP/HTTP receiver, or refused at
start with a sentence."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from common.tracing import TracingConfigError, trace_exporter_names
from tests.otlp_receiver import OtlpReceiver

EXPORT_ONE_SPAN = textwrap.dedent("""
    from opentelemetry import trace
    from common.tracing import setup_tracing
    tracing = setup_tracing()
    assert tracing is not None
    with trace.get_tracer("test").start_as_current_span("configured"):
        pass
    tracing.provider.force_flush()
""")


def _run(env: dict[str, str], code: str = EXPORT_ONE_SPAN) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("variables", [
    {},
    {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
    {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
    {"OTEL_TRACES_EXPORTER": "otlp"},
    {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
], ids=["endpoint-only", "protocol", "traces-protocol", "exporter-otlp", "exporter-and-protocol"])
def test_documented_configurations_export_spans(variables: dict[str, str]) -> None:
    with OtlpReceiver() as receiver:
        done = _run({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                     "OTEL_TRACES_SAMPLER": "always_on", **variables})
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 10
        while not any(span.name == "configured" for span in receiver.snapshot()):
            assert time.monotonic() < deadline, "the span never reached the receiver"
            time.sleep(0.05)


@pytest.mark.parametrize(("variables", "says"), [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "opentelemetry-exporter-otlp-proto-grpc"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "not a protocol replgate can export"),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "traces exporter 'zipkin' is not installed"),
])
def test_what_cannot_export_is_refused_with_a_sentence(variables: dict[str, str],
                                                        says: str) -> None:
    with pytest.raises(TracingConfigError, match=re.escape(says)):
        trace_exporter_names({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", **variables})


def test_serve_stops_at_start_with_the_sentence(tmp_path: Path) -> None:
    clean = {key: value for key, value in os.environ.items()
             if not key.startswith(("OTEL_", "REPLGATE_"))}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "0"],
        env={**clean, "REPLGATE_STATE_DIR": str(tmp_path),
             "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
             "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "opentelemetry-exporter-otlp-proto-grpc" in done.stderr
    assert "Traceback" not in done.stderr
