"""The web UI: the page at ``/`` and its few static files under ``/ui/``, served without auth.

The page holds no secret; it asks for an API key and talks to the API like any client. Kernel
output is untrusted: the page renders HTML and SVG only inside sandboxed iframes (opaque
origin, so no access to the page's storage or cookies), and its Content-Security-Policy, which
those frames inherit, allows scripts only from the page's own files or carrying this
response's nonce, and no connection but to the gateway itself.

Third-party files (xterm.js for the terminal tab) are vendored under ``static/vendor/``, each
named in its ``lock.json`` with the npm package, version and sha256 it came from: the lock is
also the list of what ``/ui/vendor/`` serves.
"""

from __future__ import annotations

import json
import secrets
from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Response
from fastapi.responses import HTMLResponse

from gateway.errors import NotFound

router = APIRouter(include_in_schema=False)

ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "approvals.js": "text/javascript; charset=utf-8",
    "approver.js": "text/javascript; charset=utf-8",
    "cells.js": "text/javascript; charset=utf-8",
    "files.js": "text/javascript; charset=utf-8",
    "network.js": "text/javascript; charset=utf-8",
    "output.js": "text/javascript; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "sessions.js": "text/javascript; charset=utf-8",
    "signin.js": "text/javascript; charset=utf-8",
    "status.js": "text/javascript; charset=utf-8",
    "templates.js": "text/javascript; charset=utf-8",
    "terminal.js": "text/javascript; charset=utf-8",
    "text.js": "text/javascript; charset=utf-8",
    "watch.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
NONCE_PLACEHOLDER = "{{nonce}}"
VENDOR_TYPES = {
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".LICENSE": "text/plain; charset=utf-8",
}


@cache
def _static(name: str) -> bytes:
    return files("gateway").joinpath("static", name).read_bytes()


@cache
def vendored() -> dict[str, str]:
    """Each vendored file the lock names, with its media type (by its name's ending)."""
    lock = json.loads(_static("vendor/lock.json"))
    names = [name for package in lock["packages"] for name in package["files"]]
    return {name: next(media for end, media in VENDOR_TYPES.items() if name.endswith(end))
            for name in names}


def content_security_policy(nonce: str) -> str:
    return "; ".join((
        "default-src 'self'",
        f"script-src 'self' 'nonce-{nonce}'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ))


def _headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache", **(extra or {})}


@router.get("/")
def index() -> HTMLResponse:
    """The page; each answer has a fresh nonce for the scripts of its output frames."""
    nonce = secrets.token_urlsafe(18)
    html = _static("index.html").decode().replace(NONCE_PLACEHOLDER, nonce)
    return HTMLResponse(html, headers=_headers({
        "Content-Security-Policy": content_security_policy(nonce),
        "Cache-Control": "no-store", "X-Frame-Options": "DENY"}))


@router.get("/ui/{name}")
def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no UI file named {name!r}")
    return Response(_static(name), media_type=media_type, headers=_headers())


@router.get("/ui/vendor/{name}")
def vendor_asset(name: str) -> Response:
    media_type = vendored().get(name)
    if media_type is None:
        raise NotFound(f"no vendored UI file named {name!r}")
    return Response(_static(f"vendor/{name}"), media_type=media_type, headers=_headers())
