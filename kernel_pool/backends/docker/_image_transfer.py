"""Custom templates' images between machines: saved into the bundle store by the gateway that
built one, loaded from it by a node that lacks it (``docs/cluster.md``).

Both ways are ``docker save`` / ``docker load`` as asyncio subprocesses, the image streamed
in the store's chunks (never whole in memory). The object's key is the image's tag made a
key (:func:`image_key`): each build of a template has a tag of its own, and a node asks
the engine for the tag before it loads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import aclosing

import docker
import docker.errors

from kernel_pool.bundles import BundleStore
from kernel_pool.exceptions import ImageError

__all__ = ["ensure_image", "export_image", "image_key"]

FOLDER = "template-images"
READ_SIZE = 1024 * 1024
_loading: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
"""One load per image at once in this process: a burst of sessions of a template a node
lacks waits for the first one's load."""


def image_key(tag: str) -> str:
    """The store's key of the image tagged ``tag`` (``repository:tag`` made one segment)."""
    return f"{FOLDER}/{tag.replace('/', '~').replace(':', '%')}.tar"


async def export_image(tag: str, store: BundleStore) -> str:
    """Save the image ``tag`` into ``store`` (unless it is there already); its key."""
    key = image_key(tag)
    if await store.exists(key):
        return key
    async with _docker("save", tag, stdout=asyncio.subprocess.PIPE) as (proc, errors):
        assert proc.stdout is not None
        # The object is committed only if the writer's block ends cleanly: a failed save
        # raises inside it, and leaves nothing under the key.
        async with store.writer(key) as out:
            while chunk := await proc.stdout.read(READ_SIZE):
                await out.write(chunk)
            if await proc.wait() != 0:
                raise ImageError(f"docker save {tag} failed: {await errors}")
    return key


async def ensure_image(tag: str, key: str, store: BundleStore) -> bool:
    """Load the image ``tag`` from ``store``'s ``key`` unless the engine has it; whether it
    was loaded. ImageError when the load fails (BundleNotFound when there is no object)."""
    if await _present(tag):
        return False
    async with _loading[tag]:
        if await _present(tag):
            return False
        async with _docker("load", "--quiet", stdin=asyncio.subprocess.PIPE) as (proc, errors):
            assert proc.stdin is not None
            async with aclosing(store.reader(key)) as chunks:
                async for chunk in chunks:
                    proc.stdin.write(chunk)
                    await proc.stdin.drain()
            proc.stdin.close()
            if await proc.wait() != 0:
                raise ImageError(f"docker load of {tag} failed: {await errors}")
    if not await _present(tag):
        raise ImageError(f"the store's {key} did not hold the image {tag}")
    return True


@contextlib.asynccontextmanager
async def _docker(*args: str, stdin: int | None = None, stdout: int | None = None
                  ) -> AsyncIterator[tuple[asyncio.subprocess.Process, asyncio.Task[str]]]:
    """``docker *args`` as a subprocess, with a task reading its stderr all along (read only
    at the end, a chatty stderr would fill its pipe and stall the stream); killed and
    waited for if the block leaves it running."""
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdin=stdin, stdout=stdout or asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    stderr = proc.stderr

    async def read_errors() -> str:
        return (await stderr.read()).decode(errors="replace").strip()

    errors = asyncio.ensure_future(read_errors())
    try:
        yield proc, errors
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        errors.cancel()  # done already unless the block left early


async def _present(tag: str) -> bool:
    def look() -> bool:
        client = docker.from_env()
        try:
            client.images.get(tag)
            return True
        except docker.errors.ImageNotFound:
            return False
        finally:
            client.close()
    return await asyncio.to_thread(look)
