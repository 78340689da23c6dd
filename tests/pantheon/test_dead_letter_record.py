"""The dead-letter record and the breaker change are defined once, in ``bus``: each layer's
shape is one of them plus that layer's fields, and the live feed's are the read model's."""

from __future__ import annotations

import dataclasses
import typing

import msgspec

from bus import BreakerChange, BreakerEvent, DeadLetter, DeadLetterRecord, Envelope
from bus.backends.nats import DeadLetterEntry
from pantheon import live, readmodel
from pantheon.sessions import BreakerTransition, StoredDeadLetter

SHARED = [f.name for f in dataclasses.fields(DeadLetterRecord)]


def test_every_dead_letter_is_the_bus_record_with_its_layer_s_fields_after() -> None:
    for kind in (DeadLetter, DeadLetterEntry, StoredDeadLetter, readmodel.DeadLetterView):
        assert issubclass(kind, DeadLetterRecord), kind
        assert [f.name for f in dataclasses.fields(kind)][: len(SHARED)] == SHARED, kind
    assert issubclass(DeadLetterEntry, DeadLetter)
    hints = typing.get_type_hints(live.Snapshot)
    assert hints["dead_letters"] == tuple[readmodel.DeadLetterView, ...]
    assert hints["breaker_events"] == tuple[readmodel.BreakerEvent, ...]
    assert typing.get_type_hints(live.Trace)["hops"] == tuple[readmodel.HopBar, ...] | None
    assert issubclass(BreakerEvent, BreakerChange) and issubclass(BreakerTransition, BreakerChange)
    assert issubclass(readmodel.BreakerEvent, BreakerChange)


def test_a_layer_s_dead_letter_is_built_from_another_s_by_the_shared_fields() -> None:
    env = Envelope("mail.in", {"id": 7}, id=41)
    letter = DeadLetter(3, 41, "mail.in", "triage", "failed", "ValueError", "no", "tb", 2, env, 9.5)
    view = readmodel.DeadLetterView.of(letter, t_s=1.5, redriven=False, payload=env.payload)
    assert [getattr(view, n) for n in SHARED] == [getattr(letter, n) for n in SHARED]
    assert (view.t_s, view.payload, view.node, view.redriven_by) == (1.5, {"id": 7}, None, None)


def test_a_nats_dead_letter_keeps_its_stream_names() -> None:
    env = Envelope("mail.in", "poison", id=5)
    entry = DeadLetterEntry(
        12, 5, "mail.in", "triage", "failed", "ValueError", "bad", None, 3, env, 1.0,
        node="n1", subject="pantheon.t.2.mail.in",
    )  # fmt: skip
    assert (entry.seq, entry.deliveries, entry.node) == (12, 3, "n1")


def test_a_recorded_breaker_change_reads_its_name() -> None:
    row = BreakerTransition(2.0, "actor", "closed", "open", "3 failures", seq=4, node="action")
    assert (row.name, row.breaker, row.seq, row.time) == ("actor", "actor", 4, 2.0)
    event = BreakerEvent(2.0, "actor", "closed", "open", "3 failures", trips=1, retry_after=5.0)
    assert msgspec.structs.astuple(event)[:5] == msgspec.structs.astuple(row)[:5]


def test_a_read_model_breaker_event_is_the_bus_s_change_with_when_and_where() -> None:
    event = BreakerEvent(2.0, "actor", "closed", "open", "3 failures", trips=1, retry_after=5.0)
    view = readmodel.BreakerEvent.of(event, t_s=0.5, node="action")
    assert msgspec.structs.astuple(view)[:5] == msgspec.structs.astuple(event)[:5]
    assert (view.name, view.t_s, view.node) == ("actor", 0.5, "action")


def test_a_snapshot_carries_the_read_model_s_dead_letters_and_breaker_events() -> None:
    letter = readmodel.DeadLetterView(
        1, 41, "mail.in", "triage", "failed", "ValueError", "no", "tb", 2,
        t_s=0.5, redriven=True, payload={"id": 7}, correlation_id=40, node="action",
    )  # fmt: skip
    change = readmodel.BreakerEvent(
        9.25, "triage", "closed", "open", "2 failures", t_s=0.25, node="action"
    )
    snap = live.Snapshot(
        session_id="s", scenario=None, status="running", live=True, seq=1, t_s=1.0,
        totals=live.Totals(), breaker_events=(change,), dead_letters=(letter,),
    )  # fmt: skip
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(snap), type=live.Snapshot)
    assert back.dead_letters == (letter,) and back.breaker_events == (change,)
