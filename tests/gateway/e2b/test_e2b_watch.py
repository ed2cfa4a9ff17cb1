"""E2B's ``files.watch_dir``, through the unmodified SDK against a real gateway: the sync
face's polling watchers, the async face's ``WatchDir`` stream, entry info, recursion into
folders made later, refusals, and the watch's clean end when the sandbox pauses."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from e2b import (
    AsyncSandbox,
    FileNotFoundException,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    Sandbox,
    SandboxException,
)

pytestmark = pytest.mark.usefixtures("e2b_env")


@pytest.fixture(scope="module")
def sandbox(e2b_env: dict[str, str]) -> Iterator[Sandbox]:
    made = Sandbox.create()
    yield made
    made.kill()


def test_a_poll_holds_what_was_written_just_before(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("polled")
    handle = sandbox.files.watch_dir("polled", include_entry=True)
    assert sandbox.commands.list() == []  # a watch is not a command
    sandbox.files.write("polled/a.txt", "hello")
    events = handle.get_new_events()
    assert [(e.type, e.name) for e in events] == [
        (FilesystemEventType.CREATE, "a.txt"), (FilesystemEventType.CHMOD, "a.txt"),
        (FilesystemEventType.WRITE, "a.txt")]
    entry = events[-1].entry
    assert entry is not None
    assert (entry.name, entry.path, entry.type, entry.size) == (
        "a.txt", "/home/user/polled/a.txt", FileType.FILE, 5)
    sandbox.commands.run("rm polled/a.txt")
    assert [(e.type, e.name, e.entry) for e in handle.get_new_events()] == [
        (FilesystemEventType.REMOVE, "a.txt", None)]
    handle.stop()
    with pytest.raises(SandboxException, match="already stopped"):
        handle.get_new_events()


def test_a_recursive_watch_sees_into_folders_made_after_it(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("tree")
    handle = sandbox.files.watch_dir("/home/user/tree", recursive=True)
    sandbox.files.make_dir("tree/new")
    sandbox.files.write("tree/new/deep.txt", "x")
    names = {(e.type, e.name) for e in handle.get_new_events()}
    assert (FilesystemEventType.CREATE, "new") in names
    assert (FilesystemEventType.WRITE, "new/deep.txt") in names
    handle.stop()


def test_what_cannot_be_watched_is_refused_as_e2b_does(sandbox: Sandbox) -> None:
    sandbox.files.write("plain.txt", "x")
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir("no_such_folder")
    with pytest.raises(SandboxException, match="not a folder"):
        sandbox.files.watch_dir("plain.txt")
    with pytest.raises(SandboxException, match="outside /home/user"):
        sandbox.files.watch_dir("/etc")


async def test_the_stream_ends_cleanly_when_the_sandbox_pauses(e2b_env: dict[str, str]
                                                                ) -> None:
    sandbox = await AsyncSandbox.create()
    try:
        seen: list[FilesystemEvent] = []
        written = asyncio.Event()
        exited: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

        def on_event(event: FilesystemEvent) -> None:
            seen.append(event)
            if event.type == FilesystemEventType.WRITE:
                written.set()

        await sandbox.files.watch_dir("", on_event=on_event, include_entry=True,
                                      on_exit=exited.set_result)
        await sandbox.files.write("streamed.txt", "abc")
        await asyncio.wait_for(written.wait(), 20)
        assert seen[0].type == FilesystemEventType.CREATE and seen[0].name == "streamed.txt"
        assert seen[-1].entry is not None and seen[-1].entry.size == 3

        await sandbox.pause()
        assert await asyncio.wait_for(exited, 60) is None
    finally:
        await sandbox.kill()
