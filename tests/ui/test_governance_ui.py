"""Governance in the web UI, in a real headless Chromium against a real governed gateway.

The gateway has a policy (an approve rule on ``shutil.rmtree``, a deny rule on ``os.system``,
budgets) and an approver key for tenant alpha. The page is signed in with alpha's agent key,
as the product wants (an approver key opens no session); approving takes the approver key,
which the page keeps apart ("Approver key" in the top bar). Screenshots land in tests/artifacts/.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.conftest import GatewayProcess, running_gateway
from tests.ui.conftest import VIEWPORT, Ui

ALICE = f"approver-alice-{secrets.token_hex(8)}"

POLICY = """
[[rules]]
id = "ask-before-rmtree"
action = "approve"
calls = ["shutil.rmtree"]
message = "deleting a directory tree needs a person's approval"

[[rules]]
id = "no-system"
action = "deny"
calls = ["os.system"]
message = "shell commands are not allowed here"

[defaults]
rules = ["ask-before-rmtree", "no-system"]

[budgets]
max_executions = 50
max_wall_time_s = 1800
max_lifetime_s = 7200

[profiles.tiny]
min_idle = 0

[profiles.tiny.budgets]
max_executions = 1
"""

HELD_CODE = ("import os, shutil\n"
             "os.makedirs('scratch/leaf', exist_ok=True)\n"
             "shutil.rmtree('scratch')\n"
             "print('tidied up:', os.path.exists('scratch'))")


@pytest.fixture(scope="module")
def governed(docker_client: docker.DockerClient) -> Iterator[GatewayProcess]:
    folder = Path(tempfile.mkdtemp(prefix="rg-uipol-", dir="/tmp"))
    policy = folder / "policy.toml"
    policy.write_text(POLICY)
    try:
        with running_gateway(docker_client, min_idle="2", policy_file=str(policy),
                             approval_timeout_s="300",
                             approver_keys=f"alpha:alice:{ALICE}") as process:
            yield process
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def gov(browser: Any, governed: GatewayProcess) -> AsyncIterator[Ui]:
    context = await browser.new_context(viewport=VIEWPORT)
    async with httpx.AsyncClient(timeout=60) as client:
        helper = Ui(gateway=governed, context=context, client=client)
        yield helper
        await context.close()
        for session_id in helper.created:
            await helper.api("DELETE", f"/v1/sessions/{session_id}")


def as_alice() -> dict[str, str]:
    return {"Authorization": f"Bearer {ALICE}"}


async def submit(page: Any, code: str) -> Any:
    """Type code in the composer and Shift+Enter; the new cell (not waiting for it to end)."""
    before = await page.locator("#transcript .cell").count()
    await page.fill("#code", code)
    await page.press("#code", "Shift+Enter")
    return page.locator("#transcript .cell").nth(before)


async def pending_approval(gov: Ui, session_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = await gov.api("GET", "/v1/approvals")
        assert answer.status_code == 200, answer.text
        found: list[dict[str, Any]] = [a for a in answer.json() if a["session_id"] == session_id]
        if found:
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError("no approval became pending")


async def test_held_cell_approved_from_the_page(gov: Ui) -> None:
    session_id = await gov.create_session()
    page = await gov.signed_in_page()
    await gov.open_session(page, session_id)
    budget = page.locator("#budget")
    await budget.wait_for()
    assert await budget.locator("[data-budget=executions_left]").inner_text() == "50 runs"
    assert "wall time" in await budget.locator("[data-budget=wall_time_left_s]").inner_text()
    assert await budget.locator("[data-budget=lifetime_left_s]").is_visible()
    assert await budget.locator("[data-budget=cpu_time_left_s]").count() == 0  # unlimited

    cell = await submit(page, HELD_CODE)
    await cell.and_(page.locator("[data-status=pending_approval]")).wait_for()
    assert await cell.locator(".cell-meta .badge").inner_text() == "waiting for approval"
    held = cell.locator(".cell-approval[data-state=pending]")
    assert "Waiting for approval" in await held.locator(".approval-title").inner_text()
    rule = held.locator(".approval-rules li")
    assert await rule.locator(".rule-id").inner_text() == "ask-before-rmtree"
    # The rule's line and message come from GET /v1/approvals/{id}.
    await rule.locator(".rule-where:has-text('line 3')").wait_for()
    assert "needs a person's approval" in await rule.locator(".rule-message").inner_text()
    assert (await held.locator(".approval-expires").inner_text()).startswith("expires in 4 min")
    assert await cell.locator(".output").count() == 0
    session_item = page.locator(f".session-item[data-session-id='{session_id}'] .waiting")
    await session_item.wait_for()
    assert await session_item.inner_text() == "needs approval"
    await gov.screenshot(page, "ui-approval-waiting")

    # Signed in with the agent's key: the gateway refuses (403) and the cell says why.
    await held.locator("button.approve").click()
    error = held.locator(".approval-error")
    await error.wait_for()
    text = await error.inner_text()
    assert "Only an approver can approve" in text
    assert "needs an approver key" in text  # the gateway's own detail
    assert await cell.get_attribute("data-status") == "pending_approval"
    assert await held.locator("button.approve").is_enabled()
    await gov.screenshot(page, "ui-approval-forbidden")

    # The approver's key, kept apart from the API key.
    await error.locator("button.link-button").click()
    await page.locator("#approver-panel").wait_for()
    await page.fill("#approver-input", gov.key)
    await page.click("#approver-save")
    await page.locator("#approver-error:has-text('signed in with')").wait_for()
    await page.fill("#approver-input", "not-a-key-of-this-gateway")
    await page.click("#approver-save")
    await page.locator("#approver-error:has-text('does not know')").wait_for()
    await page.fill("#approver-input", ALICE)
    await gov.screenshot(page, "ui-approver-key")
    await page.click("#approver-save")
    await page.locator("#approver-panel").wait_for(state="hidden")
    assert await page.locator("#approver-label").inner_text() == "Approver key set"
    assert await page.evaluate("localStorage.getItem('replgate.approverKey')") == ALICE
    assert await page.evaluate("localStorage.getItem('replgate.apiKey')") == gov.key

    await held.locator(".approval-comment").fill("scratch space only")
    await held.locator("button.approve").click()
    decided = cell.locator(".cell-approval[data-state=approved]")
    await decided.wait_for()
    assert (await decided.locator(".approval-title").inner_text()).startswith(
        "Approved by alice at ")
    assert await decided.locator(".approval-comment-text").inner_text() == "scratch space only"
    assert await decided.locator("button").count() == 0
    await cell.locator(".cell-meta .duration").wait_for()
    assert await cell.get_attribute("data-status") == "ok"
    assert await cell.locator(".output.stdout").inner_text() == "tidied up: False"
    assert await cell.locator(".cell-prompt").inner_text() == "[1]"
    await page.locator("#budget [data-budget=executions_left]:has-text('49 runs')").wait_for()
    await session_item.wait_for(state="detached")
    await gov.screenshot(page, "ui-approval-approved")

    approvals = await gov.api("GET", "/v1/approvals")
    assert [a for a in approvals.json() if a["session_id"] == session_id] == []


async def test_held_cell_rejected_elsewhere_shows_in_a_watching_page(gov: Ui) -> None:
    """The page joins while the cell is held (no pending_approval frame in the history), then
    sees the approver's decision arrive as an ``approval`` event."""
    session_id = await gov.create_session()
    running = asyncio.create_task(gov.api(
        "POST", f"/v1/sessions/{session_id}/execute", json={"code": HELD_CODE}))
    try:
        approval = await pending_approval(gov, session_id)
        page = await gov.signed_in_page()
        await gov.open_session(page, session_id)
        cell = page.locator(f".cell[data-execution-id='{approval['execution_id']}']")
        await cell.and_(page.locator("[data-status=pending_approval]")).wait_for()
        held = cell.locator(".cell-approval[data-state=pending]")
        assert await held.get_attribute("data-approval-id") == approval["approval_id"]
        assert await held.locator(".rule-id").inner_text() == "ask-before-rmtree"
        assert "line 3" in await held.locator(".rule-where").inner_text()

        answer = await gov.client.post(
            f"{gov.gateway.url}/v1/approvals/{approval['approval_id']}/reject",
            headers=as_alice(), json={"comment": "not on a Friday"})
        assert answer.status_code == 200, answer.text
        decided = cell.locator(".cell-approval[data-state=rejected]")
        await decided.wait_for()
        assert (await decided.locator(".approval-title").inner_text()).startswith(
            "Rejected by alice at ")
        assert await decided.locator(".approval-comment-text").inner_text() == "not on a Friday"
        await cell.locator(".cell-meta .duration").wait_for()
        assert await cell.get_attribute("data-status") == "denied"
        badge = cell.locator(".cell-meta .badge")
        assert await badge.inner_text() == "denied"
        assert "badge-denied" in (await badge.get_attribute("class") or "")
        refusal = await cell.locator(".output.error.refusal").inner_text()
        assert "rejected by alice (not on a Friday)" in refusal
        assert "ask-before-rmtree" in refusal and "did not run" in refusal
        await gov.screenshot(page, "ui-approval-rejected")
    finally:
        result = await asyncio.wait_for(running, 60)
    assert result.json()["status"] == "denied"


async def test_denied_cell_shows_its_badge_and_rule(gov: Ui) -> None:
    session_id = await gov.create_session()
    page = await gov.signed_in_page()
    await gov.open_session(page, session_id)
    cell = await gov.run(page, "import os\nos.system('touch /tmp/x')")
    assert await cell.get_attribute("data-status") == "denied"
    badge = cell.locator(".cell-meta .badge")
    assert await badge.inner_text() == "denied"
    assert "badge-denied" in (await badge.get_attribute("class") or "")
    refusal = cell.locator(".output.error.refusal")
    text = await refusal.inner_text()
    assert text.startswith("PolicyDenied: rule no-system matched line 2 (call os.system)")
    assert "shell commands are not allowed here" in text
    assert await cell.locator(".cell-approval").count() == 0
    assert await cell.locator(".cell-meta .reason").count() == 0  # said once, in the refusal
    ok = await gov.run(page, "print('still fine')")
    assert await ok.get_attribute("data-status") == "ok"
    # Nothing waits for approval and no approver key is saved: no approver button either.
    assert await page.locator("#approver").is_hidden()
    await gov.screenshot(page, "ui-denied")


async def test_budget_exceeded_cell_and_budget_header(gov: Ui) -> None:
    answer = await gov.api("POST", "/v1/sessions", json={"profile": "tiny"})
    assert answer.status_code == 201, answer.text
    session_id = answer.json()["id"]
    gov.created.append(session_id)
    page = await gov.signed_in_page()
    await gov.open_session(page, session_id)
    runs = page.locator("#budget [data-budget=executions_left]")
    await runs.wait_for()
    assert await runs.inner_text() == "1 run"
    assert "low" in (await runs.get_attribute("class") or "")

    first = await gov.run(page, "print('the only run')")
    assert await first.get_attribute("data-status") == "ok"
    await page.locator("#budget [data-budget=executions_left].spent:has-text('0 runs')").wait_for()

    cell = await gov.run(page, "print('one too many')")
    assert await cell.get_attribute("data-status") == "budget_exceeded"
    badge = cell.locator(".cell-meta .badge")
    assert await badge.inner_text() == "budget exceeded"
    assert "badge-budget_exceeded" in (await badge.get_attribute("class") or "")
    refusal = await cell.locator(".output.error.refusal").inner_text()
    assert refusal.startswith("BudgetExceeded: this session has run its budget of 1 executions")
    assert "max_executions" in refusal
    assert await cell.locator(".output.stdout").count() == 0
    await gov.screenshot(page, "ui-budget-exceeded")


async def test_signing_in_with_an_approver_key_keeps_it_for_approvals(gov: Ui) -> None:
    page = await gov.new_page()
    await page.goto(gov.gateway.url + "/")
    await page.fill("#key-input", ALICE)
    await page.click("#signin-form button[type=submit]")
    await page.locator("#signin-error:has-text('approver key')").wait_for()
    assert await page.locator("#app").is_hidden()
    assert await page.evaluate("localStorage.getItem('replgate.approverKey')") == ALICE
    assert await page.evaluate("localStorage.getItem('replgate.apiKey')") is None

    await page.fill("#key-input", gov.key)
    await page.click("#signin-form button[type=submit]")
    await page.wait_for_selector("#app:not([hidden])")
    assert await page.locator("#approver-label").inner_text() == "Approver key set"
    await page.click("#signout")
    await page.wait_for_selector("#signin:not([hidden])")
    assert await page.evaluate("localStorage.getItem('replgate.approverKey')") is None
    await page.fill("#key-input", gov.key)
    await page.click("#signin-form button[type=submit]")
    await page.wait_for_selector("#app:not([hidden])")
    assert await page.locator("#approver").is_hidden()


async def test_interrupting_a_held_cell_withdraws_its_approval(gov: Ui) -> None:
    session_id = await gov.create_session()
    page = await gov.signed_in_page()
    await gov.open_session(page, session_id)
    cell = await submit(page, HELD_CODE)
    await cell.locator(".cell-approval[data-state=pending]").wait_for()
    await page.click("#interrupt")
    await cell.locator(".cell-meta .duration").wait_for()
    assert await cell.get_attribute("data-status") == "interrupted"
    withdrawn = cell.locator(".cell-approval[data-state=withdrawn]")
    assert "ended before a decision" in await withdrawn.locator(".approval-title").inner_text()
    assert await withdrawn.locator("button").count() == 0
    assert await cell.locator(".output.stdout").count() == 0
    approvals = await gov.api("GET", "/v1/approvals")
    assert [a for a in approvals.json() if a["session_id"] == session_id] == []
