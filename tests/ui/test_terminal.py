"""The session's Terminal tab in a real Chromium: a shell in the real sandbox, typed into with the
page's keyboard, drawn by the vendored xterm.js, sized by the page, reattached after a reload."""

from __future__ import annotations

from typing import Any

from tests.ui.conftest import Ui

ROWS = """() => Array.from(document.querySelectorAll("#terminal .xterm-rows > div"),
  (row) => row.textContent.trim())"""
HAS_ROW = f"want => ({ROWS})().includes(want)"


async def terminal_page(ui: Ui, session_id: str) -> Any:
    """A signed-in page on the session's Terminal tab, its shell started; it records the page's
    errors (a Content-Security-Policy refusal of xterm.js would be one)."""
    page = await ui.signed_in_page()
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.on("console", lambda message: message.type == "error" and page.errors.append(
        message.text))
    await ui.open_session(page, session_id)
    await page.click("#tab-terminal")
    await page.wait_for_selector("#terminal-state[data-state=live]")
    assert await page.evaluate("location.hash") == f"#/s/{session_id}/terminal"
    return page


async def type_line(page: Any, line: str) -> None:
    """Type ``line`` and Enter with the page's keyboard into the focused terminal."""
    await page.click("#terminal")
    await page.keyboard.type(line)
    await page.keyboard.press("Enter")


async def shows_row(page: Any, want: str) -> None:
    """Wait until a row of the terminal reads exactly ``want``."""
    await page.wait_for_function(HAS_ROW, arg=want)


async def test_terminal_tab_runs_what_the_keyboard_types(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await terminal_page(ui, session_id)
    assert await page.locator("#transcript").is_hidden()
    await type_line(page, "echo $((6*7))")
    await shows_row(page, "42")
    await ui.screenshot(page, "ui-terminal")
    assert page.errors == []

    # The notebook tab is one click away, and back: the same shell, not a new one.
    terminal_id = await page.get_attribute("#terminal", "data-terminal-id")
    await page.click("#tab-notebook")
    await page.locator("#transcript").wait_for()
    assert await page.locator("#terminal-view").is_hidden()
    await page.click("#tab-terminal")
    assert await page.get_attribute("#terminal", "data-terminal-id") == terminal_id
    await type_line(page, "echo $((6*7+1))")
    await shows_row(page, "43")


async def test_resizing_the_page_resizes_the_shells_terminal(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await terminal_page(ui, session_id)
    cols = await page.get_attribute("#terminal", "data-cols")
    await type_line(page, "tput cols")
    await shows_row(page, cols)

    await page.set_viewport_size({"width": 900, "height": 700})
    await page.wait_for_function(
        "before => document.getElementById('terminal').dataset.cols !== before", arg=cols)
    narrower = await page.get_attribute("#terminal", "data-cols")
    assert int(narrower) < int(cols)
    await type_line(page, "tput cols")
    await shows_row(page, narrower)
    assert page.errors == []


async def test_a_reload_reattaches_to_the_same_shell(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await terminal_page(ui, session_id)
    terminal_id = await page.get_attribute("#terminal", "data-terminal-id")
    await type_line(page, "ANSWER=41")
    await type_line(page, "echo ready")
    await shows_row(page, "ready")

    await page.reload()
    await page.wait_for_selector("#terminal-state[data-state=live]")
    assert await page.get_attribute("#terminal", "data-terminal-id") == terminal_id
    # The screen is drawn again from the terminal's recent output, once.
    await shows_row(page, "ready")
    assert (await page.evaluate(ROWS)).count("ready") == 1
    # A variable of that shell only: the page reached the shell it left.
    await type_line(page, "echo $((ANSWER+1))")
    await shows_row(page, "42")
    assert page.errors == []


async def test_kill_ends_the_shell_and_new_terminal_starts_another(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await terminal_page(ui, session_id)
    first = await page.get_attribute("#terminal", "data-terminal-id")
    await page.click("#terminal-kill")
    await page.wait_for_selector("#terminal-state[data-state=exited]")
    assert await page.locator("#terminal-new").is_visible()
    assert await page.evaluate(
        f"sessionStorage.getItem('replgate.terminal.{session_id}')") is None

    await page.click("#terminal-new")
    await page.wait_for_selector("#terminal-state[data-state=live]")
    second = await page.get_attribute("#terminal", "data-terminal-id")
    assert second and second != first
    await type_line(page, "echo $((6*7))")
    await shows_row(page, "42")


async def test_a_shell_that_ended_unwatched_is_replaced_on_return(ui: Ui) -> None:
    session_id = await ui.create_session()
    page = await terminal_page(ui, session_id)
    first = await page.get_attribute("#terminal", "data-terminal-id")
    await type_line(page, "exit")
    await page.wait_for_selector("#terminal-state[data-state=exited]")
    # As if the page had been away when it ended: it still remembers the id.
    await page.evaluate(f"sessionStorage.setItem('replgate.terminal.{session_id}', '{first}')")
    await page.reload()
    await page.wait_for_selector("#terminal-state[data-state=live]")
    second = await page.get_attribute("#terminal", "data-terminal-id")
    assert second and second != first
