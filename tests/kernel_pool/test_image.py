"""The sandbox image: built, tagged by content, non-root, with a reaping PID 1."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from pathlib import Path

import docker
import docker.errors
from kp_support import processes, run_ok

from kernel_pool import Session
from kernel_pool._sandbox_image import IMAGE_REPOSITORY, content_version, context_dir
from kernel_pool.backends.docker import build_image, current_image, read_image_info
from kernel_pool.backends.docker._image import _copy_context


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
    """The languages' layers (pip's packages, R and the JDK, Deno, Java's archive) come before
    the kernel's own files: an edit of a replgate_kernel module takes every one of them from
    the engine's cache, so the image of every language is rebuilt in seconds."""
    base = docker_client.images.get(current_image()).labels["io.replgate.base"]
    context = _copy_context(context_dir(), tmp_path)
    edited = context / "replgate_kernel" / "outputs.py"
    edited.write_text(edited.read_text() + "\n# an edit\n")
    tag = f"replgate-test-edit:{secrets.token_hex(4)}"
    started = time.monotonic()
    steps: list[list[str]] = []
    try:
        for chunk in docker_client.api.build(
                path=str(context), tag=tag, target="default", rm=True, forcerm=True,
                decode=True, network_mode="host", buildargs={"BASE": base}):
            assert "error" not in chunk, chunk
            text = chunk.get("stream", "").strip()
            if text.startswith("Step "):
                steps.append([text])
            elif text and steps:
                steps[-1].append(text)
        took = time.monotonic() - started
        runs = {step[0].split(" : ", 1)[1][:60]: "---> Using cache" in step for step in steps
                if " : RUN " in step[0] or " : COPY " in step[0]}
        rebuilt = {step for step, cached in runs.items() if not cached}
        # (The npm stage's own steps are rebuilt once its images are pruned, as they are not
        # parents of the image; the Deno binary copied from it is the same, and cached.)
        kernel = ("COPY replgate_kernel ", "RUN /opt/venv/bin/python -m compileall ")
        npm_stage = ("COPY languages/npm-packages.txt ",
                     "RUN /opt/venv/bin/python -I /tmp/build/fetch_npm")
        assert [step for step in rebuilt if step.startswith(kernel[0])], runs
        assert not [step for step in rebuilt if not step.startswith(kernel + npm_stage)], runs
        assert took < 60, f"the rebuild took {took:.0f} s"
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
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
