"""A template's build under way on this gateway: its log as it grows, followed by any number of
readers, and the check that a kernel starts in the image it made."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from gateway.wire import LogLine
from kernel_pool import KernelPoolError, Profile, SessionHost, TemplateBuildFailed

__all__ = ["BuildRun", "check_kernel"]

CHECK_CODE = "import sys, ipykernel; print(sys.version.split()[0])"


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
                       log: BuildRun) -> None:
    """Start a session of ``profile`` (a real sandbox, no network) and run Python in it;
    TemplateBuildFailed with the reason otherwise, so a template that cannot run a kernel
    fails its build, never a session's start. The profile's ``start_cmd`` and ``ready_cmd``
    run as in every sandbox of it: the kernel answers once ready_cmd exited 0, and its start
    fails with both commands' output if it never does."""
    log.add(f"replgate: checking that a kernel starts in {profile.image} (no network)"
            + (f", with start_cmd {profile.start_cmd!r}" if profile.start_cmd else "")
            + (f", ready once {profile.ready_cmd!r} exits 0" if profile.ready_cmd else ""))
    try:
        session = await host.create_session(profile.name, tenant=tenant)
    except KernelPoolError as exc:
        what = "the template's service" if profile.start_cmd or profile.ready_cmd \
            else "a kernel"
        raise TemplateBuildFailed(f"{what} does not start in the image: {exc}") from exc
    try:
        if profile.ready_cmd:
            log.add("replgate: ready_cmd exited 0")
        execution = await session.submit(CHECK_CODE, timeout_s=60).result()
        if execution.error is not None:
            raise TemplateBuildFailed(
                f"the kernel started but cannot run Python: {execution.error.ename}: "
                f"{execution.error.evalue}")
        log.add(f"replgate: the kernel runs Python {execution.stdout.strip()}")
    finally:
        await host.delete_session(session.id)
