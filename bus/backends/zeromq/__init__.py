"""The ZeroMQ transport: the same bus across processes and machines, through a broker.

::

    async with run_broker() as endpoint:             # or: python -m bus.backends.zeromq broker
        async with Bus(transport=ZmqTransport(endpoint)) as bus:
            ...

Needs pyzmq (``pip install 'pantheon[zmq]'``); importing this package is what imports it.
"""

try:
    import zmq as _zmq  # noqa: F401 - imported here to fail early with a useful message
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "bus.backends.zeromq needs pyzmq: install the 'zmq' extra (pip install 'pantheon[zmq]')"
    ) from exc

from bus.backends.zeromq._broker import Broker
from bus.backends.zeromq._errors import (
    AuthenticationFailed,
    ConnectError,
    EncodeError,
    FrameTooLarge,
    PeerLost,
    RemoteHandlerError,
)
from bus.backends.zeromq._keys import CurveKeys, load_public_keys
from bus.backends.zeromq._node import ZmqTransport
from bus.backends.zeromq._process import run_broker

__all__ = [
    "AuthenticationFailed",
    "Broker",
    "ConnectError",
    "CurveKeys",
    "EncodeError",
    "FrameTooLarge",
    "PeerLost",
    "RemoteHandlerError",
    "ZmqTransport",
    "load_public_keys",
    "run_broker",
]
