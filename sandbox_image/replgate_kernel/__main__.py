"""Start an IPython kernel tuned for replgate: ``python -P -m replgate_kernel -f CONNECTION``.

The heavy data libraries are imported before the kernel answers its first request, so a warm
kernel has already paid for them; ``import pandas`` in user code is then a dictionary lookup.
"""

import contextlib
import functools
import glob
import importlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import types
from collections.abc import Iterator

PREIMPORTS = ("numpy", "pandas", "matplotlib", "matplotlib.pyplot", "scipy", "PIL.Image")
# A stream message is sent in pieces of at most this many characters, so one huge print costs
# the gateway a bounded amount of memory per message.
STREAM_CHUNK = 256 * 1024
# Bytes of one rich output's bundle when the host gives no --max-output-bytes (its default).
MAX_OUTPUT_BYTES = 8 * 1024 * 1024
# Characters a stream may hold before the IOPub thread has sent them. A writer past that waits
# for the send (back-pressure), so a print flood cannot fill the kernel's memory with backlog.
STREAM_BACKLOG = 8 * 1024 * 1024


def _private_dirs() -> None:
    """Fresh IPython and matplotlib folders, made by this process under unguessable names.

    Both are read at start-up (IPython runs its profile's start-up files and config), and /tmp
    outlives a kernel restart: code that ran before must not be able to plant anything the next
    kernel runs. Earlier kernels' folders are removed (no process of theirs is left).
    """
    for name in ("IPYTHONDIR", "MPLCONFIGDIR"):
        prefix = f".{name.lower()}-"
        for old in glob.glob(os.path.join(tempfile.gettempdir(), prefix + "*")):
            shutil.rmtree(old, ignore_errors=True)
        os.environ[name] = tempfile.mkdtemp(prefix=prefix)


def _prepare_matplotlib() -> None:
    target = os.environ.get("MPLCONFIGDIR")
    if target:
        shutil.copytree("/opt/replgate/mplconfig", target, dirs_exist_ok=True)


def _preimport() -> None:
    for name in PREIMPORTS:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _chunk_stream_messages() -> None:
    from ipykernel.iostream import IOPubThread, OutStream

    flush_buffers = OutStream._flush_buffers
    schedule_send = IOPubThread.send_multipart

    def send_multipart(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        # ipykernel hands every send to the IOPub thread through a blocking in-process pipe,
        # even a send made on that thread. One flush of a flood sends many chunks from it,
        # before it reads the pipe again: the pipe fills and the thread waits on itself.
        if threading.current_thread() is self.thread:
            self._really_send(*args, **kwargs)
        else:
            schedule_send(self, *args, **kwargs)

    def chunked(self):  # type: ignore[no-untyped-def]
        for parent, data in flush_buffers(self):
            for start in range(0, len(data), STREAM_CHUNK):
                yield parent, data[start : start + STREAM_CHUNK]

    OutStream._flush_buffers = chunked  # type: ignore[method-assign]
    IOPubThread.send_multipart = send_multipart  # type: ignore[method-assign]


def _bound_stream_backlog() -> None:
    from ipykernel.iostream import OutStream

    write = OutStream.write

    def bounded_write(self, string):  # type: ignore[no-untyped-def]
        written = write(self, string)
        with self._buffer_lock:
            backlog = sum(buffer.tell() for buffer in self._buffers.values())
        if backlog > STREAM_BACKLOG:
            self.flush()  # waits (up to flush_timeout) until the IOPub thread has sent it
        return written

    OutStream.write = bounded_write  # type: ignore[method-assign]


def _lighter_cells() -> None:
    """Take out per-cell work of a stock ipykernel that nothing here uses.

    A ``1+1`` cell flushes stdout and stderr six times (display hook, before the reply, before
    the idle status), each a round trip to the IOPub thread even with nothing written: only a
    stream with something to send is flushed now. ``execute_input`` re-broadcasts the code to
    other clients of the kernel, and the ``busy`` status of an execution says it started: the
    gateway is the kernel's only client, reads neither and tells its own clients itself.
    """
    from ipykernel.iostream import OutStream
    from ipykernel.kernelbase import Kernel

    flush = OutStream.flush

    def flush_if_written(self):  # type: ignore[no-untyped-def]
        if self._is_master_process() and not self._flush_pending:
            with self._buffer_lock:
                empty = not any(buffer.tell() for buffer in self._buffers.values())
            if empty:
                return
        flush(self)

    publish_status = Kernel._publish_status

    def publish_status_but_busy(self, status, channel, parent=None):  # type: ignore
        if status == "busy":
            header = (parent or self.get_parent(channel) or {}).get("header") or {}
            if header.get("msg_type") == "execute_request":
                return
        publish_status(self, status, channel, parent)

    OutStream.flush = flush_if_written  # type: ignore[method-assign]
    Kernel._publish_execute_input = lambda self, code, parent, count: None  # type: ignore
    Kernel._publish_status = publish_status_but_busy  # type: ignore[method-assign]
    _plain_format_calls()


def _plain_format_calls() -> None:
    """IPython's formatters' ``__call__`` run IPython's own error catcher through the
    ``decorator`` package, which binds the call's signature every time: ten formatters per
    result, about half of formatting a ``1+1``. Same catcher, called directly."""
    from IPython.core import formatters

    catch = getattr(formatters.catch_format_error, "__wrapped__", None)
    if catch is None:  # another IPython than the pinned one: leave it as it is
        return
    for cls in list(vars(formatters).values()):
        call = vars(cls).get("__call__") if isinstance(cls, type) else None
        method = getattr(call, "__wrapped__", None)
        if method is None:
            continue

        def caught(self, *args, __method=method, **kwargs):  # type: ignore[no-untyped-def]
            return catch(__method, self, *args, **kwargs)

        functools.update_wrapper(caught, method)
        cls.__call__ = caught


def _start_egress() -> None:
    """Forward 127.0.0.1:3128 to the gateway's egress proxy, now or once it serves (egress.py)."""
    if "-f" in sys.argv[1:-1]:
        from replgate_kernel import egress

        egress.start(os.path.dirname(sys.argv[sys.argv.index("-f") + 1]))


@contextlib.contextmanager
def _without_unused_modules() -> Iterator[None]:
    """Hide, while IPython and ipykernel load, what they import and a kernel here never uses.

    jedi (about 6 MiB per kernel; its completer is off, IPython's own is used), debugpy (about
    5 MiB; the gateway relays no debug_request) and IPython's terminal front end with
    prompt_toolkit (about 5 MiB; ``IPython`` imports it only for ``IPython.embed``, which a
    stub stands in for and loads when called). User code imports each of them as usual later.
    """
    hidden = [name for name in ("jedi", "debugpy") if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    stub = None
    if "IPython" not in sys.modules:
        stub = types.ModuleType("IPython.terminal.embed")

        def embed(**kwargs):  # type: ignore[no-untyped-def]
            sys.modules.pop("IPython.terminal.embed", None)
            from IPython.terminal.embed import embed as real

            return real(**kwargs)

        stub.embed = embed  # type: ignore[attr-defined]
        sys.modules[stub.__name__] = stub
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
        if stub is not None and sys.modules.get(stub.__name__) is stub:
            del sys.modules[stub.__name__]


def _agent_results(app, max_output_bytes: int) -> None:  # type: ignore[no-untyped-def]
    """What agents read beside the outputs: charts, frames and lists as data (display
    bundles), PIL images saved or shown as outputs, and the files each execution touched
    (the execute_reply's metadata); what a pause would lose; and the session's environment,
    taken from the gateway's file before each execution (session_env.py)."""
    from replgate_kernel import charts, data, files, images, snapshot

    charts.install(app.shell)
    data.install(app.shell, max_output_bytes)
    images.install()
    files.install(app.kernel, os.getcwd())
    snapshot.install(app.shell)
    if "-f" in sys.argv[1:-1]:
        from replgate_kernel import session_env

        session_env.install(app.kernel, os.path.dirname(sys.argv[sys.argv.index("-f") + 1]))


def main() -> None:
    from replgate_kernel import outputs, service
    from replgate_kernel.startup import released_stderr

    max_output_bytes = outputs.take_option(sys.argv) or MAX_OUTPUT_BYTES
    # A template's start command boots beside the kernel's imports; the kernel answers only
    # once it is ready (service.py).
    started = service.start(os.environ)
    with _without_unused_modules():
        _start_egress()
        _private_dirs()
        _prepare_matplotlib()
        _preimport()
        _chunk_stream_messages()
        _bound_stream_backlog()
        _lighter_cells()
        outputs.install(max_output_bytes)

        from ipykernel.kernelapp import IPKernelApp
        from traitlets.config import Config

    if started is not None:
        started.wait_ready()
    config = Config()
    # No SQLite history: it costs time on every cell and nothing here reads it back.
    config.HistoryManager.enabled = False
    # jedi takes 10+ s for a first completion on one CPU; IPython's own completer is instant.
    config.IPCompleter.use_jedi = False
    config.IPKernelApp.matplotlib = "inline"
    config.IPKernelApp.pylab_import_all = False
    config.InlineBackend.figure_formats = {"png"}
    config.IPKernelApp.capture_fd_output = True
    config.Application.log_level = "WARN"
    # Stock ipykernel sleeps 0.5 ms before every execute_reply ("on rare occasions, the flush
    # doesn't seem to make it"); the gateway waits for the idle status, after all output.
    config.Kernel._execute_sleep = 0.0
    # The workspace is the working directory. It joins sys.path (as in Jupyter, so user code
    # imports its own modules) only once the kernel is up: the launcher runs with -P, and a
    # file there named like a module the kernel loads at start cannot stand in for it.
    init_path = IPKernelApp.init_path
    IPKernelApp.init_path = lambda self: None  # type: ignore[method-assign]
    app = IPKernelApp.instance(config=config)
    with released_stderr(), _without_unused_modules():  # the kernel class is imported here
        app.initialize(sys.argv[1:])
    # traitlets leaves the logger at DEBUG and filters in its handler: each cell would still
    # build the records of ipykernel's debug messages (the whole reply among them).
    app.log.setLevel(max(app.log.level, logging.WARNING))
    _agent_results(app, max_output_bytes)
    init_path(app)
    app.start()


if __name__ == "__main__":
    main()
