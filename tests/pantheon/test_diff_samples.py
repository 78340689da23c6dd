"""``pantheon diff`` of two runs of their own pairs like with like: a Monitor's sampled
alerts (and what they caused) are not compared, as ``system.*`` messages are not, and an
input pairs only with an input on the same topic.

Two teams recorded on real buses into a real store. The Monitor's alert from its sample
of the dead letters came when a sample fell, and only where its bus saw dead letters: in
one process yes, on ZeroMQ (Monitor on the driver, the payer on a node) not. The diff
used to take it for an input and pair it with the other run's next one ("A has
'monitor.alert.dead_letters', B has 'claim.rejected_input'", exit 1)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from bus import Bus, Envelope
from pantheon.sessions import Recorder, SessionStore, diff_sessions

ALERT = "monitor.alert.dead_letters"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    with SessionStore(tmp_path / "s.db") as st:
        yield st


async def record(store: SessionStore, roots: Sequence[str]) -> str:
    """A run whose outside messages are ``roots`` (topics, in order): an intake checks each
    claim, and a pager answers each Monitor alert."""
    recorder = Recorder(store, scenario="claims")
    async with Bus() as bus:
        recorder.attach(bus)

        async def intake(env: Envelope) -> None:
            await bus.emit("claim.checked", env.payload)

        async def pager(env: Envelope) -> None:
            await bus.emit("page.sent", env.payload)

        bus.on("claim.received", intake, name="intake")
        bus.on("monitor.alert.*", pager, name="pager")
        numbers: dict[str, int] = {}
        for topic in roots:  # each stream numbered on its own, as an input numbers them
            n = numbers[topic] = numbers.get(topic, -1) + 1
            await bus.emit(topic, {"id": f"{topic}-{n}"})
            await bus.drain()
    await recorder.finish("completed", {})
    return recorder.session_id


async def test_a_sampled_alert_is_not_compared(store: SessionStore) -> None:
    """In one run the Monitor alerted between two claims, in the other not at all: no
    difference, and the alert and the page it caused are counted as not compared."""
    claims = ["claim.received"] * 4
    a = await record(store, [*claims[:2], ALERT, *claims[2:], "claim.rejected_input"])
    b = await record(store, [*claims, "claim.rejected_input"])
    diff = diff_sessions(store, a, b)
    assert diff.identical, diff.describe()
    assert (diff.messages_a, diff.messages_b) == (11, 9)
    assert diff.not_compared_a == {"sampled": 2} and diff.not_compared_b == {}
    assert diff.hops_compared == 9
    assert diff.counts() == (
        "11 vs 9 messages; not compared: 2 vs 0 sampled Monitor alerts and what they caused"
    )


async def test_inputs_pair_on_their_own_topic(store: SessionStore) -> None:
    """The refused record came between other claims in one run, last in the other: each
    stream of input pairs with itself, not the k-th input of one with the k-th of the
    other."""
    a = await record(store, ["claim.received", "claim.rejected_input", "claim.received"])
    b = await record(store, ["claim.received", "claim.received", "claim.rejected_input"])
    diff = diff_sessions(store, a, b)
    assert diff.identical, diff.describe()
    assert diff.hops_compared == 5


async def test_a_claim_the_other_run_lacks_is_still_a_difference(store: SessionStore) -> None:
    a = await record(store, ["claim.received"] * 3)
    b = await record(store, ["claim.received"] * 2 + [ALERT])
    diff = diff_sessions(store, a, b)
    assert diff.divergence is not None
    assert (diff.divergence.field, diff.divergence.topic) == ("missing", "claim.received")
