"""The sandbox's side of egress: ``127.0.0.1:3128`` piped to the gateway's filtering proxy.

The container has no network (``--network none``), only its own loopback. When the gateway
serves an egress proxy for this sandbox (a profile with ``egress_allow``, or a session's
network policy), its Unix socket sits beside the kernel's connection file
(``/kernel/egress.sock``). A thread of the kernel process always listens on ``127.0.0.1:3128``
and pipes each connection, byte for byte, to that socket, looked up per connection: so a warm
kernel started with no proxy gets one when a session with a policy claims it, without a
restart (the gateway then sets the variables below in the kernel). When the proxy is there
at the start, ``HTTP_PROXY``/``HTTPS_PROXY`` point at the forwarder from the start, so
``requests``, ``urllib``, ``pip`` and ``curl`` go through the gateway, which decides. Without
a proxy a connection is answered ``403 No network for this sandbox``. Nothing here filters or
can widen anything: code that skips the proxy has no route at all.
"""

import contextlib
import os
import selectors
import socket
import sys
import threading

PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PORT}"
SOCKET_NAME = "egress.sock"
CHUNK = 64 * 1024


NO_NETWORK = (b"HTTP/1.1 403 No network for this sandbox\r\nContent-Type: text/plain\r\n"
              b"Content-Length: 70\r\nX-Replgate-Egress: refused\r\nConnection: close\r\n\r\n"
              b"replgate egress refused: this sandbox's session has no network policy\n")


def start(kernel_dir: str) -> bool:
    """Forward 127.0.0.1:3128 to ``kernel_dir/egress.sock``; set the proxy variables if the
    socket exists now (True then)."""
    path = os.path.join(kernel_dir, SOCKET_NAME)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", PORT))
        listener.listen(64)
    except OSError as exc:
        listener.close()
        print(f"replgate: egress forwarder not started: {exc}", file=sys.stderr)
        return False
    threading.Thread(target=_accept, args=(listener, path), name="replgate-egress",
                     daemon=True).start()
    if not os.path.exists(path):
        return False
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ[name] = PROXY_URL
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        os.environ.pop(name, None)
    return True


def _accept(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _address = listener.accept()
        except OSError:
            continue
        threading.Thread(target=_pipe, args=(client, path), daemon=True).start()


def _pipe(client: socket.socket, path: str) -> None:
    # Without it the small writes back to the client (the CONNECT answer, TLS flights) wait
    # for the client's delayed ACK: about 40 ms on every new connection.
    with contextlib.suppress(OSError):
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        with contextlib.suppress(OSError):
            client.sendall(NO_NETWORK)
        client.close()
        upstream.close()
        return
    peers = {client: upstream, upstream: client}
    with selectors.DefaultSelector() as selector:
        for sock in peers:
            selector.register(sock, selectors.EVENT_READ)
        open_ends = 2
        try:
            while open_ends:
                for key, _mask in selector.select():
                    source = key.fileobj
                    assert isinstance(source, socket.socket)
                    data = source.recv(CHUNK)
                    if data:
                        peers[source].sendall(data)
                        continue
                    selector.unregister(source)
                    open_ends -= 1
                    with contextlib.suppress(OSError):
                        peers[source].shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()
