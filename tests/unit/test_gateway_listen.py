"""Gateway replicas share one port; a gateway of another deployment is refused it."""

from __future__ import annotations

import os
import select
import socket
from pathlib import Path

import pytest

from specops_services.gateway.http.socket import claim_port, deployment_id, listening_socket
from specplatform.errors import RuntimeSetupError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_replicas_listen_on_one_port_and_the_kernel_spreads_connections() -> None:
    port = _free_port()
    replicas = [listening_socket("127.0.0.1", port) for _ in range(2)]
    clients = []
    try:
        for sock in replicas:
            sock.listen(64)
        for _ in range(32):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        accepted = [0, 0]
        while sum(accepted) < len(clients):
            ready, _, _ = select.select(replicas, [], [], 5)
            assert ready, "a connection was never accepted"
            for sock in ready:
                conn, _ = sock.accept()
                conn.close()
                accepted[replicas.index(sock)] += 1
        # 32 connections all hashed to one socket: odds of 2 in 2**32.
        assert min(accepted) > 0, accepted
    finally:
        for sock in clients + replicas:
            sock.close()


def test_the_port_is_claimed_for_one_deployment_at_a_time(tmp_path: Path) -> None:
    ours = deployment_id("postgresql://a/specops", "nats://a:4222")
    theirs = deployment_id("postgresql://b/specops", "nats://a:4222")
    first = claim_port("127.0.0.1", 8787, ours, tmp_path)
    second = claim_port("127.0.0.1", 8787, ours, tmp_path)
    with pytest.raises(RuntimeSetupError, match="another deployment"):
        claim_port("127.0.0.1", 8787, theirs, tmp_path)
    other_port = claim_port("127.0.0.1", 8788, theirs, tmp_path)
    for fd in (first, second, other_port):
        os.close(fd)
    # Once our replicas are gone (closed, or killed: the kernel drops their locks) it is free.
    os.close(claim_port("127.0.0.1", 8787, theirs, tmp_path))
