"""The gateway's listening socket, which its replicas on one host share.

Each replica binds the port with SO_REUSEPORT and the kernel spreads new connections
over them. The same option would just as quietly let the gateway of another deployment
(another state dir, another database) share the port, and then half of a client's
requests would land in the wrong database. So a replica first claims the port with a
shared `flock` on a file that names its deployment: replicas of one deployment share
the claim, a gateway of another is refused, as a second plain bind used to be.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import time
from pathlib import Path

from specplatform.errors import RuntimeSetupError
from specplatform.hostlock import default_lock_dir

CLAIM_TIMEOUT_S = 5.0
POLL_S = 0.05


def deployment_id(database_url: str, nats_url: str) -> str:
    """Who serves a port: a digest of the servers behind it (no credentials in the file)."""
    return hashlib.sha256(f"{database_url}\n{nats_url}".encode()).hexdigest()[:16]


def claim_port(host: str, port: int, deployment: str, directory: Path | None = None) -> int:
    """Hold the port for `deployment` for as long as this process lives; the claim's fd.

    RuntimeSetupError if the gateway of another deployment on this host serves it.
    """
    folder = directory if directory is not None else default_lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"gateway-{host}-{port}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + CLAIM_TIMEOUT_S
    while True:
        if _try(fd, fcntl.LOCK_EX):
            # No gateway serves the port: it is ours; write who we are, then share it.
            os.ftruncate(fd, 0)
            os.pwrite(fd, deployment.encode(), 0)
            fcntl.flock(fd, fcntl.LOCK_SH)
            return fd
        if _try(fd, fcntl.LOCK_SH):
            owner = os.pread(fd, 64, 0).decode(errors="replace")
            if owner == deployment:
                return fd
            os.close(fd)
            raise RuntimeSetupError(
                f"{host}:{port} is served by the gateway of another deployment on this host "
                "(other database or NATS); set SPECOPS_GATEWAY_PORT to another port"
            )
        # Another replica holds it exclusively for the moment it writes its name.
        if time.monotonic() > deadline:
            os.close(fd)
            raise RuntimeSetupError(f"could not claim {host}:{port} within {CLAIM_TIMEOUT_S:g} s")
        time.sleep(POLL_S)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that the deployment's other replicas bind too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeSetupError(f"gateway cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _try(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
