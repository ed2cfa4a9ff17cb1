"""Code contexts of other languages through the port (bash: the lightest kernel of the image;
tests/kernel_pool/test_contexts.py tries every language in a pool), made, restarted and
removed, the same wherever the session runs."""

from __future__ import annotations

import pytest

from kernel_pool import (
    ContextNotFound,
    ExecutionStatus,
    InvalidRequest,
    SessionPort,
    StreamEvent,
    UnknownLanguage,
)


async def test_a_language_runs_in_its_own_context_beside_python(session: SessionPort) -> None:
    assert {"python", "bash"} <= set(session.languages)
    await session.submit("X = 'python'").result()
    first = await session.submit("X=7; echo $X", language="bash").result()
    again = await session.submit("echo $((X + 1))", language="bash").result()

    assert (first.status, first.stdout.strip()) == (ExecutionStatus.OK, "7")
    assert again.stdout.strip() == "8", "the context keeps its variables"
    assert (await session.submit("print(X)").result()).stdout == "python\n"
    contexts = {c.id: c for c in await session.list_contexts()}
    assert contexts["bash"].language == "bash" and contexts["bash"].running
    assert contexts["python"].language == "python"


async def test_contexts_are_made_restarted_and_removed(session: SessionPort) -> None:
    await session.submit("X=7", language="bash").result()
    made = await session.create_context("Bash")  # (names are not case-sensitive)
    assert made.language == "bash" and made.id.startswith("ctx-")
    assert not made.running, "its kernel starts with its first execution"
    ran = await session.submit("echo ${X:-unset}", context_id=made.id).result()
    assert ran.stdout.strip() == "unset", "a new context has variables of its own"
    assert {c.id for c in await session.list_contexts()} == {"python", "bash", made.id}

    await session.restart_context("bash")
    again = await session.submit("echo ${X:-gone}", language="bash").result()
    assert again.stdout.strip() == "gone"

    await session.remove_context(made.id)
    assert made.id not in {c.id for c in await session.list_contexts()}
    with pytest.raises(ContextNotFound, match=made.id):
        await session.remove_context(made.id)
    with pytest.raises(ContextNotFound, match=made.id):
        await session.restart_context(made.id)
    with pytest.raises(ContextNotFound, match=made.id):
        session.submit("echo hi", context_id=made.id)


async def test_a_context_made_in_a_folder_runs_there(session: SessionPort) -> None:
    made = await session.create_context("bash", cwd="/tmp")
    here = await session.submit("pwd", context_id=made.id).result()

    assert made.cwd == "/tmp" and here.stdout == "/tmp\n", here
    with pytest.raises(InvalidRequest, match="does not exist"):
        await session.create_context("bash", cwd="/nowhere")


async def test_an_interrupt_reaches_the_context_running_the_code(session: SessionPort) -> None:
    await session.submit("X=1", language="bash").result()
    handle = session.submit("echo go; while true; do :; done", language="bash")
    async for event in handle.stream():
        if isinstance(event, StreamEvent):
            break
    assert await session.interrupt("python") is False, "not the context running now"
    assert await session.interrupt("bash") is True
    result = await handle.result()

    assert result.status is ExecutionStatus.INTERRUPTED and not result.restarted, result
    assert (await session.submit("echo $X", language="bash").result()).stdout.strip() == "1"


async def test_languages_and_contexts_refused_are_named(session: SessionPort) -> None:
    with pytest.raises(UnknownLanguage, match="cobol"):
        session.submit("1", language="cobol")
    with pytest.raises(UnknownLanguage, match="cobol"):
        await session.create_context("cobol")
    with pytest.raises(InvalidRequest, match="runs python"):
        session.submit("1", language="bash", context_id="python")
    with pytest.raises(ContextNotFound, match="no code context 'bash'"):
        await session.interrupt("bash")
    await session.submit("true", language="bash").result()
    assert await session.interrupt("bash") is False, "nothing runs there"
