"""A template's start command (E2B's ``set_start_cmd``), started by the kernel's launcher before
the kernel serves, and its ready command run until it exits 0.

The host asks for them in the launch's environment (:data:`START`, :data:`READY`,
:data:`WITHIN`), taken out of it before anything else reads it. The start command runs as
``sh -c`` in a session and process group of its own, as the kernel's child: a kernel template
(a checkpoint of the kernel's process tree) holds it running and ready, so a sandbox restored
from one has it at once, and a booted kernel answers only once it is ready. The host spares it
when it kills what an execution left behind: it knows it as a child of the kernel leading a
session of its own when the kernel first answered (``DockerSandbox.started``).

Its output is read while the ready command is tried (its last lines are quoted if it never
gets ready), then by ``cat`` into ``/dev/null``, another child of the kernel in a session of
its own: none of it reaches the kernel's outputs, and a service that writes on never blocks on
a full pipe. A start command that exits non-zero first, or a ready command that never exits 0
within its time, fails the kernel's start: the launcher exits with why on its standard error,
which the host quotes.
"""

import contextlib
import os
import select
import signal
import subprocess
import threading
import time

START = "REPLGATE_START_CMD"
READY = "REPLGATE_READY_CMD"
WITHIN = "REPLGATE_READY_WITHIN_S"
KEPT_BYTES = 2048
"""The end of the start command's output kept for a failure's message."""
AGAIN_S = 0.1
"""The pause between two tries of the ready command."""
QUOTED_CHARS = 600


class Service:
    """The start command running, its output read until :meth:`wait_ready` ends."""

    def __init__(self, start_cmd: str, ready_cmd: str, within_s: float) -> None:
        self.start_cmd, self.ready_cmd = start_cmd, ready_cmd
        self.deadline = time.monotonic() + within_s
        self.within_s = within_s
        self.tail = bytearray()
        self.process: subprocess.Popen[bytes] | None = None
        self._read = -1
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None
        if not start_cmd:
            return
        self._read, write = os.pipe()
        try:
            self.process = subprocess.Popen(
                ["/bin/sh", "-c", start_cmd], stdin=subprocess.DEVNULL, stdout=write,
                stderr=write, start_new_session=True)
        except OSError as exc:
            raise SystemExit(f"the template's start_cmd could not start: {exc}") from exc
        finally:
            os.close(write)
        self._reader = threading.Thread(target=self._keep_tail, daemon=True)
        self._reader.start()

    def _keep_tail(self) -> None:
        while not self._stop.is_set():
            if not select.select([self._read], [], [], AGAIN_S)[0]:
                continue
            chunk = os.read(self._read, 65536)
            if not chunk:
                return
            self.tail = (self.tail + chunk)[-KEPT_BYTES:]

    def wait_ready(self) -> None:
        """Return once the ready command exits 0 (at once without one); otherwise end the
        start command's group and exit with why."""
        last = None
        while self.ready_cmd:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self._fail(f"ready_cmd did not exit 0 within {self.within_s:g} s", last)
            try:
                last = subprocess.run(["/bin/sh", "-c", self.ready_cmd], capture_output=True,
                                      stdin=subprocess.DEVNULL, timeout=left, check=False)
            except subprocess.TimeoutExpired:
                continue  # past the deadline: said above
            if last.returncode == 0:
                break
            code = self.process.poll() if self.process is not None else None
            if code not in (None, 0):
                self._fail(f"start_cmd exited with {code} before ready_cmd exited 0", last)
            time.sleep(AGAIN_S)
        self._hand_over()

    def _hand_over(self) -> None:
        """Stop reading the output here: ``cat`` reads it on, into /dev/null (in an image
        without ``cat``, this process's reader thread does)."""
        if self._reader is None:
            return
        try:
            subprocess.Popen(["cat"], stdin=self._read, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return
        self._stop.set()
        self._reader.join()
        os.close(self._read)

    def _fail(self, why: str, last: "subprocess.CompletedProcess[bytes] | None") -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self._stop.set()
        parts = [f"the template's {why}"]
        if last is not None:
            said = (last.stdout + last.stderr).decode(errors="replace").strip()
            parts.append(f"ready_cmd's last try exited with {last.returncode}"
                         + (f": {said[-QUOTED_CHARS:]}" if said else ""))
        if self.start_cmd:
            said = bytes(self.tail).decode(errors="replace").strip()
            parts.append("start_cmd's output ends: " + (said[-QUOTED_CHARS:] if said
                                                        else "(none)"))
        raise SystemExit("\n".join(parts))


def start(environ: "os._Environ[str]") -> Service | None:
    """The service the launch asked for in ``environ`` (its variables taken out), started;
    None when it asked for none."""
    start_cmd, ready_cmd = environ.pop(START, ""), environ.pop(READY, "")
    within = environ.pop(WITHIN, "")
    if not start_cmd and not ready_cmd:
        return None
    try:
        within_s = float(within)
    except ValueError:
        within_s = 60.0
    return Service(start_cmd, ready_cmd, within_s)
