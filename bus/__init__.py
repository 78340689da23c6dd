"""Pantheon's event bus: in-process by default, the same API over any :class:`Transport`.

Light on purpose: importing ``bus`` pulls in msgspec and the standard library, nothing else.
"""

from bus._breaker import CircuitBreaker
from bus._bus import Bus
from bus._clock import Clock, SystemClock
from bus._config import (
    DEFAULT_BLOCK_TIMEOUT,
    DEFAULT_BREAKER,
    DEFAULT_MAX_QUEUE,
    BreakerPolicy,
    Overflow,
    Priority,
    Retry,
)
from bus._decode import DEFAULT_MAX_DECODE_BYTES, UntrustedDecoder
from bus._dlq import DeadLetter, DeadLetterQueue, DeadLetterReason, DeadLetterRecord
from bus._envelope import Envelope
from bus._errors import (
    BusClosedError,
    BusError,
    CircuitOpenError,
    DecodeError,
    EncodeError,
    NoRouteError,
    PublishError,
    QueueFullError,
    RequestTimeout,
    TransportError,
)
from bus._hooks import (
    UNSAMPLED,
    BreakerChange,
    BreakerEvent,
    BusObserver,
    Delivery,
    ObserverHandle,
    Tracer,
    is_sampled,
)
from bus._metrics import BusStats, EdgeStats, LatencySummary, SubscriberStats, TopicStats
from bus._sched import SchedulingStats, beside_the_loop
from bus._subscription import Handler, Subscription
from bus._topics import matches, validate_pattern
from bus._transport import InProcessHub, InProcessTransport, Receipt, Transport
from bus._worker import current_envelope, current_handler, current_subscription

__all__ = [
    "DEFAULT_BLOCK_TIMEOUT",
    "DEFAULT_BREAKER",
    "DEFAULT_MAX_DECODE_BYTES",
    "DEFAULT_MAX_QUEUE",
    "UNSAMPLED",
    "BreakerChange",
    "BreakerEvent",
    "BreakerPolicy",
    "Bus",
    "BusClosedError",
    "BusError",
    "BusObserver",
    "BusStats",
    "CircuitBreaker",
    "CircuitOpenError",
    "Clock",
    "DeadLetter",
    "DeadLetterQueue",
    "DeadLetterReason",
    "DeadLetterRecord",
    "DecodeError",
    "Delivery",
    "EdgeStats",
    "EncodeError",
    "Envelope",
    "Handler",
    "InProcessHub",
    "InProcessTransport",
    "LatencySummary",
    "NoRouteError",
    "ObserverHandle",
    "Overflow",
    "Priority",
    "PublishError",
    "QueueFullError",
    "Receipt",
    "RequestTimeout",
    "Retry",
    "SchedulingStats",
    "SubscriberStats",
    "Subscription",
    "SystemClock",
    "TopicStats",
    "Tracer",
    "Transport",
    "TransportError",
    "UntrustedDecoder",
    "beside_the_loop",
    "current_envelope",
    "current_handler",
    "current_subscription",
    "is_sampled",
    "matches",
    "validate_pattern",
]
