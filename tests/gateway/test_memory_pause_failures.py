"""A memory pause's failures through a running gateway: killed while it packs, a state
directory that fills up, a deletion during the packing (real engine, real CRIU; fails, never
skips, without them). Whatever happens, the session stays running or restorable, says why
when it kept less, and nothing is left on disk or counted against the snapshot budget."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import httpx
import psutil

from tests.conftest import (
    GatewayProcess,
    fill_disk,
    make_gateway,
    repeating,
    running_gateway,
    small_disk,
)
from tests.gateway.test_lifecycle import new_session, run, value

HELD_MIB = 160
"""What the big sessions hold in memory, incompressible: their dump dwarfs a fresh kernel's."""

BIG = f"""
import os
def _holding(n):
    blob = os.urandom(n)
    while True:
        yield len(blob)
held = _holding({HELD_MIB} << 20)
next(held)
x = 41
"""
"""A session whose memory only a memory pause keeps: a generator, and the data only it holds
(out of the variables snapshot, which cannot keep a generator)."""


def client_of(process: GatewayProcess) -> httpx.Client:
    return httpx.Client(base_url=process.url, headers=process.headers(), timeout=120)


def big_session(client: httpx.Client) -> str:
    sid = new_session(client)
    run(client, sid, BIG)
    return sid


def pause(client: httpx.Client, sid: str) -> dict[str, object]:
    answer = client.post(f"/v1/sessions/{sid}/pause")
    assert answer.status_code == 200, answer.text
    about: dict[str, object] = answer.json()
    return about


@contextlib.contextmanager
def packings_held(process: GatewayProcess) -> Iterator[list[psutil.Process]]:
    """Stop each packing the gateway starts (its ``tar -c``) as it appears, so that the block
    acts while packings are surely under way: incompressible memory is archived by a plain
    copy, a fraction of a second, which a test's next request could come after. The list holds
    them; those left afterwards are continued."""
    assert process.process is not None
    gateway = psutil.Process(process.process.pid)
    held: list[psutil.Process] = []

    def hold() -> None:
        with contextlib.suppress(psutil.Error):
            for child in gateway.children():
                if child not in held and child.name() == "tar" and "-cf" in child.cmdline():
                    child.suspend()
                    held.append(child)

    try:
        with repeating(hold, 0.002):
            yield held
    finally:
        for packer in held:
            with contextlib.suppress(psutil.Error):
                packer.resume()


def container_of(process: GatewayProcess, sid: str) -> str:
    """The session's container, as the gateway recorded it."""
    with sqlite3.connect(f"file:{process.state_dir / 'replgate.db'}?mode=ro", uri=True) as db:
        [(sandbox,)] = db.execute("SELECT sandbox FROM sessions WHERE id = ?", (sid,))
    container_id: str = json.loads(sandbox)["container_id"]
    return container_id


def engine_dump(docker_client: docker.DockerClient, container_id: str) -> Path:
    """Where the engine keeps (and restores) the container's memory dump."""
    root = Path(docker_client.info()["DockerRootDir"])
    return root / "containers" / container_id / "checkpoints" / "replgate"


def snapshot_files(process: GatewayProcess, sid: str = "") -> dict[str, int]:
    """The files in the snapshot folder (of one session), with their sizes."""
    return {path.name: path.stat().st_size
            for path in (process.state_dir / "snapshots").glob(f"{sid}*") if path.is_file()}


def archive(files: dict[str, int]) -> str | None:
    return next((name for name in files if ".memory." in name
                 and not name.endswith(".part")), None)


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_gateway_killed_while_packing_takes_the_dump_back_or_says_what_was_lost(
        docker_client: docker.DockerClient) -> None:
    process = make_gateway(keep_sessions_on_stop="true", pause_with="memory")
    with running_gateway(docker_client, process):
        with client_of(process) as client:
            kept, lost = big_session(client), big_session(client)
            with packings_held(process) as packers:  # both packings under way at the kill
                with ThreadPoolExecutor(2) as pool:
                    paused = list(pool.map(lambda sid: pause(client, sid), (kept, lost)))
                eventually(lambda: len(packers) == 2, "the packings did not start")
                process.stop(signal.SIGKILL)
            # Continued, they outlive the gateway (their own sessions), and end with no one to
            # finish their archives.
            psutil.wait_procs(packers, timeout=60)
        assert [about["paused_with"] for about in paused] == ["memory", "memory"], paused
        for sid in (kept, lost):  # the kill came during the packing: no archive was made
            assert archive(snapshot_files(process, sid)) is None, snapshot_files(process)
        dumps = {sid: engine_dump(docker_client, container_of(process, sid))
                 for sid in (kept, lost)}
        assert all((dump / "replgate.json").is_file() for dump in dumps.values())
        shutil.rmtree(dumps[lost])  # a dump not intact any more: no memory to come back to
        # Room for the archive of the dump taken back and one more dump (incompressible, an
        # archive is most of its dump), not for that dump counted twice nor a partial archive.
        dump_bytes = sum(p.stat().st_size for p in dumps[kept].rglob("*") if p.is_file())
        process.env["REPLGATE_SNAPSHOT_BUDGET"] = str(dump_bytes * 22 // 10)

        process.start()
        with client_of(process) as client:
            about = client.get(f"/v1/sessions/{lost}").json()
            assert (about["status"], about["paused_with"]) == ("paused", "variables"), about
            assert "memory image was lost" in about["reason"], about
            assert "held" in about["not_kept"], about  # what the variables could not keep
            about = client.get(f"/v1/sessions/{kept}").json()
            assert (about["status"], about["paused_with"]) == ("paused", "memory"), about

            # The dump is packed again; the killed gateway's partial archives are gone.
            eventually(lambda: not dumps[kept].exists(), "the dump was not packed again")
            files = snapshot_files(process)
            assert not [name for name in files if name.endswith(".part")], files
            assert archive(snapshot_files(process, kept)) is not None, files
            assert archive(snapshot_files(process, lost)) is None, files
            about = client.get(f"/v1/sessions/{kept}").json()
            assert about["snapshot_bytes"] == sum(
                size for name, size in snapshot_files(process, kept).items()
                if not name.endswith(".json")), (about, files)

            # The budget counts what is on disk, nothing more: another big session's dump
            # fits beside the archive (it would not beside a dump still counted, or the
            # partial archives).
            other = big_session(client)
            assert pause(client, other)["paused_with"] == "memory", \
                client.get(f"/v1/sessions/{other}").json()

            # Its memory came back: the generator, and the data only it held.
            assert value(client, kept, "next(held)") == str(HELD_MIB << 20)
            assert client.get(f"/v1/sessions/{kept}").json()["reason"] is None
            assert value(client, lost, "x") == "41"
            failed = client.post(f"/v1/sessions/{lost}/execute", json={"code": "next(held)"})
            assert failed.json()["status"] == "error"
            for sid in (kept, lost, other):
                assert client.delete(f"/v1/sessions/{sid}").status_code == 204
            eventually(lambda: snapshot_files(process) == {}, "snapshots left behind")


def test_state_directory_full_during_packing_leaves_a_variables_pause_that_says_so(
        docker_client: docker.DockerClient) -> None:
    process = make_gateway(pause_with="memory", workspace_size="32m",
                           state_min_free="1m")
    with small_disk(HELD_MIB) as disk:
        shutil.rmtree(process.state_dir, ignore_errors=True)
        process.state_dir = disk / "state"
        process.env["REPLGATE_STATE_DIR"] = str(process.state_dir)
        with running_gateway(docker_client, process), client_of(process) as client:
            sid = big_session(client)
            container_id = container_of(process, sid)
            # Room for the variables snapshot and the records, not for the memory's archive.
            fill_disk(disk / "filler", leave=24 << 20)

            assert pause(client, sid)["paused_with"] == "memory"

            def settled() -> bool:
                return client.get(f"/v1/sessions/{sid}").json()["paused_with"] == "variables"
            eventually(settled, "the failed packing did not end as a variables pause")
            about = client.get(f"/v1/sessions/{sid}").json()
            assert about["status"] == "paused", about
            assert "memory image was not kept" in about["reason"], about
            assert "No space left on device" in about["reason"], about
            files = snapshot_files(process, sid)
            assert archive(files) is None and not [n for n in files if n.endswith(".part")]
            eventually(lambda: not engine_dump(docker_client, container_id).exists(),
                       "the dump that was not packed stayed")

            assert value(client, sid, "x") == "41"  # restored from its variables

            # A disk too full for the variables snapshot itself: a 507, the session runs on.
            run(client, sid, "import os\nbig = os.urandom(3 << 20)")
            fill_disk(disk / "filler", leave=3 << 19)  # over REPLGATE_STATE_MIN_FREE
            answer = client.post(f"/v1/sessions/{sid}/pause")
            assert answer.status_code == 507, answer.text
            assert "No space left on device" in answer.json()["detail"], answer.text
            assert str(disk) not in answer.text  # the host's folders are not the tenant's
            about = client.get(f"/v1/sessions/{sid}").json()
            assert about["status"] == "idle" and "pause failed" in about["reason"], about
            assert not [n for n in snapshot_files(process, sid) if n.endswith(".part")]
            assert value(client, sid, "len(big)") == str(3 << 20)
            assert client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_delete_during_packing_leaves_nothing_and_frees_its_budget(
        docker_client: docker.DockerClient) -> None:
    # Room for one big session's dump, not two: the second pause fits only if the first's
    # dump stopped counting when its session was deleted.
    budget = ((HELD_MIB + 120) << 20) * 3 // 2
    with running_gateway(docker_client, pause_with="memory",
                         snapshot_budget=str(budget)) as process, client_of(process) as client:
        sid = big_session(client)
        container_id = container_of(process, sid)
        with packings_held(process) as packers:
            assert pause(client, sid)["paused_with"] == "memory"
            eventually(lambda: len(packers) == 1, "the packing did not start")
            assert archive(snapshot_files(process, sid)) is None  # still packing

            assert client.delete(f"/v1/sessions/{sid}").status_code == 204

        eventually(lambda: snapshot_files(process, sid) == {}, "the session's files stayed")
        assert not engine_dump(docker_client, container_id).exists()
        other = big_session(client)
        assert pause(client, other)["paused_with"] == "memory", \
            client.get(f"/v1/sessions/{other}").json()
        assert client.delete(f"/v1/sessions/{other}").status_code == 204
