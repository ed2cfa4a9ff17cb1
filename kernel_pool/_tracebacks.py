"""A traceback as plain text, and its short form: what an agent needs to fix its code.

IPython sends a traceback as a list of entries, coloured with ANSI codes: a rule, a header
(``KeyError    Traceback (most recent call last)``), one entry per frame (``Cell In[3], line
2`` or ``File /path:line, in name(...)`` and the lines around it), the exception line, and,
for a chained exception, the sentence that links it to the next such section. The plain text
is all of it without the colours: 1,857 characters for a pandas ``KeyError``, most of them in
pandas' own frames.

The short form keeps the frames of the user's own code (cells, and files outside the Python
installation, such as a module in the workspace) with the exception line of each section that
has any, and the last section's exception line; a line ``[... N frames in library code]``
stands where frames were left out, ``[... N chained exceptions in library code]`` for whole
sections. When the exception is one of a missing network (a name that does not resolve, an
unreachable network), a sentence says that the sandbox has none. A traceback that is not
IPython's (another language's kernel) stays whole, with that sentence where it applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
"""ANSI escape sequences (CSI, and the two-byte ones): Jupyter colours tracebacks with them."""

NO_NETWORK = ("[no network] The sandbox has no network access: host names do not resolve and "
              "connections fail, so retrying will not help. Work with files in the workspace "
              "instead (they can be uploaded to it).")
"""Added to the short form of an error caused by the missing network."""

_NETWORK = re.compile(
    r"Temporary failure in name resolution|Name or service not known|"
    r"No address associated with hostname|NameResolutionError|Could not resolve host|"
    r"Network is unreachable|No route to host|EAI_AGAIN|ENOTFOUND|ENETUNREACH|EHOSTUNREACH")
"""What the exception of a missing network says: failed name lookups (socket's gaierror, and
urllib3/requests/httpx/curl/Node wrapping it) and unreachable networks (errno 101 under runc,
113 under gVisor, for an address given as such)."""

_RULE = re.compile(r"-{20,}")
_HEADER = re.compile(r"\S+\s+Traceback \(most recent call last\)")
_CHAIN = ("The above exception was the direct cause of the following exception:",
          "During handling of the above exception, another exception occurred:")
_FRAME = re.compile(r"(?:Cell In\s*\[|Input In\s*\[|<ipython-input-|File )")
_FILE = re.compile(r"File (.+?):\d+")
_LIBRARY_PATH = re.compile(r"/(?:site|dist)-packages/|/lib/python\d")
_SKIPPED = "[... skipping similar frames"


def plain(traceback: list[str]) -> str:
    """The traceback's entries as one text, without colour codes."""
    return ANSI.sub("", "\n".join(traceback))


@dataclass
class _Section:
    """One exception of a chain: its frames (``(is_user_code, text)``) and its own lines."""

    link: str | None = None
    frames: list[tuple[bool, str]] = field(default_factory=list)
    exception: list[str] = field(default_factory=list)

    @property
    def has_user_frames(self) -> bool:
        return any(user for user, _ in self.frames)


def short_form(traceback: list[str]) -> str:
    """The short form of IPython's ``traceback`` (see the module's docstring); ``""`` for no
    traceback."""
    entries = [ANSI.sub("", entry).rstrip() for entry in traceback]
    sections = _sections(entries)
    if sections is None:  # not IPython's: kept whole
        text = "\n".join(entries).strip()
        return _with_network_note(text, _NETWORK.search(text) is not None)
    kept = [section for section in sections if section.has_user_frames]
    if not kept or kept[-1] is not sections[-1]:
        kept.append(sections[-1])
    blocks: list[str] = []
    hidden = len(sections) - len(kept)
    if hidden:
        blocks.append(f"[... {_count(hidden, 'chained exception')} in library code]")
    for number, section in enumerate(kept):
        if number and section.link:
            blocks.append(section.link)
        blocks.extend(_frames(section))
        blocks.extend(section.exception)
    network = any(_NETWORK.search(line) for section in sections for line in section.exception)
    return _with_network_note("\n\n".join(blocks), network)


def _sections(entries: list[str]) -> list[_Section] | None:
    """IPython's entries split into the sections of the exception chain; None when they do not
    read as IPython's (no header, or no frame at all)."""
    sections: list[_Section] = []
    link: str | None = None
    for entry in entries:
        text = entry.strip()
        if not text or _RULE.fullmatch(text):
            continue
        if _HEADER.fullmatch(text):
            sections.append(_Section(link=link))
            link = None
        elif text in _CHAIN:
            link = text
        elif not sections:
            return None
        elif _FRAME.match(entry):
            sections[-1].frames.append((_is_user_code(entry), entry))
        elif text.startswith(_SKIPPED):  # IPython folding a recursion: as the frame before it
            frames = sections[-1].frames
            frames.append((bool(frames) and frames[-1][0], text))
        elif text.startswith("[..."):  # entries the output caps left out
            sections[-1].frames.append((False, text))
        else:
            sections[-1].exception.append(text)
    if not any(section.frames for section in sections):
        return None
    return sections


def _is_user_code(frame: str) -> bool:
    """A cell, or a file outside the Python installation and its packages (a module of the
    workspace); not a compiled module's frame (``File index.pyx:167``, a relative path)."""
    match = _FILE.match(frame)
    if match is None:
        return True  # Cell In[...], Input In [...], <ipython-input-...>
    path = match.group(1)
    return path.startswith(("/", "~")) and _LIBRARY_PATH.search(path) is None


def _frames(section: _Section) -> list[str]:
    """The section's user frames, with one line for each run of frames left out between; a
    section without user frames keeps its last frame, where the exception was raised."""
    frames = section.frames
    if not section.has_user_frames and frames:
        frames = [*((False, text) for _, text in frames[:-1]), (True, frames[-1][1])]
    blocks: list[str] = []
    left_out = 0
    for user, text in frames:
        if not user:
            left_out += 1
            continue
        if left_out:
            blocks.append(f"[... {_count(left_out, 'frame')} in library code]")
            left_out = 0
        blocks.append(text)
    if left_out:
        blocks.append(f"[... {_count(left_out, 'frame')} in library code]")
    return blocks


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _with_network_note(text: str, network: bool) -> str:
    if not network:
        return text
    return f"{text}\n\n{NO_NETWORK}" if text else NO_NETWORK
