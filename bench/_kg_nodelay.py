"""Jupyter Kernel Gateway with TCP_NODELAY on its kernel WebSockets: a diagnostic, not a fix.

``python -m bench._kg_nodelay [kernel gateway options]``

jupyter_server's ``KernelWebsocketHandler`` never calls tornado's ``set_nodelay(True)``, and
tornado leaves Nagle's algorithm on for WebSockets (its HTTP/1 code turns it back on after
each response, the upgrade included). A cell's reply is several small frames (status busy,
execute_input, execute_result, execute_reply, status idle) written one by one: the first goes
out at once, the next waits for the client's ACK of the first, which Linux delays by up to
40 ms (delayed ACK). Setting TCP_NODELAY on the socket, as here, takes the stall away.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.services.kernels.websocket import KernelWebsocketHandler

_open = KernelWebsocketHandler.open


async def _open_without_nagle(self: KernelWebsocketHandler, *args: Any, **kwargs: Any) -> None:
    self.set_nodelay(True)
    await _open(self, *args, **kwargs)


if __name__ == "__main__":
    KernelWebsocketHandler.open = _open_without_nagle  # type: ignore[method-assign]
    import kernel_gateway.gatewayapp as app

    app.launch_instance()
