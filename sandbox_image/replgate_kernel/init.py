"""PID 1 of a sandbox container: starts kernels on request, reaps every orphan, never exits
until told to stop.

Kernels descend from this process (not ``docker exec``) so that a checkpoint of the container
(CRIU, which dumps PID 1's process tree) holds the kernel. The host asks for a kernel by
writing ``/kernel/launch.json`` (``{"name": "k3", "max_output_bytes": N, "language": "r"}``,
the language ``python`` unless named; a code context's kernel is named ``x<8 hex>k<n>`` and
may bring ``"env"``, its session's variables over the container's) and sending SIGUSR1; this
process starts that language's kernel (:data:`KERNELS`: ``python -P -m replgate_kernel ... -f
/kernel/k3.json``), writes its pid to ``/kernel/k3.pid`` and, once it has reaped it, its exit
code to ``/kernel/k3.exit``.
The host reads both as untrusted (the folder is the sandbox's). A request with ``"adopt": PID``
starts nothing: it names a kernel the host restored from a template, which became this
process's child when CRIU, its parent, exited; it is recorded and reaped like one started here.
Orphans of any process in the container are re-parented here; a sandbox-wide ``kill -KILL
-1`` spares PID 1, so the container survives the hard stop of a runaway execution and the
next kernel reuses its workspace.
"""

import contextlib
import json
import os
import re
import signal
import stat
import sys

KERNEL_DIR = "/kernel"
REQUEST = os.path.join(KERNEL_DIR, "launch.json")
NAME = re.compile(r"(x[0-9a-f]{8})?k[0-9]{1,9}")
REQUEST_LIMIT = 1 << 16
"""A request's size at most (a context's brings its session's environment)."""
SIGNALS = {signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}
KERNELS = {
    "python": ("python", "-P", "-m", "replgate_kernel", "--max-output-bytes={max_output_bytes}",
               "-f", "{connection_file}"),
    "bash": ("python", "-P", "-m", "replgate_kernel.bash", "-f", "{connection_file}"),
    # IRkernel, run by a script of ours that spares each execution work repeated (irkernel.R).
    "r": ("R", "--no-echo", "--no-save", "--no-restore", "-f",
          "/opt/replgate/replgate_kernel/irkernel.R", "--args", "{connection_file}"),
    # Deno's kernel listens on TCP only: the relay puts it behind the ipc socket files.
    "javascript": ("python", "-I", "-S", "/opt/replgate/replgate_kernel/relay.py",
                   "{connection_file}", "deno", "jupyter", "--kernel", "--conn"),
    # JJava (JShell, its snippets run in the kernel's own JVM), started as its launcher would
    # start it but without the launcher's JVM in front. JeroMQ's ipc is TCP underneath: the
    # relay again. The JVM's options (jjava.args: serial GC, C1 only, a heap of a quarter of
    # the sandbox's memory at most) and its class-data archive are the image's (Dockerfile).
    "java": ("python", "-I", "-S", "/opt/replgate/replgate_kernel/relay.py", "{connection_file}",
             "java", "@/opt/jjava/jjava.args", "-XX:SharedArchiveFile=/opt/jjava/jjava.jsa",
             "-jar", "/opt/venv/share/jupyter/kernels/java/jjava.jar"),
}
"""Each language's kernel command. An image offers the languages whose programs it has (its
``io.replgate.languages`` label); a kernel whose program is missing exits at once with 127."""
STDERR_KEPT = frozenset({"python", "bash"})
"""The kernels whose standard error goes to ``/kernel/<name>.err`` until they have started
(``replgate_kernel.startup``), for the host to quote when a start fails; the others' goes to
``/dev/null`` (none of them would let go of the file, which would fill the folder)."""
PR_SET_THP_DISABLE = 41
NOT_FOUND = 127
CANNOT_RUN = 126


def _write(name: str, text: str) -> None:
    path = os.path.join(KERNEL_DIR, name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # whatever was planted there (a link is removed, not followed)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _launch(kernels: dict[int, str]) -> None:
    try:
        # The folder is the sandbox's: a FIFO planted at this name must not block PID 1.
        fd = os.open(REQUEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            request = json.loads(f.read(REQUEST_LIMIT))
        os.unlink(REQUEST)
        name = request["name"]
        adopt = request.get("adopt")
        max_output = int(request["max_output_bytes"]) if adopt is None else 0
        language = request.get("language", "python")
        env = dict(os.environ)
        env.update({str(key): str(value) for key, value in request.get("env", {}).items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return
    if adopt is not None:
        _adopt(kernels, name, adopt)
        return
    command = KERNELS.get(language) if isinstance(language, str) else None
    if command is None:
        _not_found(name)
        return
    argv = [part.format(connection_file=os.path.join(KERNEL_DIR, f"{name}.json"),
                        max_output_bytes=max_output) for part in command]
    devnull = os.path.join(os.sep, "dev", "null")
    files = [(os.POSIX_SPAWN_OPEN, fd, devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    errors = _start_errors(name) if language in STDERR_KEPT else None
    if errors is not None:
        files[2] = (os.POSIX_SPAWN_DUP2, errors, 2)
    try:
        pid = os.posix_spawnp(
            argv[0], argv, env,
            file_actions=files,
            setsid=True,
            setsigmask=(),  # this process blocks the signals it waits for; the kernel must not
        )
    except FileNotFoundError:  # a language whose program this image lacks
        _not_found(name)
        return
    except (OSError, ValueError):  # what it could not start with (a NUL in the environment)
        _not_found(name, CANNOT_RUN)
        return
    finally:
        if errors is not None:
            os.close(errors)
    kernels[pid] = name
    _write(f"{name}.pid", str(pid))


def _start_errors(name: str) -> int | None:
    """A new ``/kernel/<name>.err`` open for writing, or None (a full folder: ``/dev/null``)."""
    path = os.path.join(KERNEL_DIR, f"{name}.err")
    with contextlib.suppress(OSError):
        os.unlink(path)  # whatever was planted there (a link is removed, not followed)
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None


def _not_found(name: str, code: int = NOT_FOUND) -> None:
    """Record at once that no kernel started (the host stops waiting for one)."""
    _write(f"{name}.pid", "0")
    _write(f"{name}.exit", str(code))


def _adopt(kernels: dict[int, str], name: str, pid: object) -> None:
    if not isinstance(pid, int) or pid <= 1:
        return
    try:
        ended, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return  # not this process's child: the host sees no pid and says so
    _write(f"{name}.pid", str(pid))
    if ended:
        _write(f"{name}.exit", str(os.waitstatus_to_exitcode(status)))
    else:
        kernels[pid] = name


def _reap(kernels: dict[int, str]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        name = kernels.pop(pid, None)
        if name is not None:
            _write(f"{name}.exit", str(os.waitstatus_to_exitcode(status)))


def _small_pages() -> None:
    """Turn transparent huge pages off for this process and so for every kernel it starts
    (the flag is inherited and kept across exec) when the host asks (``--small-pages``: a
    runc profile without ``huge_pages``). CRIU dumps the flag and restores it before
    it refills memory: a memory resume then fills small pages, which on a VM whose host took
    back the free memory cost a fifth of what fresh huge pages do."""
    if "--small-pages" not in sys.argv[1:]:
        return
    import ctypes  # here alone: PID 1 imports as little as it can

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)


def main() -> None:
    _small_pages()
    kernels: dict[int, str] = {}
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    # The host may have asked before the mask above was set: the signal was then dropped (a
    # namespace's PID 1 gets no signal it has not asked for), the request is there.
    with contextlib.suppress(OSError):
        _launch(kernels)
    while True:
        signum = signal.sigwaitinfo(SIGNALS).si_signo
        if signum in (signal.SIGTERM, signal.SIGINT):
            os._exit(0)
        try:
            if signum == signal.SIGUSR1:
                _launch(kernels)
            _reap(kernels)
        except OSError:
            pass  # a full or vanished socket folder: the host sees no pid and says so


main()
