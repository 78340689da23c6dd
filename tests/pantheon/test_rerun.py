"""The re-run engine: its public face, each mode's policy call by call, and the replay's hint
when a handler reads randomness (or keeps state) outside an effect."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from cli_run import pantheon as cli

import pantheon
import pantheon.rerun
from agents import AgentStopping, ApprovalUnavailable, MCPServerUnavailable
from pantheon.rerun import EffectCall, ExactReplay, Resume, Verdict, WhatIf
from pantheon.rerun._engine import dangling
from pantheon.sessions import StoredDelivery, StoredEffect, StoredEnvelope
from pantheon.sessions._codec import encode
from pantheon.sessions._store import EFFECT_ERROR, EFFECT_OK, EFFECT_REPR


def test_public_names_are_exactly_the_engine_and_its_policies() -> None:
    public = {n for n in dir(pantheon.rerun) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(pantheon.rerun, n)).__name__ == "module"}
    assert public - modules == set(pantheon.rerun.__all__)
    # The subpackage does not shadow the user API's replay() once imported.
    assert callable(pantheon.replay)


def effect(name: str, value: object = "v", flag: int = EFFECT_OK) -> StoredEffect:
    return StoredEffect(1, 7, "agent", 0, name, flag, encode(value)[0], None, None, 0.0)


def call(name: str, record: StoredEffect | None, *, same: bool = True) -> EffectCall:
    return EffectCall(70, "agent", 0, name, 7, record, same)


def test_exact_replay_serves_the_recorded_call_and_diverges_on_anything_else() -> None:
    exact = ExactReplay()
    assert exact.halts
    assert exact.decide(call("tool.x", effect("tool.x"))) == Verdict("serve")
    assert exact.decide(call("tool.x", None)) == Verdict(
        "diverge", "no recorded effect at this position"
    )
    assert exact.decide(call("tool.y", effect("tool.x"))) == Verdict("diverge")
    unstored = effect("tool.x", flag=EFFECT_REPR)
    assert exact.decide(call("tool.x", unstored)).action == "diverge"
    live = ExactReplay(live=True)
    assert live.decide(call("tool.x", unstored)) == Verdict("live")
    assert live.decide(call("tool.y", effect("tool.x"))) == Verdict("diverge")


def test_what_if_serves_only_the_unchanged_call_of_an_unchanged_handling() -> None:
    changed: set[str] = set()
    policy = WhatIf(lambda agent, model_call: agent not in changed)
    assert not policy.halts
    rec = effect("tool.x", "answer")
    assert policy.decide(call("tool.x", rec)).action == "serve"
    assert policy.decide(call("tool.x", rec, same=False)).action == "live"
    assert policy.decide(call("tool.y", rec)).action == "live"
    assert policy.decide(EffectCall(70, "agent", 0, "tool.x", None, None, True)).action == "live"
    changed.add("agent")
    assert policy.decide(call("tool.x", rec)).action == "live"
    changed.clear()
    # A live call that answers as recorded keeps the handling on the recorded path ...
    policy.ran(call("tool.x", rec), "answer", False)
    assert policy.decide(call("tool.x", rec)).action == "serve"
    # ... one that answers otherwise (or raises) takes the rest of the handling live.
    policy.ran(call("tool.x", rec), "another answer", False)
    assert policy.decide(call("tool.x", rec)).action == "live"
    other = WhatIf(lambda agent, model_call: True)
    other.ran(call("tool.x", rec), None, True)
    assert other.decide(call("tool.x", rec)).action == "live"


def test_what_if_with_digests_on_both_sides_decides_by_the_request_alone() -> None:
    policy = WhatIf(lambda agent, model_call: False)  # every agent changed
    asked = dataclasses.replace(effect("tool.x", "answer"), digest=b"a" * 16)

    def digested(name: str, digest: bytes | None, *, same: bool = True) -> EffectCall:
        return EffectCall(70, "agent", 0, name, 7, asked, same, digest)

    # Served whatever changed in the agent or the message, the handling tainted or not.
    policy.ran(digested("tool.x", b"a" * 16), "another answer", False)
    assert policy.decide(digested("tool.x", b"a" * 16, same=False)).action == "serve"
    assert policy.decide(digested("tool.x", b"b" * 16)).action == "live"
    assert policy.decide(digested("tool.y", b"a" * 16)).action == "live"  # another name
    unstored = dataclasses.replace(asked, flag=EFFECT_REPR)
    assert policy.decide(EffectCall(70, "agent", 0, "tool.x", 7, unstored, True, b"a" * 16)) == (
        Verdict("live")
    )
    # A digest on one side only: the older rule (here: the agent changed, so live).
    assert policy.decide(digested("tool.x", None)).action == "live"
    old = WhatIf(lambda agent, model_call: True)
    assert old.decide(
        EffectCall(70, "agent", 0, "tool.x", 7, effect("tool.x"), True, b"a" * 16)
    ) == (Verdict("serve"))


def test_resume_serves_what_was_recorded_and_counts_the_calls_that_differ() -> None:
    policy = Resume()
    assert policy.decide(call("tool.x", effect("tool.x"))).action == "serve"
    assert policy.decide(call("tool.x", None)).action == "live"
    assert policy.mismatched == 0
    assert policy.decide(call("tool.y", effect("tool.x"))).action == "live"
    assert policy.decide(call("tool.x", effect("tool.x", flag=EFFECT_REPR))).action == "live"
    assert policy.mismatched == 2


def test_resume_asks_again_what_a_node_failed_only_because_its_driver_had_died() -> None:
    """Such a failure is no answer: served, it would dead-letter what a person must still
    decide (an approval) or a call the budget would now admit. Any other recorded failure
    of the same effects is served, as every recorded failure is."""
    from pantheon.approvals import ApprovalDriverGone
    from pantheon.runner import BudgetDriverGone

    def failed(name: str, cls: type[Exception]) -> StoredEffect:
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        return dataclasses.replace(effect(name), flag=EFFECT_ERROR, error_type=qualified)

    policy = Resume()
    gone = failed("human.approval", ApprovalDriverGone)
    assert policy.decide(call("human.approval", gone)).action == "live"
    assert policy.decide(call("budget.admit", failed("budget.admit", BudgetDriverGone))) == (
        Verdict("live")
    )
    refused = failed("human.approval", ApprovalUnavailable)  # e.g. a request too large
    assert policy.decide(call("human.approval", refused)).action == "serve"
    assert (policy.asked_again, policy.mismatched) == (2, 0)


def test_resume_runs_again_what_failed_only_because_the_model_agent_was_stopping() -> None:
    """A model agent whose node left with messages queued (its driver died) fails those that
    need its closed tool servers with AgentStopping: no answer of the tools, so resume runs
    them live. A tool server's own failure stays served, as recorded."""

    def failed(name: str, cls: type[Exception], message: str) -> StoredEffect:
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        return dataclasses.replace(
            effect(name), flag=EFFECT_ERROR, error_type=qualified, error=message
        )

    assert AgentStopping.__module__ == "agents._model_agent"  # the name records keep
    policy = Resume()
    stopping = failed(
        "tools.list",
        AgentStopping,
        "model agent 'triage' is stopping: its tool sources are closed and a stopping "
        "agent does not start them again",
    )
    assert policy.decide(call("tools.list", stopping)) == Verdict("live")
    gone = failed("tool.find", MCPServerUnavailable, "MCP server 'fleet' is gone (calling ...)")
    assert policy.decide(call("tool.find", gone)) == Verdict("serve")
    assert (policy.asked_again, policy.mismatched) == (1, 0)


MODULE = """
import random
import time

SEEN = []


def lane(ticket, at):
    return "fast"


async def stamp(env, agent):
    chosen = await agent.effect("tool.lane", lane, env.payload["id"], time.time())
    await agent.emit("ticket.routed", {"id": env.payload["id"], "lane": chosen})


async def route(env, agent):
    lane = await agent.effect("tool.lane", lambda: "fast")
    await agent.emit("ticket.routed", {"id": env.payload["id"], "lane": lane,
                                       "score": random.random()})


async def echo(env, agent):
    SEEN.append(env.payload["id"])
    for _ in range(SEEN.count(env.payload["id"])):
        await agent.emit("ticket.echoed", {"id": env.payload["id"]})
"""

SCENARIO = """\
version: 1
name: {name}
input:
  kind: jsonl
  path: tickets.jsonl
  topic: ticket.new
agents:
  router:
    handler: "rerun_mod:{handler}"
    subscribe: [ticket.new]
"""


def team(tmp_path: Path, handler: str) -> Path:
    (tmp_path / "rerun_mod.py").write_text(MODULE, encoding="utf-8")
    (tmp_path / "tickets.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(3)), encoding="utf-8"
    )
    path = tmp_path / f"{handler}.yaml"
    path.write_text(SCENARIO.format(name=handler, handler=handler), encoding="utf-8")
    return path


HINT = (
    "agent 'router' published a different message from the same input and the same effect "
    "answers: it reads randomness or the clock outside an effect"
)


@pytest.mark.parametrize(("handler", "field"), [("route", "payload"), ("echo", "extra")])
def test_a_divergence_from_a_handler_outside_its_effects_says_so(
    tmp_path: Path, handler: str, field: str
) -> None:
    store = tmp_path / "s.db"
    summary = asyncio.run(pantheon.run(team(tmp_path, handler), store=store))
    report = asyncio.run(pantheon.replay(summary.session_id or "", store=store))
    div = report.divergence
    assert div is not None and div.field == field and div.agent == "router"
    assert div.hint is not None and div.hint.startswith(HINT)
    assert "self.effect(...)" in div.hint
    message = str(div)
    assert HINT in message and "original message None" not in message
    if field == "extra":
        assert f"replay message {div.replay_id} (none in the original)" in message
    assert report.to_dict()["divergence"]["hint"] == div.hint


def test_no_hint_when_the_handlers_effects_ran_live(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    summary = asyncio.run(pantheon.run(team(tmp_path, "route"), store=store))
    report = asyncio.run(pantheon.replay(summary.session_id or "", store=store, live_effects=True))
    # The handler's effect ran for real: its answer, not the handler, may be the cause.
    assert report.divergence is not None and report.divergence.field == "payload"
    assert report.divergence.hint is None


def test_a_replay_counts_the_served_calls_that_asked_something_else(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    summary = asyncio.run(pantheon.run(team(tmp_path, "stamp"), store=store))
    report = asyncio.run(pantheon.replay(summary.session_id or "", store=store))
    # The lane was asked with the time read outside an effect: served as recorded, and
    # the replay matches, but every request differed.
    assert report.matched and report.effects_called == 0
    assert report.requests_changed == {"tool.lane": 3}
    assert report.to_dict()["requests_changed"] == {"tool.lane": 3}
    proc = cli("replay", summary.session_id or "", "--store", str(store), cwd=tmp_path)
    assert "served 3: tool.lane 3; called 0" in proc.stdout
    assert "asked other than recorded 3: tool.lane 3" in proc.stdout


def _env(mid: int, cause: int | None, source: str | None, node: str | None) -> StoredEnvelope:
    return StoredEnvelope(mid, mid, f"t{mid}", 2, cause, 1, source, 0, 0, 0.0, None, False, node)


def test_a_resume_does_not_align_with_what_a_dead_node_left_hanging() -> None:
    """Node ``think`` died handling message 2 (no delivery of it to ``reasoner`` there): it
    had published 3 (a request its effect made, whose effect record died with it) and 4
    (its output, which ``keep`` handled into 5), and, handling 6 to the end, 7. Only 3 is
    left hanging: 4 carries recorded work, 7 came from a handling that ended, and what
    ``keep`` published is not the dead node's."""
    envelopes = [
        _env(1, None, None, None),
        _env(2, 1, "sensor", "keep"),
        _env(3, 2, "reasoner", "think"),
        _env(4, 2, "reasoner", "think"),
        _env(5, 4, "planner", "keep"),
        _env(6, 1, "sensor", "keep"),
        _env(7, 6, "reasoner", "think"),
        _env(8, 2, "memory", "keep"),
    ]
    ended = [StoredDelivery(0, "reasoner", 6, 0, 0, 0, "ok", None, None, "think")]
    cuts = {"think": "its records end after 9 in 1 shipments"}
    assert dangling(envelopes, cuts, ended, []) == {3}
    # A recorded effect made handling 3 (``keep`` took it and acted) anchors it too.
    acted = StoredEffect(0, 3, "memory", 0, "tool.x", EFFECT_OK, None, None, None, 0.0)
    assert dangling(envelopes, cuts, ended, [acted]) == set()
    # ... and a message a kept one came from (a chain inside the dead node).
    chain = [*envelopes, _env(9, 3, "planner", "think"), _env(10, 9, "guardian", "keep")]
    assert dangling(chain, cuts, ended, []) == set()
    assert dangling(envelopes, {}, ended, []) == set()
