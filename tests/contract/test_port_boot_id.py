"""A sandbox's boot id through the port, the same wherever it runs: its own, kept by a pause
(which says it), new after a restart."""

from __future__ import annotations

from pathlib import Path

from kernel_pool import SessionPort

BOOT_ID = "/proc/sys/kernel/random/boot_id"
HOST_BOOT_ID = Path(BOOT_ID).read_text().strip()


async def boot_id(session: SessionPort) -> str:
    command = await session.run_command(f"cat {BOOT_ID}")
    read = b"".join([chunk async for chunk in session.sandbox_read(BOOT_ID, 100)])
    assert command.exit_code == 0 and command.stdout.strip() == read.decode().strip()
    return command.stdout.strip()


async def test_a_pause_keeps_the_boot_id_and_a_restart_changes_it(session: SessionPort) -> None:
    before = await boot_id(session)
    assert before != HOST_BOOT_ID

    info = await session.pause()

    assert info.boot_id == before
    await session.resume()
    assert await boot_id(session) == before
    await session.restart()
    assert await boot_id(session) not in (before, HOST_BOOT_ID)
