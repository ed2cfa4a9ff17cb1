"""Run a TCP-only Jupyter kernel behind the ipc sockets the host connects to.

``python -I -S relay.py CONNECTION_FILE PROGRAM...`` starts ``PROGRAM... TCP_CONNECTION_FILE``
(Deno's kernel: ``deno jupyter --kernel --conn``) on free ports of the sandbox's loopback, which
exists even without a network, then binds the ipc socket files the host connects to
(``<ip>-<port>``, as jupyter_client names them) and copies bytes both ways. ZMTP is the same
over a Unix socket as over TCP, so the relay never parses a message: the host and the kernel
speak to each other, key and signatures included. It exits with the kernel's exit code, and the
kernel dies with it (its parent-death signal), so the host watches one process as for any kernel.
"""

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
START_TIMEOUT_S = 60.0
BUFFER_LIMIT = 1 << 20
"""Bytes read from one side and not yet written to the other, past which that side is no
longer read (back-pressure), so a flood of output cannot fill the relay's memory."""
PR_SET_PDEATHSIG = 1


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _start(program: list[str], config: dict[str, object]) -> tuple[subprocess.Popen[bytes],
                                                                   dict[str, int]]:
    ports = dict(zip(CHANNELS, _free_ports(len(CHANNELS)), strict=True))
    tcp = {**config, "transport": "tcp", "ip": "127.0.0.1",
           **{f"{channel}_port": port for channel, port in ports.items()}}
    fd, path = tempfile.mkstemp(prefix=".kernel-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(tcp, f)
    # NO_COLOR: Deno colours the text/plain of values otherwise, which clients show verbatim.
    try:
        kernel = subprocess.Popen([*program, path], env={**os.environ, "NO_COLOR": "1"},
                                  preexec_fn=_die_with_parent)
    except FileNotFoundError:  # an image without the program: as PID 1 says it of its own
        os.unlink(path)
        sys.exit(127)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        for port in ports.values():
            while True:
                if kernel.poll() is not None:
                    sys.exit(kernel.returncode)
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", port), timeout=1):
                    break
                if time.monotonic() > deadline:
                    kernel.kill()
                    sys.exit("the kernel did not listen on its ports in time")
                time.sleep(0.01)
    finally:
        os.unlink(path)
    return kernel, ports


class Relay:
    """Unix listeners in front of the kernel's TCP ports, and the byte pipes between them."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self.selector = selector
        self.peer: dict[socket.socket, socket.socket] = {}
        self.pending: dict[socket.socket, bytearray] = {}
        self.masks: dict[socket.socket, int] = {}

    def listen(self, path: str, port: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(16)
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, ("accept", port))

    def accept(self, listener: socket.socket, port: int) -> None:
        try:
            outside, _ = listener.accept()
        except BlockingIOError:
            return
        try:
            inside = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            outside.close()  # the kernel is going away; its exit ends the relay
            return
        for end, other in ((outside, inside), (inside, outside)):
            end.setblocking(False)
            self.peer[end] = other
            self.pending[end] = bytearray()  # bytes waiting to be written to ``end``
        for end in (outside, inside):
            self._watch(end)

    def _watch(self, end: socket.socket) -> None:
        """Wait on ``end`` for what it can do now: read while its peer's backlog has room,
        write while it has a backlog; neither (a full backlog the peer has not taken yet):
        not watched until the peer drains it."""
        room = len(self.pending[self.peer[end]]) < BUFFER_LIMIT
        mask = (selectors.EVENT_READ if room else 0) | (
            selectors.EVENT_WRITE if self.pending[end] else 0)
        current = self.masks.get(end, 0)
        if mask == current:
            return
        if not mask:
            self.selector.unregister(end)
        elif not current:
            self.selector.register(end, mask, ("pipe", None))
        else:
            self.selector.modify(end, mask, ("pipe", None))
        self.masks[end] = mask

    def pipe(self, end: socket.socket, events: int) -> None:
        other = self.peer.get(end)
        if other is None:
            return
        try:
            if events & selectors.EVENT_READ:
                data = end.recv(65536)
                if not data:
                    raise ConnectionResetError
                self.pending[other] += data
            if events & selectors.EVENT_WRITE and self.pending[end]:
                sent = end.send(self.pending[end])
                del self.pending[end][:sent]
            for side in (end, other):
                self._watch(side)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.close(end)

    def close(self, end: socket.socket) -> None:
        for side in (end, self.peer.get(end)):
            if side is None or side not in self.peer:
                continue
            if self.masks.pop(side, 0):
                self.selector.unregister(side)
            self.peer.pop(side)
            self.pending.pop(side)
            side.close()


def main(connection_file: str, program: list[str]) -> None:
    with open(connection_file) as f:
        config = json.load(f)
    kernel, ports = _start(program, config)
    selector = selectors.DefaultSelector()
    relay = Relay(selector)
    for channel in CHANNELS:
        relay.listen(f"{config['ip']}-{config[channel + '_port']}", ports[channel])
    exited = os.pidfd_open(kernel.pid)
    selector.register(exited, selectors.EVENT_READ, ("exit", None))
    while True:
        for key, events in selector.select():
            action, port = key.data
            if action == "exit":
                code = kernel.wait()
                sys.exit(code if code >= 0 else 128 - code)  # as a shell reports a signal
            if action == "accept":
                relay.accept(key.fileobj, port)  # type: ignore[arg-type]
            else:
                relay.pipe(key.fileobj, events)  # type: ignore[arg-type]


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the kernel's, by message
    main(sys.argv[1], sys.argv[2:])
