"""Spans for the bus and its agents, following the OTel messaging and GenAI conventions.

Why spans are not made with ``tracer.start_span``: the SDK's span costs about 17 µs to start
and end on this machine (attribute validation, locks, the sampler, processor callbacks),
more than ten in-process messages. At 1% sampling two such spans per message would cost the
bus a quarter of its throughput. So a sampled span is a small slotted record while it runs
and becomes an SDK :class:`ReadableSpan` when it ends (about 4 µs), handed to the span
processors the application configured. Exporters, processors and the wire format are the
SDK's; only the bookkeeping of a running span is ours, and the SDK's tracer is still used
for spans anything else makes inside a handler (they nest under ours: the current span is
kept in the OTel context).

Sampling is ``ParentBased(TraceIdRatioBased(ratio))`` decided once per root message with the
SDK's own rule (sampled when the trace id's low 64 bits are under
``TraceIdRatioBased.get_bound_for_rate(ratio)``), computed on one ``getrandbits`` before any
id exists. A root the sampler declines carries :data:`UNSAMPLED` in ``env.trace``, which every
message it causes inherits, so the bus skips them with one string index: no span object, no
id, no context attach or detach.
"""

from __future__ import annotations

import random
import time
import traceback
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from bus import Envelope

__all__ = ["UNSAMPLED", "BusTracer", "parse_traceparent"]

#: The trace context of a message whose root the sampler declined (W3C flags ``00``). It has
#: no ids on purpose: making them would cost every unsampled root what a span saves.
UNSAMPLED = "00-00000000000000000000000000000000-0000000000000000-00"

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
#: A publish span starts when its envelope was created, unless that is older than this (a
#: redrive or replay of an old envelope): then it starts when it is published again.
_MAX_PUBLISH_NS = 1_000_000_000
_bits = random.getrandbits
_time_ns = time.time_ns


def parse_traceparent(trace: str) -> SpanContext:
    """The span context of a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``).

    Raises ``ValueError`` naming the header when it is malformed: an envelope from another
    node with a broken trace is a bug worth seeing, not a reason to start a new trace."""
    parts = trace.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        raise ValueError(f"malformed traceparent {trace!r}: want 00-<32 hex>-<16 hex>-<2 hex>")
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        raise ValueError(f"malformed traceparent {trace!r}: not hexadecimal") from None
    return SpanContext(trace_id, span_id, True, TraceFlags(flags))


def _traceparent(trace_id: int, span_id: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-01"


class _Span:
    """A sampled span while it runs; :meth:`BusTracer._finish` turns it into a ReadableSpan.

    Also the context manager :meth:`BusTracer.span` returns: entering makes it the current
    span (children and emits parent to it), leaving ends it, recording an escaping exception.
    """

    __slots__ = (
        "attributes",
        "context",
        "events",
        "kind",
        "links",
        "name",
        "parent",
        "start",
        "status",
        "token",
        "tracer",
    )

    def __init__(
        self,
        tracer: BusTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: tuple[Link, ...] = (),
    ) -> None:
        self.tracer = tracer
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.attributes = attributes
        self.links = links
        self.events: list[Event] = []
        self.status = _UNSET
        self.start = _time_ns()
        self.token: object = None

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def record_exception(self, exc: BaseException) -> None:
        self.events.append(
            Event(
                "exception",
                {
                    "exception.type": type(exc).__qualname__,
                    "exception.message": str(exc),
                    "exception.stacktrace": "".join(traceback.format_exception(exc)),
                },
            )
        )

    def fail(self, description: str, exc: BaseException | None) -> None:
        if exc is not None:
            self.record_exception(exc)
            self.attributes["error.type"] = type(exc).__qualname__
        self.status = Status(StatusCode.ERROR, description)

    def activate(self) -> None:
        """Make this the current span of the running task (the OTel context)."""
        ctx = otel_trace.set_span_in_context(NonRecordingSpan(self.context))
        self.token = otel_context.attach(ctx)

    def __enter__(self) -> _Span:
        self.activate()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        otel_context.detach(self.token)
        if exc is not None:
            self.fail(f"{type(exc).__qualname__}: {exc}", exc)
        self.tracer._finish(self, _time_ns())


class BusTracer:
    """Implements :class:`bus.Tracer` with the OTel SDK: install as ``bus.tracer``.

    ``processor`` receives every ended span (build it from exporters with the SDK's
    ``BatchSpanProcessor`` or ``SimpleSpanProcessor``); ``ratio`` is the share of root
    messages traced, whole requests at a time.
    """

    def __init__(
        self,
        processor: SpanProcessor,
        *,
        ratio: float = 1.0,
        resource: Resource | None = None,
        scope: InstrumentationScope | None = None,
    ) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"sampling ratio must be in [0, 1], got {ratio!r}")
        self.ratio = ratio
        self._bound = TraceIdRatioBased.get_bound_for_rate(ratio)
        self._processor = processor
        self._resource = resource if resource is not None else Resource.create()
        self._scope = scope or InstrumentationScope("pantheon.bus")
        # Envelopes stamp ``created`` from the monotonic clock; spans want wall-clock ns.
        self._wall_offset = _time_ns() - time.monotonic_ns()

    # -- bus.Tracer ------------------------------------------------------------------------

    def on_publish(self, env: Envelope) -> None:
        trace = env.trace
        if trace is None:
            low = _bits(64)
            if low >= self._bound:
                env.trace = UNSAMPLED
                return
            trace_id = (_bits(64) << 64) | low
            parent = None
        else:
            parent = parse_traceparent(trace)
            if not parent.trace_flags.sampled:
                return
            # Inside a handler the current span (its process span, or an agent's span within
            # it) is the more precise parent, as long as it belongs to the same trace.
            current = otel_trace.get_current_span().get_span_context()
            if current.trace_id == parent.trace_id:
                parent = current
            trace_id = parent.trace_id
        span_id = _bits(64) or 1
        env.trace = _traceparent(trace_id, span_id)
        now = _time_ns()
        start = env.created + self._wall_offset
        if not 0 <= now - start <= _MAX_PUBLISH_NS:
            start = now
        span = _Span(
            self,
            f"publish {env.topic}",
            SpanContext(trace_id, span_id, False, _SAMPLED),
            parent,
            SpanKind.PRODUCER,
            {
                "messaging.system": "pantheon",
                "messaging.operation.name": "publish",
                "messaging.operation.type": "send",
                "messaging.destination.name": env.topic,
                "messaging.message.id": str(env.id),
                "messaging.message.conversation_id": str(env.correlation_id),
                "pantheon.session.id": env.session_id or "",
                "pantheon.priority": int(env.priority),
                "pantheon.hops": env.hops,
            },
        )
        span.start = start
        self._finish(span, now)

    def start_process(self, subscription: str, env: Envelope) -> _Span:
        assert env.trace is not None  # the bus calls this for sampled envelopes only
        producer = parse_traceparent(env.trace)
        span = _Span(
            self,
            f"process {env.topic}",
            SpanContext(producer.trace_id, _bits(64) or 1, False, _SAMPLED),
            producer,
            SpanKind.CONSUMER,
            {
                "messaging.system": "pantheon",
                "messaging.operation.name": "process",
                "messaging.operation.type": "process",
                "messaging.destination.name": env.topic,
                "messaging.consumer.group.name": subscription,
                "messaging.message.id": str(env.id),
                "messaging.message.conversation_id": str(env.correlation_id),
                "pantheon.session.id": env.session_id or "",
            },
            # The creation context as a link too, as the conventions ask of consumers: with
            # fan-out every subscriber's process span is a sibling under the one publish.
            (Link(producer),),
        )
        span.activate()
        return span

    def end_process(self, token: Any, outcome: str, error: BaseException | None) -> None:
        span: _Span = token
        otel_context.detach(span.token)
        span.attributes["pantheon.outcome"] = outcome
        if outcome != "delivered":
            span.fail(outcome if error is None else f"{outcome}: {error!r}", error)
        elif error is not None:
            span.record_exception(error)  # failed, then a retry succeeded
        self._finish(span, _time_ns())

    def span(
        self, name: str, attributes: dict[str, Any], kind: str = "internal"
    ) -> _Span | None:
        parent = otel_trace.get_current_span().get_span_context()
        if not parent.trace_flags.sampled:
            return None
        try:
            span_kind = _KINDS[kind]
        except KeyError:
            raise ValueError(f"span kind must be one of {sorted(_KINDS)}, got {kind!r}") from None
        context = SpanContext(parent.trace_id, _bits(64) or 1, False, _SAMPLED)
        return _Span(self, name, context, parent, span_kind, attributes)

    # -- export ----------------------------------------------------------------------------

    def _finish(self, span: _Span, end: int) -> None:
        self._processor.on_end(
            ReadableSpan(
                span.name,
                span.context,
                span.parent,
                self._resource,
                span.attributes,
                span.events,
                span.links,
                span.kind,
                None,
                span.status,
                span.start,
                end,
                self._scope,
            )
        )
