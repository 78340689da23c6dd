"""Spans for the bus and its agents, following the OTel messaging and GenAI conventions.

Why spans are not made with ``tracer.start_span``: the SDK's span costs about 17 µs to start
and end on this machine (attribute validation, locks, the sampler, processor callbacks),
more than ten in-process messages. At 1% sampling two such spans per message would cost the
bus a quarter of its throughput. So a sampled span is only ids and a few references while it
runs (the publish span is a tuple; the envelope holds the rest of its attributes), and the
SDK objects (``SpanContext``, ``Link``, the attribute dict, :class:`ReadableSpan`) are built
when it has ended, for the span processors the application configured.

With batching (what :class:`~pantheon.telemetry.Telemetry` does by default) the processor is
a :class:`SpanBatcher`: ended spans go to it as those records, and its thread builds and
exports them 512 at a time. It replaces the SDK's ``BatchSpanProcessor``, which cost a
traced message more than everything else (a lock, a ``getpid`` and a deque per span, and a
second thread waking up). Exporters and the wire format are the SDK's; the SDK's tracer is
still used for spans anything else makes inside a handler (they nest under ours: the current
span is kept in the OTel context, and its processor is the same batcher).

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

import logging
import math
import os
import random
import sys
import threading
import time
import traceback
from collections import deque
from contextvars import ContextVar, Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from bus import UNSAMPLED, Envelope

__all__ = ["UNSAMPLED", "BusTracer", "SpanBatcher", "parse_traceparent"]

_log = logging.getLogger(__name__)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
#: A publish span starts when its envelope was created, unless that is older than this (a
#: redrive or replay of an old envelope): then it starts when it is published again.
_MAX_PUBLISH_NS = 1_000_000_000
#: Ids of recent publishes, by traceparent, so their consumers need not parse it.
#: Cleared when full: a miss only costs a parse.
_CONTEXT_CACHE = 4096
#: A SpanBatcher wakes once this many spans have ended (or every ``_FLUSH_EVERY_S``) and
#: exports them ``_BATCH`` at a time: each wake-up takes the GIL from the event loop, which
#: costs it more than building a few hundred spans does.
_WAKE_AT = 2048
_BATCH = 512
_FLUSH_EVERY_S = 1.0
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


class _Span:
    """A sampled span while it runs: ids and references, no SDK objects (see the module).

    ``env`` and ``subscription`` are set for a process span, whose messaging attributes are
    read from the envelope when the span is built; ``attributes`` holds the rest (an agent's
    GenAI attributes, the outcome). ``remote`` says the parent came from a traceparent
    rather than a span of this process.

    Also the context manager :meth:`BusTracer.span` returns: entering makes it the current
    span (children and emits parent to it), leaving ends it, recording an escaping exception.
    ``trace_hex`` is the trace id as it appears in a traceparent, to tell cheaply whether a
    message emitted under this span belongs to its trace.
    """

    __slots__ = (
        "attributes",
        "end",
        "env",
        "events",
        "kind",
        "name",
        "otel_token",
        "parent_id",
        "remote",
        "span_id",
        "start",
        "status",
        "subscription",
        "token",
        "trace_hex",
        "trace_id",
        "tracer",
    )

    def __init__(
        self,
        tracer: BusTracer,
        name: str,
        trace_id: int,
        parent_id: int,
        remote: bool,
        kind: SpanKind,
        attributes: dict[str, Any],
        trace_hex: str,
        env: Envelope | None = None,
        subscription: str = "",
    ) -> None:
        self.tracer = tracer
        self.name = name
        self.trace_id = trace_id
        self.span_id = _bits(64) or 1
        self.parent_id = parent_id
        self.remote = remote
        self.trace_hex = trace_hex
        self.kind = kind
        self.attributes = attributes
        self.env = env
        self.subscription = subscription
        self.events: list[Event] = []
        self.status = _UNSET
        self.start = _time_ns()
        self.end = 0
        self.token: Any = None
        self.otel_token: Token[otel_context.Context] | None = None

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
            context = SpanContext(self.trace_id, self.span_id, False, _SAMPLED)
            self.otel_token = otel_context.attach(
                otel_trace.set_span_in_context(NonRecordingSpan(context))
            )

    def deactivate(self) -> None:
        if self.token is None:  # a span closed while it waited for a retry is not active
            return
        if self.otel_token is not None:
            otel_context.detach(self.otel_token)
            self.otel_token = None
        _current.reset(self.token)
        self.token = None

    def __enter__(self) -> _Span:
        self.activate()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.deactivate()
        if exc is not None:
            self.fail(f"{type(exc).__qualname__}: {exc}", exc)
        self.end = _time_ns()
        self.tracer._ended(self)


_current: ContextVar[_Span | None] = ContextVar("pantheon_current_span", default=None)
_env_provider = OTEL_PYTHON_TRACER_PROVIDER in os.environ


def _otel_global() -> bool:
    """Whether the application set a global tracer provider (other code may make spans).

    Reads the API's module global rather than calling ``get_tracer_provider()``, which
    looks the environment up on every call (0.8 µs, once per process span); a provider
    named by ``OTEL_PYTHON_TRACER_PROVIDER`` is loaded by that call, so it is still made
    when the variable was set at import."""
    if otel_trace._TRACER_PROVIDER is not None:
        return True
    return _env_provider and not isinstance(
        otel_trace.get_tracer_provider(), otel_trace.ProxyTracerProvider
    )


class BusTracer:
    """Implements :class:`bus.Tracer` with the OTel SDK: install as ``bus.tracer``.

    ``processor`` receives every ended span (build it from exporters with the SDK's
    ``BatchSpanProcessor`` or ``SimpleSpanProcessor``); ``ratio`` is the share of root
    messages traced, whole requests at a time. A :class:`SpanBatcher` as ``processor``
    gets ended spans unbuilt and builds them on its thread; any other processor gets each
    span built, as it ends, on the caller's thread.
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
        #: Where an ended span's record goes: built later by a batcher, or built now.
        self._ended = processor.add if isinstance(processor, SpanBatcher) else self._end_now
        self._contexts: dict[str, tuple[int, int]] = {}
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
            parent_id = 0
            remote = False
        else:
            # Inside a handler the current span (its process span, or an agent's span within
            # it) is the more precise parent, as long as it belongs to the same trace.
            current = _current.get()
            if current is not None and current.trace_hex == trace[3:35]:
                trace_id, parent_id, remote = current.trace_id, current.span_id, False
            else:
                ids = self._contexts.get(trace)
                if ids is None:
                    parent = parse_traceparent(trace)
                    if not parent.trace_flags.sampled:
                        return
                    trace_id, parent_id, remote = parent.trace_id, parent.span_id, True
                else:
                    trace_id, parent_id = ids
                    remote = False
        span_id = _bits(64) or 1
        env.trace = traceparent = f"00-{trace_id:032x}-{span_id:016x}-01"
        contexts = self._contexts
        if len(contexts) >= _CONTEXT_CACHE:
            contexts.clear()
        contexts[traceparent] = (trace_id, span_id)
        self._ended((self, env, trace_id, span_id, parent_id, remote, _time_ns()))

    def start_process(self, subscription: str, env: Envelope) -> _Span:
        trace = env.trace
        assert trace is not None  # the bus calls this for sampled envelopes only
        ids = self._contexts.get(trace)
        if ids is None:
            producer = parse_traceparent(trace)
            trace_id, parent_id, remote = producer.trace_id, producer.span_id, True
        else:
            (trace_id, parent_id), remote = ids, False
        span = _Span(
            self,
            f"process {env.topic}",
            trace_id,
            parent_id,
            remote,
            SpanKind.CONSUMER,
            {},
            trace[3:35],
            env,
            subscription,
        )
        span.activate()
        return span

    def resume_process(self, token: Any) -> None:
        """Another attempt of the message ``token`` spans, after a retry's backoff."""
        token.activate()

    def end_process(self, token: Any, outcome: str, error: BaseException | None) -> None:
        span: _Span = token
        span.deactivate()
        if outcome == "retrying":  # the message waits for another attempt: span stays open
            return
        span.attributes["pantheon.outcome"] = outcome
        if outcome != "delivered":
            span.fail(outcome if error is None else f"{outcome}: {error!r}", error)
        elif error is not None:
            span.record_exception(error)  # failed, then a retry succeeded
        span.end = _time_ns()
        self._ended(span)

    def span(self, name: str, attributes: dict[str, Any], kind: str = "internal") -> _Span | None:
        current = _current.get()
        if current is None:
            return None
        try:
            span_kind = _KINDS[kind]
        except KeyError:
            raise ValueError(f"span kind must be one of {sorted(_KINDS)}, got {kind!r}") from None
        return _Span(
            self,
            name,
            current.trace_id,
            current.span_id,
            False,
            span_kind,
            attributes,
            current.trace_hex,
        )

    # -- export ----------------------------------------------------------------------------

    def _end_now(self, record: Any) -> None:
        self._on_end(self._build(record))

    def _build(self, record: Any) -> ReadableSpan:
        """The SDK span for an ended ``_Span``, or a publish span's record
        ``(tracer, env, trace_id, span_id, parent_id, remote, end)``."""
        if type(record) is tuple:
            _, env, trace_id, span_id, parent_id, remote, end = record
            start = env.created + self._wall_offset
            if not 0 <= end - start <= _MAX_PUBLISH_NS:
                start = end
            return ReadableSpan(
                f"publish {env.topic}",
                SpanContext(trace_id, span_id, False, _SAMPLED),
                SpanContext(trace_id, parent_id, remote, _SAMPLED) if parent_id else None,
                self._resource,
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
                (),
                (),
                SpanKind.PRODUCER,
                None,
                _UNSET,
                start,
                end,
                self._scope,
            )
        span: _Span = record
        parent = SpanContext(span.trace_id, span.parent_id, span.remote, _SAMPLED)
        attributes = span.attributes
        links: tuple[Link, ...] = ()
        env = span.env
        if env is not None:
            attributes = {
                "messaging.system": "pantheon",
                "messaging.operation.name": "process",
                "messaging.operation.type": "process",
                "messaging.destination.name": env.topic,
                "messaging.consumer.group.name": span.subscription,
                "messaging.message.id": str(env.id),
                "messaging.message.conversation_id": str(env.correlation_id),
                "pantheon.session.id": env.session_id or "",
                **attributes,
            }
            # The creation context as a link too, as the conventions ask of consumers: with
            # fan-out every subscriber's process span is a sibling under the one publish.
            links = (Link(parent),)
        return ReadableSpan(
            span.name,
            SpanContext(span.trace_id, span.span_id, False, _SAMPLED),
            parent,
            self._resource,
            attributes,
            span.events,
            links,
            span.kind,
            None,
            span.status,
            span.start,
            span.end,
            self._scope,
        )


def _built(record: Any) -> ReadableSpan:
    """The SDK span for what a :class:`SpanBatcher` holds: a bus span's record, or an SDK
    span (from the provider's tracer) as it came."""
    kind = type(record)
    if kind is tuple:
        return record[0]._build(record)
    if kind is _Span:
        return record.tracer._build(record)
    return record


class SpanBatcher(SpanProcessor):
    """Builds ended spans and exports them in batches, on its own thread.

    The processor :class:`~pantheon.telemetry.Telemetry` gives both the bus tracer and the
    SDK tracer provider when it batches. ``exporters`` get batches of up to 512 spans;
    ``processors`` (the application's own) get every span's ``on_end``, also on the
    thread. :meth:`force_flush` exports what has ended so far before returning;
    :meth:`shutdown` does, then shuts the exporters and processors down.
    """

    def __init__(
        self, exporters: list[SpanExporter], processors: list[SpanProcessor] | None = None
    ) -> None:
        self._exporters = list(exporters)
        self._processors = list(processors or ())
        self._queue: deque[Any] = deque()
        self._lock = threading.Lock()  # one exporter at a time: the thread or a flush
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="pantheon-spans", daemon=True)
        self._thread.start()

    def add(self, record: Any) -> None:
        """Queue an ended span (a bus tracer's record, or an SDK span) for the thread."""
        if self._stopped:  # after shutdown: nobody would export it later
            self._export([_built(record)], {})
            return
        queue = self._queue
        queue.append(record)
        if len(queue) == _WAKE_AT:
            self._wake.set()

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self.add(span)

    def _export(self, batch: list[ReadableSpan], failed: dict[int, int]) -> None:
        """Export one batch to every exporter not in ``failed`` (id -> spans dropped)."""
        for processor in self._processors:
            for span in batch:
                processor.on_end(span)
        # The export's own I/O must not be traced (an instrumented HTTP client would make
        # spans about exporting spans).
        token = otel_context.attach(otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            for exporter in self._exporters:
                key = id(exporter)
                if key in failed:
                    failed[key] += len(batch)
                    continue
                try:
                    ok = exporter.export(batch) is not SpanExportResult.FAILURE
                except Exception:
                    _log.exception("span exporter %r failed", exporter)
                    ok = False
                if not ok:
                    failed[key] = 0
        finally:
            otel_context.detach(token)

    def _drain(self) -> None:
        """Export everything queued. An exporter that fails a batch (OTLP: after retrying for
        its whole timeout) gets no more batches of this drain: they are dropped and counted
        in one log line. Otherwise an unreachable collector would hold a flush, and so a
        process's exit, for one timeout per 512 spans (minutes for one run); the next
        drain, a second later, tries it again."""
        failed: dict[int, int] = {}
        with self._lock:
            queue = self._queue
            while queue:
                pop = queue.popleft
                self._export([_built(pop()) for _ in range(min(len(queue), _BATCH))], failed)
        for exporter in self._exporters:
            dropped = failed.get(id(exporter))
            if dropped:
                _log.error(
                    "span exporter %r failed: dropped %d more spans without trying it again",
                    exporter,
                    dropped,
                )

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(_FLUSH_EVERY_S)
            self._wake.clear()
            self._drain()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        self._drain()
        ok = True
        for exporter in self._exporters:
            ok = exporter.force_flush(timeout_millis) and ok
        for processor in self._processors:
            ok = processor.force_flush(timeout_millis) and ok
        return ok

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        self._thread.join()
        self._drain()
        for exporter in self._exporters:
            exporter.shutdown()
        for processor in self._processors:
            processor.shutdown()
