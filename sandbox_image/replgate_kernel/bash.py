"""bash_kernel, without pexpect's pause before every line it sends to the shell.

pexpect waits ``delaybeforesend`` (50 ms) before each write to its child, for programs that
turn their terminal's echo off late (password prompts). bash_kernel's shell is started with
echo off, and the kernel sends each line of a cell, then ``echo $?``, through that wait: a
``1+1`` cost over 100 ms of sleeping, and the kernel's start (its prompt and display functions,
one line at a time) about a second. Run as ``python -m replgate_kernel.bash -f FILE``.
"""

from typing import Any

import pexpect


class _Spawn(pexpect.spawn):  # type: ignore[misc]
    """pexpect's spawn, sending at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delaybeforesend = None


def main() -> None:
    pexpect.spawn = _Spawn  # bash_kernel spawns its shell as ``pexpect.spawn(...)``
    from bash_kernel.kernel import BashKernel
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=BashKernel)


if __name__ == "__main__":
    main()
