"""Bus spans on a real bus: names, kinds, messaging attributes, parents, links, sampling."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, StatusCode
from telemetry_helpers import Traced

from bus import Bus, Envelope, InProcessHub, InProcessTransport, Retry, is_sampled
from pantheon.telemetry import UNSAMPLED, BusTracer, parse_traceparent


def by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


async def test_publish_and_process_follow_the_messaging_conventions(traced: Traced) -> None:
    seen: list[Envelope] = []

    async def handle(env: Envelope) -> None:
        seen.append(env)

    async with Bus(session_id="s-1") as bus:
        traced.telemetry.instrument(bus)
        bus.on("order.*", handle, name="billing")
        env = await bus.emit("order.created", {"n": 1})
        await bus.drain()

    spans = by_name(traced.spans())
    [publish] = spans["publish order.created"]
    [process] = spans["process order.created"]
    assert publish.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert publish.parent is None  # outside input is a root
    assert (
        dict(publish.attributes or {}).items()
        >= {
            "messaging.system": "pantheon",
            "messaging.destination.name": "order.created",
            "messaging.message.id": str(env.id),
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "pantheon.session.id": "s-1",
        }.items()
    )
    assert (
        dict(process.attributes or {}).items()
        >= {
            "messaging.system": "pantheon",
            "messaging.destination.name": "order.created",
            "messaging.message.id": str(env.id),
            "messaging.consumer.group.name": "billing",
            "messaging.operation.type": "process",
            "pantheon.outcome": "delivered",
        }.items()
    )
    # The envelope carries the producer span as its W3C traceparent; the consumer is its child
    # and links to it.
    carried = parse_traceparent(seen[0].trace or "")
    assert (carried.trace_id, carried.span_id) == (
        publish.context.trace_id,
        publish.context.span_id,
    )
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert process.context.trace_id == publish.context.trace_id
    assert [link.context.span_id for link in process.links] == [publish.context.span_id]
    assert process.status.status_code is StatusCode.UNSET


async def test_fan_out_gives_each_subscriber_a_process_span_under_the_one_publish(
    traced: Traced,
) -> None:
    async with Bus() as bus:
        traced.telemetry.instrument(bus)
        for name in ("a", "b", "c"):
            bus.on("fan.*", lambda env: None, name=name)
        await bus.emit("fan.out", 1)
        await bus.drain()

    spans = by_name(traced.spans())
    [publish] = spans["publish fan.out"]
    processes = spans["process fan.out"]
    groups = sorted(str((s.attributes or {})["messaging.consumer.group.name"]) for s in processes)
    assert groups == ["a", "b", "c"]
    for s in processes:
        assert s.parent is not None and s.parent.span_id == publish.context.span_id
        assert [link.context.span_id for link in s.links] == [publish.context.span_id]
    assert len({s.context.span_id for s in processes}) == 3


async def test_messages_emitted_while_processing_are_children_of_that_processing(
    traced: Traced,
) -> None:
    """A chain a -> b -> c is one trace: publish(a) < process(a) < publish(b) < ..."""

    async with Bus() as bus:
        traced.telemetry.instrument(bus)

        async def first(env: Envelope) -> None:
            await bus.emit("step.b", env.payload)

        async def second(env: Envelope) -> None:
            await bus.emit("step.c", env.payload)

        bus.on("step.a", first, name="first")
        bus.on("step.b", second, name="second")
        bus.on("step.c", lambda env: None, name="third")
        await bus.emit("step.a", 1)
        await bus.drain()

    spans = traced.spans()
    assert len(spans) == 6
    assert len({s.context.trace_id for s in spans}) == 1
    by_id = {s.context.span_id: s for s in spans}
    chain = []
    [leaf] = by_name(spans)["process step.c"]
    span: ReadableSpan | None = leaf
    while span is not None:
        chain.append(span.name)
        span = by_id.get(span.parent.span_id) if span.parent is not None else None
    assert chain == [
        "process step.c",
        "publish step.c",
        "process step.b",
        "publish step.b",
        "process step.a",
        "publish step.a",
    ]


async def test_a_failed_handling_is_an_error_span_with_the_exception(traced: Traced) -> None:
    async def broken(env: Envelope) -> None:
        raise KeyError("no such order")

    async with Bus() as bus:
        traced.telemetry.instrument(bus)
        bus.on("order.*", broken, name="broken", retry=Retry(attempts=2, backoff=0.0))
        await bus.emit("order.created", 1)
        await bus.drain()

    [process] = traced.named("process order.created")
    assert process.status.status_code is StatusCode.ERROR
    assert "failed" in (process.status.description or "")
    assert (process.attributes or {})["pantheon.outcome"] == "failed"
    assert (process.attributes or {})["error.type"] == "KeyError"
    [event] = process.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "KeyError"
    assert "no such order" in str((event.attributes or {})["exception.stacktrace"])


async def test_a_retry_that_succeeds_keeps_the_span_ok_but_records_the_failure(
    traced: Traced,
) -> None:
    calls = []

    async def flaky(env: Envelope) -> None:
        calls.append(env.id)
        if len(calls) == 1:
            raise TimeoutError("slow upstream")

    async with Bus() as bus:
        traced.telemetry.instrument(bus)
        bus.on("job.*", flaky, name="flaky", retry=Retry(attempts=3, backoff=0.0))
        await bus.emit("job.run", 1)
        await bus.drain()

    [process] = traced.named("process job.run")
    assert len(calls) == 2
    assert process.status.status_code is StatusCode.UNSET
    assert (process.attributes or {})["pantheon.outcome"] == "delivered"
    assert [e.name for e in process.events] == ["exception"]


async def test_an_open_breaker_marks_the_span_circuit_open(traced: Traced) -> None:
    async with Bus() as bus:
        traced.telemetry.instrument(bus)
        bus.on("x.*", lambda env: None, name="guarded")
        bus.breaker("guarded").force_open()
        await bus.emit("x.y", 1)
        await bus.drain()

    [process] = traced.named("process x.y")
    assert process.status.status_code is StatusCode.ERROR
    assert (process.attributes or {})["pantheon.outcome"] == "circuit_open"


class CountingTracer(BusTracer):
    """Counts what the bus asks of the tracer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.publishes = self.processes = 0

    def on_publish(self, env: Envelope) -> None:
        self.publishes += 1
        super().on_publish(env)

    def start_process(self, subscription: str, env: Envelope) -> Any:
        self.processes += 1
        return super().start_process(subscription, env)


async def run_chains(tracer: BusTracer, roots: int) -> list[Envelope]:
    """``roots`` outside messages, each causing two more; returns every envelope seen."""
    seen: list[Envelope] = []
    async with Bus() as bus:
        bus.observe(tracer)

        async def relay(env: Envelope) -> None:
            seen.append(env)
            if env.topic == "c.1":
                await bus.emit("c.2", None)
            elif env.topic == "c.2":
                await bus.emit("c.3", None)

        bus.on("c.*", relay, name="relay")
        for _ in range(roots):
            await bus.emit("c.1", None)
        await bus.drain()
    return seen


@pytest.mark.parametrize("ratio", [0.0, 1.0])
async def test_sampling_ratio_zero_traces_nothing_and_one_traces_everything(
    traced: Traced, ratio: float
) -> None:
    tracer = CountingTracer(SimpleSpanProcessor(traced.exporter), ratio=ratio)
    seen = await run_chains(tracer, roots=50)
    assert len(seen) == 150
    if ratio == 0.0:
        # Declined at the root, once, in advance: the bus stamps the roots itself (no call
        # reaches the tracer at all) and every descendant inherits the decision without ids.
        assert traced.spans() == []
        assert tracer.publishes == 0 and tracer.processes == 0
        assert all(env.trace is UNSAMPLED for env in seen)
    else:
        assert len(traced.spans()) == 300  # a publish and a process span per message
        assert tracer.processes == 150
        assert len({s.context.trace_id for s in traced.spans()}) == 50
        assert all(is_sampled(env.trace) for env in seen)


async def test_a_partial_ratio_samples_whole_requests(traced: Traced) -> None:
    tracer = BusTracer(SimpleSpanProcessor(traced.exporter), ratio=0.25)
    await run_chains(tracer, roots=2000)
    per_trace: dict[int, int] = {}
    for s in traced.spans():
        per_trace[s.context.trace_id] = per_trace.get(s.context.trace_id, 0) + 1
    # The decision is made once per root: a sampled request has all six spans, never a part.
    assert set(per_trace.values()) == {6}
    # 2000 independent draws at 0.25: 500 expected, sd ~19; 6 sd either side never fails.
    assert 385 <= len(per_trace) <= 615


async def test_the_trace_id_of_a_sampled_root_satisfies_trace_id_ratio_based() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    exporter = InMemorySpanExporter()
    tracer = BusTracer(SimpleSpanProcessor(exporter), ratio=0.3)
    for _ in range(300):
        tracer.on_publish(Envelope.new("t", None))
    bound = TraceIdRatioBased.get_bound_for_rate(0.3)
    spans = exporter.get_finished_spans()
    assert spans
    # Any SDK TraceIdRatioBased(0.3) downstream (another service) agrees with our decision.
    assert all(s.context.trace_id & 0xFFFFFFFFFFFFFFFF < bound for s in spans)


async def test_an_unsampled_message_makes_no_span_and_no_context_switch(traced: Traced) -> None:
    from opentelemetry import context as otel_context

    tracer = CountingTracer(SimpleSpanProcessor(traced.exporter), ratio=0.0)
    attached: list[object] = []
    real_attach = otel_context.attach

    def spy(ctx: Any) -> object:
        attached.append(ctx)
        return real_attach(ctx)

    otel_context.attach = spy  # type: ignore[assignment]
    try:
        await run_chains(tracer, roots=20)
    finally:
        otel_context.attach = real_attach
    assert attached == [] and traced.spans() == [] and tracer.processes == 0


def test_parse_traceparent_rejects_malformed_headers() -> None:
    ctx = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    assert ctx.trace_id == 0x0AF7651916CD43DD8448EB211C80319C and ctx.trace_flags.sampled
    for bad in ("00-xyz", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033zz-01", ""):
        with pytest.raises(ValueError, match="malformed traceparent"):
            parse_traceparent(bad)


async def test_a_message_from_another_bus_is_processed_under_its_remote_producer(
    traced: Traced,
) -> None:
    """Two buses joined by a transport: the receiving bus adds a process span under the
    sender's publish span, and no second publish span."""
    hub = InProcessHub()
    async with (
        Bus(transport=InProcessTransport(hub)) as sender,
        Bus(transport=InProcessTransport(hub)) as receiver,
    ):
        traced.telemetry.instrument(sender)
        traced.telemetry.instrument(receiver)
        receiver.on("r.*", lambda env: None, name="remote")
        await asyncio.sleep(0)
        await sender.emit("r.x", None)
        await sender.drain()
        await receiver.drain()
    spans = by_name(traced.spans())
    [publish] = spans["publish r.x"]
    [process] = spans["process r.x"]
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert process.context.trace_id == publish.context.trace_id


async def test_the_bus_without_a_tracer_never_touches_trace_context() -> None:
    async with Bus() as bus:
        got: list[str | None] = []
        bus.on("p.*", lambda env: got.append(env.trace), name="p")
        await bus.emit("p.q", None)
        await asyncio.sleep(0)
        await bus.drain()
    assert bus.tracer is None and got == [None]


async def test_batched_spans_reach_exporters_and_processors_on_flush_and_shutdown() -> None:
    """With batching the bus's spans (and the provider's) are built on the SpanBatcher's
    thread; force_flush hands every ended one on, and shutdown drains what is left."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pantheon.telemetry import Telemetry

    exporter, mirrored = InMemorySpanExporter(), InMemorySpanExporter()
    telemetry = Telemetry(
        span_exporters=[exporter], span_processors=[SimpleSpanProcessor(mirrored)]
    )
    async with Bus() as bus:
        telemetry.instrument(bus)
        bus.on("b.*", lambda env: None, name="b")
        for _ in range(10):
            await bus.emit("b.x", None)
        await bus.drain()
    assert telemetry.tracer_provider is not None
    with telemetry.tracer_provider.get_tracer("other").start_as_current_span("other work"):
        pass
    telemetry.force_flush()
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["other work"] + ["process b.x"] * 10 + ["publish b.x"] * 10
    assert sorted(s.name for s in mirrored.get_finished_spans()) == names
    async with Bus() as bus:
        telemetry.instrument(bus)
        await bus.emit("late.x", None)
    telemetry.shutdown()
    assert [s.name for s in exporter.get_finished_spans()][-1] == "publish late.x"


def test_a_failing_exporter_is_tried_once_per_flush_not_once_per_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A collector that is down costs a flush one failed export (OTLP: its whole timeout,
    retries included), not one per 512 spans: otherwise a run's last flush, and so a node's
    exit, waited minutes. The rest is dropped and counted; the next flush tries again, and
    the other exporters get every span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pantheon.telemetry._tracing import SpanBatcher

    class Collector(SpanExporter):
        """Counts what it is asked to export; refuses while ``up`` is False."""

        def __init__(self) -> None:
            self.up = False
            self.calls: list[int] = []

        def export(self, spans: Any) -> SpanExportResult:
            self.calls.append(len(spans))
            return SpanExportResult.SUCCESS if self.up else SpanExportResult.FAILURE

    def ended(n: int) -> list[ReadableSpan]:
        tracer = TracerProvider().get_tracer("t")
        spans = [tracer.start_span(f"s{i}") for i in range(n)]
        for span in spans:
            span.end()
        return spans  # type: ignore[return-value]  # SDK spans are ReadableSpans

    collector, memory = Collector(), InMemorySpanExporter()
    batcher = SpanBatcher([collector, memory])
    try:
        # Queued under the batcher's lock, so one drain (its thread's or the flush's)
        # sees all of them.
        with batcher._lock:
            for span in ended(1200):
                batcher.add(span)
        with caplog.at_level("ERROR", logger="pantheon.telemetry._tracing"):
            batcher.force_flush()
        assert collector.calls == [512]
        assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
            "dropped 688 more spans without trying it again"
        ]
        collector.up = True
        for span in ended(10):
            batcher.add(span)
        batcher.force_flush()
        assert collector.calls == [512, 10]
        assert len(memory.get_finished_spans()) == 1210
    finally:
        batcher.shutdown()
