"""Snapshots on disk and workspace copies for forks (the gateway's side; no kernel needed)."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernel_pool._copies import copy_workspace
from kernel_pool._disk import SANDBOX_UID
from kernel_pool._snapshot import SnapshotStore
from kernel_pool._streams import HEAD_BYTES, Pump
from kernel_pool._workspace import Workspace
from kernel_pool.exceptions import SnapshotBudgetExceeded, SnapshotError
from kernel_pool.state import PauseInfo

ZSTD_FRAME = b"\x28\xb5\x2f\xfd"
"""The magic number that begins each zstd frame."""


@pytest.fixture
def workspaces(tmp_path: Path) -> Iterator[tuple[Workspace, Workspace]]:
    made = (Workspace.create(tmp_path / "a", 16 * 2**20),
            Workspace.create(tmp_path / "b", 16 * 2**20))
    yield made
    for workspace in made:
        workspace.destroy()


def save(store: SnapshotStore, key: str, data: bytes,
         info: PauseInfo | None = None) -> PauseInfo:
    """Store ``data`` as a kernel's stream would be: read from a pipe, compressed on the way."""
    source, sink = os.pipe()

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError), os.fdopen(sink, "wb") as pipe:
            pipe.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    writer = store.open_write(key)
    try:
        suffix = Pump().out(source, writer)
        return store.commit(key, writer, info or PauseInfo(), suffix)
    except BaseException:
        writer.abort()
        raise
    finally:
        feeder.join()


def load(store: SnapshotStore, key: str) -> bytes:
    """What a kernel would read of the stored snapshot (decompressed, through a pipe)."""
    reader, suffix = store.open_read(key)
    source, sink = os.pipe()
    got = bytearray()

    def drain() -> None:
        with os.fdopen(source, "rb") as pipe:
            while chunk := pipe.read(1 << 16):
                got.extend(chunk)

    drainer = threading.Thread(target=drain)
    drainer.start()
    try:
        Pump().into(reader, suffix, sink)
    finally:
        reader.close()
        drainer.join()
    return bytes(got)


def test_save_then_load_gives_the_bytes_back_privately(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 2**20)
    info = save(store, "s1", b"pickled" * 1000, PauseInfo(kept=["x"], not_kept={"t": "thread"}))

    assert load(store, "s1") == b"pickled" * 1000
    assert 0 < info.image_bytes < 7000 and info.paused_at
    assert store.info("s1") == info
    assert stat.S_IMODE((tmp_path / "snapshots").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in store.root.iterdir())


def test_a_large_snapshot_streams_through_in_chunks(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 2**30)
    data = b"x" * (3 << 20) + os.urandom(5 << 20)  # some compressible, most not

    info = save(store, "s1", data)

    assert load(store, "s1") == data
    assert info.image_bytes < len(data)


def stored_as(store: SnapshotStore, key: str) -> str:
    reader, suffix = store.open_read(key)
    reader.close()
    return suffix


def stored_bytes(store: SnapshotStore, key: str) -> bytes:
    reader, _ = store.open_read(key)
    try:
        return b"".join(iter(reader.read, b""))
    finally:
        reader.close()


def test_a_small_stream_is_compressed_here_and_one_within_its_head_in_one_frame(
        tmp_path: Path) -> None:
    # A session holding little is paused a hundred times in a burst: each zstd started for
    # it (one for the head, one more for an empty rest, one at the resume) costs more than
    # all its kilobytes. Small, zlib compresses it in the gateway; within the head, one zstd
    # makes one frame.
    store = SnapshotStore(tmp_path / "snapshots", 2**30)
    small = b"a namespace of a few values\n" * 1000  # 28 KB, compressible
    middle = b"a compressible frame, row after row\n" * (HEAD_BYTES // 72)  # half the head

    save(store, "small", small)
    save(store, "middle", middle)

    assert stored_as(store, "small") == ".zlib"
    assert zlib.decompress(stored_bytes(store, "small")) == small
    assert stored_as(store, "middle") == ".zst"
    assert stored_bytes(store, "middle").count(ZSTD_FRAME) == 1
    assert load(store, "small") == small and load(store, "middle") == middle


def test_a_small_snapshot_cut_short_or_garbled_is_corrupt(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 2**20)
    save(store, "s1", b"pickled" * 1000)
    image = next(p for p in store.root.iterdir() if not p.name.endswith(".json"))
    whole = image.read_bytes()

    for damaged in (whole[: len(whole) // 2], b"garbage"):
        image.write_bytes(damaged)
        with pytest.raises(SnapshotError, match="corrupt"):
            load(store, "s1")
    image.write_bytes(whole)
    assert load(store, "s1") == b"pickled" * 1000


def test_a_stream_that_would_not_shrink_is_stored_as_it_is(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 2**30)
    floats = os.urandom(2 * HEAD_BYTES + 12345)  # random floats' bytes: zstd saves nothing
    text = b"a compressible frame, row after row\n" * (3 * HEAD_BYTES // 36)

    assert save(store, "noise", floats).image_bytes == len(floats)
    assert save(store, "text", text).image_bytes < len(text) // 4
    assert (stored_as(store, "noise"), stored_as(store, "text")) == (".raw", ".zst")
    # The head and the rest are two zstd frames, read back as one stream.
    assert load(store, "noise") == floats and load(store, "text") == text


def test_save_over_the_budget_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 100)

    with pytest.raises(SnapshotBudgetExceeded, match="REPLGATE_SNAPSHOT_BUDGET"):
        save(store, "s1", os.urandom(4096))
    assert store.info("s1") is None and store.used_bytes() == 0


def test_a_snapshot_outgrowing_the_budget_midway_stops_and_leaves_nothing(
        tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 3 << 20)

    with pytest.raises(SnapshotBudgetExceeded):
        save(store, "s1", os.urandom(8 << 20))
    assert list(store.root.iterdir()) == [] and store.used_bytes() == 0


def test_a_stream_stored_as_it_is_stops_past_the_budget_after_its_head(
        tmp_path: Path) -> None:
    # Past its head, a stream stored as it is moves from the pipe into the file within the
    # kernel (splice): the budget is still counted as it goes.
    store = SnapshotStore(tmp_path / "snapshots", HEAD_BYTES + (2 << 20))

    with pytest.raises(SnapshotBudgetExceeded, match="REPLGATE_SNAPSHOT_BUDGET"):
        save(store, "s1", os.urandom(4 * HEAD_BYTES))
    assert list(store.root.iterdir()) == [] and store.used_bytes() == 0


def test_a_deleted_snapshot_makes_room_in_the_budget_at_once(tmp_path: Path) -> None:
    first = save(SnapshotStore(tmp_path / "probe", 2**20), "s", os.urandom(4096))
    one = first.image_bytes + len(first.model_dump_json())
    store = SnapshotStore(tmp_path / "snapshots", 2 * one + one // 2)
    save(store, "s1", os.urandom(4096))
    save(store, "s2", os.urandom(4096))
    with pytest.raises(SnapshotBudgetExceeded):
        save(store, "s3", os.urandom(4096))
    store.delete("s1")
    assert save(store, "s3", os.urandom(4096)).image_bytes > 4096


def test_load_of_a_corrupt_snapshot_says_so_and_keeps_it(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 2**20)
    save(store, "s1", b"data" * 50_000)  # zstd's, past the small ones zlib compresses
    image = next(p for p in store.root.iterdir() if not p.name.endswith(".json"))
    image.write_bytes(b"garbage")

    with pytest.raises(SnapshotError, match="corrupt"):
        load(store, "s1")
    assert image.exists()


def test_an_earlier_versions_zlib_snapshot_still_loads(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 2**30)
    data = os.urandom(3 << 20) + b"x" * (2 << 20)
    store.root.mkdir(mode=0o700)
    (store.root / "old.zlib").write_bytes(zlib.compress(data, 1))

    assert load(store, "old") == data
    store.delete("old")
    assert list(store.root.iterdir()) == []


def test_a_copy_is_a_snapshot_of_its_own(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 2**30)
    save(store, "parent", b"state" * 1000)

    info = store.copy("parent", "child", PauseInfo(reseed=True))
    store.delete("parent")

    assert load(store, "child") == b"state" * 1000
    assert info.reseed and store.info("child") == info


def test_delete_removes_image_and_info(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 2**20)
    save(store, "s1", b"data")
    store.delete("s1")

    assert list(store.root.iterdir()) == []


@pytest.mark.parametrize("key", ["", "../escape", ".hidden"])
def test_bad_keys_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(SnapshotError):
        save(SnapshotStore(tmp_path, 2**20), key, b"x")


def test_copy_keeps_files_folders_and_links_as_links(
        workspaces: tuple[Workspace, Workspace]) -> None:
    source, target = workspaces
    (source.root / "data").mkdir()
    (source.root / "data" / "in.csv").write_text("a,b\n1,2\n")
    os.symlink("/etc/passwd", source.root / "passwd-link")

    copy_workspace(source, target)

    assert (target.root / "data" / "in.csv").read_text() == "a,b\n1,2\n"
    assert os.readlink(target.root / "passwd-link") == "/etc/passwd"  # a link, not the file
    assert (target.root / "data" / "in.csv").stat().st_uid == SANDBOX_UID


def test_copy_skips_fifos_and_never_follows_a_linked_folder(
        workspaces: tuple[Workspace, Workspace], tmp_path: Path) -> None:
    source, target = workspaces
    os.mkfifo(source.root / "pipe")  # opening it to read would hang the copy
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host file")
    os.symlink(outside, source.root / "escape")

    copy_workspace(source, target)

    assert not (target.root / "pipe").exists()
    assert (target.root / "escape").is_symlink()
    assert not any(p.name == "secret" for p in target.root.rglob("*")
                   if not p.is_symlink() and p.is_file())


def test_concurrent_saves_all_succeed(tmp_path: Path) -> None:
    # A fork writes its copies' snapshots at once: each save's budget check lists the folder
    # while the others' partial files are renamed away under it.
    store = SnapshotStore(tmp_path / "snapshots", 2**30)

    def saves(worker: int) -> None:
        for n in range(60):
            save(store, f"w{worker}-{n}", os.urandom(256))

    with ThreadPoolExecutor(8) as threads:
        list(threads.map(saves, range(8)))
    assert len(list(store.root.glob("*.json"))) == 8 * 60


def test_an_unpacked_memory_dump_counts_in_the_budget_until_dropped(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 64 * 1024)
    info = save(store, "s1", b"pickled")

    held = store.hold_memory("s1", 40 * 1024, info)

    assert held.paused_with == "memory" and store.info("s1") == held
    with pytest.raises(SnapshotBudgetExceeded):
        save(store, "s2", os.urandom(30 * 1024))
    with pytest.raises(SnapshotBudgetExceeded):
        store.hold_memory("s3", 30 * 1024, info)
    store.drop_held("s1")
    save(store, "s2", os.urandom(30 * 1024))
