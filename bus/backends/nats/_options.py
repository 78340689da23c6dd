"""What ``NatsTransport(...)`` accepts: its options checked, its credentials for nats-py.

A bad option is refused when the transport is made, naming it, rather than found later as
a server's refusal or a stalled loop.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_options", "credentials"]


def credentials(
    user: str | None,
    password: str | None,
    nkey_seed: str | None,
    creds: str | None,
    token: str | None,
) -> dict[str, Any]:
    """The options nats-py's ``connect`` takes for those credentials (none: anonymous)."""
    return {
        k: v
        for k, v in (
            ("user", user),
            ("password", password),
            ("nkeys_seed", nkey_seed),
            ("user_credentials", creds),
            ("token", token),
        )
        if v is not None
    }


def check_options(
    storage: str,
    user: str | None,
    password: str | None,
    replicas: int,
    credit: int,
    batch: int,
    window: int,
    max_deliver: int,
    liveness: int,
    dedup_window: float,
    max_age: float,
    ack_wait: float,
    ack_timeout: float,
    heartbeat: float,
    connect_timeout: float,
    backoff: tuple[float, float],
) -> None:
    """A bad option is refused when the transport is made, naming it, not found later."""
    if storage not in ("file", "memory"):
        raise ValueError(f"NatsTransport: storage must be 'file' or 'memory', got {storage!r}")
    if (user is None) != (password is None):
        raise ValueError("NatsTransport: user and password go together")
    for label, value in (
        ("replicas", replicas),
        ("credit", credit),
        ("batch", batch),
        ("window", window),
        ("max_deliver", max_deliver),
        ("liveness", liveness),
    ):
        if value < 1:
            raise ValueError(f"NatsTransport: {label} must be >= 1, got {value}")
    for label, seconds in (
        ("dedup_window", dedup_window),
        ("max_age", max_age),
        ("ack_wait", ack_wait),
        ("ack_timeout", ack_timeout),
        ("heartbeat", heartbeat),
        ("connect_timeout", connect_timeout),
        ("backoff[1]", backoff[1]),
    ):
        if seconds <= 0:
            raise ValueError(f"NatsTransport: {label} must be > 0, got {seconds}")
    if backoff[0] < 0 or backoff[0] > backoff[1]:
        raise ValueError(f"NatsTransport: backoff must be (base >= 0, max >= base), got {backoff}")
