"""Kernel-side half of a variables snapshot: the user namespace to a file and back, with dill.

The gateway evaluates :func:`save` or :func:`load` as a user expression of a silent execution
(nothing lands in the history or the namespace) and reads the JSON text they return. The file
lies in the session's own workspace only while it passes between the gateway and the kernel.
"""

import json
import os
import random
import tempfile
import threading
from typing import Any

import dill
from IPython import get_ipython

MAX_REASON = 200
# The kernel's own folders in /tmp (made at its start, see __main__): not the user's files.
KERNEL_TMP_PREFIXES = (".ipythondir-", ".mplconfigdir-")
# /tmp entries named one by one in what a snapshot did not keep; past that, a count.
MAX_TMP_LISTED = 10

_kernel_threads: set[int | None] | None = None
"""The threads the kernel runs before any cell (IOPub, heartbeat, control, output pipes)."""


def install(shell: Any) -> None:
    """Note the kernel's own threads at the first execution, before any user code has run:
    threads started later are the user's, which a variables snapshot cannot keep."""

    def note_kernel_threads(*args: object) -> None:
        global _kernel_threads
        _kernel_threads = {thread.ident for thread in threading.enumerate()}
        shell.events.unregister("pre_execute", note_kernel_threads)

    shell.events.register("pre_execute", note_kernel_threads)


def _namespace() -> tuple[dict[str, object], set[str]]:
    shell = get_ipython()
    return shell.user_ns, set(shell.user_ns_hidden)


def _user_names(namespace: dict[str, object], hidden: set[str]) -> list[str]:
    """The names the user made: IPython's own (``In``, ``_3``, ``get_ipython``) are not."""
    return [name for name in namespace if not name.startswith("_") and name not in hidden]


def _process_not_kept() -> dict[str, str]:
    """What the process holds beyond its variables, which a variables snapshot loses: the
    user's running threads and the files in /tmp (a memory pause keeps both)."""
    lost: dict[str, str] = {}
    threads = threading.enumerate()
    # No cell has run yet (a snapshot's own evaluation runs none): every thread is the kernel's.
    kernel_threads = {t.ident for t in threads} if _kernel_threads is None else _kernel_threads
    for thread in threads:
        if thread.ident not in kernel_threads and thread is not threading.main_thread():
            lost[f"thread {thread.name!r}"] = "a running thread: a variables snapshot keeps none"
    try:
        entries = sorted(entry for entry in os.listdir(tempfile.gettempdir())
                         if not entry.startswith(KERNEL_TMP_PREFIXES))
    except OSError:
        entries = []
    for entry in entries[:MAX_TMP_LISTED]:
        lost[f"/tmp/{entry}"] = "a file in /tmp: a variables snapshot keeps only the workspace"
    if len(entries) > MAX_TMP_LISTED:
        lost["/tmp"] = f"{len(entries) - MAX_TMP_LISTED} more entries, not kept either"
    return lost


def save(path: str) -> str:
    """Write the user's variables to ``path``; JSON with the names kept and what was not.

    One pickle for all, so objects shared between variables stay shared; a value that cannot
    be pickled (a thread, a socket, a generator) is left out with the reason. What is not a
    variable but is lost all the same (running threads, files in /tmp) is listed too.
    """
    namespace, hidden = _namespace()
    names = _user_names(namespace, hidden)
    lost: dict[str, str] = {}
    while True:
        values = {name: namespace[name] for name in names if name not in lost}
        try:
            with open(path, "wb") as f:
                dill.dump(values, f, recurse=True)
            break
        except Exception:
            before = len(lost)
            for name, value in values.items():
                try:
                    dill.dumps(value, recurse=True)
                except Exception as exc:
                    lost[name] = f"{type(exc).__name__}: {exc}"[:MAX_REASON]
            if len(lost) == before:  # only together do they fail: give up honestly
                lost.update({name: "could not be saved with the other variables"
                             for name in values})
                with open(path, "wb") as f:
                    dill.dump({}, f)
                break
    os.chmod(path, 0o600)
    return json.dumps({"kept": sorted(n for n in names if n not in lost),
                       "not_kept": {**lost, **_process_not_kept()}})


def load(path: str, reseed: bool) -> str:
    """Put the variables saved in ``path`` back into the namespace and delete the file.

    ``reseed``: a copy of a session (a fork) must not draw the same random numbers as its
    siblings, so the generators of ``random`` and ``numpy.random`` start from fresh entropy.
    """
    try:
        with open(path, "rb") as f:
            values = dill.load(f)
    finally:
        os.unlink(path)
    namespace, _hidden = _namespace()
    namespace.update(values)
    if reseed:
        random.seed()
        numpy = __import__("sys").modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
    return json.dumps({"loaded": sorted(values)})
