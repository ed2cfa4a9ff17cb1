"""A paused session written to the bundle store by one pool and restored by another (two
pools of their own, real kernels in real containers; the store a folder and SeaweedFS)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio.to_thread
import docker
import pytest
from kp_support import pausing_pool, run_ok

from kernel_pool import KernelPool
from kernel_pool.bundles import (
    BundleCorrupt,
    BundleInfo,
    BundleKeys,
    Bundles,
    open_store,
    read_session,
    write_session,
)

KEYS = BundleKeys(os.urandom(32))
WRITE = """
import os, pathlib
x = 41
os.makedirs('data/deep', exist_ok=True)
pathlib.Path('data/deep/in.bin').write_bytes(bytes(range(256)) * 4096)
os.symlink('deep/in.bin', 'data/link')
os.setxattr('data/deep/in.bin', 'user.e2b.tag', b'kept')  # E2B's file metadata
"""


async def _paused_bundle(pool: KernelPool, bundles: Bundles) -> str:
    """A session of ``pool`` with ``x`` and files, paused, its bundle written; its id."""
    session = await pool.create_session()
    await run_ok(session, WRITE)
    info = await session.pause()
    await write_session(bundles, "acme", session.id,
                        BundleInfo(paused_with="variables", image_digest="sha256:test",
                                   kept=info.kept, not_kept=info.not_kept),
                        pool.snapshots, session.workspace)
    return session.id


async def test_a_paused_session_resumes_in_another_pool_with_its_variables_and_files(
        state_root: Path, docker_client: docker.DockerClient, store_url: str) -> None:
    bundles = Bundles(open_store(store_url), KEYS)
    async with pausing_pool(state_root, docker_client, "bundle-a") as first, \
            pausing_pool(state_root, docker_client, "bundle-b") as second:
        sid = await _paused_bundle(first, bundles)
        await first.delete_session(sid)  # nothing of it is left on the first "node"
        bundle = await bundles.open("acme", sid)
        restored = await second.restore_session(
            lambda workspace: read_session(bundle, sid, second.snapshots, workspace),
            session_id=sid, execution_count=3)
        assert restored.paused and restored.pause_info is not None
        assert "x" in restored.pause_info.kept
        # A file request works on it while paused, as on any paused session.
        assert len(await restored.read_file("data/deep/in.bin", 1 << 21)) == 256 * 4096
        assert (await restored.stat_path("data/deep/in.bin")).metadata == {"tag": "kept"}
        out = await run_ok(restored, "import os\nprint(x + 1, os.readlink('data/link'), "
                           "open('data/link', 'rb').read(3) == bytes([0, 1, 2]))")
        assert out == "42 deep/in.bin True\n"
        await second.delete_session(sid)
        await bundles.delete("acme", sid)


async def test_a_context_resumed_on_another_node_is_listed_and_says_it_started_afresh(
        state_root: Path, docker_client: docker.DockerClient, store_url: str) -> None:
    """A bundle holds Python's variables alone: the resuming pool lists the session's other
    contexts, and their next execution starts a fresh kernel and says so."""
    bundles = Bundles(open_store(store_url), KEYS)
    async with pausing_pool(state_root, docker_client, "bundle-c") as first, \
            pausing_pool(state_root, docker_client, "bundle-d") as second:
        session = await first.create_session()
        assert (await session.submit("n=41", language="bash").result()).status == "ok"
        info = await session.pause()
        contexts = {k: v for k, v in session.contexts.items() if k != "python"}
        assert contexts == {"bash": "bash"}
        await write_session(bundles, "acme", session.id,
                            BundleInfo(paused_with="variables", image_digest="sha256:test",
                                       kept=info.kept, not_kept=info.not_kept,
                                       contexts=contexts),
                            first.snapshots, session.workspace)
        sid = session.id
        await first.delete_session(sid)
        bundle = await bundles.open("acme", sid)
        restored = await second.restore_session(
            lambda workspace: read_session(bundle, sid, second.snapshots, workspace),
            session_id=sid)
        assert [(c.id, c.running) for c in await restored.list_contexts()] == [
            ("python", True), ("bash", False)]
        back = await restored.submit("echo ${n:-unset}", language="bash").result()
        assert (back.stdout, back.restarted) == ("unset\n", True), back
        assert back.reason is not None and "Bash kernel" in back.reason, back
        await second.delete_session(sid)
        await bundles.delete("acme", sid)


async def test_a_bundle_that_does_not_open_leaves_nothing_behind(
        state_root: Path, docker_client: docker.DockerClient, tmp_path: Path) -> None:
    url = (tmp_path / "bundles").as_uri()
    async with pausing_pool(state_root, docker_client, "bundle-c") as first, \
            pausing_pool(state_root, docker_client, "bundle-d") as second:
        sid = await _paused_bundle(first, Bundles(open_store(url), KEYS))
        await first.delete_session(sid)
        # Another master key: the manifest opens with neither tenant key derived from it.
        with pytest.raises(BundleCorrupt):
            await Bundles(open_store(url), BundleKeys(os.urandom(32))).open("acme", sid)
        # The manifest is whole but a part changed on the store's disk: refused midway.
        bundle = await Bundles(open_store(url), KEYS).open("acme", sid)
        (part,) = [p for p in (tmp_path / "bundles").rglob("workspace.tar")]
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 1
        part.write_bytes(bytes(data))
        made_before = {p.name for p in (second.settings.state_dir).rglob("*")}
        with pytest.raises(BundleCorrupt):
            await second.restore_session(
                lambda workspace: read_session(bundle, sid, second.snapshots, workspace),
                session_id=sid)
        assert sid not in second.sessions
        assert await anyio.to_thread.run_sync(second.snapshots.info, sid) is None
        left = {p.name for p in (second.settings.state_dir).rglob("*")} - made_before
        assert not [name for name in left if sid in name], left
