"""Run one shell command for the gateway: ``python -I -S command.py CMD`` (a ``docker exec``).

``sh -c CMD`` runs in a process group and session of its own, on this process's stdout and
stderr (no copy in between). When the shell exits, or when the gateway stops the command
(SIGTERM: its timeout, or a kill asked for), the whole group is killed, so a background child
(``sleep 100 &``) does not outlive the command or hold its output open. A child that left the
group on purpose (``setsid``) is killed by the gateway after the next execution, like any
process an execution leaves behind.

The exit status is the shell's; killed by a signal N it is 128 + N, as in a shell.
"""

import os
import signal
import subprocess
import sys


def _kill_group(pgid: int) -> None:
    # A group forking while it is killed: a few passes until nothing is left in it.
    for _ in range(20):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return


def main() -> int:
    child: subprocess.Popen[bytes] | None = None
    stopped_by = 0

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopped_by
        if child is None:
            stopped_by = signum  # the shell may have started: killed once it is known
            return
        _kill_group(child.pid)
        os._exit(128 + signum)

    # The handlers come first: a stop that came while the shell started (its first output
    # can reach the gateway before this process gets further) killed this process alone, by
    # the default action, and left the shell's group running.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    child = subprocess.Popen(["/bin/sh", "-c", sys.argv[1]], start_new_session=True)
    if stopped_by:
        stop(stopped_by, None)
    code = child.wait()
    _kill_group(child.pid)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
