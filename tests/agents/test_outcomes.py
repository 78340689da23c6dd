"""agents.Outcomes: each item's decision in the team's own terms, live on a bus and fed by
hand, and its score against labels."""

from __future__ import annotations

from typing import Any

from agents import Learner, Outcomes, OutcomeSpec, score_decisions
from bus import Bus

INVOICES = OutcomeSpec(
    topics=("invoice.decided",),
    key="invoice_id",
    fields=("decision",),
    input_key="id",
    malformed_topic="input.malformed",
)


def feed(o: Outcomes, *messages: tuple[str, Any, int, int | None, int | None]) -> None:
    for m in messages:
        o.see(*m)


def test_a_declared_outcome_keeps_the_last_decision_per_item_and_only_its_fields() -> None:
    o = Outcomes(INVOICES)
    feed(
        o,
        ("invoice.decided", {"invoice_id": "I-1", "decision": "approve", "by": "x"}, 1, 0, 1),
        ("invoice.decided", {"invoice_id": "I-2", "decision": "hold"}, 2, 0, 2),
        ("invoice.decided", {"invoice_id": "I-1", "decision": "hold"}, 3, 0, 1),  # re-decided
        ("invoice.coded", {"invoice_id": "I-3", "decision": "approve"}, 4, 0, 3),  # not outcome
        ("input.malformed", {"line": 4, "reason": "bad", "key": "I-9"}, 5, None, 5),
    )
    assert o.decisions() == {
        "I-1": {"decision": "hold"},
        "I-2": {"decision": "hold"},
        "I-9": {"decision": "reject"},
    }


def test_scores_per_field_against_mapping_and_scalar_labels_and_counts_unnamed() -> None:
    spec = OutcomeSpec(topics=("done",), key="k", fields=("action", "queue"))
    o = Outcomes(
        spec,
        {
            "a": {"action": "approve", "queue": "ap"},
            "b": {"action": "hold", "queue": "ap"},
            "c": "approve",  # a bare label scores the first decision field
        },
    )
    feed(
        o,
        ("done", {"k": "a", "action": "approve", "queue": "ap"}, 1, 0, 1),
        ("done", {"k": "b", "action": "approve", "queue": "ap"}, 2, 0, 2),
        ("done", {"k": "c", "action": "approve", "queue": "x"}, 3, 0, 3),
        ("done", {"k": "d", "action": "approve"}, 4, 0, 4),  # no label
        ("done", {"action": "approve"}, 5, 0, 5),  # names no item
    )
    score = o.score()
    assert (score.decided, score.scored, score.correct, score.unlabelled) == (4, 3, 2, 2)
    assert score.by_field == {"action": (2, 3), "queue": (2, 2)}
    assert score.as_report() == {
        "scored": 3,
        "unlabelled": 2,
        "accuracy": 2 / 3,
        "action_accuracy": 2 / 3,
        "queue_accuracy": 1.0,
    }


def test_values_compare_as_text_so_json_labels_match_python_payloads() -> None:
    score = score_decisions({"x": {"amount": "12"}}, {"x": {"amount": 12}}, ("amount",))
    assert score.correct == 1
    typed = score_decisions({"x": {"ok": "true"}}, {"x": {"ok": "True"}}, ("ok",))
    assert typed.correct == 0  # True is "true" as JSON: a string "True" is not the same value


def test_the_default_outcome_is_the_last_leaf_message_of_each_items_tree() -> None:
    o = Outcomes(OutcomeSpec(key="id", input_key="id"))
    feed(
        o,
        ("loan.received", {"id": "L1", "amount": 10}, 1, None, 1),
        ("loan.scored", {"id": "L1", "amount": 10, "score": 0.7}, 2, 1, 1),
        ("loan.decided", {"id": "L1", "amount": 10, "score": 0.7, "verdict": "yes"}, 3, 2, 1),
        ("audit.noted", {"id": "L1", "note": "x"}, 4, 3, 1),
        ("loan.received", {"id": "L2", "amount": 99}, 5, None, 5),
        ("loan.decided", {"id": "L2", "amount": 99, "verdict": "no"}, 6, 5, 5),
    )
    leaves = {"loan.decided"}
    assert o.decisions(lambda t: t in leaves) == {
        "L1": {"score": "0.7", "verdict": "yes"},  # what it added to the input
        "L2": {"verdict": "no"},
    }
    # Without a leaf predicate the last message of the tree wins.
    assert o.decisions()["L1"] == {"note": "x"}


def test_items_past_the_bound_are_dropped_and_counted() -> None:
    o = Outcomes(INVOICES, max_items=2)
    for i in range(5):
        o.see("invoice.decided", {"invoice_id": f"I-{i}", "decision": "ok"}, i + 1, 0, i + 1)
    o.see("invoice.decided", {"invoice_id": "I-0", "decision": "hold"}, 9, 0, 1)
    assert o.decisions() == {"I-0": {"decision": "hold"}, "I-1": {"decision": "ok"}}
    assert o.dropped == 3


async def test_on_a_bus_it_follows_what_is_published() -> None:
    o = Outcomes(INVOICES, {"I-1": {"decision": "hold"}})
    async with Bus() as bus:
        bus.observe(o)
        await bus.emit("invoice.decided", {"invoice_id": "I-1", "decision": "hold"})
        await bus.drain()
    assert o.score().field_accuracy("decision") == 1.0


def test_nouns_and_headline_words_come_from_the_teams_key_and_fields() -> None:
    assert INVOICES.noun == "invoice"
    assert OutcomeSpec(key="id").noun == "item"
    assert OutcomeSpec(key="ticket_key").noun == "ticket"
    assert INVOICES.what_changed() == "decision"
    assert OutcomeSpec(fields=("action", "queue", "owner")).what_changed() == (
        "action, queue and owner"
    )
    assert OutcomeSpec().what_changed() == "outcome"


def test_a_learner_scores_any_teams_outcome_without_knowing_email() -> None:
    labels = {"I-1": {"decision": "approve"}, "I-2": {"decision": "hold"}}
    learner = Learner(labels=labels, outcome=INVOICES)
    assert learner.subscriptions == ("invoice.decided", "input.malformed")
    assert learner.observe("invoice.decided", {"invoice_id": "I-1", "decision": "approve"}) == []
    assert learner.observe("invoice.decided", {"invoice_id": "I-2", "decision": "approve"}) == []
    assert learner.observe("input.malformed", {"key": "I-3", "reason": "x"}) == []
    report = learner.report()
    assert report["decision_accuracy"] == 0.5
    assert (report["scored"], report["unlabelled"]) == (2, 1)
    assert "intent_accuracy" not in report  # no predicted intent: nothing tuned


def test_a_learner_subclass_learns_through_learn() -> None:
    class Counting(Learner):
        def learn(self, outcome: Any, label: Any) -> list[dict[str, Any]]:
            return [{"item": None if outcome is None else outcome["invoice_id"]}]

    learner = Counting(labels={"I-1": {"decision": "approve"}}, outcome=INVOICES)
    assert learner.observe("invoice.decided", {"invoice_id": "I-1", "decision": "x"}) == [
        {"item": "I-1"}
    ]
    assert learner.observe("invoice.decided", {"invoice_id": "I-7", "decision": "x"}) == []


def test_a_team_that_decides_by_topic_names_topic_as_a_field() -> None:
    spec = OutcomeSpec(topics=("ticket.*",), key="id", fields=("topic",))
    o = Outcomes(spec, {"T1": {"topic": "ticket.urgent"}, "T2": {"topic": "ticket.urgent"}})
    o.see("ticket.urgent", {"id": "T1", "body": "down"}, 1, 0, 1)
    o.see("ticket.normal", {"id": "T2", "body": "hi"}, 2, 0, 2)
    assert o.decisions() == {"T1": {"topic": "ticket.urgent"}, "T2": {"topic": "ticket.normal"}}
    assert o.score().field_accuracy("topic") == 0.5


def test_a_declared_outcome_keeps_a_running_tally_for_live_views() -> None:
    o = Outcomes(INVOICES, {"I-1": {"decision": "approve"}, "I-2": {"decision": "hold"}})
    o.see("invoice.decided", {"invoice_id": "I-1", "decision": "hold"}, 1, 0, 1)
    o.see("invoice.decided", {"invoice_id": "I-2", "decision": "hold"}, 2, 0, 2)
    o.see("invoice.decided", {"invoice_id": "I-3", "decision": "approve"}, 3, 0, 3)
    assert o.tally == {"hold": 2, "approve": 1}
    assert o.live() == (3, 2, 1)
    o.see("invoice.decided", {"invoice_id": "I-1", "decision": "approve"}, 4, 0, 1)  # re-decided
    assert o.tally == {"hold": 1, "approve": 2}
    assert o.live() == (3, 2, 2)
    score = o.score()
    assert (score.decided, score.scored, score.correct) == o.live()


def test_without_declared_fields_every_label_field_is_scored_and_refusals_count() -> None:
    # A declared outcome without fields: the decision is the payload; the label says which
    # fields matter, and a decision missing one of them is wrong, not unscored.
    spec = OutcomeSpec(topics=("done",), key="id", malformed_topic="bad")
    o = Outcomes(spec, {"a": {"action": "x"}, "b": {"action": "x"}, "c": {"action": "reject"}})
    o.see("done", {"id": "a", "action": "x"}, 1, 0, 1)
    o.see("done", {"id": "b", "error": "boom"}, 2, 0, 2)
    o.see("bad", {"key": "c", "reason": "unreadable"}, 3, None, 3)
    score = o.score()
    assert (score.scored, score.correct) == (3, 2)
    assert score.by_field == {"action": (2, 3)}
    assert o.live() == (3, 3, 2)


def test_label_values_compare_as_decisions_do() -> None:
    from agents import label_decision

    assert label_decision({"approved": True}, ("approved",)) == {"approved": "true"}
    assert label_decision("hold", ("decision",)) == {"decision": "hold"}


def test_a_learner_counts_a_payload_that_is_no_mapping_as_unlabelled() -> None:
    learner = Learner(labels={}, outcome=INVOICES)
    assert learner.observe("invoice.decided", "not a record") == []  # type: ignore[arg-type]
    assert learner.unlabelled == 1
