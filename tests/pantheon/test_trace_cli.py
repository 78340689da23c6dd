"""``pantheon trace``: the story of one item, from a terminal, on sessions really recorded by
``pantheon run``: a model agent's team against its scenario's stand-in model (model calls,
tool calls with their arguments and answers, a tool's error, an approval and who decided
it), its exact replay, and a plain invoice team with approvals and dead letters."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_run import pantheon
from invoice_team import recorded_run
from refund_trace_team import recorded_refunds, write_refunds

from pantheon.sessions import SessionStore

#: Durations and offsets vary run to run; everything else of a line is pinned.
_TIME = re.compile(r"\d+\.\d ms")


def timeless(text: str) -> list[str]:
    return [_TIME.sub("N ms", line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def refunds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return recorded_refunds(tmp_path_factory.mktemp("refunds"))


def trace(store: Path, *args: str) -> tuple[int, str, str]:
    done = pantheon("trace", *args, "--store", store.name, cwd=store.parent)
    return done.returncode, done.stdout, done.stderr


def test_without_an_item_it_lists_the_items_to_pick_from(refunds: tuple[Path, str]) -> None:
    store, sid = refunds
    code, out, err = trace(store, sid)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"3 items in session {sid} (run of refund-trace), by ticket:",
        "item  outcome  expected        messages  hops  effects  errors  dead letters",
        "T-1   none     none (right)           2     2        5       0             0",
        "T-2   refund   refund (right)         3     2        7       0             0",
        "T-3   none     refund (wrong)         2     2        3       1             0",
        f"pantheon trace {sid} T-1 --store sessions.db shows one",
    ]


def test_an_item_s_model_calls_tool_calls_and_approval_in_order(
    refunds: tuple[Path, str],
) -> None:
    store, sid = refunds
    code, out, err = trace(store, sid, "T-2")
    assert (code, err) == (0, "")
    assert timeless(out) == [
        f"item T-2 in session {sid} (run of refund-trace): 3 messages, 2 handlings, "
        "7 effect calls, 0 errors, 0 dead letters",
        "+N ms  refund.asked  input → refunds",
        '    {"ticket": "T-2", "customer": "Bo", "order": "A-2", "text": "Lost?"}',
        "  refunds: started +N ms (waited N ms), handled in N ms, delivered",
        "    0 model.openai.chat  N ms",
        "        stand-in, 13 tokens in, 3 out",
        '        asks order_status(order_id="A-2")',
        '    1 tool.order_status(order_id="A-2")  N ms',
        '        → {"order_id": "A-2", "status": "lost", "paid": 95.5}',
        "    2 model.openai.chat  N ms",
        "        stand-in, 19 tokens in, 5 out",
        '        asks refund_limit(status="lost", paid=95.5)',
        '    3 tool.refund_limit(status="lost", paid=95.5)  N ms',
        "        → 95.5",
        "    4 model.openai.chat  N ms",
        "        stand-in, 20 tokens in, 8 out",
        '        said {"action": "refund", "amount": 95.5, "reason": "A-2 is lost"}',
        "  +N ms  refund.decided  from refunds → payout",
        '      {"action": "refund", "amount": 95.5, "reason": "A-2 is lost", "ticket": "T-2"}',
        "    payout: started +N ms (waited N ms), handled in N ms, delivered",
        "      0 human.approval  N ms",
        '          approved by desk-lead (request 1): note "receipt seen"',
        "          asked refund 95.50 for T-2",
        "      1 tool.pay  N ms",
        '          → {"paid": 95.5, "transfer": "TR-T-2"}',
        "    +N ms  refund.paid  from payout → nobody",
        '        {"ticket": "T-2", "paid": 95.5, "transfer": "TR-T-2"}',
        "outcome: refund (expected refund: right)",
    ]


def test_a_tool_s_error_is_shown_where_the_model_met_it(refunds: tuple[Path, str]) -> None:
    store, sid = refunds
    code, out, _ = trace(store, sid, "T-3")
    assert code == 0
    lines = timeless(out)
    start = lines.index('    1 tool.order_status(order_id="A-9")  N ms')
    assert lines[start - 1 : start + 5] == [
        '        asks order_status(order_id="A-9")',
        '    1 tool.order_status(order_id="A-9")  N ms',
        "        raised LookupError: no order A-9",
        "    2 model.openai.chat  N ms",
        "        stand-in, 19 tokens in, 8 out",
        '        said {"action": "none", "amount": 0.0, "reason": "A-9 not found"}',
    ]
    assert lines[0].endswith("3 effect calls, 1 error, 0 dead letters")
    assert lines[-1] == "outcome: none (expected refund: wrong)"


def test_json_has_the_same_story_as_data(refunds: tuple[Path, str]) -> None:
    store, sid = refunds
    code, out, _ = trace(store, sid, "T-2", "--json")
    assert code == 0
    doc = json.loads(out)
    assert {k: doc[k] for k in ("session", "kind", "item", "key", "noun")} == {
        "session": sid,
        "kind": "run",
        "item": "T-2",
        "key": "ticket",
        "noun": "item",
    }
    assert (doc["outcome"], doc["expected"], doc["right"]) == ("refund", "refund", True)
    assert doc["decision"] == {"action": "refund"}
    assert doc["counts"] == {
        "messages": 3,
        "handlings": 2,
        "effects": 7,
        "errors": 0,
        "dead_letters": 0,
    }
    asked, decided, paid = doc["messages"]
    assert [asked["topic"], decided["topic"], paid["topic"]] == [
        "refund.asked",
        "refund.decided",
        "refund.paid",
    ]
    assert [m["depth"] for m in doc["messages"]] == [0, 1, 2]
    assert decided["source"] == "refunds" and decided["causation_id"] == asked["envelope_id"]
    (handling,) = asked["handlings"]
    assert handling["subscriber"] == "refunds" and handling["outcome"] == "delivered"
    first, lookup = handling["effects"][:2]
    assert first["kind"] == "model" and first["name"] == "model.openai.chat"
    assert first["asks"] == [
        {"name": "order_status", "arguments": {"order_id": "A-2"}, "id": first["asks"][0]["id"]}
    ]
    assert (first["input_tokens"], first["output_tokens"]) == (13, 3)
    assert lookup["kind"] == "tool" and lookup["arguments"] == {"order_id": "A-2"}
    assert lookup["result"] == {"order_id": "A-2", "status": "lost", "paid": 95.5}
    assert [e["ordinal"] for e in handling["effects"]] == [0, 1, 2, 3, 4]
    approval = decided["handlings"][0]["effects"][0]
    assert {k: approval[k] for k in ("kind", "approved", "by", "note", "approval", "asked")} == {
        "kind": "approval",
        "approved": True,
        "by": "desk-lead",
        "note": "receipt seen",
        "approval": 1,
        "asked": "refund 95.50 for T-2",
    }


def test_json_lists_the_items_with_their_counts(refunds: tuple[Path, str]) -> None:
    store, sid = refunds
    code, out, _ = trace(store, sid, "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["session"], doc["key"], doc["noun"]) == (sid, "ticket", "item")
    rows = [
        {k: r[k] for k in ("item", "outcome", "expected", "right", "effects", "errors")}
        for r in doc["items"]
    ]
    assert rows == [
        {"item": "T-1", "outcome": "none", "expected": "none", "right": True, "effects": 5,
         "errors": 0},
        {"item": "T-2", "outcome": "refund", "expected": "refund", "right": True, "effects": 7,
         "errors": 0},
        {"item": "T-3", "outcome": "none", "expected": "refund", "right": False, "effects": 3,
         "errors": 1},
    ]  # fmt: skip


def test_any_message_s_id_names_its_item(refunds: tuple[Path, str]) -> None:
    store, sid = refunds
    with SessionStore(store, create=False) as st:
        (paid,) = [e for e in st.envelopes(sid) if e.topic == "refund.paid"]
    code, out, _ = trace(store, sid, str(paid.id))
    assert code == 0
    assert out.splitlines()[0].startswith(f"item T-2 in session {sid} (run of refund-trace)")


def test_unknown_item_or_session_is_one_line_and_exit_2(refunds: tuple[Path, str]) -> None:
    store, sid = refunds
    code, out, err = trace(store, sid, "T-9")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"error: session {sid} has no item 'T-9' (closest: T-1, T-2, T-3); "
        f"pantheon trace {sid} --store sessions.db lists its items"
    ]
    code, out, err = trace(store, "nosuch", "T-1")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: no session 'nosuch' in sessions.db; pantheon sessions list --store sessions.db "
        "shows them"
    ]


def test_an_exact_replay_tells_the_same_story_served(refunds: tuple[Path, str]) -> None:
    store, sid = refunds
    replayed = pantheon("replay", sid, "--store", store.name, cwd=store.parent)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    code, out, _ = trace(store, "latest", "T-2")
    assert code == 0
    lines = timeless(out)
    with SessionStore(store, create=False) as st:
        replay = st.session("latest")
    assert replay.replay_of == sid
    assert lines[0] == (
        f"item T-2 in session {replay.id} (replay of refund-trace): 3 messages, "
        "2 handlings, 7 effect calls, 0 errors, 0 dead letters"
    )
    _, original, _ = trace(store, sid, "T-2")
    assert lines[1:] == timeless(original)[1:]  # every call served as it was answered


def test_a_plain_team_s_approval_and_dead_letter(tmp_path: Path) -> None:
    store, sid, _ = recorded_run(tmp_path, bank_limit=5_000)
    code, out, _ = trace(store, sid, "INV-31")
    assert code == 0
    assert timeless(out) == [
        f"item INV-31 in session {sid} (run of invoices): 3 messages, 3 handlings, "
        "2 effect calls, 1 error, 1 dead letter",
        "+N ms  invoice.received  input → checker",
        '    {"id": "INV-31", "amount": 8100.0}',
        "  checker: started +N ms (waited N ms), handled in N ms, delivered",
        "    0 fault.window  N ms",
        "        → false",
        "  +N ms  invoice.checked  from checker → approver",
        '      {"id": "INV-31", "amount": 8100.0}',
        "    approver: started +N ms (waited N ms), handled in N ms, delivered",
        "      0 human.approval  N ms",
        # The request's number is the order the run asked it in: not pinned.
        *[line for line in timeless(out) if line.startswith("          approved by auto")],
        "          asked pay 8100.00 EUR (INV-31)",
        "    +N ms  invoice.decided  from approver → payer",
        '        {"id": "INV-31", "amount": 8100.0, "approved": true}',
        "      payer: started +N ms (waited N ms), handled in N ms, failed: RuntimeError: "
        "the bank refuses 8100.00 EUR for INV-31",
        *[line for line in timeless(out) if line.startswith("        dead letter #")],
        "outcome: none (the item reached no outcome)",
    ]
    (decided,) = [line for line in out.splitlines() if "approved by" in line]
    assert re.fullmatch(r' {10}approved by auto \(request \d+\): note "scripted"', decided)
    (letter,) = [line for line in out.splitlines() if "dead letter #" in line]
    assert re.fullmatch(
        r" {8}dead letter #\d+: failed after 1 attempt: RuntimeError: the bank refuses "
        r"8100\.00 EUR for INV-31",
        letter,
    )
    code, out, _ = trace(store, sid)
    lines = out.splitlines()
    assert lines[:2] == [
        f"40 items in session {sid} (run of invoices), by id:",
        "item    outcome            messages  hops  effects  errors  dead letters",
    ]
    assert "INV-04  invoice_id=INV-04         4     3        2       0             0" in lines
    assert "INV-31  -                         3     3        2       1             1" in lines


def test_a_multi_process_session_says_where_each_hop_ran(node_sessions: Any) -> None:
    """The support team on three ZeroMQ nodes: every message and handling names its
    process, as the scenario placed the agents, and a dead letter on node ``action``
    shows under the Actor's handling there."""
    store = node_sessions.store
    done = pantheon("trace", node_sessions.three, "--store", str(store), "--json", cwd=store.parent)
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)
    assert (items["key"], items["noun"]) == ("email_id", "email")
    troubled = next(r["item"] for r in items["items"] if r["dead_letters"])
    done = pantheon(
        "trace", node_sessions.three, troubled, "--store", str(store), "--json", cwd=store.parent
    )
    doc = json.loads(done.stdout)
    assert doc["multi_process"] is True
    placed = {
        "sensor": "perception",
        "reasoner": "cognition",
        "memory": "cognition",
        "planner": "cognition",
        "guardian": "action",
        "actor": "action",
    }
    seen = {}
    for m in doc["messages"]:
        assert m["node"] is not None
        for h in m["handlings"]:
            seen[h["subscriber"].partition(":")[0]] = h["node"]
    assert {a: n for a, n in seen.items() if a in placed} == {
        a: placed[a] for a in seen if a in placed
    }
    assert {"sensor", "reasoner", "guardian", "actor"} <= set(seen)
    letters = [
        (h["subscriber"], h["node"], d["reason"])
        for m in doc["messages"]
        for h in m["handlings"]
        for d in h["dead_letters"]
    ]
    assert letters and all(node == "action" for _, node, _ in letters)
    text = pantheon("trace", node_sessions.three, troubled, "--store", str(store), cwd=store.parent)
    assert re.search(r"^ *actor on action: started \+", text.stdout, re.M), text.stdout
    assert re.search(r"^ *dead letter #\d+: failed after", text.stdout, re.M), text.stdout


def test_inputs_without_a_key_are_named_by_their_place(tmp_path: Path) -> None:
    scenario = write_refunds(tmp_path)
    text = scenario.read_text()
    start, end = text.index("outcome:"), text.index("approvals:")
    scenario.write_text((text[:start] + text[end:]).replace("  key: ticket\n", ""))
    # Every input from one shop: a shared ``*_id`` field names no item (review: the trace
    # took it for one, and merged every input's tree into "S1").
    asks = tmp_path / "asks.jsonl"
    records = [json.loads(line) for line in asks.read_text().splitlines()]
    asks.write_text("".join(json.dumps({**r, "shop_id": "S1"}) + "\n" for r in records))
    run = pantheon("run", str(scenario), "--store", "s.db", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    done = pantheon("trace", "latest", "--store", "s.db", cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert lines[0].endswith("by id (#N: the Nth input, which has no id):"), lines[0]
    assert [line.split()[0] for line in lines[2:5]] == ["#1", "#2", "#3"]
    done = pantheon("trace", "latest", "#2", "--store", "s.db", cwd=tmp_path)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[2] == (
        '    {"ticket": "T-2", "customer": "Bo", "order": "A-2", "text": "Lost?", "shop_id": "S1"}'
    )
    assert lines[-1] == (
        "outcome: none can name it (its input has no 'id' field; the scenario's input.key "
        "names the field that does)"
    )
