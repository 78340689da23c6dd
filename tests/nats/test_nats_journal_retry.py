"""A node's journal shipments onto the stream survive unacknowledged appends: a slow ack on
a loaded machine used to end the node's journal there (its end mark never came, and a
resume found the node's journal cut short). The appends go to a stand-in transport here;
the real stream's part ids (``Nats-Msg-Id``) are what make sending again store once
(tests/nats/test_nats_resume.py runs the real thing)."""

from __future__ import annotations

import asyncio

import nats.errors

from pantheon.runner._node_journal import JetStreamShipper


class FlakyStream:
    """Fails the first ``misses`` appends with the client's ack timeout."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.stored: list[tuple[str, int, bytes, bool]] = []

    async def journal_append(self, session: str, seq: int, data: bytes, end: bool) -> None:
        if self.misses:
            self.misses -= 1
            raise nats.errors.TimeoutError
        self.stored.append((session, seq, data, end))


async def test_an_unacknowledged_shipment_is_sent_again_and_the_journal_goes_on() -> None:
    stream = FlakyStream(misses=3)
    ship = JetStreamShipper(stream, "s1")
    for seq in range(3):
        ship(seq, b"x%d" % seq, seq == 2)
    await asyncio.sleep(0)  # handed over from the writer thread through the loop
    await ship.drain()
    assert stream.stored == [
        ("s1", 0, b"x0", False),
        ("s1", 1, b"x1", False),
        ("s1", 2, b"x2", True),
    ]
    assert (ship.retried, ship.failed) == (3, None)


async def test_a_stream_that_never_acknowledges_stops_shipping_after_the_retry_time() -> None:
    stream = FlakyStream(misses=10**6)
    ship = JetStreamShipper(stream, "s1", retry_for=0.3)
    ship(0, b"x", False)
    ship(1, b"y", True)
    await asyncio.sleep(0)
    await ship.drain()
    assert stream.stored == []
    assert isinstance(ship.failed, nats.errors.TimeoutError)
    assert ship.retried >= 2
