"""CRIU's kernel-feature cache, for the CRIU runs inside sandboxes.

Every CRIU run begins by probing the kernel ("kerndat": a network namespace with a veth pair,
test mappings, the vDSO and more) unless it can load ``/run/criu.kdat``, which it writes itself
where ``/run`` is writable. Inside a sandbox it is not: CRIU runs in the container's mount
namespace (:func:`._template.run_criu`), whose root is read-only. So every template restore and
every kernel-tree dump or restore probed anew: 26 ms of a restore's 60-80 ms of CPU here, the
first third of its log at ``-v4``.

The gateway makes the cache at its start, by ``criu check`` in a mount namespace of its own
with a tmpfs on ``/run`` (the host's ``/run``, where the engine's CRIU keeps its own cache, is
not touched), and each runc sandbox gets it read-only at that path: root's, mode 0600, so the
sandbox's user (no capabilities) cannot read it; it holds the zero page's frame number. It is
made again at every start: it describes the running kernel, and CRIU trusts any cache of its
own build, whichever kernel wrote it (after a reboot into another, a stale one would be used).
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from kernel_pool.backends.docker._criu import CRIU_HOME, criu_command

logger = logging.getLogger(__name__)

NAME = "criu.kdat"
"""The cache's name in the gateway's state directory."""
IN_SANDBOX = "/run/criu.kdat"
"""Where CRIU looks for its cache (its build's ``KDAT_RUNDIR``), in the sandbox's file system."""
CHECK_TIMEOUT_S = 30
WRITE_AND_SHOW = ('mount -t tmpfs -o size=1m,mode=0700 tmpfs /run || exit 1; '
                  '"$@" >/dev/null 2>&1; exec cat /run/criu.kdat')
"""Run in a mount namespace of its own: a private ``/run``, CRIU's check (which writes the cache
there whatever it finds), then the cache on standard output. The check's own verdict does not
matter here: the cache is written before it looks at anything else."""


def make_cache(target: Path) -> Path | None:
    """Write CRIU's kernel-feature cache for this kernel to ``target`` (root's, 0600) with the
    private CRIU root ``./run.sh`` installs (blocking); ``target``, or None where it could not
    be made (no such root, not root, CRIU refused): sandboxes then go without, as before."""
    try:
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               WRITE_AND_SHOW, "sh", *criu_command(str(CRIU_HOME)), "check"],
                              capture_output=True, timeout=CHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("CRIU's kernel-feature cache could not be made (%s): each CRIU run in a "
                    "sandbox probes the kernel", exc)
        return None
    if done.returncode or not done.stdout:
        logger.info("CRIU's kernel-feature cache could not be made (exit status %d: %s): each "
                    "CRIU run in a sandbox probes the kernel", done.returncode,
                    done.stderr.decode(errors="replace").strip()[-200:])
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}-{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(done.stdout)
    os.replace(partial, target)
    return target
