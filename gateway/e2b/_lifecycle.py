"""What an E2B sandbox's create asks of its end, and how replgate does it.

E2B's create takes ``autoPause`` (at its timeout the sandbox is paused, not killed),
``autoPauseMemory`` (``false``: that pause keeps the files only, and the resume cold-boots) and
``autoResume`` (traffic to the paused sandbox resumes it); the SDKs' ``lifecycle`` option sends
them. On replgate:

- the timeout's pause is replgate's pause (docs/lifecycle.md: the variables, or the whole memory
  where the host can), made by whichever gateway claims the sandbox's end; the sandbox is then
  paused as if its SDK had paused it (listed ``paused``, ``is_running()`` False, no end) until a
  connect, or traffic when ``autoResume`` is on;
- ``autoPauseMemory: false`` restarts the kernel before that pause, so only the files are kept
  and the resume starts a fresh kernel: variables gone, files kept (E2B's reboot);
- ``autoResume``: any request to the paused sandbox's ports (``/health`` too, as any traffic
  wakes one on E2B) resumes it, and it ends the create's ``timeout`` later, to be paused again.

The policy is kept in the database beside the sandbox's end (``e2b_sandboxes.lifecycle``), so
it holds across gateway restarts and on many machines. The checks are E2B's server's: a
filesystem-only pause needs ``autoPause``, and cannot be resumed by traffic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ValidationError

from gateway.e2b._errors import E2BError
from gateway.e2b._models import NewSandbox, SandboxLifecycle
from gateway.service import Gateway


class SandboxPolicy(BaseModel):
    """A sandbox's lifecycle as its create asked for it."""

    on_timeout: Literal["kill", "pause"] = "kill"
    keep_memory: bool = True
    """For ``on_timeout="pause"``: False keeps the files only (the kernel is restarted)."""
    auto_resume: bool = False
    timeout_s: int = 300
    """How long the sandbox runs after traffic resumed it (its create's ``timeout``)."""

    def described(self) -> SandboxLifecycle:
        """E2B's ``SandboxLifecycle``, as ``get_info()`` reads it."""
        return SandboxLifecycle(onTimeout=self.on_timeout, autoResume=self.auto_resume)

    @classmethod
    def stored(cls, text: str | None) -> SandboxPolicy:
        """The policy kept in the database (None, or a record not read: E2B's defaults)."""
        if text is None:
            return cls()
        try:
            return cls.model_validate_json(text)
        except ValidationError:
            return cls()


def asked(body: NewSandbox, timeout_s: int) -> SandboxPolicy:
    """The policy a create asks for; E2B's 400 for the combinations its server refuses."""
    pause = bool(body.auto_pause)
    keep_memory = body.auto_pause_memory is not False
    auto_resume = body.auto_resume is not None and body.auto_resume.enabled
    if not keep_memory and not pause:
        raise E2BError(400, "autoPauseMemory=false only applies when autoPause is true.")
    if not keep_memory and auto_resume:
        raise E2BError(400, "autoPauseMemory=false (a filesystem-only snapshot) cannot be "
                            "auto-resumed by traffic and must be resumed explicitly: leave "
                            "autoResume disabled and resume it with Sandbox.connect().")
    return SandboxPolicy(on_timeout="pause" if pause else "kill", keep_memory=keep_memory,
                         auto_resume=auto_resume, timeout_s=timeout_s)


async def pause_at_timeout(gateway: Gateway, tenant: str, session_id: str,
                           policy: SandboxPolicy) -> None:
    """The timeout's pause: with the memory (replgate's pause keeps what it can), or, for a
    filesystem-only one, after a restart, so that nothing of the kernel's memory is kept."""
    if not policy.keep_memory:
        await gateway.restart(tenant, session_id)
    await gateway.pause(tenant, session_id)
