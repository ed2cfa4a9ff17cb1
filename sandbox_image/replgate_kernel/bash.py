"""bash_kernel, without pexpect's pause before every line it sends to the shell.

pexpect waits ``delaybeforesend`` (50 ms) before each write to its child, for programs that
turn their terminal's echo off late (password prompts). bash_kernel's shell is started with
echo off, and the kernel sends each line of a cell, then ``echo $?``, through that wait: a
``1+1`` cost over 100 ms of sleeping, and the kernel's start (its prompt and display functions,
one line at a time) about a second. Run as ``python -m replgate_kernel.bash -f FILE``.

Each execution first drops what the terminal holds from before it: output that background
processes of an ended execution wrote after its prompt (a fork bomb's "fork: retry" lines). The
session kills such processes as the execution ends, so nothing later belongs to them, and the
next execution's output must start with its own.

An execution that ran into the sandbox's process limit (a fork bomb) leaves no process behind
it: the session spares what a context's kernel started (a job started with ``&`` runs on, as in
a terminal), but a bomb's jobs would fork on, each failure a "fork: retry" line in the output
of whatever runs next.
"""

import contextlib
import importlib
import os
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any

import pexpect

_PIDS_EVENTS = (Path("/sys/fs/cgroup/pids.events"), Path("/sys/fs/cgroup/pids/pids.events"))
"""The sandbox's count of forks its process limit refused (cgroup v2, then v1)."""
_KILL_ROUNDS = 50


class _Spawn(pexpect.spawn):  # type: ignore[misc]
    """pexpect's spawn, sending at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delaybeforesend = None


def _drop_pending(child: pexpect.spawn) -> None:
    """Read and drop everything the shell's terminal holds now, without waiting."""
    child.buffer = ""
    while True:
        try:
            child.read_nonblocking(65536, timeout=0)
        except (pexpect.TIMEOUT, pexpect.EOF):
            child.buffer = ""
            return


def _forks_refused() -> int | None:
    """How many forks the process limit refused so far; None where it cannot be read."""
    for path in _PIDS_EVENTS:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "max":
                return int(value)
    return None


def _descendants(root: int) -> list[int]:
    """The living processes below ``root`` (zombies left out: they are already dead)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _end_runaway(shell: int) -> None:
    """Stop, then kill, every process below the shell, round after round until none is left
    (a fork bomb forks on while it is being killed)."""
    for _ in range(_KILL_ROUNDS):
        pids = _descendants(shell)
        if not pids:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        time.sleep(0.01)


def _without_ipython_terminal() -> None:
    """Stand in for ``IPython.terminal.embed`` until something calls its ``embed``.

    ``IPython/__init__`` imports it (for ``IPython.embed``), and with it IPython's terminal:
    prompt_toolkit and its debugger, about 0.15 s of a bash kernel's 0.45 s start, which a
    bash kernel never uses. The stand-in's ``embed`` imports the real module and calls it.
    """
    name = "IPython.terminal.embed"

    def embed(*args: Any, **kwargs: Any) -> Any:
        sys.modules.pop(name, None)
        real = importlib.import_module(name)
        return real.embed(*args, **kwargs)

    stand_in = types.ModuleType(name)
    stand_in.embed = embed  # type: ignore[attr-defined]
    sys.modules.setdefault(name, stand_in)


def main() -> None:
    pexpect.spawn = _Spawn  # bash_kernel spawns its shell as ``pexpect.spawn(...)``
    _without_ipython_terminal()
    from bash_kernel.kernel import BashKernel
    from ipykernel.kernelapp import IPKernelApp

    class _Kernel(BashKernel):  # type: ignore[misc]
        # The same parameters as BashKernel's: ipykernel reads the signature to decide what
        # to pass (a ``**kwargs`` would be handed ``cell_meta``, which BashKernel refuses).
        def do_execute(self, code: str, silent: bool, store_history: bool = True,
                       user_expressions: Any = None, allow_stdin: bool = False) -> Any:
            _drop_pending(self.bashwrapper.child)
            refused = _forks_refused()
            reply = super().do_execute(code, silent, store_history, user_expressions,
                                       allow_stdin)
            if refused is not None and (_forks_refused() or 0) > refused:
                _end_runaway(self.bashwrapper.child.pid)
                # The shell tells of its jobs' end before its next prompt: one command more,
                # whose output is nobody's.
                with contextlib.suppress(Exception):
                    self.bashwrapper.run_command("true", timeout=10)
                _drop_pending(self.bashwrapper.child)
            return reply

    from replgate_kernel.startup import released_stderr

    app = IPKernelApp.instance(kernel_class=_Kernel)
    with released_stderr():
        app.initialize()
    app.start()


if __name__ == "__main__":
    main()
