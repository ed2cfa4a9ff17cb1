"""PID 1 of a sandbox container: reaps every orphan and never exits until told to stop.

Kernels are started beside it (``docker exec``); orphans of any process in the container are
re-parented here. A sandbox-wide ``kill -KILL -1`` spares PID 1, so the container survives the
hard stop of a runaway execution and the next kernel reuses its workspace.
"""

import os
import signal


def _reap(_signum: int, _frame: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _stop(_signum: int, _frame: object) -> None:
    os._exit(0)


signal.signal(signal.SIGCHLD, _reap)
signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGINT, _stop)
while True:
    signal.pause()
