"""Shell commands run beside a session's kernel: the request, and a kill's answer."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from kernel_pool import PtySize

from ._base import EnvName, Strict, Timeout


class CommandRequest(Strict):
    """``POST /v1/sessions/{id}/commands``: a shell command to run beside the kernel."""

    cmd: str = Field(max_length=100_000, description="run as `sh -c CMD`")
    timeout_s: Timeout | None = None
    env: dict[EnvName, Annotated[str, Field(max_length=32_768)]] = Field(
        default_factory=dict, max_length=256, description="added to the session's environment")
    cwd: str | None = Field(None, max_length=4096,
                            description="folder relative to the workspace, or an absolute "
                            "path in the sandbox (default: the workspace, /home/user)")
    id: str | None = Field(None, min_length=1, max_length=128,
                           pattern=r"^[A-Za-z0-9_.-]+$",
                           description="a name for the command, to kill it while it runs")
    stdin: bool = Field(False, description="keep its stdin open for "
                        "POST /v1/sessions/{id}/commands/{command_id}/input (name it by `id`)")
    pty: PtySize | None = Field(None, description="run it on a terminal of this size (stdin "
                                "open, its output one stdout stream)")


class KillOut(BaseModel):
    killed: bool
