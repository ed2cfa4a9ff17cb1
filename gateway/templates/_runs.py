"""A template's build under way on this gateway: its log as it grows, followed by any number of
readers, and the check that a kernel starts in the image it made."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from gateway.wire import LogLine
from kernel_pool import (
    CommandResult,
    KernelPoolError,
    Profile,
    SessionHost,
    SessionPort,
    TemplateBuildFailed,
)

__all__ = ["BuildRun", "check_kernel"]

CHECK_CODE = "import sys, ipykernel; print(sys.version.split()[0])"
READY_WITHIN_S = 60.0
"""How long a template's ``ready_cmd`` may take to exit 0 after its ``start_cmd`` started."""


class BuildRun:
    """One build's log lines, in order, and whether the build has ended."""

    def __init__(self, build_id: str) -> None:
        self.build_id = build_id
        self.lines: list[LogLine] = []
        self.ended = False
        self.task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def __repr__(self) -> str:
        return f"<BuildRun {self.build_id} {len(self.lines)} lines{' ended' if self.ended else ''}>"

    def add(self, text: str, *, error: bool = False) -> None:
        self.lines.append(LogLine(offset=len(self.lines), build_id=self.build_id,
                                  at=datetime.now(UTC), text=text, error=error))
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    async def follow(self, offset: int = 0) -> AsyncIterator[LogLine]:
        """The lines from ``offset`` as they come, to the build's end."""
        while True:
            while offset < len(self.lines):
                yield self.lines[offset]
                offset += 1
            if self.ended:
                return
            changed = self._changed
            await changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


async def check_kernel(host: SessionHost, profile: Profile, *, tenant: str,
                       start_cmd: str | None, ready_cmd: str | None, log: BuildRun) -> None:
    """Start a session of ``profile`` (a real sandbox, no network), run Python in it, start
    ``start_cmd`` and wait for ``ready_cmd``; TemplateBuildFailed with the reason otherwise,
    so a template that cannot run a kernel fails its build, never a session's start."""
    log.add(f"replgate: checking that a kernel starts in {profile.image} (no network)")
    try:
        session = await host.create_session(profile.name, tenant=tenant)
    except KernelPoolError as exc:
        raise TemplateBuildFailed(f"a kernel does not start in the image: {exc}") from exc
    try:
        execution = await session.submit(CHECK_CODE, timeout_s=60).result()
        if execution.error is not None:
            raise TemplateBuildFailed(
                f"the kernel started but cannot run Python: {execution.error.ename}: "
                f"{execution.error.evalue}")
        log.add(f"replgate: the kernel runs Python {execution.stdout.strip()}")
        # start_cmd runs as a command of its own, not awaited (a background job of a command
        # would end with it): it runs while ready_cmd is polled, and goes with the session.
        starter = None if not start_cmd else asyncio.ensure_future(
            session.run_command(start_cmd, timeout_s=READY_WITHIN_S + 30))
        try:
            if start_cmd:
                log.add(f"replgate: start_cmd started: {start_cmd}")
            if ready_cmd:
                await _until_ready(session, ready_cmd, starter, log)
        finally:
            if starter is not None:
                starter.cancel()
                with contextlib.suppress(BaseException):
                    await starter
    finally:
        await host.delete_session(session.id)


async def _until_ready(session: SessionPort, ready_cmd: str,
                       starter: asyncio.Future[CommandResult] | None, log: BuildRun) -> None:
    """Run ``ready_cmd`` until it exits 0, each attempt given the time left; fail at once if
    ``start_cmd`` (``starter``) ended unsuccessfully first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_WITHIN_S
    last = None
    while (left := deadline - loop.time()) > 0:
        last = await session.run_command(ready_cmd, timeout_s=left)
        if last.exit_code == 0:
            log.add("replgate: ready_cmd exited 0")
            return
        if starter is not None and starter.done() and not starter.cancelled() \
                and starter.exception() is None and starter.result().exit_code != 0:
            ended = starter.result()
            said = (ended.stderr or ended.stdout).strip()[-300:]
            raise TemplateBuildFailed(f"start_cmd exited with {ended.exit_code} before "
                                      "ready_cmd exited 0" + (f": {said}" if said else ""))
        await asyncio.sleep(0.5)
    said = (last.stderr or last.stdout).strip()[-300:] if last is not None else ""
    raise TemplateBuildFailed(f"ready_cmd never exited 0 within {READY_WITHIN_S:g} s"
                              + (f": {said}" if said else ""))
