"""E2B's snapshots, through the unmodified SDK: ``create_snapshot`` of a running sandbox (it
keeps running), sandboxes created from it by id or name (each its own copy, with the variables
and files of its moment), ``list_snapshots`` (all, by name, by sandbox), ``delete_snapshot``
(the sandboxes made from it go on), another tenant's snapshots absent, the tenant's quotas,
and snapshots kept across a gateway restart."""

from __future__ import annotations

import asyncio
import secrets
import signal

import docker
import pytest
from e2b import RateLimitException, SandboxException
from e2b import SandboxNotFoundException as E2BSandboxNotFound
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.conftest import GatewayProcess, running_gateway

pytestmark = pytest.mark.usefixtures("e2b_env")


def _listed(**query: str) -> list[str]:
    paginator = Sandbox.list_snapshots(**query)  # type: ignore[arg-type]
    return [s.snapshot_id for s in paginator.next_items()]


def test_sandboxes_from_a_snapshot_are_copies_of_its_moment() -> None:
    source = Sandbox.create()
    name = f"snap-{secrets.token_hex(4)}"
    made: list[Sandbox] = []
    try:
        source.run_code("kept = {'answer': 42}")
        source.files.write("/home/user/app/config.json", '{"env": "test"}')
        snapshot = source.create_snapshot(name=name)
        assert snapshot.snapshot_id.startswith("snap_") and snapshot.names == [name]
        # the source keeps running, unchanged by what follows
        assert source.is_running()
        source.run_code("kept['answer'] = 0")
        source.files.write("/home/user/app/config.json", "changed")

        made = [Sandbox.create(snapshot.snapshot_id), Sandbox.create(name)]
        for copy in made:
            assert copy.sandbox_id != source.sandbox_id and copy.is_running()
            assert copy.files.read("/home/user/app/config.json") == '{"env": "test"}'
            assert copy.run_code("kept['answer']").text == "42"
        made[0].files.write("/home/user/app/config.json", "mine")
        made[0].run_code("kept['answer'] = 1")
        assert made[1].files.read("/home/user/app/config.json") == '{"env": "test"}'
        assert made[1].run_code("kept['answer']").text == "42"
        assert source.run_code("kept['answer']").text == "0"
    finally:
        for copy in made:
            copy.kill()
        source.kill()
        Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_a_filesystem_snapshot_keeps_the_files_alone() -> None:
    source = Sandbox.create()
    try:
        source.run_code("only_in_memory = 1")
        source.files.write("/home/user/on-disk.txt", "kept")
        snapshot = source.create_snapshot(mode="filesystem")
        copy = Sandbox.create(snapshot.snapshot_id)
        try:
            assert copy.files.read("/home/user/on-disk.txt") == "kept"
            assert copy.run_code("'only_in_memory' in globals()").text == "False"
        finally:
            copy.kill()
        assert source.run_code("only_in_memory").text == "1"
    finally:
        source.kill()
        Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_list_snapshots_all_by_name_and_by_sandbox() -> None:
    first, second = Sandbox.create(), Sandbox.create()
    name = f"listed-{secrets.token_hex(4)}"
    try:
        named = first.create_snapshot(name=name)
        other = Sandbox.create_snapshot(second.sandbox_id)  # the class method
        assert _listed()[:2] == [other.snapshot_id, named.snapshot_id]  # newest first
        assert _listed(name=name) == [named.snapshot_id]
        assert _listed(name=f"{name}-none") == []
        assert _listed(sandbox_id=second.sandbox_id) == [other.snapshot_id]
        paginator = Sandbox.list_snapshots(limit=1)
        assert paginator.next_items()[0].snapshot_id == other.snapshot_id
        assert paginator.has_next
        assert paginator.next_items()[0].snapshot_id == named.snapshot_id
    finally:
        for sandbox in (first, second):
            sandbox.kill()
        for snapshot_id in _listed():
            Sandbox.delete_snapshot(snapshot_id)


def test_a_name_taken_again_moves_to_the_new_snapshot() -> None:
    source = Sandbox.create()
    name = f"again-{secrets.token_hex(4)}"
    try:
        source.run_code("v = 'old'")
        old = source.create_snapshot(name=name)
        source.run_code("v = 'new'")
        new = source.create_snapshot(name=name)
        assert _listed(name=name) == [new.snapshot_id]
        assert Sandbox.delete_snapshot(old.snapshot_id) is False  # replaced: gone
        copy = Sandbox.create(name)
        try:
            assert copy.run_code("print(v)").logs.stdout == ["new\n"]
        finally:
            copy.kill()
        with pytest.raises(SandboxException, match="400: snapshot name 'default' is a profile"):
            source.create_snapshot(name="default")
    finally:
        source.kill()
        Sandbox.delete_snapshot(name)


def test_deleting_a_snapshot_leaves_the_sandboxes_made_from_it() -> None:
    source = Sandbox.create()
    try:
        source.files.write("/home/user/data.txt", "shared")
        snapshot = source.create_snapshot()
        copy = Sandbox.create(snapshot.snapshot_id)
        try:
            assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
            assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
            assert copy.files.read("/home/user/data.txt") == "shared"
            assert copy.commands.run("cat /home/user/data.txt").stdout == "shared"
            gone = f"404: snapshot '{snapshot.snapshot_id}' not found"
            with pytest.raises(SandboxException, match=gone):
                Sandbox.create(snapshot.snapshot_id)
        finally:
            copy.kill()
    finally:
        source.kill()


def test_another_tenants_snapshots_are_absent(gateway: GatewayProcess) -> None:
    source = Sandbox.create()
    theirs = {"api_key": gateway.keys["beta"]}
    try:
        snapshot = source.create_snapshot()
        assert snapshot.snapshot_id not in [
            s.snapshot_id for s in Sandbox.list_snapshots(**theirs).next_items()]
        with pytest.raises(SandboxException, match="404"):
            Sandbox.create(snapshot.snapshot_id, **theirs)
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **theirs) is False
        with pytest.raises(E2BSandboxNotFound):
            Sandbox.create_snapshot(source.sandbox_id, **theirs)
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    finally:
        source.kill()


def test_quotas_refuse_with_a_sentence_and_snapshots_outlive_a_restart(
        docker_client: docker.DockerClient) -> None:
    with running_gateway(docker_client, max_snapshots_per_tenant="1",
                         max_snapshot_bytes_per_tenant="2m") as other:
        options = {"api_key": other.keys["alpha"], "api_url": f"{other.url}/e2b",
                   "sandbox_url": f"{other.url}/e2b/sandbox"}
        source = Sandbox.create(**options)
        source.files.write("big.bin", secrets.token_bytes(3 << 20))
        with pytest.raises(RateLimitException, match="MAX_SNAPSHOT_BYTES_PER_TENANT"):
            source.create_snapshot()
        assert Sandbox.list_snapshots(**options).next_items() == []  # not kept
        source.files.remove("big.bin")
        source.run_code("kept = 'across the restart'")
        snapshot = source.create_snapshot()
        with pytest.raises(RateLimitException, match="MAX_SNAPSHOTS_PER_TENANT"):
            source.create_snapshot()

        source.kill()
        other.stop(signal.SIGKILL)
        other.start()
        copy = Sandbox.create(snapshot.snapshot_id, **options)
        assert copy.run_code("print(kept)").logs.stdout == ["across the restart\n"]
        copy.kill()
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **options) is True


async def test_many_sandboxes_are_made_from_a_snapshot_at_once() -> None:
    source = await AsyncSandbox.create()
    made: list[AsyncSandbox] = []
    try:
        await source.files.write("/home/user/seed.txt", "seeded")
        snapshot = await source.create_snapshot()
        made = list(await asyncio.gather(*(AsyncSandbox.create(snapshot.snapshot_id)
                                           for _ in range(4))))
        assert len({copy.sandbox_id for copy in made}) == 4
        for index, copy in enumerate(made):
            await copy.files.write("/home/user/seed.txt", f"copy {index}")
        assert [await copy.files.read("/home/user/seed.txt") for copy in made] == [
            f"copy {index}" for index in range(4)]
        assert await source.files.read("/home/user/seed.txt") == "seeded"
    finally:
        await asyncio.gather(*(copy.kill() for copy in made))
        await source.kill()
        await AsyncSandbox.delete_snapshot(snapshot.snapshot_id)
