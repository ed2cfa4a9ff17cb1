"""The host's reading of what the sandbox's PID 1 records about its kernels (untrusted files)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from kernel_pool.backends.docker._init_kernel import (
    container_pid,
    exit_code,
    find_kernel,
    host_pid,
    latest_kernel,
    read_record,
    write_for_sandbox,
)


def test_read_record_refuses_links_fifos_and_garbage(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("42")
    (tmp_path / "k1.pid").symlink_to(tmp_path / "secret")
    os.mkfifo(tmp_path / "k2.pid")  # would block a plain read forever
    (tmp_path / "k3.pid").write_text("12; rm -rf /")
    (tmp_path / "k4.pid").write_text(" 17\n")
    assert read_record(tmp_path / "k1.pid") is None
    assert read_record(tmp_path / "k2.pid") is None
    assert read_record(tmp_path / "k3.pid") is None
    assert read_record(tmp_path / "missing") is None
    assert read_record(tmp_path / "k4.pid") == 17


def test_exit_code_out_of_range_ignored(tmp_path: Path) -> None:
    (tmp_path / "k1.exit").write_text("99999")
    (tmp_path / "k2.exit").write_text("-9")
    assert exit_code(tmp_path, "k1") is None
    assert exit_code(tmp_path, "k2") == -9


def test_host_pid_only_for_a_child_of_that_init(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        # This process is not in a pid namespace of its own: the child's pid is the same in
        # both, and it is this process's child, not init's (pid 1 in the host's namespace).
        assert host_pid(os.getpid(), child.pid) == child.pid
        assert host_pid(1, child.pid) is None
        assert host_pid(os.getpid(), 1) is None
        (tmp_path / "k7.pid").write_text(str(child.pid))
        assert find_kernel(tmp_path, "k7", os.getpid()) == (child.pid, None)
        assert find_kernel(tmp_path, "k7", 1) == (None, None)
    finally:
        child.kill()
        child.wait()


def test_latest_kernel_skips_reaped_ones(tmp_path: Path) -> None:
    for name in ("k1", "k2", "k10"):
        (tmp_path / f"{name}.pid").write_text("5")
    (tmp_path / "k10.exit").write_text("0")
    # Names the host never gives, planted by the sandbox: "k²" passes str.isdigit().
    for planted in ("kx", "k\u00b2", "k1234567890", "k-1"):
        (tmp_path / f"{planted}.pid").write_text("5")
    assert latest_kernel(tmp_path) == "k2"
    assert latest_kernel(tmp_path / "none") is None


def test_container_pid_of_a_host_process() -> None:
    # This process's own namespace is the host's: the innermost pid is its pid.
    assert container_pid(os.getpid()) == os.getpid()
    assert container_pid(2**22 + 7) is None  # no such process


def test_write_for_sandbox_replaces_a_planted_link_and_leaves_its_target(
        tmp_path: Path) -> None:
    victim = tmp_path / "host-file"
    victim.write_text("the host's")
    (tmp_path / "k1.json").symlink_to(victim)
    write_for_sandbox(tmp_path / "k1.json", "{}")
    assert victim.read_text() == "the host's"
    written = (tmp_path / "k1.json").lstat()
    assert stat.S_ISREG(written.st_mode) and stat.S_IMODE(written.st_mode) == 0o600
    assert (tmp_path / "k1.json").read_text() == "{}"
