"""MCP's ``network_policy`` tool on a session with secret rules, through the MCP SDK's client
over ``/mcp`` against a gateway with secrets on: the tool says which requests get which secret,
by name, never by value. (MCP's sessions run on the ``default`` profile, which never opens the
network: the rules wait for a policy that allows their host.)"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Iterator

import docker
import httpx
import pytest

from tests.conftest import GatewayProcess, running_gateway
from tests.gateway.test_mcp import connect, texts


@pytest.fixture(scope="module")
def gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    key = base64.b64encode(os.urandom(32)).decode()
    with running_gateway(docker_client, secrets_key=key) as process:
        yield process


async def test_network_policy_names_the_rules_and_secrets_never_a_value(
        gateway: GatewayProcess) -> None:
    value = f"sk-mcp-{secrets.token_hex(16)}"
    async with httpx.AsyncClient(base_url=gateway.url, headers=gateway.headers("alpha"),
                                 timeout=60) as http, connect("http", gateway) as mcp:
        assert (await http.put("/v1/secrets/OPENAI", json={"value": value})).status_code == 204
        ran = await mcp.call_tool("execute_python", {"code": "1 + 1"})  # makes its session
        assert not ran.is_error, texts(ran)
        (session,) = [s for s in (await http.get("/v1/sessions")).json()
                      if s["metadata"].get("client") == "mcp"]
        patched = await http.patch(f"/v1/sessions/{session['id']}/network", json={
            "default": "deny", "deny": ["10.0.0.0/8"],
            "rules": [{"host": "api.openai.com", "methods": ["POST"], "paths": ["/v1/*"],
                       "headers": {"Authorization": "Bearer {secret:OPENAI}"}}]})
        assert patched.status_code == 200, patched.text

        shown = await mcp.call_tool("network_policy", {})
        assert not shown.is_error, texts(shown)
        text = texts(shown)
        assert text.startswith("This session has no network")
        assert ("- https://api.openai.com:443, POST, /v1/*: sets Authorization: Bearer "
                "{secret:OPENAI}") in text
        assert value not in text
        assert value not in json.dumps(shown.model_dump(mode="json"))
