"""envd's ``process.Process`` service: commands in the sandbox.

replgate's commands (``Session.run_command``) arrive with the agent-results work; until then
every method answers UNIMPLEMENTED with a sentence, so ``commands.run`` fails at once, clearly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.e2b._connect import ConnectService, Empty, not_offered, server_stream, unary

SERVICE = "process.Process"
_WHY = "shell commands (commands.run) in this version; run Python with run_code instead"


async def _unary(request: Empty) -> Empty:
    raise not_offered(_WHY)


async def _stream(request: Empty) -> AsyncIterator[Empty]:
    raise not_offered(_WHY)
    yield Empty()  # pragma: no cover - makes this an async generator


def process_service() -> ConnectService:
    return ConnectService(SERVICE, dict([
        server_stream(SERVICE, "Start", Empty, Empty, _stream),
        server_stream(SERVICE, "Connect", Empty, Empty, _stream),
        *(unary(SERVICE, name, Empty, Empty, _unary) for name in
          ("List", "Update", "SendInput", "SendSignal", "CloseStdin")),
    ]))
