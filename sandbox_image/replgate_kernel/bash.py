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
"""

from typing import Any

import pexpect


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


def main() -> None:
    pexpect.spawn = _Spawn  # bash_kernel spawns its shell as ``pexpect.spawn(...)``
    from bash_kernel.kernel import BashKernel
    from ipykernel.kernelapp import IPKernelApp

    class _Kernel(BashKernel):  # type: ignore[misc]
        # The same parameters as BashKernel's: ipykernel reads the signature to decide what
        # to pass (a ``**kwargs`` would be handed ``cell_meta``, which BashKernel refuses).
        def do_execute(self, code: str, silent: bool, store_history: bool = True,
                       user_expressions: Any = None, allow_stdin: bool = False) -> Any:
            _drop_pending(self.bashwrapper.child)
            return super().do_execute(code, silent, store_history, user_expressions,
                                      allow_stdin)

    IPKernelApp.launch_instance(kernel_class=_Kernel)


if __name__ == "__main__":
    main()
