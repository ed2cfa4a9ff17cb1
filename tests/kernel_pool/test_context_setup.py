"""What a code context is given as its kernel starts, and what R reports of an execution: the
folder a context was made with (``create_context(cwd=...)``) in every language, the session's
variables as Java's properties, R's last value as the cell's result and the files R touched.
Real kernels of the default image, in the suite's shared pool."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import SESSION_ENV, pausing_pool, run_ok

from kernel_pool import Execution, InvalidRequest, KernelPool, Profile, Session, env_code

LANGUAGES = ["python", "r", "javascript", "bash", "java"]
CWD = {"python": "import os; print(os.getcwd())", "r": "cat(getwd(), '\\n')",
       "javascript": "console.log(Deno.cwd())", "bash": "pwd",
       "java": 'System.out.println(System.getProperty("user.dir"));'}


async def _in(session: Session, code: str, *, language: str | None = None,
              context_id: str | None = None) -> Execution:
    return await session.submit(code, language=language, context_id=context_id).result()


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_context_starts_in_the_folder_it_was_made_with(shared_session: Session,
                                                               language: str) -> None:
    await run_ok(shared_session, "import os\nfor d in ('/tmp/ctx dir', 'sub/in'):\n"
                                 "    os.makedirs(d, exist_ok=True)")
    for cwd, seen in (("/tmp/ctx dir", "/tmp/ctx dir"), ("sub/in/", "/home/user/sub/in")):
        made = await shared_session.create_context(language, cwd=cwd)
        try:
            assert made.cwd == cwd.rstrip("/")
            listed = {c.id: c for c in await shared_session.list_contexts()}
            assert listed[made.id].cwd == made.cwd
            here = await _in(shared_session, CWD[language], context_id=made.id)
            assert (here.status, here.stdout.strip()) == ("ok", seen), here
            # a restart starts it there again
            await shared_session.restart_context(made.id)
            again = await _in(shared_session, CWD[language], context_id=made.id)
            assert again.stdout.strip() == seen, again
        finally:
            await shared_session.remove_context(made.id)


async def test_a_folder_no_kernel_can_start_in_is_refused_when_the_context_is_made(
        shared_session: Session) -> None:
    await run_ok(shared_session, "import os; os.makedirs('/tmp/locked', exist_ok=True); "
                                 "os.chmod('/tmp/locked', 0)")
    before = await shared_session.list_contexts()
    for cwd, says in (("/nowhere", "does not exist in the sandbox: create it first"),
                      ("/etc/passwd", "is not a folder"),
                      ("/tmp/locked", "is not open to the sandbox's user"),
                      ("bad\x00name", "without NUL")):
        with pytest.raises(InvalidRequest, match=says):
            await shared_session.create_context("r", cwd=cwd)
    assert await shared_session.list_contexts() == before
    # /root is open, as E2B's suite makes a context there (its kernels run as root)
    made = await shared_session.create_context("python", cwd="/root")
    here = await _in(shared_session, CWD["python"], context_id=made.id)
    await shared_session.remove_context(made.id)
    assert here.stdout == "/root\n", here


async def test_a_folder_gone_before_the_first_execution_is_its_error(
        shared_session: Session) -> None:
    await run_ok(shared_session, "import os; os.makedirs('/tmp/soon gone', exist_ok=True)")
    made = await shared_session.create_context("javascript", cwd="/tmp/soon gone")
    try:
        await run_ok(shared_session, "import os; os.rmdir('/tmp/soon gone')")
        failed = await _in(shared_session, "1", context_id=made.id)
        assert failed.status == "error" and failed.error is not None
        assert "could not be set up in its folder '/tmp/soon gone'" in failed.error.evalue
        await run_ok(shared_session, "import os; os.makedirs('/tmp/soon gone')")
        here = await _in(shared_session, CWD["javascript"], context_id=made.id)
        assert (here.status, here.stdout) == ("ok", "/tmp/soon gone\n"), here
    finally:
        await shared_session.remove_context(made.id)


async def test_java_has_the_sessions_variables_as_properties_too(shared_session: Session) -> None:
    # As E2B's server gives them (System.getProperty), beside the process's environment.
    (name, value), = SESSION_ENV.items()
    got = await _in(shared_session, f'System.out.println(System.getProperty("{name}") + "|" + '
                                    f'System.getenv("{name}"));', language="java")
    assert (got.status, got.stdout) == ("ok", f"{value}|{value}\n"), got


def _shown(done: Execution) -> list[tuple[str, str]]:
    return [(output.type, output.data["text/plain"]) for output in done.outputs]


async def test_r_sends_the_value_of_its_last_expression_as_the_result(
        shared_session: Session) -> None:
    mean = await _in(shared_session, "x <- c(1, 2, 3); mean(x)", language="r")
    assert _shown(mean) == [("result", "[1] 2")], mean
    two = await _in(shared_session, "1\n'last'", language="r")
    assert _shown(two) == [("display", "[1] 1"), ("result", '[1] "last"')], two
    # a value something came after is a display, as IRkernel sends every value
    followed = await _in(shared_session, "5; cat('after\\n')", language="r")
    assert (_shown(followed), followed.stdout) == ([("display", "[1] 5")], "after\n"), followed
    failed = await _in(shared_session, "6; stop('b')", language="r")
    assert failed.status == "error" and ("result", "[1] 6") not in _shown(failed), failed
    assert _shown(await _in(shared_session, "invisible(7)", language="r")) == []


WATCHER = """cat(Filter(function(p) any(grepl("files.py", tryCatch(readBin(
    file.path("/proc", p, "cmdline"), "character", 16L), error = function(e) ""), fixed = TRUE)),
    list.files("/proc", pattern = "^[0-9]+$")), "\\n")"""
"""R code printing the pid of R's watcher of the workspace."""


def _files(done: Execution) -> set[tuple[str, str]]:
    return {(change.path, change.change) for change in done.files}


async def test_r_reports_the_files_it_touched(session: Session) -> None:
    made = await _in(session, 'writeLines("a", "r1.txt"); dir.create("rd"); '
                              'writeLines("b", "rd/r2.txt")', language="r")
    assert _files(made) == {("r1.txt", "created"), ("rd/r2.txt", "created")}, made
    changed = await _in(session, 'cat("more", file = "r1.txt", append = TRUE); '
                                 'invisible(file.remove("rd/r2.txt"))', language="r")
    assert _files(changed) == {("r1.txt", "modified"), ("rd/r2.txt", "deleted")}, changed
    # what changed between two executions is not the second one's doing
    await run_ok(session, "open('from_python.txt', 'w').write('p')")
    assert _files(await _in(session, "1 + 1", language="r")) == set()
    # the clean-up after an execution cut short kills the kernel's children, its watcher too:
    # the next execution starts another
    before = await _in(session, WATCHER, language="r")
    cut = await session.submit("Sys.sleep(30)", 2, language="r").result()
    assert cut.status == "timeout", cut
    after = await _in(session, f'writeLines("c", "r3.txt")\n{WATCHER}', language="r")
    assert _files(after) == {("r3.txt", "created")}, after
    assert after.stdout.strip() not in ("", before.stdout.strip()), (before, after)


async def test_the_files_of_r_are_those_of_its_workspace_not_its_folder(session: Session) -> None:
    await run_ok(session, "import os; os.makedirs('/tmp/elsewhere', exist_ok=True)")
    made = await session.create_context("r", cwd="/tmp/elsewhere")
    written = await _in(session, 'writeLines("x", "out.txt"); '
                                 'writeLines("y", "/home/user/in_workspace.txt")',
                        context_id=made.id)
    assert _files(written) == {("in_workspace.txt", "created")}, written


async def test_javascript_executions_queued_at_once_all_end(session: Session) -> None:
    # A per-call variable is three executions queued at once (set, the code, put back). Deno's
    # kernel, sent one before it had replied to the late-output marker of the one before, now
    # and then never answered it: it hung to its timeout.
    code = env_code("javascript", {"TEST_ENV_VAR": "overwrite"})
    assert code is not None
    setup, restore = code
    for _ in range(200):
        handles = [session.submit(code, 15, language="javascript")
                   for code in (setup, "process.env.TEST_ENV_VAR", restore)]
        done = [await handle.result() for handle in handles]
        assert [d.status for d in done] == ["ok"] * 3, done
        assert _shown(done[1]) == [("result", '"overwrite"')], done


@pytest.fixture(scope="module")
async def pausing(state_root: Path, docker_client: docker.DockerClient,
                  ) -> AsyncIterator[KernelPool]:
    profile = Profile(name="default", memory="1g", workspace_size="64m", tmp_size="32m",
                      pids=256, min_idle=0, default_timeout_s=60, max_timeout_s=120)
    async with pausing_pool(state_root, docker_client, "ctxsetup",
                            profiles={"default": profile}) as pool:
        yield pool


async def test_a_memory_pause_keeps_rs_watcher_and_a_contexts_folder(pausing: KernelPool) -> None:
    session = await pausing.create_session()
    try:
        await run_ok(session, "import os; os.makedirs('/tmp/there', exist_ok=True)")
        made = await session.create_context("r", cwd="/tmp/there")
        first = await _in(session, f'writeLines("a", "/home/user/a.txt")\n{WATCHER}',
                          context_id=made.id)
        assert _files(first) == {("a.txt", "created")}, first
        info = await session.pause()
        assert info.paused_with == "memory", (info, session.reason)
        # recorded with the pause, for a gateway that takes the session back
        assert {c.id: c.cwd for c in info.contexts} == {made.id: "/tmp/there"}, info
        await session.resume()
        back = await _in(session, f'writeLines("b", "/home/user/b.txt")\n{WATCHER}\n'
                                  "cat(getwd(), '\\n')", context_id=made.id)
        assert (back.status, back.restarted) == ("ok", False), back
        assert _files(back) == {("b.txt", "created")}, back
        assert back.stdout.split() == [first.stdout.strip(), "/tmp/there"], (first, back)
    finally:
        await pausing.delete_session(session.id)
