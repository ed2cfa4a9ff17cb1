"""Custom templates on nodes: two gateways of two nodes (processes of their own, over mutual TLS,
on a real PostgreSQL, a real S3 server: SeaweedFS). The first gateway builds a template and saves
its image into the bundle store; a node whose engine lacks the image loads it from there before
it makes a session of it, and the second gateway (started before the build) runs it too: each
session finds the template's package and file."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import tarfile
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from unittest import mock

import docker
import docker.errors
import httpx
import pytest
from cluster_support import Cluster, execute, gateway_client, running_cluster

from kernel_pool.backends.docker import current_image
from tests.kernel_pool.bundles.seaweed_support import BUCKET, running_seaweedfs

PACKAGE = "tomli_w"
"""A small pure-Python package on PyPI that the sandbox image does not have."""


@pytest.fixture(scope="module")
def cluster(docker_client: docker.DockerClient) -> Iterator[Cluster]:
    with running_seaweedfs() as seaweed, \
            mock.patch.dict(os.environ, seaweed.aws_env()), running_cluster(
                docker_client, nodes=2, gateways=2,
                bundle_store=f"s3://{BUCKET}/{secrets.token_hex(6)}",
                store_env=seaweed.aws_env()) as started:
        yield started  # (the gateway saves the images there: it reads the same variables)


def _context() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"from the context"
        info = tarfile.TarInfo("data/hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def _built(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    dockerfile = (f"FROM {current_image()}\nUSER root\n"
                  f"RUN pip install --no-cache-dir --disable-pip-version-check {PACKAGE}==1.0.0\n"
                  "COPY data/hello.txt /opt/data/hello.txt\n")
    answer = await client.post("/v1/templates", data={"name": name}, files={
        "dockerfile": ("Dockerfile", dockerfile.encode()),
        "context": ("context.tar.gz", _context(), "application/gzip")})
    assert answer.status_code == 202, answer.text
    info: dict[str, Any] = answer.json()
    deadline = time.monotonic() + 600
    while info["status"] == "building" and time.monotonic() < deadline:
        await asyncio.sleep(2)
        info = (await client.get(f"/v1/templates/{info['id']}")).json()
    assert info["status"] == "ready", info["error"]
    return info


def _removed(docker_client: docker.DockerClient, image: str, within_s: float = 60) -> None:
    """Take the image off the engine the nodes share (the build's check session gone first)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            docker_client.images.remove(image, noprune=True)
            return
        except docker.errors.ImageNotFound:
            return
        except docker.errors.APIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.fixture(scope="module")
async def template(cluster: Cluster) -> AsyncIterator[dict[str, Any]]:
    """A template built on the first gateway (the second one started before it)."""
    async with gateway_client(cluster.gateways[0]) as client:
        info = await _built(client, "on-nodes")
        yield info
        assert (await client.delete(f"/v1/templates/{info['id']}")).status_code == 204


async def _runs_the_template(client: httpx.AsyncClient, cluster: Cluster,
                             template: dict[str, Any]) -> None:
    created = await client.post("/v1/sessions", json={"profile": "on-nodes"})
    assert created.status_code == 201, created.text
    session = created.json()
    try:
        assert session["profile"] == template["profile"]
        assert session["node"] in {node.node_id for node in cluster.nodes}
        result = await execute(client, session["id"], (
            f"import {PACKAGE}, pathlib; print({PACKAGE}.dumps({{'a': 1}}).strip(), "
            "pathlib.Path('/opt/data/hello.txt').read_text())"))
        assert result["error"] is None, result["error"]
        assert result["stdout"].strip() == "a = 1 from the context"
    finally:
        await client.delete(f"/v1/sessions/{session['id']}")


async def test_a_node_lacking_a_templates_image_loads_it_before_its_session(
        cluster: Cluster, template: dict[str, Any], docker_client: docker.DockerClient) -> None:
    # Every node of this test shares one engine: without the image there, the session's node
    # has only the bundle store to get it from.
    _removed(docker_client, template["image"])
    async with gateway_client(cluster.gateways[0]) as client:
        await _runs_the_template(client, cluster, template)
    assert docker_client.images.get(template["image"]) is not None


async def test_another_gateway_runs_a_template_built_after_it_started(
        cluster: Cluster, template: dict[str, Any]) -> None:
    async with gateway_client(cluster.gateways[1], cluster.gateways[0]) as client:
        await _runs_the_template(client, cluster, template)
