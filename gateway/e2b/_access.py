"""Who may reach a sandbox through ``E2B_SANDBOX_URL``, and which session it is.

E2B's SDKs send every in-sandbox request to one URL and name the sandbox and the port in
headers (``E2b-Sandbox-Id``, ``E2b-Sandbox-Port``), as E2B's own proxy routes them. They carry
no API key there: the sandbox's access token (``X-Access-Token``, or the traffic token the code
interpreter SDKs send on their context calls) is the credential.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import HTTPConnection

from gateway.e2b._errors import E2BError
from gateway.e2b._sandboxes import Sandboxes
from gateway.service import Gateway
from kernel_pool import SessionClosed, SessionNotFound, SessionPort

INTERPRETER_PORT = 49999
"""The code interpreter's port: ``/execute`` and ``/contexts``."""
ENVD_PORT = 49983
"""envd's port: ``/files`` and the filesystem and process RPC services."""


async def find_sandbox(headers: Mapping[str, str], gateway: Gateway, sandboxes: Sandboxes,
                 *ports: int) -> tuple[str, SessionPort]:
    """The tenant and session a sandbox request is for, once its token is checked."""
    token = headers.get("x-access-token") or headers.get("e2b-traffic-access-token")
    sandbox_id = headers.get("e2b-sandbox-id")
    port = headers.get("e2b-sandbox-port", "")
    if not sandbox_id:
        # E2B's JS SDK before 2.15 names the sandbox on its RPC calls only: its token does too.
        sandbox_id, port = sandboxes.named_by(token), port or str(ports[0])
    if not sandbox_id:
        raise E2BError(400, "no E2b-Sandbox-Id header: point E2B_SANDBOX_URL at "
                            "http://HOST:PORT/e2b/sandbox and use E2B's SDK")
    if port not in {str(p) for p in ports}:
        raise E2BError(502, f"The sandbox {sandbox_id} port {port or '(none)'} is not open "
                            "here: replgate serves this path on port "
                            f"{' or '.join(str(p) for p in ports)}")
    tenant = await sandboxes.owner(sandbox_id, token)
    try:
        session = await gateway.session(tenant, sandbox_id)
    except (SessionNotFound, SessionClosed):  # deleted a moment ago
        raise E2BError(502, f"The sandbox {sandbox_id} was not found") from None
    await sandboxes.traffic(tenant, session)  # a paused one with autoResume wakes
    return tenant, session


def services(connection: HTTPConnection) -> tuple[Gateway, Sandboxes]:
    app = connection.app
    return app.state.gateway, app.state.e2b
