"""E2B's ``copy`` steps' files on several gateways: two gateways of one PostgreSQL database, each
with its own state directory, sharing a bundle store (``file://``). Files the unmodified SDK
uploaded to the first are ``present`` on the second, and its build of them reads them there."""

from __future__ import annotations

import base64
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from e2b import Sandbox, Template

from tests.conftest import (
    GatewayProcess,
    create_database,
    drop_database,
    make_gateway,
    running_gateway,
)

CONTENT = "uploaded to the first gateway"


@pytest.fixture(scope="module")
def pair(docker_client: docker.DockerClient) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    database_url = create_database()
    store = Path(tempfile.mkdtemp(prefix="rg-uploads-store-", dir="/tmp"))
    shared = {"database_url": database_url, "bundle_store": store.as_uri(),
              "bundle_key": base64.b64encode(os.urandom(32)).decode()}
    try:
        with running_gateway(docker_client, make_gateway(**shared)) as first, \
                running_gateway(docker_client, make_gateway(**shared)) as second:
            yield first, second
    finally:
        shutil.rmtree(store, ignore_errors=True)
        drop_database(database_url)


def _api(gateway: GatewayProcess) -> dict[str, str]:
    return {"api_url": f"{gateway.url}/e2b", "api_key": gateway.keys["alpha"]}


def test_files_uploaded_to_one_gateway_are_built_by_another(
        pair: tuple[GatewayProcess, GatewayProcess], tmp_path: Path) -> None:
    first, second = pair
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hello.txt").write_text(CONTENT)

    def template() -> Template:
        return (Template(file_context_path=str(tmp_path)).from_base_image()
                .copy("data/hello.txt", "/opt/shared/hello.txt"))

    one, two = (f"e2b-up-{n}-{uuid.uuid4().hex[:6]}" for n in ("one", "two"))
    Template.build(template(), one, **_api(first))
    put = re.findall(r"PUT /e2b/templates/uploads/([0-9a-f]{64})", first.log_path.read_text())
    assert put, "the SDK uploaded nothing to the first gateway"
    link = httpx.get(f"{second.url}/e2b/templates/{one}/files/{put[-1]}",
                     headers={"X-API-Key": second.keys["alpha"]})
    assert link.status_code == 201 and link.json()["present"] is True, link.text
    Template.build(template(), two, **_api(second))  # (the SDK uploads nothing: present)
    assert "PUT /e2b/templates/uploads/" not in second.log_path.read_text()
    sandbox = Sandbox.create(template=two, sandbox_url=f"{second.url}/e2b/sandbox",
                             **_api(second))
    try:
        assert sandbox.commands.run("cat /opt/shared/hello.txt").stdout == CONTENT
    finally:
        sandbox.kill()
        for alias in (one, two):
            httpx.delete(f"{second.url}/e2b/templates/{alias}",
                         headers={"X-API-Key": second.keys["alpha"]}, timeout=60)
