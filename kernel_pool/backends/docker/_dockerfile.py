"""A Dockerfile read as the engine's builder reads it: its instructions, each with the line it
starts on, so a build's ``Step N/M`` names the user's line, and steps can be put between them.

Only what step numbering needs: parser directives (``# escape=``), comment lines (also inside
a continued instruction), line continuations, blank lines. The builder itself checks the rest.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

__all__ = ["Instruction", "escape_of", "parse_dockerfile", "render_dockerfile"]

_DIRECTIVE = re.compile(r"#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")


class Instruction(BaseModel):
    """One instruction: its text (continuations joined as written) and its first line (1-based;
    None for one replgate put in)."""

    keyword: str
    text: str
    line: int | None = None


def escape_of(text: str) -> str:
    """The escape character the file's parser directives set (``\\`` unless ``# escape=```)."""
    for line in text.splitlines():
        found = _DIRECTIVE.match(line.strip())
        if found is None:
            break
        if found.group(1).lower() == "escape" and found.group(2) in ("`", "\\"):
            return found.group(2)
    return "\\"


def parse_dockerfile(text: str) -> list[Instruction]:
    """The file's instructions in order: the builder's steps, one each."""
    lines = text.splitlines()
    escape = escape_of(text)
    found: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if not parts and (not stripped or stripped.startswith("#")):
            continue
        if parts and stripped.startswith("#"):
            continue  # a comment inside a continued instruction is dropped
        if not parts:
            start = number
        body = raw.rstrip()
        if body.endswith(escape):
            parts.append(body[:-1])
            continue
        parts.append(body)
        joined = "\n".join(parts).strip()
        parts = []
        found.append(Instruction(keyword=joined.split(None, 1)[0].upper(), text=joined,
                                 line=start))
    if parts:  # a last line that continues into nothing is still an instruction
        joined = "\n".join(parts).strip()
        found.append(Instruction(keyword=joined.split(None, 1)[0].upper(), text=joined,
                                 line=start))
    return found


def render_dockerfile(instructions: list[Instruction], escape: str = "\\") -> str:
    """A Dockerfile of these instructions, one step each, in order."""
    head = "" if escape == "\\" else f"# escape={escape}\n"
    return head + "\n".join(i.text.replace("\n", f"{escape}\n") for i in instructions) + "\n"
