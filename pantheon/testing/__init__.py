"""Helpers for the tests of a team of your own: one agent on a real bus, a whole scenario run,
its expectations and an exact replay, from plain pytest functions; and a real local
OpenAI-compatible server for code that talks to a model.

::

    from pantheon.testing import agent_harness, assert_passed, assert_replays, run_scenario

    async def test_router_sends_invoices_to_billing():
        async with agent_harness(Router, effects={"tool.assign": {"url": "u"}}) as h:
            await h.send("ticket.triaged", {"id": "T-1", "subject": "Invoice", "urgent": False})
        assert h.published("ticket.routed")[0]["queue"] == "billing"
        assert [c.args for c in h.calls("tool.assign")] == [("T-1", "billing")]

    def test_the_team_passes_and_replays():
        summary = run_scenario("scenario.yaml")
        assert_passed(summary)
        assert_replays(summary)

An agent that asks a model or a person gets scripted ones: ``agent_harness(Sorter,
model={"queue": "billing"})`` (:class:`ScriptedModel`), ``agent_harness(Refunder,
approvals=[True, False])`` (:class:`ScriptedDesk`); a whole team runs against a local model
server with ``run_scenario("scenario.yaml", provider=server)``. Pantheon's
``docs/testing.md`` shows each with a test that runs.

A scenario can name its own scripted model (``provider: {kind: openai, model: ...,
stand_in: "module:reply"}``): the run serves it from a :class:`ModelServer` it starts and
stops itself, and ``python -m pantheon.testing --reply module:reply`` serves it alone.

``pantheon new NAME`` writes a team whose tests use these. :class:`ModelServer` answers chat
completions and Anthropic Messages (seen by its replies as :func:`openai_view` gives them)
on 127.0.0.1 over real sockets (``with ModelServer(reply=classify_reply) as
server: ... server.base_url``). :func:`read_jsonl` reads a team's JSON-lines input file
line by line exactly as a ``jsonl`` input does (a malformed line is a located problem, not
an exception), for a test that wants what the run will see. The bus's own helpers
(:class:`FakeClock`, :func:`memory_bus`, :func:`capture_events`) are here too, so a team's
tests import from one place.
"""

from bus.testing import FakeClock, capture_events, memory_bus
from pantheon.runner import JsonlLine, read_jsonl
from pantheon.standin import (
    ModelServer,
    ReceivedRequest,
    Reply,
    classify_reply,
    openai_view,
    schema_reply,
)
from pantheon.testing._harness import (
    DEFAULT_SEND_TIMEOUT,
    AgentFailed,
    AgentHarness,
    Chat,
    EffectCall,
    RecordedEffects,
    agent_harness,
)
from pantheon.testing._scripted import Answer, ChatRequest, Ruling, ScriptedDesk, ScriptedModel
from pantheon.testing._team import (
    assert_outcomes_changed,
    assert_passed,
    assert_replays,
    open_session,
    replay_matches,
    run_scenario,
    scratch_store,
    whatif,
    with_provider,
)

__all__ = [
    "DEFAULT_SEND_TIMEOUT",
    "AgentFailed",
    "AgentHarness",
    "Answer",
    "Chat",
    "ChatRequest",
    "EffectCall",
    "FakeClock",
    "JsonlLine",
    "ModelServer",
    "ReceivedRequest",
    "RecordedEffects",
    "Reply",
    "Ruling",
    "ScriptedDesk",
    "ScriptedModel",
    "agent_harness",
    "assert_outcomes_changed",
    "assert_passed",
    "assert_replays",
    "capture_events",
    "classify_reply",
    "memory_bus",
    "open_session",
    "openai_view",
    "read_jsonl",
    "replay_matches",
    "run_scenario",
    "schema_reply",
    "scratch_store",
    "whatif",
    "with_provider",
]
