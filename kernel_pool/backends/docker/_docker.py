"""What every module of the Docker backend shares: the labels and paths live containers carry,
the engine's calls off the event loop, and a kernel's connection info.

The label values and ``KERNEL_DIR``/``SOCKET_SUBDIR`` are on running containers and in their
mounts: a gateway takes back the containers an earlier one left by them, so they never change.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import anyio.to_thread
import docker.errors
import requests.exceptions

from kernel_pool.backends.docker._init_kernel import read_untrusted
from kernel_pool.exceptions import BackendError

P = ParamSpec("P")
T = TypeVar("T")

LABEL_OWNER = "io.replgate.owner"
LABEL_SANDBOX = "io.replgate.sandbox"
LABEL_PROFILE = "io.replgate.profile"
KERNEL_DIR = "/kernel"
SOCKET_SUBDIR = "kernel"
DATA_ROOT = "/var/lib/docker"
"""The engine's default data root, where ``docker info`` does not say."""
PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}


async def in_thread(func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking call in a worker thread; a cancellation first waits for the call to end.

    Cancelling a task does not stop its thread: without the wait, the clean-up after a
    cancelled ``create`` could run before the container being made exists, and miss it.
    """
    return await to_its_end(anyio.to_thread.run_sync(partial(func, *args, **kwargs)))


async def to_its_end(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``; a cancellation of the caller meanwhile is raised only once it
    ended (a removal cut half way would leave its mounts, a thread runs on anyway)."""
    call = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.wait([call])
        if not call.cancelled():
            call.exception()  # retrieved: the caller is cancelled, its outcome is moot
        raise


async def call_engine(func: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await in_thread(func, *args, **kwargs)
    except docker.errors.DockerException as exc:
        raise BackendError(f"Docker engine: {exc}") from exc
    except requests.exceptions.RequestException as exc:  # no answer in time: a stuck engine
        raise BackendError(f"Docker engine did not answer: {exc}") from exc


def container_name(sandbox_id: str) -> str:
    return f"replgate-{sandbox_id}"


def kernel_connection(key: str, ip: str | None = None) -> dict[str, Any]:
    """A kernel's connection info (jupyter_client's connection-file dict) with ``key``, and
    ``ip`` (the sockets' path stem) when given."""
    info = {**PORTS, "transport": "ipc", "key": key, "signature_scheme": "hmac-sha256",
            "kernel_name": "python3"}
    return info if ip is None else {**info, "ip": ip}


def read_connection_file(path: Path) -> dict[str, Any]:
    """A kernel's connection file, which lies in a folder the sandbox can write: read it
    without following links and keep only well-formed values (ports must be the fixed small
    integers, so a tampered file cannot point the gateway's socket paths elsewhere). A FIFO
    planted there would block the reading thread for good, and a gateway taking the sandbox
    back with it: it is malformed too."""
    text = read_untrusted(path, 65536)
    try:
        raw = json.loads(text) if text is not None else None
    except ValueError:
        raw = None
    key = raw.get("key") if isinstance(raw, dict) else None
    if not isinstance(key, str) or not key.isalnum():
        raise BackendError(f"kernel connection file {path} is missing or malformed")
    return kernel_connection(key)
