"""Custom templates' images: a user's Dockerfile built on the engine, then made a sandbox.

Two builds, each ``docker build`` with the engine's classic builder, as an asyncio subprocess
(killed at a step's timeout, which ends the build in the engine too): the user's Dockerfile,
then replgate's sandbox layer on it (:data:`SANDBOX_LAYER`: the kernel launcher, the non-root
user, the hardening of the default image, Python's kernel when the base lacks it). The classic
builder because the engine here has no buildx (BuildKit's client): its layer cache is the
engine's images, so a rebuild with one changed step runs that step and those after it.

The user's steps reach PyPI with the build host's CA bundle (``/etc/pip.conf`` put after each
``FROM``, removed by the sandbox layer), as the default image's build does behind a
TLS-inspecting proxy. Each ``Step N/M`` of the engine is mapped back to the user's line.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kernel_pool._sandbox_image import context_dir
from kernel_pool.backends.docker._dockerfile import (
    Instruction,
    escape_of,
    parse_dockerfile,
    render_dockerfile,
)
from kernel_pool.backends.docker._image import HOST_CA_BUNDLES
from kernel_pool.exceptions import ImageError, TemplateBuildFailed

__all__ = ["BuiltImage", "TemplateBuild", "build_template_image", "check_context",
           "remove_template_image"]

Log = Callable[[str], None]
ALL_LANGUAGES = ("python", "bash", "r", "javascript", "java")
"""The default image's languages, which a template FROM another base may lack."""
BUILD_FILES = ".replgate-build"
"""The folder of the user's context that holds the build's pip.conf and CA bundle."""
OUTPUT_TAIL = 15
_STEP = re.compile(r"^Step (\d+)/(\d+) : ")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NOISE = (" ---> ", "Removing intermediate container", "Sending build context",
          "DEPRECATED:", "            BuildKit is", "            environment-variable",
          "            Install the buildx")

SANDBOX_LAYER = r"""ARG BASE
FROM ${BASE}
USER root
COPY layer/ /tmp/replgate-layer/
RUN set -eu; rm -f /etc/pip.conf /etc/replgate-build-ca.crt; b=/tmp/replgate-layer; \
    if ! ls /opt/venv/lib/python3*/site-packages/ipykernel/kernelapp.py >/dev/null 2>&1; then \
      py=$(command -v python3.11 || command -v python3 || true); \
      if [ -z "$py" ]; then echo "replgate: the image has no python3; a template's base needs \
Python 3.11 (Debian bookworm's python3 and python3-venv)"; exit 1; fi; \
      if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then \
        echo "replgate: the image's $("$py" -V) is not the 3.11 replgate's kernel is locked for"; \
        exit 1; fi; \
      if ! "$py" -m venv /opt/venv; then echo "replgate: $py cannot make a venv: install \
python3-venv"; exit 1; fi; \
      if [ -s $b/host-ca.crt ]; then export PIP_CERT=$b/host-ca.crt; fi; \
      /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --quiet \
        --require-hashes --no-deps -r $b/requirements.txt; \
    fi; \
    { find / -xdev -type f -perm /6000 -exec chmod ug-s {} + 2>/dev/null || true; } & \
    getent passwd 1000 >/dev/null || useradd --uid 1000 --user-group --no-create-home \
        --home-dir /tmp --shell /usr/sbin/nologin sandbox; \
    mkdir -p /home/user /kernel /opt/replgate/mplconfig; \
    chown 1000:1000 /home/user /kernel; \
    [ -e /workspace ] || ln -s /home/user /workspace; \
    [ -n "$(ls -A /opt/replgate/mplconfig)" ] || \
        MPLCONFIGDIR=/opt/replgate/mplconfig /opt/venv/bin/python -c "import matplotlib.pyplot"; \
    rm -rf /opt/replgate/replgate_kernel; mv $b/replgate_kernel /opt/replgate/; rm -rf $b; \
    /opt/venv/bin/python -m compileall -q /opt/replgate/replgate_kernel; \
    chmod -R a+rX /opt/replgate; chmod 755 /root; \
    wait
"""
"""What makes an image a sandbox, after the user's steps: the default image's ``python`` and
``slim`` stages' work (sandbox_image/Dockerfile), each part skipped where the base has it (the
setuid sweep runs beside the rest: a second of a rebuild on a loaded machine). Its
configuration (:data:`SANDBOX_CONFIG`) is set by one commit, not a build step each: on the
classic builder every step is a container made and committed."""

SANDBOX_CONFIG = (
    "ENV PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 "
    "PYTHONPATH=/opt/replgate PYTHONDONTWRITEBYTECODE=1 MPLCONFIGDIR=/tmp/.matplotlib "
    "MPLBACKEND=module://matplotlib_inline.backend_inline IPYTHONDIR=/tmp/.ipython "
    "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1",
    "WORKDIR /home/user",
    'ENTRYPOINT ["/opt/venv/bin/python", "-I", "-S", "/opt/replgate/replgate_kernel/init.py"]',
    "CMD []",
    "USER 1000:1000",
)
"""The default image's environment, folder, entry point and user (sandbox_image/Dockerfile)."""


class TemplateBuild(BaseModel):
    """One template image to build: the user's Dockerfile, the tag, how."""

    dockerfile: str
    tag: str
    nocache: bool = False
    step_timeout_s: float = 600.0
    labels: dict[str, str] = {}


class BuiltImage(BaseModel):
    """A template's image, built: its tag, id, bytes and the languages it runs."""

    tag: str
    id: str
    size: int
    languages: list[str]

    @property
    def lacks(self) -> list[str]:
        return [name for name in ALL_LANGUAGES if name not in self.languages]


def check_context(context: bytes) -> None:
    """Raise ImageError unless ``context`` is a tar (plain or gzipped) whose members all stay
    inside it (the check ``tarfile``'s ``data`` filter makes on extraction)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(context), mode="r:*") as tar:
            for member in tar.getmembers():
                tarfile.data_filter(member, "/nonexistent-replgate-context")
    except (tarfile.TarError, OSError) as exc:
        raise ImageError(f"the context is not a usable tar: {exc}") from exc


def _prepare(build: TemplateBuild, context: bytes | None, root: Path) -> list[Instruction]:
    """Blocking: the user's context extracted under ``root/context``, the build's CA and
    pip.conf beside it, and the Dockerfile to build at ``root/Dockerfile``."""
    where = root / "context"
    where.mkdir()
    if context:
        with tarfile.open(fileobj=io.BytesIO(context), mode="r:*") as tar:
            tar.extractall(where, filter="data")
    extra = where / BUILD_FILES / "etc"
    extra.mkdir(parents=True)
    ca = next((p for p in HOST_CA_BUNDLES if Path(p).is_file()), None)
    (extra / "replgate-build-ca.crt").write_bytes(Path(ca).read_bytes() if ca else b"")
    (extra / "pip.conf").write_text(
        "[global]\ncert = /etc/replgate-build-ca.crt\n" if ca else "[global]\n")
    steps: list[Instruction] = []
    for instruction in parse_dockerfile(build.dockerfile):
        steps.append(instruction)
        if instruction.keyword == "FROM":
            steps.append(Instruction(keyword="COPY", text=f"COPY {BUILD_FILES}/ /"))
    escape = escape_of(build.dockerfile)
    (root / "Dockerfile").write_text(render_dockerfile(steps, escape))
    layer = root / "layer" / "layer"
    shutil.copytree(context_dir() / "replgate_kernel", layer / "replgate_kernel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(context_dir() / "requirements.txt", layer / "requirements.txt")
    (layer / "host-ca.crt").write_bytes(Path(ca).read_bytes() if ca else b"")
    (root / "layer" / "Dockerfile").write_text(SANDBOX_LAYER)
    return steps


async def build_template_image(build: TemplateBuild, context: bytes | None,
                               log: Log) -> BuiltImage:
    """Build the user's Dockerfile, then the sandbox layer on it, as ``build.tag``; each
    line of both builds goes to ``log``. Raises TemplateBuildFailed naming the step."""
    root = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="replgate-template-"))
    stage, layered = f"{build.tag}-stage", f"{build.tag}-layer"
    try:
        steps = await asyncio.to_thread(_prepare, build, context, root)
        args = ["-f", str(root / "Dockerfile"), "-t", stage]
        await _docker_build(args, root / "context", build, steps, log)
        labels = await _labels(stage)
        languages = (labels.get("io.replgate.languages") or "python bash").split()
        log("replgate: adding the sandbox layer (kernel launcher, user 1000, hardening)")
        await _docker_build(["-t", layered, "--build-arg", f"BASE={stage}"], root / "layer",
                            build, None, log)
        labels = {**build.labels, "io.replgate.image": "template",
                  "io.replgate.languages": " ".join(languages)}
        await _configure(layered, build.tag, labels)
        found = await _inspect(build.tag)
        return BuiltImage(tag=build.tag, id=found["Id"], size=int(found.get("Size") or 0),
                          languages=languages)
    finally:
        for tag in (stage, layered):  # untagged; as parents of the image they stay
            with contextlib.suppress(ImageError):
                await _docker("rmi", "--no-prune", tag)
        await asyncio.to_thread(shutil.rmtree, root, True)


async def _configure(source: str, tag: str, labels: dict[str, str]) -> None:
    """``tag``: ``source`` with the sandbox's configuration and ``labels``, in one commit of a
    container made (never started) from it."""
    changes = [*SANDBOX_CONFIG, *(f"LABEL {json.dumps(k)}={json.dumps(v)}"
                                  for k, v in sorted(labels.items()))]
    container = (await _docker("create", "--entrypoint", "/bin/true", source)).strip()
    try:
        args = [arg for change in changes for arg in ("--change", change)]
        await _docker("commit", *args, container, tag)
    finally:
        await _docker("rm", container)


async def remove_template_image(tag: str) -> None:
    """Remove a template's image and the cached layers only it used (its untagged parents);
    an image still in use by a container is left (ImageError says so)."""
    await _docker("rmi", tag)


async def _docker(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise ImageError(f"docker {args[0]} failed: {err.decode(errors='replace').strip()}")
    return out.decode()


async def _inspect(tag: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(await _docker("image", "inspect", tag))
    return found[0]


async def _labels(tag: str) -> dict[str, str]:
    config = (await _inspect(tag)).get("Config") or {}
    return dict(config.get("Labels") or {})


async def _docker_build(args: list[str], context: Path, build: TemplateBuild,
                        steps: list[Instruction] | None, log: Log) -> None:
    """Run one ``docker build``; each step gets ``build.step_timeout_s``."""
    env = {**os.environ, "DOCKER_BUILDKIT": "0", "DOCKER_CLI_HINTS": "false"}
    command = ["docker", "build", "--rm", "--force-rm", *args]
    if build.nocache:
        command.append("--no-cache")
    # Its own session: a signal to the gateway's process group (a stop) is the gateway's to
    # act on; the build ends when the gateway ends it (its task cancelled: killed below).
    proc = await asyncio.create_subprocess_exec(
        *command, str(context), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env, limit=1 << 20, start_new_session=True)
    assert proc.stdout is not None
    step: int | None = None
    step_started = time.monotonic()
    output: list[str] = []
    try:
        while True:
            left = build.step_timeout_s - (time.monotonic() - step_started)
            try:
                raw = await asyncio.wait_for(proc.stdout.readline(), max(left, 0.0))
            except TimeoutError:
                raise _failure(steps, step, f"ran past its timeout of {build.step_timeout_s:g} s",
                               output) from None
            if not raw:
                break
            line = _ANSI.sub("", raw.decode(errors="replace")).rstrip()
            found = _STEP.match(line)
            if found:
                step, step_started, output = int(found.group(1)), time.monotonic(), []
            elif line and not line.startswith(_NOISE):
                output.append(line)
            if line and not line.startswith(_NOISE[2:]):
                log(line)
        if await proc.wait() != 0:
            ours = [line for line in output if line.startswith("replgate: ")]
            reason = (ours[-1] if ours else output[-1] if output
                      else f"docker build exited with {proc.returncode}")
            raise _failure(steps, step, _shorter(reason), output[:-1])
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _shorter(reason: str, most: int = 400) -> str:
    return reason if len(reason) <= most else reason[:most] + "..."


def _failure(steps: list[Instruction] | None, step: int | None, reason: str,
             output: list[str]) -> TemplateBuildFailed:
    tail = "\n".join(output[-OUTPUT_TAIL:])
    last = f"\nits last output:\n{tail}" if tail else ""
    if steps is None:
        return TemplateBuildFailed(f"replgate's sandbox layer failed (step {step}): {reason}{last}",
                                   step=step)
    instruction = steps[step - 1] if step is not None and 0 < step <= len(steps) else None
    if instruction is None or instruction.line is None:
        return TemplateBuildFailed(f"the build failed: {reason}{last}", step=step)
    first = instruction.text.splitlines()[0]
    return TemplateBuildFailed(f"line {instruction.line} ({first}) failed: {reason}{last}",
                               step=step, line=instruction.line)
