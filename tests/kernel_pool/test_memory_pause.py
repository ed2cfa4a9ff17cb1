"""A memory pause: the whole sandbox checkpointed by CRIU through the engine, restored on
resume (real engine, real CRIU, real kernels; fails, never skips, without them)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import docker.errors
import pytest
from kp_support import (
    eventually,
    pausing_pool,
    run_ok,
)

from kernel_pool import KernelPool, Session
from kernel_pool._channels import KernelState
from kernel_pool.backends.docker import _sandbox_checkpoint as sandbox_checkpoint
from kernel_pool.backends.docker._checkpoint import (
    CONTAINERD_STAGING,
    DISCARDED_PREFIX,
    checkpoint_failure,
    criu_log_errors,
    criu_log_named,
    discard,
    discard_soon,
    remove_staged_copies,
    whole_dump,
    without_host_paths,
)
from kernel_pool.backends.docker._packing import IMAGE_SUFFIX, STORED_SUFFIX, Packing

SETUP = """
import threading, time
counter = [0]
def _count():
    while True:
        counter[0] += 1
        time.sleep(0.01)
threading.Thread(target=_count, daemon=True).start()
def _letters():
    yield from "abcdef"
letters = _letters()
next(letters)
handle = open("notes.txt", "w+")
handle.write("0123456789")
handle.seek(4)
open("/tmp/scratch.txt", "w").write("kept in tmp")
x = 41
"""


@pytest.fixture(scope="module")
async def memory_pool(state_root: Path, docker_client: docker.DockerClient,
                      ) -> AsyncIterator[KernelPool]:
    async with pausing_pool(state_root, docker_client, "memory", pause_with="memory") as pool:
        yield pool


@pytest.fixture
async def paused(memory_pool: KernelPool) -> AsyncIterator[Session]:
    """A session whose kernel holds a thread, a generator, an open file, /tmp and a variable,
    paused with memory."""
    session = await memory_pool.create_session()
    await run_ok(session, SETUP)
    before = int(await run_ok(session, "print(counter[0])"))
    assert before > 0
    info = await session.pause()
    assert info.paused_with == "memory", session.reason
    yield session
    if not session.closed:
        await memory_pool.delete_session(session.id)


def container_running(docker_client: docker.DockerClient, session: Session) -> bool:
    try:
        state = docker_client.api.inspect_container(session.sandbox_info().container_id)["State"]
    except docker.errors.NotFound:
        return False
    return bool(state["Running"])


def engine_checkpoints(docker_client: docker.DockerClient, container_id: str) -> list[str]:
    """What the engine's checkpoint folder of the container holds."""
    folder = (Path(docker_client.info()["DockerRootDir"]) / "containers" / container_id
              / "checkpoints")
    return sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []


def engine_events(docker_client: docker.DockerClient, container_id: str,
                  action: str) -> list[dict[str, object]]:
    """The engine's recent events of that action on the container (it keeps the latest)."""
    return list(docker_client.events(since=0, until=int(time.time()) + 1, decode=True,
                                     filters={"container": container_id, "event": action}))


async def test_memory_pause_keeps_thread_generator_open_file_tmp_and_variables(
        paused: Session, memory_pool: KernelPool, docker_client: docker.DockerClient) -> None:
    container_id = paused.sandbox_info().container_id
    # The pause answers with the dumped tree stopped; the container ends as the sandbox is
    # released, after the answer: the engine then records it as exited, as after its own
    # checkpoint.
    await paused.kernel.settle()
    state = docker_client.api.inspect_container(container_id)["State"]
    assert (state["Status"], state["Restarting"]) == ("exited", False)
    # The dump is runc's own, not the engine's checkpoint API (seconds slower).
    assert engine_events(docker_client, container_id, "checkpoint") == []
    await paused.packed()  # the pause answered before its packing; once packed, the dump goes
    assert engine_checkpoints(docker_client, container_id) == []
    assert list(memory_pool.snapshots.root.glob(f"{paused.id}*.part")) == []
    image = memory_pool.snapshots.memory_image(paused.id)
    assert image is not None and image.stat().st_size > 0
    assert stat.S_IMODE(image.stat().st_mode) == 0o600
    assert paused.pause_info is not None and paused.pause_info.image_bytes > image.stat().st_size
    at_pause = paused.pause_info

    await paused.resume()

    assert paused.reason is None
    assert staged_copies_of(paused) == []  # containerd's copy of the image went with it
    assert engine_checkpoints(docker_client, container_id) == []  # the unpacked image too
    counted = int(await run_ok(paused, "print(counter[0])"))
    await asyncio.sleep(0.2)
    assert int(await run_ok(paused, "print(counter[0])")) > counted  # the thread runs on
    assert await run_ok(paused, "print(next(letters))") == "b\n"
    assert await run_ok(paused, "print(handle.tell(), handle.read())") == "4 456789\n"
    assert await run_ok(paused, "print(open('/tmp/scratch.txt').read(), x)") == "kept in tmp 41\n"
    assert memory_pool.snapshots.memory_image(paused.id) is None  # deleted once resumed
    # Everything is kept; dill alone would have lost the generator and the open file.
    assert {"x", "letters", "handle"} <= set(at_pause.kept) and not at_pause.not_kept
    assert "letters" in at_pause.variables_not_kept


HUGE_PAGES = """
import numpy as np
def huge_pages():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    rollup = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup")
                  if ":" in line and not line[0].isdigit())
    return status["THP_enabled"].strip(), rollup["AnonHugePages"].strip()
"""


async def test_a_kernel_and_its_memory_resume_use_small_pages(memory_pool: KernelPool) -> None:
    # A profile leaves huge pages off unless it says otherwise (huge_pages): CRIU restores the
    # flag before it refills the memory, so the resume fills small pages too.
    session = await memory_pool.create_session()
    try:
        await run_ok(session, HUGE_PAGES + "held = np.ones(64 << 17)\nopen('/tmp/t', 'w')")
        assert await run_ok(session, "print(*huge_pages())") == "0 0 kB\n"
        info = await session.pause()
        assert info.paused_with == "memory", session.reason
        await session.packed()
        await session.resume()
        assert session.reason is None
        assert await run_ok(session, "print(*huge_pages(), held.sum())") == "0 0 kB 8388608.0\n"
    finally:
        await memory_pool.delete_session(session.id)


def staged_copies_of(session: Session) -> list[Path]:
    """containerd's copies (of restored checkpoints) holding the session's kernel key."""
    info = session.sandbox_info()
    key = json.loads((Path(info.socket_dir) / f"{info.kernel_name}.json").read_text())["key"]
    return [folder for folder in CONTAINERD_STAGING.glob("ctrd-checkpoint*")
            if (records := folder / "replgate.json").is_file()
            and key in records.read_text(errors="replace")]


def test_remove_staged_copies_takes_stale_copies_of_ours_only(tmp_path: Path) -> None:
    made = []
    for name, records, age_s in (("stale", '{"key": "a"}', 3600), ("fresh", '{"key": "b"}', 0),
                                 ("foreign", None, 3600)):
        folder = CONTAINERD_STAGING / f"ctrd-checkpoint-test-{os.getpid()}-{name}"
        folder.mkdir()
        made.append(folder)
        if records is not None:
            (folder / "replgate.json").write_text(records)
        os.utime(folder, (time.time() - age_s,) * 2)
    planted = CONTAINERD_STAGING / f"ctrd-checkpoint-test-{os.getpid()}-link"
    planted.symlink_to(made[0])
    try:
        assert remove_staged_copies() >= 1
        assert [folder.exists() for folder in made] == [False, True, True]
        assert planted.is_symlink()
        assert remove_staged_copies(b'{"key": "b"}') == 1
        assert not made[1].exists()
    finally:
        planted.unlink()
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def test_criu_log_named_takes_a_log_of_the_containers_own_state_only(tmp_path: Path) -> None:
    roots = (tmp_path / "runc", tmp_path / "task")
    log = tmp_path / "task" / "c1" / "work" / "restore.log"
    said = "criu failed: type NOTIFY errno 0\nlog file: {}"
    assert criu_log_named(said.format(log), "c1", roots) == log
    assert criu_log_named(f"checkpoint failed: path= {log.with_name('criu-dump.log')}",
                          "c1", roots) == log.with_name("criu-dump.log")
    # Out of the container's state by "..", another container's, or no CRIU log at all.
    escaped = f"{tmp_path}/task/c1/../../../etc/restore.log"
    assert criu_log_named(said.format(escaped), "c1", roots) is None
    assert criu_log_named(said.format(f"{tmp_path}/task/c1/../c2/restore.log"), "c1",
                          roots) is None
    assert criu_log_named(said.format(log), "c2", roots) is None
    assert criu_log_named(said.format(tmp_path / "task/c1/shadow"), "c1", roots) is None


def test_a_restored_dump_is_moved_aside_at_once_and_removed_after(tmp_path: Path) -> None:
    container = tmp_path / "containers" / "c1"
    folder = container / "checkpoints" / "replgate"
    folder.mkdir(parents=True)
    (folder / "pages-1.img").write_bytes(b"p" * 4096)
    discard_soon(folder)
    assert not folder.exists()  # the next dump or restore finds its place empty
    deadline = time.monotonic() + 10
    while list(container.glob(f"{DISCARDED_PREFIX}*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(container.iterdir()) == [container / "checkpoints"]
    # What a gateway killed during the removal left goes when a gateway takes it back.
    left = container / f"{DISCARDED_PREFIX}0123abcd"
    left.mkdir()
    (left / "pages-1.img").write_bytes(b"p")
    assert whole_dump(folder) is None
    assert not left.exists()


def test_criu_log_errors_says_the_first_error_the_cause(tmp_path: Path) -> None:
    """A failed restore's log, as CRIU 4.2 wrote it (the noise of every run first). The
    cause is its first error; the last three alone said only "Unable to open fd=53"."""
    log = tmp_path / "restore.log"
    log.write_text(
        "Error (criu/tun.c:85): tun: Unable to create tun: No such file or directory\n"
        " 10000: Error (criu/files-reg.c:2353): Can't open file home/user/held/open.bin on "
        "restore: Read-only file system\n"
        " 10000: Error (criu/files-reg.c:2267): Can't open file home/user/held/open.bin: "
        "Read-only file system\n"
        " 10000: Error (criu/files.c:1221): Unable to open fd=53 id=0xac\n"
        "Error (criu/cr-restore.c:2331): Restoring FAILED.\n")
    said = criu_log_errors(log)
    assert said.startswith(" (CRIU: 10000: Error (criu/files-reg.c:2353): Can't open file "
                           "home/user/held/open.bin on restore: Read-only file system | ... |")
    assert said.endswith("Unable to open fd=53 id=0xac | Error (criu/cr-restore.c:2331): "
                         "Restoring FAILED.)")
    assert "tun" not in said
    assert criu_log_errors(tmp_path / "missing.log") == ""


def test_without_host_paths_keeps_the_words_and_last_parts_only() -> None:
    said = ("OCI runtime restore failed: criu failed: log file: "
            "/run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby/c1/work/"
            "restore.log; Error (criu/files-reg.c:1099): Can't dump ghost file "
            "/var/lib/docker/overlay2/ab12/merged/workspace/big.bin of 3145728 size")
    assert without_host_paths(said) == (
        "OCI runtime restore failed: criu failed: log file: .../restore.log; "
        "Error (criu/files-reg.c:1099): Can't dump ghost file .../big.bin of 3145728 size")


def test_packing_runs_on_through_a_stop_signal(tmp_path: Path) -> None:
    # A gateway's stop (SIGTERM to its process group, or to its whole cgroup) waits for the
    # packing: tar and zstd start and run with the stop signals blocked.
    folder = tmp_path / "dump"
    folder.mkdir()
    # Random but for half of zeros: compressed (by tar and zstd), and slowly.
    pages = bytearray(os.urandom(128 * 2**20))
    for offset in range(0, len(pages), 4096):
        pages[offset:offset + 2048] = bytes(2048)
    (folder / "pages-1.img").write_bytes(pages)
    packing = Packing(folder, tmp_path / "s1")
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        packed = threads.submit(packing.run)
        deadline = time.monotonic() + 30
        while len(packing._processes) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert [process.poll() for process in packing._processes] == [None, None]
        for process in packing._processes:
            os.kill(process.pid, signal.SIGTERM)
        image = packed.result(timeout=120)
    assert image.name.endswith(IMAGE_SUFFIX) and image.stat().st_size > 64 * 2**20
    assert not image.with_name(image.name + ".part").exists()


def test_checkpoint_failure_names_no_host_folder() -> None:
    full = OSError(errno.ENOSPC, "No space left on device",
                   "/var/lib/replgate/snapshots/s1.memory.tar.zst.part")
    assert str(checkpoint_failure(full)) == (
        "[Errno 28] No space left on device: '.../s1.memory.tar.zst.part'")


async def test_memory_image_deleted_with_its_session(paused: Session,
                                                     memory_pool: KernelPool) -> None:
    await paused.packed()
    image = memory_pool.snapshots.memory_image(paused.id)
    assert image is not None
    await memory_pool.delete_session(paused.id)
    await eventually(lambda: not image.exists(), timeout_s=10)
    assert memory_pool.snapshots.info(paused.id) is None


async def test_corrupt_memory_image_resumes_from_variables_and_says_so(
        paused: Session, memory_pool: KernelPool) -> None:
    await paused.packed()
    image = memory_pool.snapshots.memory_image(paused.id)
    assert image is not None
    image.write_bytes(b"not an image" * 100)

    await paused.resume()

    assert paused.reason is not None and "resumed from its variables snapshot" in paused.reason
    assert "not kept: " in paused.reason and "letters" in paused.reason
    assert await run_ok(paused, "print(x)") == "41\n"
    missing = await paused.execute("next(letters)")  # a generator is not in a variables snapshot
    assert missing.status == "error"


async def test_refused_dump_pauses_with_variables_and_says_so(
        memory_pool: KernelPool, docker_client: docker.DockerClient) -> None:
    session = await memory_pool.create_session()
    try:
        # An open file deleted from the workspace is a "ghost" to CRIU, kept only up to 1 MiB:
        # past that the engine's checkpoint fails.
        await run_ok(session, "import os\nghost = open('big.bin', 'wb+')\n"
                              "ghost.write(os.urandom(3 << 20))\nos.unlink('big.bin')\nx = 41")
        info = await session.pause()
        assert info.paused_with == "variables"
        assert session.reason is not None and "memory checkpoint failed" in session.reason
        assert "ghost" in session.reason  # CRIU's own words, from its log
        assert memory_pool.snapshots.memory_image(session.id) is None
        await eventually(lambda: not container_running(docker_client, session), timeout_s=30)
        await session.resume()
        assert await run_ok(session, "print(x)") == "41\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_gvisor_memory_pause_pauses_with_variables_without_a_dump(
        memory_pool: KernelPool) -> None:
    session = await memory_pool.create_session("hostile")
    try:
        await run_ok(session, "x = 41")
        info = await session.pause()
        assert info.paused_with == "variables"
        # Refused by the sandbox's capability before anything was disconnected, not by a
        # dump tried and failed.
        assert session.reason == ("paused with variables: memory pauses are not available "
                                  "(a gVisor sandbox cannot be checkpointed with CRIU)")
        assert memory_pool.snapshots.memory_image(session.id) is None
        await session.resume()
        assert await run_ok(session, "print(x)") == "41\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_fork_of_a_memory_paused_session_copies_its_variables_snapshot(
        paused: Session, memory_pool: KernelPool) -> None:
    [child] = await memory_pool.fork_session(paused.id, 1, None)
    try:
        # No warm kernel (min_idle 0): the copy is answered paused, and is never restored
        # from the parent's memory image.
        assert child.paused and child.pause_info is not None
        assert child.pause_info.paused_with == "variables"
        assert "letters" in child.pause_info.not_kept
        assert await run_ok(child, "print(x)") == "41\n"
        assert paused.pause_info is not None and paused.pause_info.paused_with == "memory"
        await paused.resume()
        assert paused.reason is None
        assert await run_ok(paused, "print(next(letters))") == "b\n"
    finally:
        await memory_pool.delete_session(child.id)


async def pause_now(pool: KernelPool) -> tuple[Session, str]:
    """A session paused with memory, its packing not begun (the pause answered first); its
    kernel's key (what containerd's copies of its restored images hold)."""
    session = await pool.create_session()
    await run_ok(session, SETUP)
    info = session.sandbox_info()
    key = json.loads((Path(info.socket_dir) / f"{info.kernel_name}.json").read_text())["key"]
    assert (await session.pause()).paused_with == "memory", session.reason
    assert pool.snapshots.memory_image(session.id) is None  # still to be packed
    return session, key


def left_of(pool: KernelPool, docker_client: docker.DockerClient, session: Session,
            key: str) -> list[str]:
    """Every file a memory pause of the session may leave: in the state directory, in the
    engine's checkpoint folder of its container, in containerd's staging copies."""
    found = [path.name for path in pool.snapshots.root.glob(f"{session.id}.memory*")]
    found += engine_checkpoints(docker_client, session.sandbox_info().container_id)
    found += [str(folder) for folder in CONTAINERD_STAGING.glob("ctrd-checkpoint*")
              if (records := folder / "replgate.json").is_file()
              and key in records.read_text(errors="replace")]
    return found


async def test_resume_during_packing_restores_from_the_dump(
        memory_pool: KernelPool, docker_client: docker.DockerClient) -> None:
    session, key = await pause_now(memory_pool)
    try:
        await session.resume()

        assert session.reason is None
        assert await run_ok(session, "print(next(letters))") == "b\n"
        assert await run_ok(session, "print(handle.tell(), x)") == "4 41\n"
        assert left_of(memory_pool, docker_client, session, key) == []
        assert memory_pool.snapshots.info(session.id) is None
    finally:
        await memory_pool.delete_session(session.id)


async def test_a_dumped_trees_container_never_ended_is_ended_by_the_restore(
        memory_pool: KernelPool, docker_client: docker.DockerClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The container of a kernel-tree dump ends after the pause answers. A gateway stopped in
    between leaves it running, its dumped kernel stopped in it and holding the pids the
    restore needs: the restore ends it first, and everything comes back."""

    async def never(self: sandbox_checkpoint.SandboxCheckpoints) -> None:
        return None  # as if the gateway had stopped before ending it

    monkeypatch.setattr(sandbox_checkpoint.SandboxCheckpoints, "end_dumped_tree", never)
    session = await memory_pool.create_session()
    try:
        await run_ok(session, SETUP)
        info = await session.pause()
        assert info.paused_with == "memory", session.reason
        assert getattr(session.kernel.sandbox, "memory_path", None) == "kernel tree"
        await session.kernel.settle()
        assert container_running(docker_client, session)

        await session.resume()

        assert session.reason is None, session.reason
        assert await run_ok(session, "print(next(letters), handle.tell(), x)") == "b 4 41\n"
        assert await run_ok(session, "print(open('/tmp/scratch.txt').read())") == "kept in tmp\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_resume_as_the_packing_removes_the_dump_restores_from_the_archive(
        memory_pool: KernelPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume that comes once the archive is whole, while the dump is being removed: it
    used to cancel the packing there, the session kept the removed dump as its image, and
    the restore fell back to the variables (the cycles bench lost a /tmp file so at its 19th
    cycle). The removal is slowed here to widen that moment."""
    removing = threading.Event()

    def slow_discard(dump: Path) -> None:
        removing.set()
        time.sleep(1.0)
        discard(dump)

    session = await memory_pool.create_session()
    try:
        await run_ok(session, SETUP)
        info = await session.pause()
        assert info.paused_with == "memory", session.reason
        monkeypatch.setattr(sandbox_checkpoint, "discard", slow_discard)
        await eventually(removing.is_set)

        await session.resume()

        assert session.reason is None, session.reason
        assert await run_ok(session, "print(next(letters), open('/tmp/scratch.txt').read())") \
            == "b kept in tmp\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_random_data_is_stored_as_it_is_and_comes_back_whole(
        memory_pool: KernelPool) -> None:
    # Pages that mostly do not shrink (random bytes beside the kernel's heap) are stored
    # without compression (a quicker restore), and a resume after the packing restores them
    # from that archive.
    session = await memory_pool.create_session()
    try:
        await run_ok(session, "import hashlib, os\nblob = os.urandom(256 * 2**20)\n"
                              "digest = hashlib.sha256(blob).hexdigest()\n"
                              "held = open('/tmp/held.txt', 'w+')\nheld.write('kept')")
        digest = await run_ok(session, "print(digest)")
        assert (await session.pause()).paused_with == "memory", session.reason
        await session.packed()
        image = memory_pool.snapshots.memory_image(session.id)
        assert image is not None and image.name.endswith(STORED_SUFFIX), image

        await session.resume()

        assert session.reason is None, session.reason
        assert await run_ok(session, "print(hashlib.sha256(blob).hexdigest())") == digest
        assert await run_ok(session, "held.seek(0); print(held.read())") == "kept\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_cancelled_memory_resume_leaves_the_session_paused_and_resumable(
        paused: Session, memory_pool: KernelPool) -> None:
    resuming = asyncio.create_task(paused.resume())
    await eventually(lambda: paused.kernel.state is KernelState.STARTING, timeout_s=30)
    resuming.cancel()  # a client gone, a gateway shutting down: mid-restore
    with pytest.raises(asyncio.CancelledError):
        await resuming

    assert paused.paused
    assert paused.reason == "resume failed, the session stays paused: it was cancelled"
    assert " 0 in use" in repr(memory_pool)  # its slot is free again
    await paused.resume()
    assert await run_ok(paused, "print(x)") == "41\n"
    # The half-restored container was removed with the rest: the memory image cannot be
    # restored any more, and the resume says which snapshot it came from.
    assert paused.reason is not None and "resumed from its variables snapshot" in paused.reason


async def test_cancelled_memory_pause_ends_paused_with_variables(
        memory_pool: KernelPool) -> None:
    session = await memory_pool.create_session()
    try:
        await run_ok(session, "x = 41")
        pausing = asyncio.create_task(session.pause())
        # The variables snapshot is written: what follows is the memory checkpoint.
        await eventually(lambda: session.pause_info is not None, timeout_s=30)
        pausing.cancel()  # as a gateway shutting down cancels the pauses it started
        with contextlib.suppress(asyncio.CancelledError):
            await pausing

        assert session.paused, session.status
        assert session.pause_info is not None
        assert session.pause_info.paused_with == "variables"
        assert " 0 in use" in repr(memory_pool)
        await session.resume()
        assert await run_ok(session, "print(x)") == "41\n"
    finally:
        await memory_pool.delete_session(session.id)


def dump_of(container_id: str) -> int | None:
    """The pid of ``runc checkpoint`` of that container, or of the ``nsenter`` running CRIU's
    dump of a kernel's tree inside a container (only this test's dumps at the time), if one
    runs."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"checkpoint" in argv and container_id.encode() in argv:
                return int(entry.name)
            if argv[0].endswith(b"nsenter") and b"dump" in argv:
                return int(entry.name)
    return None


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (runc's or nsenter's criu)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def still_there(pids: list[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


async def test_memory_pause_cancelled_mid_dump_settles_and_leaves_no_dump_running(
        memory_pool: KernelPool, docker_client: docker.DockerClient) -> None:
    session = await memory_pool.create_session()
    container_id = session.sandbox_info().container_id
    try:
        await run_ok(session, "x = 41")
        pausing = asyncio.create_task(session.pause())
        dumper = None
        for _ in range(3000):  # the variables snapshot first, then the dump: 0.3 s or so
            dumper = dump_of(container_id)
            if dumper is not None or pausing.done():
                break
            await asyncio.sleep(0.002)
        assert dumper is not None, "the dump was not seen running"
        dumpers = [dumper, *children_of(dumper)]
        pausing.cancel()  # as a gateway shutting down cancels the pauses it started
        with contextlib.suppress(asyncio.CancelledError):
            await pausing

        # The dump ended before the pause gave up: no runc, nsenter or criu of it runs unowned.
        assert still_there(dumpers) == []
        assert engine_checkpoints(docker_client, container_id) == []  # what it made, gone
        assert session.kernel.state is KernelState.PAUSED  # paused, not dead (and restarted)
        assert session.paused, session.status
        assert session.pause_info is not None
        assert session.pause_info.paused_with == "variables"
        assert memory_pool.snapshots.memory_image(session.id) is None
        assert " 0 in use" in repr(memory_pool)
        await session.resume()
        assert await run_ok(session, "print(x)") == "41\n"
    finally:
        await memory_pool.delete_session(session.id)


async def test_delete_during_packing_leaves_nothing(
        memory_pool: KernelPool, docker_client: docker.DockerClient) -> None:
    session, key = await pause_now(memory_pool)
    container_id = session.sandbox_info().container_id

    await memory_pool.delete_session(session.id)

    assert left_of(memory_pool, docker_client, session, key) == []
    assert engine_checkpoints(docker_client, container_id) == []
    await eventually(lambda: not list(memory_pool.snapshots.root.glob(f"{session.id}*")),
                     timeout_s=10)


async def test_session_resumed_from_its_variables_is_paused_by_itself_again(
        state_root: Path, docker_client: docker.DockerClient) -> None:
    # Its ``reason`` (the resume kept less than asked) is news, not a failed pause, which
    # alone keeps the pool from pausing a session by itself.
    async with pausing_pool(state_root, docker_client, "memory-idle", pause_with="memory",
                            pause_after_s=1.0, cull_interval_s=0.2) as pool:
        session = await pool.create_session()
        await run_ok(session, "x = 41")
        await eventually(lambda: session.pause_info is not None
                         and session.pause_info.paused_with == "memory", timeout_s=30)
        await session.packed()
        image = pool.snapshots.memory_image(session.id)
        assert image is not None
        image.write_bytes(b"not an image")
        await session.resume()
        assert session.reason is not None and "variables snapshot" in session.reason

        await eventually(lambda: session.paused, timeout_s=30)
        assert await run_ok(session, "print(x)") == "41\n"


async def test_failed_packing_leaves_a_variables_pause_and_says_so(
        memory_pool: KernelPool, docker_client: docker.DockerClient) -> None:
    session, key = await pause_now(memory_pool)
    try:
        # A link where the partial archive goes (never followed): its writing fails, as on
        # a full disk.
        stem = memory_pool.snapshots.memory_stem(session.id)
        blocker = stem.with_name(f"{stem.name}{IMAGE_SUFFIX}.part")
        blocker.symlink_to(stem.with_name("elsewhere"))
        await session.packed()
        assert not blocker.is_symlink()  # removed with the memory image's files

        assert session.pause_info is not None
        assert session.pause_info.paused_with == "variables"
        assert memory_pool.snapshots.info(session.id) == session.pause_info
        assert session.reason is not None and "memory image was not kept" in session.reason
        assert left_of(memory_pool, docker_client, session, key) == []
        await session.resume()
        assert await run_ok(session, "print(x)") == "41\n"
    finally:
        await memory_pool.delete_session(session.id)
