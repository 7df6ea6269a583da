"""port_free: a port another process listens on is taken; a closed one is free again."""

from __future__ import annotations

import socket

from jobs.ports import port_free, port_problem


def test_a_listening_port_is_taken_and_free_once_closed() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        assert not port_free("127.0.0.1", port)
        assert "another process already listens on 127.0.0.1" in (port_problem("127.0.0.1", port) or "")
    finally:
        server.close()
    assert port_free("127.0.0.1", port) and port_problem("127.0.0.1", port) is None


def test_a_wildcard_listener_holds_the_port_for_localhost() -> None:
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    try:
        assert not port_free("127.0.0.1", server.getsockname()[1])
    finally:
        server.close()
