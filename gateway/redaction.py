"""Secrets kept out of the gateway's logs: :func:`redact` and the :class:`RedactSecrets` filter.

They are never applied to audited code (:mod:`gateway.audit`), which is kept verbatim.
"""

from __future__ import annotations

import logging
import re

__all__ = ["DropFrames", "RedactSecrets", "redact"]

_REDACTED = "[REDACTED]"
_SECRET_CHARS = r"[A-Za-z0-9+/=_\-.~]"
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # Authorization headers: "Bearer <key>", and Jupyter's "token <key>".
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9+/=_\-.~]+"), rf"\1{_REDACTED}"),
    (re.compile(rf"(?i)\b(token\s+){_SECRET_CHARS}{{16,}}"), rf"\1{_REDACTED}"),
    # Query strings: ?token=..., &access_token=..., api_key=...
    (
        re.compile(r"(?i)([?&;](?:access_)?(?:token|api_?key|key|secret|password)=)[^&\s#\"']+"),
        rf"\1{_REDACTED}",
    ),
    # Keys recognisable by their shape: ours (rg_, and e2b_ as E2B's SDKs want them),
    # OpenAI-style (sk-), GitHub, Slack, AWS.
    (re.compile(r"\brg_[A-Za-z0-9_\-]{16,}"), _REDACTED),
    (re.compile(r"\be2b_[0-9a-f]{16,}"), _REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), _REDACTED),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"), _REDACTED),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"), _REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), _REDACTED),
    # password=anything; key=/secret=/token= followed by something long enough to be a secret
    # (short values such as "key=name" are left, so logs stay readable).
    (
        re.compile(
            r"(?i)(\b[\w.-]{0,40}(?:password|passwd)[\w.-]{0,40}[\"']?\s*[=:]\s*[\"']?)[^\s\"',;&]+"
        ),
        rf"\1{_REDACTED}",
    ),
    (
        re.compile(
            rf"(?i)(\b[\w.-]{{0,40}}(?:secret|token|key)[\w.-]{{0,40}}[\"']?\s*[=:]\s*[\"']?)"
            rf"{_SECRET_CHARS}{{16,}}"
        ),
        rf"\1{_REDACTED}",
    ),
]


def redact(text: str) -> str:
    """``text`` with key-like secrets replaced by ``[REDACTED]``, for logs and error messages."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactSecrets(logging.Filter):
    """A logging filter that redacts secrets in messages and tracebacks; it drops nothing.

    Attach it to handlers (``handler.addFilter(RedactSecrets())``): a filter on a logger does
    not see records propagated from its children.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        if record.exc_info and not record.exc_text:
            # Format the traceback now, redacted; Formatter reuses exc_text when it is set.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class DropFrames(logging.Filter):
    """A logging filter that drops the debug lines of WebSocket frames.

    ``websockets`` logs every frame at DEBUG (for uvicorn's server, under ``uvicorn.error``),
    showing the start and end of its text: a node channel's frames carry executions' code,
    their outputs and the secrets a node asks a gateway for (docs/secrets.md), none of which
    belongs in a log, whatever ``REPLGATE_LOG_LEVEL`` says. Attach it to handlers.
    """

    FRAME_LINES = frozenset({"< %s", "> %s"})

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.DEBUG and record.msg in self.FRAME_LINES)
