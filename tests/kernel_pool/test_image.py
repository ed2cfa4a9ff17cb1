"""The sandbox image: built, tagged by content, non-root, with a reaping PID 1."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import docker
from kp_support import processes, run_ok

from kernel_pool import Session
from kernel_pool._sandbox_image import IMAGE_REPOSITORY, content_version, context_dir
from kernel_pool.backends.docker import build_image, current_image, read_image_info
from kernel_pool.backends.docker._image import _copy_context, _stream_build


def test_image_exists_when_built(docker_client: docker.DockerClient) -> None:
    assert current_image() == f"{IMAGE_REPOSITORY}:{content_version(context_dir())}"
    image = docker_client.images.get(current_image())
    assert image.labels["org.opencontainers.image.version"] == content_version(context_dir())


def test_build_image_skips_when_up_to_date(docker_client: docker.DockerClient,
                                           tmp_path: Path) -> None:
    lines: list[str] = []
    started = time.monotonic()
    info = build_image(docker_client, state_dir=tmp_path, log=lines.append)
    assert time.monotonic() - started < 10
    assert lines == [], "an up-to-date image must not be rebuilt"
    assert info.version == content_version(context_dir())
    assert info.id == docker_client.images.get(current_image()).id
    assert read_image_info(tmp_path) == info


def test_an_edit_of_the_kernels_code_rebuilds_only_the_last_layers(
        docker_client: docker.DockerClient, tmp_path: Path) -> None:
    """The languages' layers (pip's packages, R and the JDK, Deno) come before the kernel's own
    files: an edit of a replgate_kernel module reuses them from the engine's cache, so the
    image of every language is rebuilt in seconds."""
    built = docker_client.images.get(current_image())
    context = _copy_context(context_dir(), tmp_path)
    edited = context / "replgate_kernel" / "outputs.py"
    edited.write_text(edited.read_text() + "\n# an edit\n")
    tag = f"replgate-test-edit:{secrets.token_hex(4)}"
    base = built.labels["io.replgate.base"]
    started = time.monotonic()
    _stream_build(docker_client, context, tag, "edit", lambda _: None, "default",
                  {"BASE": base}, {"io.replgate.base": base})
    took = time.monotonic() - started
    try:
        before = built.attrs["RootFS"]["Layers"]
        after = docker_client.images.get(tag).attrs["RootFS"]["Layers"]
        # The same layers but the last two: the COPY of replgate_kernel/ and its compileall.
        assert len(after) == len(before) and after[:-2] == before[:-2]
        assert after[-2] != before[-2]
        assert took < 60, f"the rebuild took {took:.0f} s"
    finally:
        docker_client.images.remove(tag, force=True)


def test_image_runs_as_non_root_user(docker_client: docker.DockerClient) -> None:
    config = docker_client.images.get(current_image()).attrs["Config"]
    user = config["User"].split(":")[0]
    assert user not in ("", "0", "root")


async def test_init_reaps_orphans_when_they_exit(shared_session: Session) -> None:
    before = await processes(shared_session)
    assert before[0][0] == 1 and "init.py" in before[0][2], before[0]
    # The shell exits at once; its background children become PID 1's, then exit themselves.
    await run_ok(shared_session, "import subprocess\n"
                 "subprocess.run(['sh', '-c', 'for i in 1 2 3 4 5; do sleep 0.2 & done; exit 0'])")
    await asyncio.sleep(1.0)
    after = await processes(shared_session)
    zombies = [p for p in after if p[1] == "Z"]
    assert zombies == [], zombies
    assert not [p for p in after if p[2].startswith("sleep")]


async def test_kernel_runs_as_child_of_init(shared_session: Session) -> None:
    # A checkpoint of the container (CRIU) holds PID 1's process tree only.
    assert await run_ok(shared_session, "import os\nprint(os.getppid())") == "1\n"
