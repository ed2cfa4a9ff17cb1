"""The session's environment, taken by the kernel before each execution from a file the gateway
writes beside the kernel's connection file (``/kernel/env.json``).

A warm kernel is claimed by a session in milliseconds; asking the kernel to set the session's
variables (its ``env``, the egress proxy's, its CA bundle's) would be one more round trip to it
on that path. The gateway writes them instead, and the kernel applies the file before its next
cell when it changed since the last look: one ``stat`` per execution. Only the variables whose
value changed in the file are set, so a variable the user's code set stays until the gateway
changes that very one. The kernel says it reads the file in its ``kernel_info`` reply
(``replgate.env_file``); a kernel that does not is sent the variables as before.
"""

import json
import os

ENV_FILE = "env.json"


class SessionEnv:
    """Applies ``path``'s variables to ``os.environ`` when the file changed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int, int] | None = None
        self._applied: dict[str, str] = {}

    def apply(self) -> None:
        try:
            info = os.stat(self.path)
        except OSError:
            return
        seen = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            with open(self.path, encoding="utf-8") as file:
                env = json.load(file)
        except (OSError, ValueError):
            return
        if not isinstance(env, dict):
            return
        given = {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)}
        for name, value in given.items():
            if self._applied.get(name) != value:
                os.environ[name] = value
        self._applied = given


def install(kernel, kernel_dir: str) -> None:  # type: ignore[no-untyped-def]
    """Apply the file before every execution (silent ones too) of ``kernel``'s shell, and say
    so in its ``kernel_info`` reply."""
    env = SessionEnv(os.path.join(kernel_dir, ENV_FILE))
    kernel.shell.events.register("pre_execute", env.apply)
    cls = type(kernel)
    info = cls.kernel_info

    def kernel_info(self):  # type: ignore[no-untyped-def]
        return {**info.fget(self), "replgate": {"env_file": ENV_FILE}}

    cls.kernel_info = property(kernel_info)
