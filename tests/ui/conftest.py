"""Fixtures for the web UI: a gateway of its own, and Debian's Chromium driven by Playwright.

The browser is the system's (``/usr/bin/chromium``, Debian's ``chromium`` package), driven by
Python Playwright through ``executable_path``; Playwright never downloads a browser here. When
either is missing the tests fail (never skip), naming the command that installs it.

Playwright's async API runs on pytest-asyncio's session loop. (Its sync API would keep a loop
running in the main thread while the browser is open, and break every async test after it.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.conftest import REPO, GatewayProcess, running_gateway

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ARTIFACTS = REPO / "tests" / "artifacts"
VIEWPORT = {"width": 1360, "height": 900}


@pytest.fixture(scope="package")
def ui_gateway(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    """A gateway for the UI tests alone, so session counts and screenshots are theirs only.

    Two warm kernels: most tests start a session, and a cold start is the slowest step.
    """
    with running_gateway(docker_client, min_idle="2") as process:
        yield process


@pytest.fixture(scope="session")
def chromium() -> Path:
    if not CHROMIUM.is_file():
        pytest.fail(f"Debian's Chromium is missing ({CHROMIUM}); install it with: "
                    "sudo apt-get install -y chromium", pytrace=False)
    return CHROMIUM


@pytest.fixture(scope="package")
async def browser(chromium: Path) -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.fail("Python playwright is missing; install it with: "
                    ".venv/bin/pip install -e '.[dev]'  (no browser download is needed)",
                    pytrace=False)
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=str(chromium), headless=True, args=CHROMIUM_FLAGS)
        yield chromium
        await chromium.close()


@dataclass
class Ui:
    """One browser context on the UI gateway, with helpers to sign in and reach sessions."""

    gateway: GatewayProcess
    context: Any
    client: httpx.AsyncClient
    tenant: str = "alpha"
    created: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return self.gateway.keys[self.tenant]

    async def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self.client.request(method, f"{self.gateway.url}{path}",
                                         headers=self.gateway.headers(self.tenant), **kwargs)

    async def create_session(self) -> str:
        answer = await self.api("POST", "/v1/sessions", json={})
        assert answer.status_code == 201, answer.text
        session_id: str = answer.json()["id"]
        self.created.append(session_id)
        return session_id

    async def session_ids(self) -> set[str]:
        answer = await self.api("GET", "/v1/sessions")
        assert answer.status_code == 200, answer.text
        return {s["id"] for s in answer.json()}

    async def new_page(self) -> Any:
        page = await self.context.new_page()
        page.set_default_timeout(30_000)
        return page

    async def signed_in_page(self) -> Any:
        page = await self.new_page()
        await page.goto(self.gateway.url + "/")
        await page.wait_for_selector("#app:not([hidden]), #signin:not([hidden])")
        if await page.locator("#signin").is_visible():  # not yet signed in in this context
            await page.fill("#key-input", self.key)
            await page.click("#signin-form button[type=submit]")
            await page.wait_for_selector("#app:not([hidden])")
        return page

    async def open_session(self, page: Any, session_id: str) -> None:
        await page.goto(f"{self.gateway.url}/#/s/{session_id}")
        await page.wait_for_selector("#live[data-state=live]")

    async def run(self, page: Any, code: str) -> Any:
        """Type code in the composer, Shift+Enter, and wait for its cell to finish."""
        before = await page.locator("#transcript .cell").count()
        await page.fill("#code", code)
        await page.press("#code", "Shift+Enter")
        cell = page.locator("#transcript .cell").nth(before)
        await cell.locator(".cell-meta .duration").wait_for()
        return cell

    async def screenshot(self, page: Any, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        await page.screenshot(path=str(path))
        return path


@pytest.fixture
async def ui(browser: Any, ui_gateway: GatewayProcess) -> AsyncIterator[Ui]:
    context = await browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    async with httpx.AsyncClient(timeout=60) as client:
        helper = Ui(gateway=ui_gateway, context=context, client=client)
        yield helper
        await context.close()
        for session_id in helper.created:
            await helper.api("DELETE", f"/v1/sessions/{session_id}")
