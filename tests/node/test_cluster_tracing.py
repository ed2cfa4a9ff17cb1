"""Traces across the hop: a gateway and a node (separate processes, mutual TLS, PostgreSQL),
both set up by the OTEL_* variables, exporting to one real OTLP/HTTP receiver."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from cluster_support import NODE_TIMEOUT_S, NodeProcess, make_node

from node.tls import ClusterCerts, client_context, make_cluster_certs
from tests.conftest import (
    GatewayProcess,
    containers_of,
    create_database,
    drop_database,
    make_gateway,
    running_gateway,
    unmount_all,
)
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

CLIENT = 3  # SpanKind.CLIENT in OTLP


def _otel(receiver: OtlpReceiver, service: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": service,
            "OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as otlp:
        yield otlp


@pytest.fixture(scope="module")
def traced(docker_client: docker.DockerClient, receiver: OtlpReceiver,
           ) -> Iterator[tuple[GatewayProcess, NodeProcess, ClusterCerts]]:
    database_url = create_database()
    certs_dir = Path(tempfile.mkdtemp(prefix="rg-certs-", dir="/tmp"))
    certs = make_cluster_certs(certs_dir)
    node = make_node(f"traced-{os.getpid()}-{secrets.token_hex(2)}", database_url, certs)
    node.env.update(_otel(receiver, "replgate-node"))
    try:
        node.start()
        node.wait_registered(database_url)
        gateway = make_gateway(database_url=database_url, local_node="false",
                               node_timeout_s=str(NODE_TIMEOUT_S), tls_ca=str(certs.ca),
                               tls_cert=str(certs.gateway_cert),
                               tls_key=str(certs.gateway_key))
        gateway.env.update(_otel(receiver, "replgate-gateway"))
        gateway.warm = False
        with running_gateway(docker_client, gateway):
            yield gateway, node, certs
    finally:
        node.stop()
        left = containers_of(docker_client, node.node_id)
        for container_id in left:
            docker_client.api.remove_container(container_id, force=True, v=True)
        mounted = unmount_all(node.state_dir)
        shutil.rmtree(node.state_dir, ignore_errors=True)
        shutil.rmtree(certs_dir, ignore_errors=True)
        drop_database(database_url)
        assert not left and not mounted, (left, mounted)


async def test_an_execution_on_a_node_is_one_trace_across_the_hop(
        receiver: OtlpReceiver,
        traced: tuple[GatewayProcess, NodeProcess, ClusterCerts]) -> None:
    gateway = traced[0]
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers(),
                                 timeout=120) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        try:
            answer = await client.post(f"/v1/sessions/{sid}/execute", json={"code": "6 * 7"},
                                       headers={"traceparent": f"00-{trace_id}-{caller}-01"})
            assert answer.json()["outputs"][-1]["data"]["text/plain"] == "42"
        finally:
            await client.delete(f"/v1/sessions/{sid}")

    hop = "replgate.node.execution"

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = {(s.resource.get("service.name"), s.name) for s in spans
                 if s.trace_id == trace_id}
        return {("replgate-node", hop), ("replgate-node", "replgate.kernel.run"),
                ("replgate-gateway", "replgate.execute")} <= names

    spans = [s for s in await receiver.wait_for(complete) if s.trace_id == trace_id]
    by_id = {s.span_id: s for s in spans}
    on_node = next(s for s in spans if s.name == hop)
    assert on_node.resource["service.name"] == "replgate-node"
    # Its parent is the gateway's side of the hop (a client span: the execution sent on the
    # node's channel), in the same trace the caller started: one trace from the agent's
    # request to the kernel's node.
    sent = by_id[on_node.parent_span_id]
    assert sent.name == "replgate.node.submit" and sent.kind == CLIENT
    assert sent.resource["service.name"] == "replgate-gateway"
    assert sent.start_ns <= on_node.start_ns
    request = next(s for s in spans if s.name == "POST /v1/sessions/{session_id}/execute")
    assert request.parent_span_id == caller
    # The call to the node is the execution's own: replgate.execute holds the hop.
    execute = by_id[sent.parent_span_id]
    assert execute.name == "replgate.execute" and execute.parent_span_id == request.span_id
    # The node draws the execution's queue and its run in the kernel under its request.
    on_node_children = {s.name: s for s in spans if s.parent_span_id == on_node.span_id}
    assert {"replgate.queue", "replgate.kernel.run"} <= set(on_node_children), spans
    run = on_node_children["replgate.kernel.run"]
    assert run.resource["service.name"] == "replgate-node"
    assert on_node.start_ns <= run.start_ns <= run.end_ns <= on_node.end_ns


def test_a_node_serves_its_figures_over_mutual_tls(
        traced: tuple[GatewayProcess, NodeProcess, ClusterCerts]) -> None:
    _, node, certs = traced
    tls = client_context(certs.gateway_cert, certs.gateway_key, certs.ca)
    answer = httpx.get(f"https://{node.address}/metrics", verify=tls)
    assert answer.status_code == 200
    assert "replgate_pool_kernels" in answer.text and "replgate_sessions " in answer.text
