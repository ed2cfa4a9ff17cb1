"""Run one shell command for the gateway: ``python -I -S command.py CMD`` (a ``docker exec``).

``sh -c CMD`` runs in a process group and session of its own, on this process's stdin, stdout
and stderr (no copy in between). When the shell exits, or when the gateway stops the command
(SIGTERM: its timeout, or a kill asked for), the whole group is killed, so a background child
(``sleep 100 &``) does not outlive the command or hold its output open. A child that left the
group on purpose (``setsid``) is killed by the gateway after the next execution, like any
process an execution leaves behind.

On a terminal (``REPLGATE_PTY=COLSxROWS`` set by the gateway, the exec's stdio a pty that is
this process's controlling terminal) the shell stays in this session, so that the terminal is
its controlling one too, in a process group of its own that is the terminal's foreground group
(an interactive shell's job control needs both). Its jobs make groups of their own in the
session: ending it kills every process of the session, and waits until none is left running.
The size is set here first unless the gateway's resize came before. Under gVisor a signal to a
terminal's exec goes to the terminal's foreground group (the shell, which ignores SIGTERM), not
to this process: the gateway then signals this process through gVisor's control, finding it by
the name it takes here (``REPLGATE_NAME``, its ``/proc/self/comm``).

The exit status is the shell's; killed by a signal N it is 128 + N, as in a shell.
"""

import contextlib
import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import time

SESSION_KILL_S = 5.0
"""How long a terminal's end may go on killing its session's processes."""


def _kill_group(pgid: int) -> None:
    # A group forking while it is killed: a few passes until nothing is left in it.
    for _ in range(20):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return


def _kill_session() -> None:
    """Every other process of this session (a terminal shell's jobs, each in its group), killed
    until none is left but zombies: a killed process runs on for a moment (under gVisor,
    measurably), and one forking meanwhile adds another."""
    me = os.getpid()
    deadline = time.monotonic() + SESSION_KILL_S
    while True:
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == me and fields[0] not in (b"Z", b"X"):  # its session id
                found = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(name), signal.SIGKILL)
        if not found or time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _terminal_size(spec: str) -> None:
    cols, rows = (int(n) for n in spec.split("x"))
    current = fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8)
    if struct.unpack("HHHH", current)[:2] == (0, 0):
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _foreground() -> None:
    """In the shell, before it starts: its own group, the terminal's foreground one."""
    os.setpgid(0, 0)
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group's tcsetpgrp
    os.tcsetpgrp(0, os.getpgrp())
    signal.signal(signal.SIGTTOU, previous)


def main() -> int:
    child: subprocess.Popen[bytes] | None = None
    stopped_by = 0
    pty = os.environ.pop("REPLGATE_PTY", "")
    name = os.environ.pop("REPLGATE_NAME", "")
    if name:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name)

    def end() -> None:
        if child is not None:
            _kill_group(child.pid)
        if pty:
            _kill_session()

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopped_by
        if child is None:
            stopped_by = signum  # the shell may have started: killed once it is known
            return
        end()
        os._exit(128 + signum)

    # The handlers come first: a stop that came while the shell started (its first output
    # can reach the gateway before this process gets further) killed this process alone, by
    # the default action, and left the shell's group running.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    if pty:
        _terminal_size(pty)
        child = subprocess.Popen(["/bin/sh", "-c", sys.argv[1]], preexec_fn=_foreground)
    else:
        child = subprocess.Popen(["/bin/sh", "-c", sys.argv[1]], start_new_session=True)
    if stopped_by:
        stop(stopped_by, None)
    code = child.wait()
    end()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
