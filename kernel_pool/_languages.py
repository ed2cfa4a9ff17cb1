"""The languages a sandbox image offers, and how each one's kernel is reached.

A sandbox's PID 1 starts a kernel of any of :data:`KERNEL_LANGUAGES` (its command table:
``sandbox_image/replgate_kernel/init.py``); an image offers those whose programs it has, named
by its ``io.replgate.languages`` label (the default image: every one of them; the slim one:
python and bash). ``typescript`` runs in the JavaScript kernel (Deno's), and E2B's short names
are accepted as E2B's own server accepts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kernel_pool.exceptions import UnknownLanguage

LANGUAGES_LABEL = "io.replgate.languages"
DEFAULT_CONTEXT = "python"
"""The id of a session's own (Python) kernel as a code context."""


@dataclass(frozen=True)
class KernelLanguage:
    """One kernel a sandbox can run: what it answers to and how it is interrupted."""

    name: str
    display_name: str
    interrupt: Literal["message", "signal"]
    """``message``: an ``interrupt_request`` on the control channel stops the running code;
    ``signal``: the kernel only heeds SIGINT, sent to its process group (IRkernel; R's
    ``system()`` ignores SIGINT in R itself while its child runs)."""
    relayed: bool = False
    """Its kernel listens on TCP only: it runs as the child of ``relay.py``, which holds the
    ipc socket files and loopback connections to it (Deno's, JJava's)."""


KERNEL_LANGUAGES = {
    "python": KernelLanguage("python", "Python 3", "message"),
    "bash": KernelLanguage("bash", "Bash", "message"),
    "r": KernelLanguage("r", "R", "signal"),
    "javascript": KernelLanguage("javascript", "JavaScript and TypeScript (Deno)", "message",
                                 relayed=True),
    "java": KernelLanguage("java", "Java", "message", relayed=True),
}
SAME_KERNEL = {"typescript": "javascript"}
ALIASES = {"js": "javascript", "ts": "typescript"}


def normalize_language(language: str | None) -> str:
    """The language a request names (``None``: python), its aliases resolved."""
    name = (language or "python").strip().lower()
    return ALIASES.get(name, name)


def kernel_language(language: str | None) -> str:
    """The kernel that runs ``language``: ``typescript`` runs in the JavaScript kernel."""
    name = normalize_language(language)
    return SAME_KERNEL.get(name, name)


def offered(labels: dict[str, str] | None) -> list[str]:
    """The languages an image with these labels offers (an image built before the label:
    python alone), ``typescript`` beside ``javascript``."""
    named = (labels or {}).get(LANGUAGES_LABEL, "python").split()
    kernels = [name for name in KERNEL_LANGUAGES if name in named]
    extra = [alias for alias, kernel in SAME_KERNEL.items() if kernel in kernels]
    return kernels + extra


def check_language(language: str | None, offered: tuple[str, ...] | list[str]) -> str:
    """The kernel that runs ``language`` (None: python), or :class:`UnknownLanguage` naming
    the languages offered (an image's, as :func:`offered` reads them)."""
    name = normalize_language(language)
    kernel = kernel_language(name)
    if kernel not in KERNEL_LANGUAGES or name not in offered:
        raise UnknownLanguage(language or "", list(offered))
    return kernel


def display_language(language: str) -> str:
    """How a context's language reads in a sentence (``R``, ``JavaScript``)."""
    kernel = SAME_KERNEL.get(language, language)
    return KERNEL_LANGUAGES[kernel].display_name if kernel in KERNEL_LANGUAGES else language
