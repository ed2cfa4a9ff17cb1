"""One gateway per state directory: an exclusive lock, and the listening socket bound before use.

``replgate serve`` takes an ``flock`` on ``<state dir>/gateway.lock`` before it does anything
else and holds it for the life of its process: the kernel releases it when the process ends,
however it ends, so a killed gateway never leaves a stale lock behind. The file names the
holder (pid, then its address once the socket is bound), so a second gateway on the same
directory can say which one is running and exit having touched nothing. The socket listens
before any sandbox is taken back, so a port clash also stops a start before it changes anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path

LOCK_FILE = "gateway.lock"


class StartRefused(Exception):
    """``serve`` cannot start; the message is the one sentence to print."""


class StateLock:
    """The held lock on a state directory (released when the process ends or :meth:`release`)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, state_dir: Path) -> StateLock:
        """Lock ``state_dir`` (made if missing) for this process, or :class:`StartRefused`."""
        path = state_dir / LOCK_FILE
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(state_dir, 0o700)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StartRefused(
                f"cannot use the state directory {state_dir} ({exc.strerror or exc}); set "
                "REPLGATE_STATE_DIR to a directory this user may write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise StartRefused(
                f"another replgate gateway ({holder}) is using the state directory {state_dir}; "
                "stop it first, or set REPLGATE_STATE_DIR to another directory") from None
        except BaseException:
            os.close(fd)
            raise
        # What the file says is only for a second gateway's message: a full disk must not stop
        # this one (the lock itself needs no space).
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def record_address(self, address: str) -> None:
        """Add the address this gateway listens on, for a second one to name."""
        # Appended, not rewritten: a reader never sees the pid line half-written.
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, f"address {address}\n".encode(), os.fstat(self._fd).st_size)

    def release(self) -> None:
        """Give the directory up (the process's end does the same)."""
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _describe_holder(fd: int) -> str:
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in os.pread(fd, 4096, 0).decode(errors="replace").splitlines():
            name, _, value = line.partition(" ")
            fields[name] = value.strip()
    pid = f"pid {fields['pid']}" if fields.get("pid") else "pid unknown"
    address = fields.get("address")
    return f"{pid}, listening on {address}" if address else f"{pid}, not listening yet"


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (uvicorn serves it), or :class:`StartRefused`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Lets a restarted gateway bind at once while old connections sit in TIME_WAIT; a port
        # another process listens on is still refused.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening at once claims the port for good (two SO_REUSEADDR sockets may both be
        # bound while neither listens); requests that come before the app is ready wait.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if isinstance(exc, socket.gaierror):  # not an address
            raise StartRefused(f"cannot listen on {host}:{port} ({exc.strerror or exc}); set "
                               "--host or REPLGATE_HOST to an address of this machine") from None
        raise StartRefused(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); stop what uses that port, "
            "or choose another with --port or REPLGATE_PORT") from None
    return sock


def socket_url(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (the real port when 0 was asked)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
