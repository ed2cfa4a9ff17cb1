"""``Sandbox.list()``: E2B's filters, order and pages over a tenant's sandboxes.

A page that has more after it answers ``X-Next-Token``: the position (start time and id) of
its last sandbox, so the next page goes on from there even when sandboxes start or end in
between, and none is shown twice.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Literal
from urllib.parse import parse_qsl, unquote

from gateway.e2b._errors import E2BError
from gateway.e2b._models import DEFAULT_TEMPLATES, ListedSandbox

Order = Literal["asc", "desc"]
_Key = tuple[datetime, str]


def parse_states(state: Iterable[str]) -> set[str]:
    """``state=running,paused`` (E2B's form style) or the parameter repeated."""
    return {s.strip() for item in state for s in item.split(",") if s.strip()}


def _metadata(metadata: str | None) -> dict[str, str]:
    # The SDKs quote each key and value before they urlencode the pairs: unquote once more.
    return {unquote(k): unquote(v)
            for k, v in parse_qsl(metadata or "", keep_blank_values=True)}


def select(found: Iterable[ListedSandbox], *, metadata: str | None, state: Iterable[str],
           started_after: datetime | None, template: str | None) -> list[ListedSandbox]:
    """The sandboxes every given filter lets through."""
    wanted = _metadata(metadata)
    states = parse_states(state)
    if template in DEFAULT_TEMPLATES:
        template = "default"
    return [s for s in found
            if all(s.metadata.get(k) == v for k, v in wanted.items())
            and (not states or s.state in states)
            and (started_after is None or _started(s) >= started_after)
            and (not template or template in (s.templateID, s.alias))]


def _started(sandbox: ListedSandbox) -> datetime:
    return datetime.fromisoformat(sandbox.startedAt)


def _key(sandbox: ListedSandbox) -> _Key:
    return _started(sandbox), sandbox.sandboxID


def _token(key: _Key) -> str:
    raw = json.dumps([key[0].isoformat(), key[1]]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _position(token: str) -> _Key:
    try:
        started, sandbox_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return datetime.fromisoformat(started), str(sandbox_id)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise E2BError(400, f"invalid nextToken {token!r}: pass the X-Next-Token header of "
                            "the previous page unchanged") from exc


def page(found: Iterable[ListedSandbox], *, order: Order, limit: int,
         next_token: str | None) -> tuple[list[ListedSandbox], str | None]:
    """One page of ``limit`` sandboxes by start time (newest first for ``desc``), after the
    position ``next_token`` names; with the token of the page after it, if there is one."""
    newest_first = order == "desc"
    ordered = sorted(found, key=_key, reverse=newest_first)
    if next_token:
        after = _position(next_token)
        ordered = [s for s in ordered if (_key(s) < after if newest_first else _key(s) > after)]
    items = ordered[:limit]
    more = len(ordered) > limit
    return items, _token(_key(items[-1])) if more else None
