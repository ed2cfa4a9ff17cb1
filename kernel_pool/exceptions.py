"""The errors replgate's kernel pool raises, each with a message a user can act on.

    KernelPoolError
    ├── ImageError             the sandbox image cannot be built or found
    ├── BackendError           the container engine failed or is unreachable
    ├── ProfileNotFound        no profile of that name
    ├── CapacityError          the pool is at max_kernels (HTTP 503/429 at the gateway)
    ├── KernelStartError       a kernel did not come up
    ├── SessionNotFound        no such session (or not yours)
    ├── SessionClosed          the session was deleted or culled
    ├── QueueFull              too many executions waiting on one session
    ├── InvalidRequest         a value out of range (timeout, code size, ...)
    └── WorkspaceError         a file path or size the workspace refuses
        └── PathOutsideWorkspace

An error in the user's code is not an exception here: it is data (an ``error`` event).
"""

from __future__ import annotations


class KernelPoolError(Exception):
    """Base of every replgate pool error."""


class ImageError(KernelPoolError):
    """The sandbox image could not be built or is missing."""


class BackendError(KernelPoolError):
    """The container engine failed, or could not be reached."""


class ProfileNotFound(KernelPoolError):
    def __init__(self, profile: str, known: list[str]) -> None:
        self.profile = profile
        super().__init__(f"unknown profile {profile!r}; known profiles: {', '.join(known)}")


class CapacityError(KernelPoolError):
    def __init__(self, profile: str, limit: int) -> None:
        self.profile = profile
        self.limit = limit
        super().__init__(
            f"no kernel available for profile {profile!r}: the pool is at its limit of {limit} "
            "kernels; delete idle sessions or raise REPLGATE_MAX_KERNELS"
        )


class KernelStartError(KernelPoolError):
    def __init__(self, sandbox_id: str, reason: str) -> None:
        self.sandbox_id = sandbox_id
        super().__init__(f"kernel in sandbox {sandbox_id} did not start: {reason}")


class SessionNotFound(KernelPoolError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id} not found")


class SessionClosed(KernelPoolError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id} is closed; create a new session")


class QueueFull(KernelPoolError):
    def __init__(self, session_id: str, limit: int) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id} already has {limit} executions waiting; wait for them to "
            "finish or raise REPLGATE_MAX_QUEUED_EXECUTIONS"
        )


class TooManyCommands(KernelPoolError):
    def __init__(self, session_id: str, limit: int) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id} already runs {limit} shell commands; wait for one to end, "
            "kill one, or raise REPLGATE_MAX_COMMANDS")


class InvalidRequest(KernelPoolError):
    """A request value is out of range; the message names the limit."""


class WorkspaceError(KernelPoolError):
    """The workspace refuses a path or a size."""


class PathOutsideWorkspace(WorkspaceError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"path {path!r} leaves the session's workspace; use a relative path")
