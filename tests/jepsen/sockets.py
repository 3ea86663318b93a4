"""Real sockets for the proxy tests: an echo server behind a proxy, and dials from a chosen source."""

from __future__ import annotations

import socket
import threading


def echo_server(host: str = "127.0.0.1") -> tuple[socket.socket, str]:
    """A listening socket on ``host`` that echoes every connection (daemon threads); (socket, "host:port")."""
    server = socket.socket()
    server.bind((host, 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return

            def echo(c: socket.socket = conn) -> None:
                with c:
                    try:
                        while data := c.recv(4096):
                            c.sendall(data)
                    except OSError:
                        pass

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    bound_host, port = server.getsockname()
    return server, f"{bound_host}:{port}"


def connect(address: str, source: str) -> socket.socket:
    """A connection to ``address`` leaving from ``source`` (as a server's raft dials leave from its bind host)."""
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))
