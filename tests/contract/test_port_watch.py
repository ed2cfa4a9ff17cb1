"""A session's folders watched through the port (inotify in its sandbox), the same wherever it
runs: changes in order with their entries, folders made later watched too, a poller's flush,
refusals, and the watch's clean end when the session pauses or goes."""

from __future__ import annotations

import asyncio

import pytest

from kernel_pool import (
    DirWatch,
    FileMissing,
    PathOutsideWorkspace,
    SessionHost,
    SessionPort,
    TooManyWatches,
    WatchEvent,
    WorkspaceError,
)
from kernel_pool._watch import WATCH_QUEUE

MAX_WATCHES = 8
"""``PoolLimits.max_watches``'s default, which both legs run with."""


async def _until(watch: DirWatch, done: str, timeout_s: float = 20.0) -> list[WatchEvent]:
    """The watch's events until one of type ``done`` (included)."""
    seen: list[WatchEvent] = []
    async with asyncio.timeout(timeout_s):
        async for event in watch:
            seen.append(event)
            if event.type == done:
                break
    return seen


async def test_changes_come_in_order_with_their_entries(session: SessionPort) -> None:
    await session.make_dir("d")
    watch = await session.watch_dir("d", recursive=True)
    await session.write_file("d/a.txt", b"hello")
    await watch.flush()  # (gVisor: what the host wrote is seen at a flush or a rescan)
    await session.run_command("mkdir d/sub && printf hi > d/sub/b.txt && chmod 600 d/a.txt"
                              " && mv d/a.txt d/c.txt && rm d/c.txt")
    await watch.flush()
    await watch.close()
    events = await _until(watch, "end")

    kinds = [(e.type, e.name) for e in events]
    # a.txt's chmod after its create (the gateway giving it to the sandbox's user) is seen
    # by inotify under runc; gVisor's rescan of what the host wrote cannot tell an owner
    assert [k for k in kinds if k[1] == "a.txt" and k[0] != "chmod"][:2] == [
        ("create", "a.txt"), ("write", "a.txt")], kinds
    assert kinds.index(("write", "a.txt")) < kinds.index(("create", "sub")), kinds
    assert ("create", "sub") in kinds and ("write", "sub/b.txt") in kinds, kinds
    assert kinds.count(("create", "sub/b.txt")) == 1, kinds
    assert kinds[-5:] == [("chmod", "a.txt"), ("rename", "a.txt"), ("create", "c.txt"),
                          ("remove", "c.txt"), ("end", "")], kinds
    written = next(e for e in events if e.type == "write")
    assert written.path == "d/a.txt" and written.entry is not None
    assert (written.entry.path, written.entry.kind, written.entry.size) == (
        "d/a.txt", "file", 5)
    folder = next(e for e in events if e.name == "sub")
    assert folder.is_dir and folder.entry is not None and folder.entry.kind == "dir"
    assert events[-1].reason == "the watch was stopped"


async def test_a_flush_makes_a_poll_hold_what_was_just_written(session: SessionPort) -> None:
    watch = await session.watch_dir("")
    for round_ in range(3):
        await session.write_file(f"f{round_}.txt", b"x")
        await watch.flush()
        assert [(e.type, e.name) for e in watch.take() if e.type != "chmod"] == [
            ("create", f"f{round_}.txt"), ("write", f"f{round_}.txt")]
    await watch.close()


async def test_a_folder_watched_alone_does_not_report_its_subfolders(
        session: SessionPort) -> None:
    await session.make_dir("top/inner")
    watch = await session.watch_dir("top")
    await session.write_file("top/inner/deep.txt", b"x")
    await session.write_file("top/here.txt", b"y")
    await watch.flush()
    names = {e.name for e in watch.take()}
    assert names == {"here.txt"}, names
    await watch.close()


async def test_what_cannot_be_watched_is_refused(session: SessionPort) -> None:
    await session.write_file("file.txt", b"x")
    with pytest.raises(FileMissing):
        await session.watch_dir("nope")
    with pytest.raises(WorkspaceError, match="not a folder"):
        await session.watch_dir("file.txt")
    with pytest.raises(PathOutsideWorkspace):
        await session.watch_dir("../etc")


async def test_a_pause_ends_the_watch_cleanly(session: SessionPort) -> None:
    # a generator: no variables snapshot keeps it, so the pause keeps the memory where it can
    await session.submit("g = (i for i in range(3))").result()
    watch = await session.watch_dir("", recursive=True)
    await session.pause()
    events = await _until(watch, "end")
    assert events[-1].reason == "the session was paused"
    await session.resume()
    again = await session.watch_dir("")  # resumed, it watches anew
    await session.write_file("after.txt", b"x")
    assert (await _until(again, "write"))[-1].name == "after.txt"
    await again.close()


async def test_deleting_the_session_ends_the_watch_cleanly(host: SessionHost) -> None:
    session = await host.create_session()
    watch = await session.watch_dir("")
    await host.delete_session(session.id)
    events = await _until(watch, "end")
    assert events[-1].type == "end" and events[-1].reason is not None


async def test_a_consumer_that_falls_behind_is_told_and_the_watch_ends(
        session: SessionPort) -> None:
    watch = await session.watch_dir("")
    await session.run_command("seq 3000 | xargs touch")  # a create and a chmod each
    await watch.flush()
    events = await _until(watch, "end")
    assert events[-1].reason is not None and events[-1].reason.startswith("lagged"), events[-1]
    assert len(events) <= WATCH_QUEUE + 1


async def test_watches_are_bounded_per_session(session: SessionPort) -> None:
    watches = [await session.watch_dir("") for _ in range(MAX_WATCHES)]
    with pytest.raises(TooManyWatches):
        await session.watch_dir("")
    await watches.pop().close()
    watches.append(await session.watch_dir(""))  # a closed one frees its place
    for watch in watches:
        await watch.close()
