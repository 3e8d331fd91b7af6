"""Loopback TCP ports for the processes of the local runtime."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def port_free(port: int, host: str = HOST) -> bool:
    """Whether a listener could bind `port` now.

    With SO_REUSEADDR, as nats-server (Go) and Python's HTTP servers set it: the
    connections of a killed server linger in TIME_WAIT on its port and must not read as
    the port being taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = HOST) -> int:
    """A port no one listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
