"""The sandbox's file program (``replgate_kernel/fsop.py``), started by ``docker exec`` as the
sandbox's user, as a shell command is (:mod:`._commands`) but without the shell: its arguments
are passed as they are, so no path is ever parsed by a shell.
"""

from __future__ import annotations

from typing import Any

from kernel_pool._disk import SANDBOX_GID, SANDBOX_UID
from kernel_pool.backends.docker._commands import DockerCommand, Run

FSOP = ("/opt/venv/bin/python", "-I", "-S", "/opt/replgate/replgate_kernel/fsop.py")


async def start_file_op(api: Any, run: Run, container_id: str, args: list[str], *,
                        running: set[int], stdin: bool) -> DockerCommand:
    """``fsop.py ARGS`` in the container; its pid joins ``running`` (spared by the clean-up
    after an execution) while it runs."""
    exec_id = (await run(api.exec_create, container_id, [*FSOP, *args],
                         user=f"{SANDBOX_UID}:{SANDBOX_GID}", workdir="/", environment={},
                         stdout=True, stderr=True, stdin=stdin, tty=False))["Id"]
    raw = await run(api.exec_start, exec_id, socket=True, tty=False)
    process = DockerCommand(api, run, exec_id, raw, running)
    try:
        await process._find_pid()
    except BaseException:
        await process.close()
        raise
    return process
