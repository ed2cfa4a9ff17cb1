"""The Templates panel in a real Chromium against a real gateway and engine: templates built
through the API listed with their status, size and error; a building one's log followed live
and whole once done; a session made of a ready template from "New session", its heading naming
the template, its cell finding the template's file; a failed build's error in the page."""

from __future__ import annotations

import secrets

from kernel_pool.backends.docker import current_image
from tests.ui.conftest import Ui


async def _build(ui: Ui, name: str, dockerfile: str) -> str:
    answer = await ui.api("POST", "/v1/templates", data={"name": name},
                          files={"dockerfile": ("Dockerfile", dockerfile.encode())})
    assert answer.status_code == 202, answer.text
    template_id: str = answer.json()["id"]
    return template_id


async def test_templates_are_listed_followed_and_used_for_a_new_session(ui: Ui) -> None:
    suffix = secrets.token_hex(3)
    good, bad = f"marker-{suffix}", f"broken-{suffix}"
    # The step names the run (no layer of an earlier run to reuse) and lasts long enough
    # that the page, signed in, finds the build still under way.
    good_id = await _build(ui, good, f"FROM {current_image()}\nUSER root\n"
                                     f"RUN echo hi > /opt/marker && echo {suffix} && sleep 8\n")
    bad_id = await _build(ui, bad, f"FROM {current_image()}\nRUN ls /no/such/folder\n")
    try:
        page = await ui.signed_in_page()
        item = page.locator(f".template-item[data-template-id={good_id}]")
        await item.wait_for()
        # Opened while it builds: the log follows the build over its WebSocket.
        assert await item.get_attribute("data-status") == "building"
        await item.click()
        await page.locator("#template-log[data-live]").wait_for()
        assert await page.text_content("#template-log-title") == f"Build log of {good}"
        # Listed ready (the list polls while a build runs), with its size.
        ready = page.locator(f".template-item[data-template-id={good_id}][data-status=ready]")
        await ready.wait_for(timeout=300_000)
        await page.locator("#template-log[data-whole]").wait_for()
        assert await ready.locator(".badge").text_content() == "ready"
        assert "B" in (await ready.locator(".session-sub").text_content() or "")  # kB/MB
        logged = await page.locator("#template-log .log-line").all_text_contents()
        lines = (await ui.api("GET", f"/v1/templates/{good_id}/logs")).json()
        assert logged == [line["text"] for line in lines]
        assert any("RUN echo hi > /opt/marker" in text for text in logged), logged

        # The failed build: its error in the list, its whole log (ending in the error) on click.
        failed = page.locator(f".template-item[data-template-id={bad_id}][data-status=failed]")
        await failed.wait_for(timeout=300_000)
        error = await failed.locator(".template-error").text_content() or ""
        assert error.startswith("line 2 (RUN ls /no/such/folder) failed"), error
        assert "No such file or directory" in error
        await failed.click()
        last = page.locator("#template-log[data-whole] .log-line.error").last
        await last.wait_for()
        assert "line 2" in (await last.text_content() or "")

        # Only the ready one is offered to a new session; the session runs on its image.
        options = await page.locator("#new-profile option").evaluate_all(
            "options => options.map(o => o.value)")
        assert good in options and bad not in options, options
        await page.select_option("#new-profile", good)
        before = await ui.session_ids()
        await page.click("#new-session")
        await page.wait_for_selector("#live[data-state=live]")
        made = await ui.session_ids() - before
        ui.created.extend(made)
        assert len(made) == 1
        await page.wait_for_function(
            "name => document.getElementById('session-profile').textContent === name",
            arg=f"template {good}")
        sub = page.locator(f".session-item[data-session-id=\"{made.pop()}\"] .session-sub")
        assert (await sub.text_content() or "").startswith(f"{good} · ")
        cell = await ui.run(page, "print(open('/opt/marker').read().strip())")
        assert (await cell.locator(".output.stdout").inner_text()).strip() == "hi"
        await ui.screenshot(page, "ui-templates")
    finally:
        for session_id in ui.created:
            await ui.api("DELETE", f"/v1/sessions/{session_id}")
        ui.created.clear()
        for template_id in (good_id, bad_id):
            await ui.api("DELETE", f"/v1/templates/{template_id}")
