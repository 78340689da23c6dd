"""The gateway's errors.

::

    PantheonError
    └── GatewayError             the gateway cannot start as configured
        └── TokenError           a tokens file or variable is unreadable or wrong (located)
"""

from __future__ import annotations

from pantheon._errors import PantheonError

__all__ = ["GatewayError", "TokenError"]


class GatewayError(PantheonError, RuntimeError):
    """The gateway cannot start as configured (a missing extra, a port in use)."""


class TokenError(GatewayError, ValueError):
    """A tokens document is unreadable or wrong; the message names where and which field,
    never a token's value."""
