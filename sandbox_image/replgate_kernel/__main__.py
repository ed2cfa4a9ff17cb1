"""Start an IPython kernel tuned for replgate: ``python -m replgate_kernel -f CONNECTION_FILE``.

The heavy data libraries are imported before the kernel answers its first request, so a warm
kernel has already paid for them; ``import pandas`` in user code is then a dictionary lookup.
"""

import importlib
import os
import shutil
import sys

PREIMPORTS = ("numpy", "pandas", "matplotlib", "matplotlib.pyplot", "scipy", "PIL.Image")
# A stream message is sent in pieces of at most this many characters, so one huge print costs
# the gateway a bounded amount of memory per message.
STREAM_CHUNK = 256 * 1024


def _prepare_matplotlib() -> None:
    target = os.environ.get("MPLCONFIGDIR")
    if target and not os.path.isdir(target):
        shutil.copytree("/opt/replgate/mplconfig", target)


def _preimport() -> None:
    for name in PREIMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _chunk_stream_messages() -> None:
    from ipykernel.iostream import OutStream

    flush_buffers = OutStream._flush_buffers

    def chunked(self):  # type: ignore[no-untyped-def]
        for parent, data in flush_buffers(self):
            for start in range(0, len(data), STREAM_CHUNK):
                yield parent, data[start : start + STREAM_CHUNK]

    OutStream._flush_buffers = chunked  # type: ignore[method-assign]


def _start_egress() -> None:
    """Under an egress profile, route HTTP(S) through the gateway's proxy (see egress.py)."""
    if "-f" in sys.argv[1:-1]:
        from replgate_kernel import egress

        egress.start(os.path.dirname(sys.argv[sys.argv.index("-f") + 1]))


def main() -> None:
    _start_egress()
    _prepare_matplotlib()
    _preimport()
    _chunk_stream_messages()

    from ipykernel.kernelapp import IPKernelApp
    from traitlets.config import Config

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
    app = IPKernelApp.instance(config=config)
    app.initialize(sys.argv[1:])
    app.start()


if __name__ == "__main__":
    main()
