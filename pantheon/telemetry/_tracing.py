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

Sampling is ``ParentBased(TraceIdRatioBased(ratio))``, decided once per root message. Each root
is sampled independently with probability ``ratio``, but instead of a random draw per root the
tracer draws how many roots to decline before the next sampled one (geometrically
distributed, which is the same process) and leaves that count in ``skip``, which the bus
counts down itself: a declined root costs a decrement, not a call. A sampled root's trace id
has its low 64 bits under ``TraceIdRatioBased.get_bound_for_rate(ratio)``, so the SDK's
sampler with the same ratio anywhere downstream agrees with the decision. A declined root
carries :data:`bus.UNSAMPLED` in ``env.trace``, which every message it causes inherits, so the
bus skips them by identity: no span object, no id, no context attach or detach.
"""

from __future__ import annotations

import math
import random
import sys
import time
import traceback
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from bus import UNSAMPLED, Envelope

__all__ = ["UNSAMPLED", "BusTracer", "parse_traceparent"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
#: A publish span starts when its envelope was created, unless that is older than this (a
#: redrive or replay of an old envelope): then it starts when it is published again.
_MAX_PUBLISH_NS = 1_000_000_000
#: Span contexts of recent publishes, by traceparent, so their consumers need not parse it.
#: Cleared when full: a miss only costs a parse.
_CONTEXT_CACHE = 4096
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
    ``trace_hex`` is the trace id as it appears in a traceparent, to tell cheaply whether a
    message emitted under this span belongs to its trace.
    """

    __slots__ = (
        "attributes",
        "context",
        "events",
        "kind",
        "links",
        "name",
        "otel_token",
        "parent",
        "start",
        "status",
        "token",
        "trace_hex",
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
        trace_hex: str,
        links: tuple[Link, ...] = (),
    ) -> None:
        self.tracer = tracer
        self.name = name
        self.context = context
        self.trace_hex = trace_hex
        self.parent = parent
        self.kind = kind
        self.attributes = attributes
        self.links = links
        self.events: list[Event] = []
        self.status = _UNSET
        self.start = _time_ns()
        self.token: Any = None
        self.otel_token: object = None

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
        """Make this the current span of the running task: ours (what emits and agents'
        spans parent to), and the OTel context's when the application has set a global
        tracer provider, so spans other instrumentation makes in a handler nest under it.
        (Attaching costs about as much as the rest of a span: not paid when nobody looks.)"""
        self.token = _current.set(self)
        if _otel_global():
            ctx = otel_trace.set_span_in_context(NonRecordingSpan(self.context))
            self.otel_token = otel_context.attach(ctx)

    def deactivate(self) -> None:
        if self.otel_token is not None:
            otel_context.detach(self.otel_token)
        _current.reset(self.token)

    def __enter__(self) -> _Span:
        self.activate()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.deactivate()
        if exc is not None:
            self.fail(f"{type(exc).__qualname__}: {exc}", exc)
        self.tracer._finish(self, _time_ns())


_current: ContextVar[_Span | None] = ContextVar("pantheon_current_span", default=None)


def _otel_global() -> bool:
    """Whether the application set a global tracer provider (other code may make spans)."""
    return not isinstance(otel_trace.get_tracer_provider(), otel_trace.ProxyTracerProvider)


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
        #: Roots already declined: the bus stamps them UNSAMPLED and counts this down.
        self.skip = self._draw_skip()
        self._on_end = processor.on_end
        self._contexts: dict[str, SpanContext] = {}
        self._resource = resource if resource is not None else Resource.create()
        self._scope = scope or InstrumentationScope("pantheon.bus")
        # Envelopes stamp ``created`` from the monotonic clock; spans want wall-clock ns.
        self._wall_offset = _time_ns() - time.monotonic_ns()

    # -- bus.Tracer ------------------------------------------------------------------------

    def _draw_skip(self) -> int:
        """Roots to decline before the next sampled one, ~ Geometric(ratio)."""
        if self.ratio >= 1.0:
            return 0
        if self.ratio <= 0.0:
            return sys.maxsize
        return int(math.log(1.0 - random.random()) / math.log1p(-self.ratio))

    def on_publish(self, env: Envelope) -> None:
        trace = env.trace
        if trace is None:
            skip = self.skip
            if skip:  # a bus counts these down itself; this serves other callers
                self.skip = skip - 1
                env.trace = UNSAMPLED
                return
            self.skip = self._draw_skip()
            trace_id = (_bits(64) << 64) | (_bits(64) % self._bound) or 1
            parent = None
        else:
            # Inside a handler the current span (its process span, or an agent's span within
            # it) is the more precise parent, as long as it belongs to the same trace.
            current = _current.get()
            if current is not None and current.trace_hex == trace[3:35]:
                parent = current.context
            else:
                parent = self._context_of(trace)
                if not parent.trace_flags.sampled:
                    return
            trace_id = parent.trace_id
        span_id = _bits(64) or 1
        env.trace = traceparent = _traceparent(trace_id, span_id)
        context = SpanContext(trace_id, span_id, False, _SAMPLED)
        contexts = self._contexts
        if len(contexts) >= _CONTEXT_CACHE:
            contexts.clear()
        contexts[traceparent] = context
        end = _time_ns()
        start = env.created + self._wall_offset
        if not 0 <= end - start <= _MAX_PUBLISH_NS:
            start = end
        attributes = {
            "messaging.system": "pantheon",
            "messaging.operation.name": "publish",
            "messaging.operation.type": "send",
            "messaging.destination.name": env.topic,
            "messaging.message.id": str(env.id),
            "messaging.message.conversation_id": str(env.correlation_id),
            "pantheon.session.id": env.session_id or "",
            "pantheon.priority": int(env.priority),
            "pantheon.hops": env.hops,
        }
        self._on_end(
            ReadableSpan(
                f"publish {env.topic}",
                context,
                parent,
                self._resource,
                attributes,
                (),
                (),
                SpanKind.PRODUCER,
                None,
                _UNSET,
                start,
                end,
                self._scope,
            )
        )

    def _context_of(self, traceparent: str) -> SpanContext:
        context = self._contexts.get(traceparent)
        return context if context is not None else parse_traceparent(traceparent)

    def start_process(self, subscription: str, env: Envelope) -> _Span:
        trace = env.trace
        assert trace is not None  # the bus calls this for sampled envelopes only
        producer = self._context_of(trace)
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
            trace[3:35],
            # The creation context as a link too, as the conventions ask of consumers: with
            # fan-out every subscriber's process span is a sibling under the one publish.
            (Link(producer),),
        )
        span.activate()
        return span

    def end_process(self, token: Any, outcome: str, error: BaseException | None) -> None:
        span: _Span = token
        span.deactivate()
        span.attributes["pantheon.outcome"] = outcome
        if outcome != "delivered":
            span.fail(outcome if error is None else f"{outcome}: {error!r}", error)
        elif error is not None:
            span.record_exception(error)  # failed, then a retry succeeded
        self._finish(span, _time_ns())

    def span(
        self, name: str, attributes: dict[str, Any], kind: str = "internal"
    ) -> _Span | None:
        current = _current.get()
        if current is None:
            return None
        try:
            span_kind = _KINDS[kind]
        except KeyError:
            raise ValueError(f"span kind must be one of {sorted(_KINDS)}, got {kind!r}") from None
        parent = current.context
        context = SpanContext(parent.trace_id, _bits(64) or 1, False, _SAMPLED)
        return _Span(self, name, context, parent, span_kind, attributes, current.trace_hex)

    # -- export ----------------------------------------------------------------------------

    def _finish(self, span: _Span, end: int) -> None:
        self._on_end(
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
