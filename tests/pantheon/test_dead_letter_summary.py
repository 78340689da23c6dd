"""The run summary's dead letters: each line names its exception's type and nothing of one
team's payloads, and the printed counts add up to what the summary lists."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from agents import Outbox
from bus import Bus, Envelope
from pantheon.cli._summary_text import dead_letter_lines, dead_letters_text
from pantheon.runner._build import Team
from pantheon.runner._report import local_report


async def test_a_dead_letter_line_names_the_exception_type_and_no_payload_field() -> None:
    async def needs_invoice(env: Envelope) -> None:
        env.payload["invoice_id"]

    async with Bus() as bus:
        bus.on("bill.due", needs_invoice, name="billing")
        sent = await bus.emit("bill.due", {"email_id": "e1", "amount": 3})
        await asyncio.wait_for(bus.drain(), 5)
        report = local_report(bus, Team({}, Outbox(None)))
    assert report["dead_letters"] == [
        {
            "subscriber": "billing",
            "topic": "bill.due",
            "envelope_id": sent.id,
            "reason": "failed",
            "error": "KeyError: 'invoice_id'",
        }
    ]


def _letters(**counts: int) -> list[dict[str, Any]]:
    return [
        {"subscriber": "router", "reason": reason, "error": f"Error: {reason}"}
        for reason, n in counts.items()
        for _ in range(n)
    ]


def test_a_capped_list_says_how_many_it_lists_and_its_lines_add_up_to_that() -> None:
    s = SimpleNamespace(
        dlq={"circuit_open": 195, "failed": 5},
        dead_letters=_letters(circuit_open=95, failed=5),
        dlq_evicted=0,
        session_id="s1",
    )
    assert dead_letters_text(s) == (
        "dead letters 200 (195 circuit_open, 5 failed; 100 listed, all in the session store)"
    )
    assert dead_letter_lines(s) == [
        "  95 x router (circuit_open), e.g. Error: circuit_open",
        "  5 x router (failed), e.g. Error: failed",
    ]


def test_a_complete_list_needs_no_note_and_sheds_are_never_listed() -> None:
    s = SimpleNamespace(
        dlq={"failed": 2, "shed": 40},
        dead_letters=_letters(failed=2),
        dlq_evicted=0,
        session_id=None,
    )
    assert dead_letters_text(s) == "dead letters 42 (40 shed, 2 failed)"


def test_pairs_past_the_printed_few_are_summed_on_one_line() -> None:
    letters = [
        {"subscriber": f"agent{i}", "reason": "failed", "error": None}
        for i in range(5)
        for _ in "ab"
    ]
    s = SimpleNamespace(dlq={"failed": 10}, dead_letters=letters, dlq_evicted=0, session_id="s1")
    assert dead_letter_lines(s) == [
        "  2 x agent0 (failed)",
        "  2 x agent1 (failed)",
        "  2 x agent2 (failed)",
        "  4 more in 2 other subscriber/reason pairs (pantheon dlq list s1)",
    ]


def test_a_killed_nodes_dead_letters_are_in_no_memory() -> None:
    """A multi-process run counts a killed node's dead letters from its record: its queue
    died with it, so they count as evicted, and when they are all the run had none is kept
    in memory (not "the last 0")."""
    s = SimpleNamespace(
        dlq={"failed": 7}, dead_letters=_letters(failed=7), dlq_evicted=7, session_id="s1"
    )
    assert dead_letters_text(s) == (
        "dead letters 7 (7 failed; none kept in memory, all in the session store)"
    )
    s.dlq, s.dead_letters = {"failed": 7, "node_lost": 20}, _letters(failed=7, node_lost=20)
    assert dead_letters_text(s) == (
        "dead letters 27 (20 node_lost, 7 failed; the last 20 kept in memory, "
        "all in the session store)"
    )
