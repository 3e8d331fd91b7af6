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


# Ports tried after the preferred one before any free port: the kernel's pick lies in the
# ephemeral range, where any outgoing connection on this host may take it while a crashed
# server is down, and the server could then not come back on it.
NEAR_PORTS = 100


def pick_port(preferred: int, host: str = HOST) -> int:
    """`preferred` if free, else the next free one above it, else any free port."""
    for candidate in range(preferred, min(preferred + NEAR_PORTS, 65536)):
        if port_free(candidate, host):
            return candidate
    return free_port(host)
