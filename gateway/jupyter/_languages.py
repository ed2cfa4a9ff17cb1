"""Kernels of other languages than Python on Jupyter's API: their kernelspecs, and the code
context a kernel of one runs in.

A kernel started by such a kernelspec is a session whose metadata names the language
(:data:`KERNEL_LANGUAGE_KEY`); its executions run in that language's default context (whose
id is the language), made at the first of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.service import Gateway
from kernel_pool import SessionPort

KERNEL_LANGUAGE_KEY = "jupyter_language"
"""The session metadata's key naming the language of a kernel started by another kernelspec
than a profile's Python one."""


@dataclass(frozen=True)
class LanguageSpec:
    """A language's kernelspec: its kernel's own name and spec, as Jupyter installs them."""

    name: str
    argv: list[str]
    display_name: str
    language: str
    interrupt_mode: str
    language_info: dict[str, str]
    """What its ``kernel_info_reply`` says (nbclient and nbconvert read it)."""


LANGUAGE_SPECS = {
    "r": LanguageSpec(
        "ir", ["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"], "R",
        "R", "signal", {"name": "R", "codemirror_mode": "r", "pygments_lexer": "r",
                        "mimetype": "text/x-r-source", "file_extension": ".r"}),
    "javascript": LanguageSpec(
        "deno", ["deno", "jupyter", "--kernel", "--conn", "{connection_file}"], "Deno",
        "typescript", "message", {"name": "typescript", "codemirror_mode": "typescript",
                                  "pygments_lexer": "typescript", "mimetype": "text/x.typescript",
                                  "file_extension": ".ts", "nbconvert_exporter": "script"}),
    "bash": LanguageSpec(
        "bash", ["python", "-m", "replgate_kernel.bash", "-f", "{connection_file}"], "Bash", "bash",
        "message", {"name": "bash", "codemirror_mode": "shell", "pygments_lexer": "bash",
                    "mimetype": "text/x-sh", "file_extension": ".sh"}),
    "java": LanguageSpec(
        "java", ["java", "-jar", "jjava.jar", "{connection_file}"], "Java (jjava)", "java",
        "message", {"name": "Java", "codemirror_mode": "java", "pygments_lexer": "java",
                    "mimetype": "text/x-java-source", "file_extension": ".jshell"}),
}


def kernel_language(session: SessionPort) -> str:
    """The language a kernel (session) runs its executions in: its kernelspec's."""
    language = session.state().metadata.get(KERNEL_LANGUAGE_KEY)
    return language if isinstance(language, str) and language in LANGUAGE_SPECS else "python"


async def _context(session: SessionPort, language: str) -> str | None:
    """The language's context in the session, None before its first execution made it."""
    return next((c.id for c in await session.list_contexts() if c.id == language), None)


async def interrupt_kernel(gateway: Gateway, tenant: str, session: SessionPort) -> bool:
    """Interrupt what runs in the kernel's language; False when nothing did."""
    language = kernel_language(session)
    if language == "python":
        return await gateway.interrupt(tenant, session.id)
    context = await _context(session, language)
    return context is not None and await session.interrupt(context)


async def restart_kernel(gateway: Gateway, tenant: str, session: SessionPort) -> SessionPort:
    """A fresh kernel for the kernel's language: its variables go, files stay (another
    language's: the session's Python variables stay too)."""
    language = kernel_language(session)
    if language == "python":
        return await gateway.restart(tenant, session.id)
    context = await _context(session, language)
    if context is not None:
        await session.restart_context(context)
    return session
