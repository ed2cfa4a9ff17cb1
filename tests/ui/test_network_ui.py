"""The session's Network tab in a real Chromium: the policy its sandbox runs under, its secret
rules with each secret named and never shown, and the attempts its egress proxy decided, on a
gateway with secrets on (a tenant's secret stored, which the page must never hold)."""

from __future__ import annotations

import base64
import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.conftest import GatewayProcess, running_gateway
from tests.ui.conftest import VIEWPORT, Ui

POLICY = """
[profiles.open]
min_idle = 1
network_max = { default = "allow" }
"""
NETWORK = {
    "default": "deny", "allow": ["api.example.com"], "deny": ["10.0.0.0/8"],
    "rules": [{"host": "api.example.com", "methods": ["POST"], "paths": ["/v1/*"],
               "headers": {"Authorization": "Bearer {secret:OPENAI}"}}],
}


@pytest.fixture(scope="module")
def secrets_gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    policy = Path(tempfile.mkdtemp(prefix="rg-uinet-", dir="/tmp")) / "policy.toml"
    policy.write_text(POLICY)
    with running_gateway(docker_client, policy_file=str(policy), min_idle="0",
                         secrets_key=base64.b64encode(os.urandom(32)).decode()) as process:
        yield process


@pytest.fixture
async def net_ui(browser: Any, secrets_gateway: GatewayProcess) -> AsyncIterator[Ui]:
    context = await browser.new_context(viewport=VIEWPORT)
    async with httpx.AsyncClient(timeout=60) as client:
        helper = Ui(gateway=secrets_gateway, context=context, client=client)
        yield helper
        await context.close()
        for session_id in helper.created:
            await helper.api("DELETE", f"/v1/sessions/{session_id}")


async def test_network_tab_shows_the_policy_rules_and_attempts_never_a_secret(
        net_ui: Ui) -> None:
    value = f"sk-ui-{secrets.token_hex(16)}"
    stored = await net_ui.api("PUT", "/v1/secrets/OPENAI", json={"value": value})
    assert stored.status_code == 204, stored.text
    created = await net_ui.api("POST", "/v1/sessions", json={"profile": "open",
                                                             "network": NETWORK})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    net_ui.created.append(session_id)
    ran = await net_ui.api("POST", f"/v1/sessions/{session_id}/execute", json={
        "code": "import urllib.request\ntry: urllib.request.urlopen('http://10.1.2.3/', "
                "timeout=5)\nexcept Exception as exc: print(exc)"})
    assert ran.status_code == 200 and "403" in ran.json()["stdout"], ran.text

    page = await net_ui.signed_in_page()
    await net_ui.open_session(page, session_id)
    await page.click("#tab-network")
    await page.locator("#network-rules .network-rule").wait_for()
    assert await page.evaluate("location.hash") == f"#/s/{session_id}/network"
    assert await page.locator("#transcript").is_hidden()
    assert await page.text_content("#network-default") == "closed by default"
    assert await page.locator("#network-allow li").all_text_contents() == ["api.example.com"]
    assert await page.locator("#network-deny li").all_text_contents() == ["10.0.0.0/8"]
    cells = await page.locator("#network-rules .network-rule td").all_text_contents()
    assert cells[:3] == ["api.example.com:443", "POST", "/v1/*"]
    assert cells[3] == "Authorization: Bearer secret OPENAI"
    assert await page.get_attribute("#network-rules .secret-chip", "data-secret") == "OPENAI"
    refused = page.locator("#network-log .egress-attempt.refused")
    await refused.first.wait_for()
    assert "10.1.2.3" in (await refused.first.text_content() or "")
    await net_ui.screenshot(page, "ui-network")
    assert value not in await page.content()

    # A policy changed through the API shows at the next refresh: no rule, the default open.
    changed = await net_ui.api("PATCH", f"/v1/sessions/{session_id}/network",
                               json={"default": "allow", "deny": ["10.0.0.0/8"]})
    assert changed.status_code == 200, changed.text
    await page.click("#network-refresh")
    await page.locator("#network-rules-empty").wait_for()
    assert await page.text_content("#network-default") == "open by default"
    assert await page.locator("#network-rules-table").is_hidden()
    # And the tab is where a link to it leads, after a reload too.
    await page.reload()
    await page.locator("#network-view:not([hidden])").wait_for()
    # The tab shows at once; its policy once fetched (the badge's class is set with its text).
    await page.locator("#network-default.open, #network-default.closed").wait_for()
    assert await page.text_content("#network-default") == "open by default"
