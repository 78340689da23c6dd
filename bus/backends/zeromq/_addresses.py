"""Where a node's data socket listens, and the address other nodes reach it at.

Kept apart from the links: these are pure functions of the broker's endpoint, used once at
bind time, and the cluster tests and tools can reason about them without a socket.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tempfile

__all__ = ["default_data_bind", "local_address"]


def default_data_bind(broker: str, incarnation: int) -> str:
    """Where a node's data socket listens unless told: beside the broker's ipc socket, or
    on a free port of the interface that reaches the broker."""
    if broker.startswith("ipc://"):
        path = f"{broker[len('ipc://') :]}.{os.getpid()}-{incarnation:08x}"
        if len(path) > 100:  # the limit of a Unix socket path
            path = os.path.join(tempfile.gettempdir(), f"pantheon-{os.getpid()}-{incarnation:x}")
        return f"ipc://{path}"
    if broker.startswith("tcp://"):
        host = broker[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
        if is_loopback(host):
            return "tcp://127.0.0.1:0"
        return "tcp://0.0.0.0:0"
    return "tcp://127.0.0.1:0"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_address(broker: str) -> str:
    """The address of this machine's interface that routes to the broker (no packet sent)."""
    host, port = broker[len("tcp://") :].rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host.strip("[]"), int(port)))
        return str(probe.getsockname()[0])
