"""The sandbox's boot id as E2B's tests read it to tell a reboot (``files.read`` of
``/proc/sys/kernel/random/boot_id``), with the unmodified SDK against a real gateway: each
sandbox's own, kept by a pause, new after a filesystem-only one (a cold boot)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2b import Sandbox

pytestmark = pytest.mark.usefixtures("e2b_env")

BOOT_ID = "/proc/sys/kernel/random/boot_id"
HOST_BOOT_ID = Path(BOOT_ID).read_text().strip()


def boot_id(sandbox: Sandbox) -> str:
    """As the files API and a command read it (they agree)."""
    read = sandbox.files.read(BOOT_ID).strip()
    assert sandbox.commands.run(f"cat {BOOT_ID}").stdout.strip() == read
    return read


def test_each_sandbox_boots_with_its_own_id() -> None:
    first, second = Sandbox.create(), Sandbox.create()
    try:
        assert len({boot_id(first), boot_id(second), HOST_BOOT_ID}) == 3
    finally:
        first.kill()
        second.kill()


def test_a_pause_keeps_the_boot_id_and_a_filesystem_only_one_reboots() -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.files.write("/home/user/marker.txt", "kept")
        before = boot_id(sandbox)

        assert sandbox.pause()
        resumed = sandbox.connect()
        assert boot_id(resumed) == before  # resumed in place, not booted

        assert resumed.pause(mode="filesystem")
        rebooted = resumed.connect()
        assert rebooted.files.read("/home/user/marker.txt") == "kept"
        assert boot_id(rebooted) not in (before, HOST_BOOT_ID)
    finally:
        sandbox.kill()
