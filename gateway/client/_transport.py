"""How the client reaches one gateway with one API key: HTTP requests, errors translated.

The address and key come from the arguments, else from the gateway of this machine as
:mod:`gateway.local` finds it (``REPLGATE_URL``, ``REPLGATE_API_KEY``, else
``http://127.0.0.1:8000`` and the key ``replgate serve`` wrote in its state folder), read when a
sandbox is created or connected, never at import.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx

from gateway import local

from ._errors import AuthenticationError, TransportError, error_from_response
from ._tracecontext import trace_headers

# Starting a session may start a container; an execution lasts as long as its own timeout_s,
# which the gateway enforces, so the client does not race it with a read timeout of its own.
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
EXECUTE_TIMEOUT = httpx.Timeout(60.0, connect=10.0, read=None)


def resolve_base_url(base_url: str | None) -> str:
    """``base_url``, else ``REPLGATE_URL``, else the gateway's default address."""
    return base_url.rstrip("/") if base_url else local.gateway_url()


def resolve_api_key(api_key: str | None) -> str:
    """``api_key``, else ``REPLGATE_API_KEY``, else the key ``replgate serve`` created on this
    machine; without any, :class:`AuthenticationError`."""
    key = api_key or local.api_key()
    if not key:
        raise AuthenticationError(
            "No API key: pass api_key=... or set REPLGATE_API_KEY (`replgate serve` prints the "
            "key it created when REPLGATE_API_KEYS is unset, and keeps it in "
            f"{local.state_dir() / local.KEY_FILE}, where this client looks too).")
    return key


@functools.cache
def _verifying_context() -> ssl.SSLContext:
    """httpx's own verification (certifi's authorities), made once per process: making it
    takes about 20 ms, which every sandbox's create paid when each client made its own."""
    return httpx.create_ssl_context()


def _tls_for(base_url: str) -> ssl.SSLContext:
    """The TLS context of a client of ``base_url``. A plain ``http://`` gateway needs none: it
    gets a context that trusts no authority (nothing to load), so that an ``https://`` URL it
    might redirect to fails closed rather than unverified."""
    if httpx.URL(base_url).scheme == "https":
        return _verifying_context()
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class Transport:
    """An HTTP client bound to one gateway and key; error answers become :class:`ReplgateError`."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None) -> None:
        self.base_url = resolve_base_url(base_url)
        self.headers = {"Authorization": f"Bearer {resolve_api_key(api_key)}"}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers,
                                       timeout=DEFAULT_TIMEOUT, verify=_tls_for(self.base_url))

    def websocket_url(self, path: str) -> str:
        """The ``ws://`` (or ``wss://``) address of ``path`` on this gateway."""
        url = httpx.URL(self.base_url)
        scheme = "wss" if url.scheme == "https" else "ws"
        return str(url.copy_with(scheme=scheme, path=url.path.rstrip("/") + path))

    async def request(self, method: str, path: str, *, json: Any = None,
                      content: bytes | None = None,
                      limits: httpx.Timeout = DEFAULT_TIMEOUT) -> httpx.Response:
        """Send a request; raise the matching :class:`ReplgateError` for an error answer."""
        try:
            response = await self._http.request(method, path, json=json, content=content,
                                                timeout=limits, headers=trace_headers())
        except httpx.TimeoutException as exc:
            raise TransportError(
                f"The gateway at {self.base_url} did not answer {method} {path} in time "
                f"({exc!r}); it may be overloaded. Retry, or check that it is healthy "
                "(GET /healthz).") from exc
        except httpx.TransportError as exc:
            raise TransportError(
                f"Could not reach the replgate gateway at {self.base_url} ({exc!r}). Start it "
                "with `replgate serve`, or pass base_url=... / set REPLGATE_URL.") from exc
        if response.is_error:
            raise error_from_response(response)
        return response

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()
