"""A node's live part joined to its driver's feed, in one process: two real buses, one the
driver's and one a node's, each with its feed; the node's part goes over the text the
control line carries (pantheon.live._parts). What a real multi-process run cannot show
cheaply: a node's dead letter listed under the session store's id and redriven on that
node from the driver's feed, and bad parts counted and dropped (the real run:
tests/live/test_live_nodes.py)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

from bus import Bus, Envelope
from pantheon.live import LiveFeed, NodeParts, PartsBoard
from pantheon.live._parts import _traces, decode_part, encode_part, merge_breakers
from pantheon.live._snapshot import BreakerState, Trace
from pantheon.readmodel import BreakerEvent, HopBar


async def test_a_nodes_dead_letter_shows_under_its_store_id_and_is_redriven_on_that_node() -> None:
    async with Bus() as driver_bus, Bus() as node_bus:
        failing = {"on": True}

        async def review(env: Envelope) -> None:
            if failing["on"]:
                raise RuntimeError(f"no reviewer for {env.payload['id']}")

        node_bus.on("access.screened", review, name="reviewer")
        driver_bus.on("access.requested", lambda env: None, name="intake")
        own: dict[str, int] = {}
        node = LiveFeed(
            node_bus,
            nodes={"intake": "driver", "reviewer": "two"},
            here="two",
            own_topics=lambda: own,
        )
        board = PartsBoard(["one", "two"])  # "two" is index 2 of 3 processes
        asked: list[tuple[str, int]] = []

        async def on_node(name: str, entry_id: int) -> tuple[bool, str]:
            asked.append((name, entry_id))
            result = await node.redrive(entry_id)
            return result.ok, result.detail

        board.redrive = on_node
        driver = LiveFeed(driver_bus, nodes={"intake": "driver", "reviewer": "two"}, board=board)
        marked: list[int] = []

        async def mark(entry_id: int) -> None:
            marked.append(entry_id)

        driver.on_redrive.append(mark)
        await node.start()
        await driver.start()
        try:
            for i in range(3):
                await node_bus.emit("access.screened", {"id": f"r{i}"})
                own["access.screened"] = own.get("access.screened", 0) + 1
            await node_bus.drain()
            await driver_bus.emit("access.requested", {"id": "r9"})
            await driver_bus.drain()
            board.take("two", encode_part(node.part()))
            snap = driver.snapshot()
            # The node's letters under the ids the session store gives them: own * 3 + 2.
            own_ids = [e.entry_id for e in node_bus.dlq.entries()]
            assert [d.entry_id for d in snap.dead_letters] == [i * 3 + 2 for i in own_ids]
            assert {d.node for d in snap.dead_letters} == {"two"}
            assert snap.totals.dead_lettered == 3
            # Counted once each, by the bus that published or handled it.
            assert snap.totals.published == 3 + 1
            assert {h.name: h.count for h in snap.hops if h.kind == "agent"} == {
                "intake": 1,
                "reviewer": 3,
            }
            failing["on"] = False
            shown = snap.dead_letters[0].entry_id
            result = await driver.redrive(shown)
            assert result.ok, result.detail
            assert result.detail == "node two: re-published to its subscription"
            assert asked == [("two", own_ids[0])]
            assert marked == [shown]  # the store's id, which the recorder marks
            await node_bus.drain()
            board.take("two", encode_part(node.part()))
            again = {d.entry_id: d.redriven for d in driver.snapshot().dead_letters}
            assert again[shown] is True
            # An id no process of the run has is refused, naming why.
            missing = await driver.redrive(7 * 3 + 1)  # node "one" sent nothing
            assert not missing.ok
        finally:
            await driver.aclose()
            await node.aclose()


def test_bad_parts_are_counted_and_dropped() -> None:
    board = PartsBoard(["one", "two"])
    board.take("one", "not base64 at all!")
    board.take("one", 42)
    board.take("one", "aGVsbG8=")  # base64, not a part
    assert board.dropped == 3 and board.parts() == []


async def test_a_part_is_taken_only_from_the_node_it_names() -> None:
    async with Bus() as bus:
        feed = LiveFeed(bus, nodes={"a": "one"}, here="one", own_topics=dict)
        await feed.start()
        try:
            text = encode_part(feed.part())
        finally:
            await feed.aclose()
    assert decode_part(text).node == "one"
    board = PartsBoard(["one", "two"])
    board.take("two", text)  # a node speaking for another
    board.take("three", text)  # a node the run does not place
    assert board.dropped == 2 and board.parts() == []
    board.take("one", text)
    assert [p.node for p in board.parts()] == ["one"]


async def test_a_node_sends_parts_only_while_someone_watches_and_once_when_it_leaves() -> None:
    """A part costs a node milliseconds (its traces): an unwatched run pays none a tick."""
    async with Bus() as bus:
        team = SimpleNamespace(usage_by_agent=dict, tally=None)
        host = SimpleNamespace(bus=bus, node="one", placed={"a": "one"}, own_topics={}, team=team)
        sent: list[tuple[str, dict[str, Any]]] = []
        first = threading.Event()

        def say(event: str, **fields: Any) -> None:
            sent.append((event, fields))
            first.set()

        parts = NodeParts(host, say)
        parts.feed.interval = 0.01
        await parts.start()
        await asyncio.sleep(0.05)
        assert sent == []  # nobody watches the driver's feed
        parts.watch({"cmd": "watch", "on": True})
        assert await asyncio.to_thread(first.wait, 5)  # sent from a thread, at once
        await asyncio.sleep(0.05)
        assert len(sent) >= 3 and {e for e, _ in sent} == {"live"}  # then every tick
        parts.watch({"cmd": "watch", "on": False})
        await asyncio.sleep(0.03)  # a send under way when it was told
        quiet = len(sent)
        await asyncio.sleep(0.05)
        assert len(sent) == quiet
        await parts.aclose()  # the last part, whoever watches: the final snapshot is whole
        assert len(sent) == quiet + 1
        assert decode_part(sent[-1][1]["data"]).node == "one"


async def test_a_dead_letter_msgpack_cannot_encode_goes_in_the_part_as_its_repr() -> None:
    """The very payload of an encode_error: a node's part must still go (it failed at the
    node's leaving, and the node looked dead)."""
    async with Bus() as bus:

        async def refuse(env: Envelope) -> None:
            raise RuntimeError("no")

        bus.on("odd.thing", refuse, name="refuser")
        await bus.emit("odd.thing", {"when": object()})
        await bus.drain()
        feed = LiveFeed(bus, nodes={"refuser": "one"}, here="one", own_topics=dict)
        feed._on_dead_letter(bus.dlq.entries()[0])
        part = decode_part(encode_part(feed.part()))
    [letter] = part.dead_letters
    assert "object object at" in str(letter.payload)


async def test_counters_a_node_brings_after_a_silence_are_no_spike() -> None:
    """Nodes send parts only while someone watches: the first part brings the node's whole
    history, which the driver spreads over its samples rather than one tick's rate."""
    async with Bus() as driver_bus, Bus() as node_bus:
        node_bus.on("t.x", lambda env: None, name="worker")
        for _ in range(500):
            await node_bus.emit("t.x", {})
        await node_bus.drain()
        own = {"t.x": 500}
        node = LiveFeed(node_bus, nodes={"worker": "one"}, here="one", own_topics=lambda: own)
        board = PartsBoard(["one"])
        driver = LiveFeed(driver_bus, nodes={"worker": "one"}, board=board, ticking=False)
        await driver.start()
        try:
            for _ in range(3):
                driver._sample()
            board.take("one", encode_part(node.part()))
            driver._sample()
            [topic] = [s for s in driver.snapshot(sampled=True).series if s.key == "t.x"]
            assert topic.total == 500
            assert set(topic.counts) == {0}  # flat: the silence's history, not a spike
            own["t.x"] = 520  # then a tick apart: counted as the rate it is
            board.take("one", encode_part(node.part()))
            driver._sample()
            [topic] = [s for s in driver.snapshot(sampled=True).series if s.key == "t.x"]
            assert topic.counts[-1] == 20 and topic.total == 520
        finally:
            await driver.aclose()


def _bar(depth: int, agent: str, node: str, start: float) -> HopBar:
    return HopBar(depth + 1, depth or None, f"t{depth}", agent, depth, start, start, start + 1,
                  0.0, 1.0, "delivered", None, node)  # fmt: skip


def _trace(cid: int, label: str, *bars: HopBar) -> Trace:
    start = min(b.start_ms for b in bars)
    end = max(b.end_ms for b in bars)
    return Trace(cid, bars[0].topic, label, start, end - start, len(bars), "ok", bars)


def test_a_requests_hops_from_every_process_join_and_one_without_its_start_waits() -> None:
    """Each process sends its part on its own tick: the newest requests' later hops may come
    before their first one, and would read as starting midway."""
    driver = _trace(7, "t5", _bar(5, "learner", "driver", 50.0))
    perception = _trace(7, "e0001: refund", _bar(0, "sensor", "perception", 10.0))
    cognition = _trace(7, "t1", _bar(1, "reasoner", "cognition", 20.0))
    newest = _trace(8, "t1", _bar(1, "reasoner", "cognition", 90.0))  # its sensor hop not in
    [joined] = _traces([driver, cognition, perception, newest], limit=50)
    assert (joined.correlation_id, joined.label, joined.topic) == (7, "e0001: refund", "t0")
    assert [h.agent for h in joined.hops or ()] == ["sensor", "reasoner", "learner"]
    assert (joined.start_ms, joined.total_ms, joined.hop_count) == (10.0, 41.0, 3)


def test_a_breaker_in_several_processes_is_one_row_at_its_worst() -> None:
    """An agent on two nodes has a breaker in each; a viewer keys its rows by name (the
    terminal monitor's table refuses a key twice)."""
    merged = merge_breakers(
        [
            BreakerState("reasoner", "closed", 1, node="work1"),
            BreakerState("actor", "closed", 0, node="work1"),
            BreakerState("reasoner", "open", 2, 0.5, "failures", node="work2"),
            BreakerState("actor", "closed", 0, node="work3"),
            BreakerState("actor", "closed", 1, node="work2"),
        ]
    )
    # The row names the nodes in its (worst) state: work2's reasoner is open, work1's not.
    assert merged == (
        BreakerState("actor", "closed", 1, node="work1, work2, work3"),
        BreakerState("reasoner", "open", 3, 0.5, "failures", node="work2"),
    )


def test_a_stored_sessions_breakers_are_merged_as_the_live_feeds_are() -> None:
    """The monitor on a finished session: a breaker that opened on work1 and whose other
    copy later closed on work2 is open (on work1), not closed because work2 spoke last."""
    from pantheon.live._store import _breakers as stored

    def change(t: float, old: str, new: str, node: str | None) -> BreakerEvent:
        return BreakerEvent(t, "reasoner", old, new, "5 consecutive failures", t_s=t, node=node)

    events = [
        change(1.0, "closed", "open", "work1"),
        change(2.0, "closed", "open", "work2"),
        change(3.0, "open", "half_open", "work2"),
        change(4.0, "half_open", "closed", "work2"),
    ]
    driver = {"breakers": {"learner": "closed"}, "subscribers": {"learner": {}}}
    assert stored(driver, events, "driver") == (
        BreakerState("learner", "closed", 0, node="driver"),
        BreakerState("reasoner", "open", 2, None, "5 consecutive failures", node="work1"),
    )
