"""Is a TCP port free to listen on? Asked before a server job starts, so that a port another process
holds is refused up front instead of the job failing, or worse, another server answering its
readiness check."""

from __future__ import annotations

import errno
import socket


def port_free(host: str, port: int) -> bool:
    """True when a server could listen on `host`:`port` now.

    Binds the way servers do (SO_REUSEADDR, so a port left in TIME_WAIT by an earlier server counts as
    free) and lets go at once. A listener on the wildcard address holds the port for `host` too.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def port_problem(host: str, port: int) -> str | None:
    """A sentence for a form or a CLI when the port is taken, else None."""
    if port_free(host, port):
        return None
    return (f"port {port}: another process already listens on {host}:{port} (pick another port, or stop the "
            "server holding it)")
