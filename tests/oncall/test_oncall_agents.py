"""Each of the on-call team's agents on crafted alerts, on a real bus; then the whole chain."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from oncall.agents import Correlator, Decider, Dedup, Scorer, alert_problem
from oncall.estate import MAINTENANCE, epoch, iso
from oncall.policy import RUNBOOK, OnCallPolicy, Rule
from pydantic import ValidationError

import pantheon
from agents import Actor, Agent, Guardian, Outbox
from bus import Bus, Envelope
from bus.testing import capture_events

T0 = 1_715_000_000.0  # 2024-05-06T12:53:20Z
POLICY = "oncall.policy:OnCallPolicy"
FREEZE = {"start": "2024-05-07T12:00:00Z", "end": "2024-05-07T18:00:00Z", "reason": "freeze"}
TOOLS = {
    name: f"oncall.tools:{name}"
    for name in ("page", "restart_service", "clear_disk", "failover_db", "renew_cert", "scale_out")
}
ACTOR = {
    "tools": TOOLS,
    "key": "alert_id",
    "outcome_fields": ["alert_id", "incident", "duplicate", "decision", "action", "verdict"],
}


def alert(
    n: int,
    at: float,
    host: str,
    kind: str,
    severity: str = "critical",
    status: str = "firing",
    **extra: Any,
) -> dict[str, Any]:
    service = host.rsplit("-", 1)[0]
    role = {"db-1": "primary", "db-2": "replica"}.get(host)
    return {
        "id": f"a-{n}",
        "ts": iso(T0 + at),
        "service": service,
        "host": host,
        "kind": kind,
        "severity": severity,
        "status": status,
        "summary": f"{host} {kind}",
        "labels": {"env": "prod"} | ({"role": role} if role else {}),
        **extra,
    }


async def run(
    agents: Iterable[Agent], topic: str, payloads: Iterable[Any], watch: str
) -> list[Envelope]:
    """Attach ``agents`` to a fresh bus, publish ``payloads`` on ``topic`` in order, and
    return what was published on ``watch`` once the bus is quiet."""
    async with Bus() as bus:
        for agent in agents:
            await agent.attach(bus)
        with capture_events(bus, watch) as seen:
            for p in payloads:
                await bus.emit(topic, p)
            await bus.drain()
    return seen


# -- the input: the built-in Observer with the team's check ------------------------------------


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({}, None),
        ({"host": ""}, "missing or empty field 'host'"),
        ({"ts": None}, "missing or empty field 'ts'"),
        ({"severity": "sev1"}, "severity 'sev1' is not one of info, warning, critical"),
        ({"status": "acked"}, "status 'acked' is not one of firing, resolved"),
        ({"ts": "Mon May  6 14:03:11 2024"}, "is not an ISO-8601 time"),
    ],
)
def test_alert_problem_says_what_cannot_be_triaged(
    change: dict[str, Any], reason: str | None
) -> None:
    problem = alert_problem(alert(1, 0, "api-1", "oom_kill") | change)
    assert problem == reason if reason is None else reason in (problem or "")


async def test_the_observer_publishes_alerts_without_their_ground_truth(tmp_path: Path) -> None:
    good = alert(1, 0, "api-1", "oom_kill") | {"expected": {"action": "restart_service"}}
    rejected = {"decision": "reject", "action": "reject"}
    bad = alert(2, 5, "api-2", "oom_kill", severity="sev1") | {"expected": rejected}
    (tmp_path / "alerts.jsonl").write_text(
        "\n".join([json.dumps(good), "<html>502 Bad Gateway</html>", json.dumps(bad)]) + "\n",
        encoding="utf-8",
    )
    (tmp_path / "team.yaml").write_text(
        textwrap.dedent(
            """\
            version: 1
            name: feed
            input:
              kind: jsonl
              path: alerts.jsonl
              label: expected
              topic: observation.alert.received
              malformed_topic: observation.alert.malformed
              validate: "oncall.agents:alert_problem"
            agents:
              observer: {}
              scorer: {class: "oncall.agents:Scorer"}
            """
        ),
        encoding="utf-8",
    )
    seen: list[Envelope] = []
    summary = await pantheon.run(
        tmp_path / "team.yaml",
        record=False,
        on_bus=lambda bus: bus.observe(SimpleNamespace(on_publish=seen.append)),
    )
    published = {e.topic: e.payload for e in seen}
    assert published["observation.alert.received"] == {
        k: v for k, v in good.items() if k != "expected"
    }
    [malformed] = [e.payload for e in seen if e.topic == "observation.alert.malformed"][1:]
    assert malformed["key"] == "a-2" and "severity 'sev1'" in malformed["reason"]
    assert (summary.inputs, summary.malformed) == (1, 2)
    # The rejected alert was scored by its label; the HTML line has none.
    assert (summary.accuracy["scored"], summary.accuracy["unlabelled"]) == (1, 1)
    assert summary.accuracy["action_accuracy"] == 1.0
    assert summary.dlq == {}


# -- Dedup -------------------------------------------------------------------------------------


async def test_dedup_tells_repeats_from_new_alerts_and_spots_flapping() -> None:
    stream = [
        alert(1, 0, "api-1", "oom_kill"),
        alert(2, 90, "api-1", "oom_kill"),  # re-sent while firing
        alert(3, 100, "api-2", "oom_kill"),  # another host: another alert
        alert(4, 200, "api-1", "oom_kill"),
        alert(5, 600, "api-1", "oom_kill"),  # 400 s of silence, no resolve: resumed
        alert(6, 1300, "api-1", "oom_kill"),  # 700 s: past the pause too, a new alert
        alert(7, 610, "web-1", "health_check"),
        alert(8, 640, "web-1", "health_check", status="resolved"),
        alert(9, 700, "web-1", "health_check"),  # back after a resolve: once
        alert(10, 730, "web-1", "health_check", status="resolved"),
        alert(11, 760, "web-1", "health_check"),  # twice within 10 min: flapping
    ]
    dedup = Dedup(settings={"window_s": 300, "pause_s": 600, "flap_window_s": 600, "flap_after": 2})
    out = await run([dedup], "observation.alert.received", stream, "alert.*")
    got = [
        (
            e.payload["id"],
            e.topic.removeprefix("alert."),
            e.payload["first"],
            e.payload["resumed"],
            e.payload["flapping"],
        )
        for e in out
    ]
    assert got == [
        ("a-1", "new", None, False, False),
        ("a-2", "duplicate", "a-1", False, False),
        ("a-3", "new", None, False, False),
        ("a-4", "duplicate", "a-1", False, False),
        ("a-5", "new", None, True, False),
        ("a-6", "new", None, False, False),
        ("a-7", "new", None, False, False),
        ("a-8", "resolved", "a-7", False, False),
        ("a-9", "new", None, False, False),
        ("a-10", "resolved", "a-9", False, False),
        ("a-11", "new", None, False, True),
    ]
    assert [e.payload["duplicate"] for e in out].count(True) == dedup.duplicates == 2
    assert out[0].payload["fingerprint"] == "api/api-1/oom_kill"


def test_dedup_remembers_a_bounded_number_of_fingerprints() -> None:
    dedup = Dedup(settings={"max_fingerprints": 2})
    for n, host in enumerate(["api-1", "api-2", "api-3"]):
        dedup.classify(alert(n, n, host, "oom_kill"))
    # api-1 was forgotten to make room: its repeat is taken for a new alert.
    topic, _ = dedup.classify(alert(9, 10, "api-1", "oom_kill"))
    assert topic == "alert.new"
    topic, _ = dedup.classify(alert(10, 11, "api-3", "oom_kill"))
    assert topic == "alert.duplicate"


# -- Correlator --------------------------------------------------------------------------------


def deduped(*alerts: dict[str, Any]) -> list[dict[str, Any]]:
    dedup = Dedup()
    return [dedup.classify(a)[1] for a in alerts]


async def test_a_cascade_is_one_incident_rooted_where_it_started() -> None:
    stream = deduped(
        alert(1, 0, "db-1", "service_down"),
        alert(2, 20, "api-2", "error_rate_5xx"),
        alert(3, 30, "web-1", "disk_full", "warning"),  # a coincidence on another host
        alert(4, 45, "web-3", "latency_p99"),
        alert(5, 50, "worker-1", "error_rate_5xx"),
        alert(6, 80, "api-2", "error_rate_5xx"),  # a re-notification
        alert(7, 90, "cache-1", "cpu_high", "info"),
    )
    out = await run([Correlator()], "alert.new", stream, "incident.alert")
    filed = {e.payload["alert"]["id"]: e.payload for e in out}
    cascade = {filed[f"a-{n}"]["incident"] for n in (1, 2, 4, 5, 6)}
    assert len(cascade) == 1 and None not in cascade
    assert filed["a-3"]["incident"] not in cascade | {None}
    assert filed["a-7"]["incident"] is None and filed["a-7"]["silenced"] == "info"
    assert {filed[f"a-{n}"]["root"]["id"] for n in (1, 2, 4, 5, 6)} == {"a-1"}
    assert filed["a-6"]["services"] == ["api", "db", "web", "worker"]
    assert filed["a-1"]["opened"] and not filed["a-2"]["opened"]


async def test_the_root_moves_upstream_when_the_cause_arrives_late() -> None:
    stream = deduped(
        alert(1, 0, "web-2", "latency_p99"),
        alert(2, 6, "api-1", "error_rate_5xx"),
        alert(3, 9, "cache-1", "service_down"),
        alert(4, 30, "web-2", "latency_p99"),
    )
    out = await run([Correlator()], "alert.new", stream, "incident.alert")
    roots = [(e.payload["root"]["id"], e.payload["root_changed"]) for e in out]
    assert roots == [("a-1", False), ("a-2", True), ("a-3", True), ("a-3", False)]
    assert len({e.payload["incident"] for e in out}) == 1


def test_correlator_keeps_unrelated_and_late_alerts_apart() -> None:
    corr = Correlator(settings={"window_s": 120, "close_after_s": 600})
    a, b, c, d, e = deduped(
        alert(1, 0, "api-1", "error_rate_5xx"),
        alert(2, 30, "cache-2", "disk_full"),  # resources stay on their host
        alert(3, 200, "web-1", "latency_p99"),  # related service, but 200 s later
        alert(4, 2000, "api-1", "error_rate_5xx"),  # same check, long after: new problem
        alert(5, 2010, "api-1", "error_rate_5xx", status="resolved"),
    )
    first, second, third, fourth, fifth = (corr.file(x) for x in (a, b, c, d, e))
    assert len({first["incident"], second["incident"], third["incident"]}) == 3
    assert fourth["incident"] not in {first["incident"], third["incident"]}
    assert fifth["incident"] == fourth["incident"]
    # Closed after 600 s idle: the first incident is no longer open.
    assert corr.open_incidents == [fourth["incident"]]


def test_an_alert_that_kept_firing_stays_in_its_incident() -> None:
    corr = Correlator(settings={"window_s": 120})
    first, lost, back = (
        corr.file(x)
        for x in deduped(
            alert(1, 0, "worker-1", "oom_kill"),
            alert(2, 450, "worker-1", "oom_kill"),  # a lost notification: resumed
            alert(3, 1200, "worker-1", "oom_kill"),  # silent for 750 s: a new problem
        )
    )
    assert lost["alert"]["resumed"] and lost["incident"] == first["incident"]
    assert not back["alert"]["resumed"] and back["incident"] != first["incident"]


def test_alerts_from_a_host_under_maintenance_are_silenced_before_grouping() -> None:
    window = MAINTENANCE[1]  # cache-2, 14:00-14:30 on 2024-05-06
    corr = Correlator(settings={"maintenance": [window]})
    start = iso_to_rel(window["start"])
    cascade, inside, after = deduped(
        alert(1, start + 100, "cache-1", "service_down"),
        alert(2, start + 110, "cache-2", "service_down"),
        alert(3, start + 1900, "cache-2", "service_down"),
    )
    root = corr.file(cascade)
    silenced = corr.file(inside)
    assert silenced["incident"] is None
    assert silenced["silenced"] == "cache-2 under maintenance: redis upgrade"
    assert corr.file(after)["incident"] is not None  # the window is over
    assert root["incident"] is not None


def iso_to_rel(ts: str) -> float:
    return epoch(ts) - T0


# -- Decider -----------------------------------------------------------------------------------


def filed(*alerts: dict[str, Any], **settings: Any) -> list[dict[str, Any]]:
    corr = Correlator(settings=settings)
    return [corr.file(a) for a in deduped(*alerts)]


async def test_decider_follows_the_runbook_and_starts_each_action_once() -> None:
    stream = filed(
        alert(1, 0, "api-1", "oom_kill"),
        alert(2, 60, "api-1", "oom_kill"),  # covered: already restarting
        alert(3, 100, "web-2", "disk_full", "warning"),
        alert(4, 200, "api-3", "latency_p99", "warning"),
        alert(5, 300, "db-1", "cpu_high"),
    )
    out = await run([Decider()], "incident.alert", stream, "decision.proposed")
    got = [
        (p["alert_id"], p["decision"], p["action"], [s["tool"] for s in p["steps"]])
        for p in (e.payload for e in out)
    ]
    assert got == [
        ("a-1", "remediate", "restart_service", ["restart_service"]),
        ("a-2", "remediate", "restart_service", []),
        ("a-3", "remediate", "clear_disk", ["clear_disk"]),
        ("a-4", "ignore", "ignore", []),
        ("a-5", "page", "page", ["page"]),
    ]
    first = out[0].payload
    assert first["steps"][0] == {
        "tool": "restart_service",
        "incident": first["incident"],
        "service": "api",
        "host": "api-1",
    }
    assert first["target"] == {"service": "api", "host": "api-1", "role": None}
    assert out[1].payload["decided_at"] == first["ts"]


def test_a_late_root_changes_the_decision_and_starts_the_new_action() -> None:
    decider = Decider()
    api, db, web = (
        decider.propose(f)
        for f in filed(
            alert(1, 0, "api-1", "error_rate_5xx"),
            alert(2, 5, "db-1", "service_down"),
            alert(3, 30, "web-2", "latency_p99"),
        )
    )
    assert (api["action"], [s["tool"] for s in api["steps"]]) == ("page", ["page"])
    assert (db["action"], [s["tool"] for s in db["steps"]]) == ("failover_db", ["failover_db"])
    assert db["target"] == {"service": "db", "host": "db-1", "role": "primary"}
    assert db["decided_at"] == db["ts"] != api["decided_at"]
    assert (web["action"], web["steps"], web["root"]) == ("failover_db", [], "a-2")


def test_a_third_restart_within_the_hour_is_paged() -> None:
    decider = Decider(settings={"max_repeats": 2, "repeat_window_s": 3600})
    crashes = filed(*(alert(n, n * 900, "worker-2", "oom_kill") for n in range(4)))
    got = [decider.propose(f) for f in crashes]
    assert [p["action"] for p in got] == ["restart_service"] * 2 + ["page"] * 2
    assert got[2]["why"] == "restart_service on worker-2 already ran 2 times in 60 min"
    assert got[2]["steps"][0]["tool"] == "page"


def test_flapping_and_silenced_alerts_are_ignored() -> None:
    decider = Decider()
    flap = filed(
        alert(1, 0, "web-1", "health_check"),
        alert(2, 30, "web-1", "health_check", status="resolved"),
        alert(3, 60, "web-1", "health_check"),
        alert(4, 90, "web-1", "health_check", status="resolved"),
        alert(5, 120, "web-1", "health_check"),
        alert(6, 130, "api-1", "cpu_high", "info"),
    )
    got = [decider.propose(f) for f in flap]
    assert [p["action"] for p in got] == ["restart_service"] * 4 + ["ignore"] * 2
    assert got[4]["why"] == "health_check on web-1 is flapping"
    assert got[4]["steps"] == []  # nothing to start for an ignore
    assert got[5]["why"] == "silenced: info"


def test_runbook_rules_are_checked() -> None:
    with pytest.raises(ValidationError, match="names its action"):
        Rule(decision="remediate")
    with pytest.raises(ValidationError):
        Decider(settings={"runbook": [{"decision": "remediate", "action": "reboot_dc"}]})
    assert RUNBOOK[-1] == Rule(decision="ignore")


# -- Guardian with the on-call policy ----------------------------------------------------------


def proposal(action: str, host: str, decided_at: str, *, steps: bool = True) -> dict[str, Any]:
    role = {"db-1": "primary"}.get(host)
    return {
        "alert_id": "a-1",
        "incident": "I-0001",
        "decision": "remediate",
        "action": action,
        "target": {"service": host.rsplit("-", 1)[0], "host": host, "role": role},
        "decided_at": decided_at,
        "summary": f"{host} down",
        "steps": [{"tool": action, "incident": "I-0001", "host": host}] if steps else [],
    }


async def test_guardian_blocks_failing_over_the_primary_and_pages_with_the_reason() -> None:
    guardian = Guardian(
        subscribe=["decision.proposed"],
        settings={"policy": POLICY, "policy_options": {"freezes": [FREEZE]}},
    )
    out = await run(
        [guardian],
        "decision.proposed",
        [
            proposal("failover_db", "db-1", "2024-05-06T10:00:00Z"),
            proposal("restart_service", "api-2", "2024-05-07T13:00:00Z"),
            proposal("restart_service", "api-2", "2024-05-07T19:00:00Z"),
            proposal("failover_db", "db-1", "2024-05-06T10:00:00Z", steps=False),
        ],
        "guardian.decision",
    )
    primary, frozen, fine, covered = (e.payload for e in out)
    assert (primary["verdict"], primary["decision"], primary["proposed"]) == (
        "blocked",
        "page",
        "failover_db",
    )
    assert primary["reasons"] == ["failover_db of primary db-1 needs a human"]
    assert primary["steps"] == [
        {
            "tool": "page",
            "incident": "I-0001",
            "service": "db",
            "host": "db-1",
            "summary": "db-1 down",
            "why": "failover_db of primary db-1 needs a human",
        }
    ]
    assert frozen["verdict"] == "blocked" and frozen["steps"][0]["tool"] == "page"
    assert frozen["reasons"] == ["freeze: no automatic restart_service on api-2; paging instead"]
    assert (fine["verdict"], fine["steps"][0]["tool"]) == ("approved", "restart_service")
    assert (covered["verdict"], covered["action"], covered["steps"]) == ("blocked", "page", [])
    assert guardian.decisions == {"blocked": 3, "approved": 1}


def test_a_bad_freeze_is_refused_when_the_guardian_is_configured() -> None:
    bad = {"start": "2024-05-07T18:00:00Z", "end": "2024-05-07T12:00:00Z"}
    with pytest.raises(ValidationError, match="freeze ends"):
        Guardian(settings={"policy": POLICY, "policy_options": {"freezes": [bad]}})
    assert (
        OnCallPolicy(human_only=[])(proposal("failover_db", "db-1", FREEZE["end"]))["verdict"]
        == "approved"
    )


# -- Scorer ------------------------------------------------------------------------------------


def outcome(
    n: int,
    incident: str | None,
    action: str,
    *,
    duplicate: bool = False,
    tools: tuple[str, ...] = (),
) -> dict[str, Any]:
    decision = action if action in ("page", "ignore") else "remediate"
    return {
        "alert_id": f"a-{n}",
        "incident": incident,
        "duplicate": duplicate,
        "decision": decision,
        "action": action,
        "verdict": "approved",
        "results": [{"tool": t, "status": "done"} for t in tools],
    }


def label(incident: str | None, action: str, *, duplicate: bool = False) -> dict[str, Any]:
    decision = action if action in ("page", "ignore", "reject") else "remediate"
    return {
        "incident": incident,
        "decision": decision,
        "action": action,
        "duplicate": duplicate,
        "root": False,
    }


async def test_scorer_reports_accuracy_grouping_and_pages_against_the_labels() -> None:
    labels = {
        "a-1": label("INC-1", "page"),
        "a-2": label("INC-1", "page", duplicate=True),
        "a-3": label("INC-1", "page"),
        "a-4": label("INC-2", "restart_service"),
        "a-5": label("INC-2", "restart_service"),
        "a-6": label(None, "ignore"),
        "a-7": label("INC-3", "page"),
        "a-8": label(None, "reject"),
    }
    scorer = Scorer(labels=labels)
    outcomes = [
        outcome(1, "I-1", "page", tools=("page",)),
        outcome(2, "I-1", "page", duplicate=True),
        outcome(3, "I-2", "restart_service"),  # filed with the wrong incident
        outcome(4, "I-2", "restart_service", tools=("restart_service",)),
        outcome(5, "I-2", "clear_disk"),  # right decision, wrong action
        outcome(6, "I-3", "page", duplicate=True, tools=("page",)),  # a false page
        outcome(7, None, "ignore"),  # a missed page
        outcome(99, None, "ignore"),  # not in the labels
    ]
    await run([scorer], "action.executed", outcomes, "learner.*")
    await run([scorer], "observation.alert.malformed", [{"alert_id": "a-8"}], "learner.*")
    r = scorer.report()
    assert (r["scored"], r["unlabelled"]) == (8, 1)
    assert r["action_accuracy"] == 4 / 8  # a-1, a-2, a-4, a-8
    assert r["decision_accuracy"] == 5 / 8  # and a-5
    assert r["dedup_accuracy"] == 6 / 7  # a-6 is no repeat; a-8 was never triaged
    # Pairs that belong together: (1,2) (1,3) (2,3) (4,5); filed together: (1,2) (3,4) (3,5)
    # (4,5); both: (1,2) (4,5).
    assert (r["grouping_precision"], r["grouping_recall"]) == (2 / 4, 2 / 4)
    assert r["pages"] == {"needed": 2, "sent": 2, "missed": 1, "false": 1}
    assert r["incidents"] == {"real": 3, "filed": 3}
    assert r["mistakes"] == {
        "page -> restart_service": 1,
        "restart_service -> clear_disk": 1,
        "ignore -> page": 1,
        "page -> ignore": 1,
    }


# -- the chain ---------------------------------------------------------------------------------


async def test_the_chain_turns_an_alert_storm_into_one_page_and_one_restart(
    tmp_path: Path,
) -> None:
    stream = [
        alert(1, 0, "db-1", "service_down"),
        alert(2, 15, "api-1", "error_rate_5xx"),
        alert(3, 40, "web-2", "latency_p99"),
        alert(4, 90, "db-1", "service_down"),
        alert(5, 100, "api-1", "error_rate_5xx"),
        alert(6, 120, "worker-3", "oom_kill"),
        alert(7, 200, "worker-3", "oom_kill"),
        alert(8, 210, "cache-2", "cpu_high", "info"),
    ]
    outbox = Outbox(tmp_path / "outbox.jsonl")
    team: list[Agent] = [
        Dedup(),
        Correlator(),
        Decider(),
        Guardian(subscribe=["decision.proposed"], settings={"policy": POLICY}),
        Actor(outbox=outbox, settings=ACTOR),
    ]
    out = await run(team, "observation.alert.received", stream, "action.executed")
    done = {e.payload["alert_id"]: e.payload for e in out}
    assert len(done) == 8
    assert {done[f"a-{n}"]["incident"] for n in range(1, 6)} == {"I-0001"}
    assert {done[f"a-{n}"]["action"] for n in range(1, 6)} == {"page"}
    assert [done[f"a-{n}"]["duplicate"] for n in range(1, 8)] == [False] * 3 + [True] * 2 + [
        False,
        True,
    ]
    assert done["a-6"]["action"] == done["a-7"]["action"] == "restart_service"
    assert done["a-8"]["action"] == "ignore"
    lines = [json.loads(x) for x in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    assert [(x["alert_id"], x["tool"]) for x in lines] == [
        ("a-1", "page"),
        ("a-6", "restart_service"),
    ]
    assert lines[0]["result"]["paged"] == "oncall-db"
    assert lines[0]["why"] == "failover_db of primary db-1 needs a human"
