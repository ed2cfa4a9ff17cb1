"""A kernel's standard error while it starts, for the host to quote if the start fails.

PID 1 starts the Python and Bash kernels with their standard error in a file of the socket
folder (``/kernel/<name>.err``). What goes wrong before the kernel answers (a broken
environment, a failed import, a crash) is written there, and the host quotes its last lines
when the start fails. Once a kernel has loaded what it needs, :func:`released_stderr` points
its standard error at ``/dev/null`` as before, so the file stops growing (the socket folder
is a small tmpfs), ipykernel's copy of the descriptor (it echoes every captured write there)
is never the file's, and a checkpoint of the kernel holds no descriptor of that folder.
"""

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def released_stderr() -> Iterator[None]:
    """Standard error to ``/dev/null`` from here on; back to the start's file for the
    traceback when the block raises (the kernel's last steps of starting failed)."""
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    try:
        yield
    except BaseException:
        os.dup2(saved, 2)
        raise
    finally:
        os.close(saved)
