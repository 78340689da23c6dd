"""The generated alert stream: deterministic from its seed, the committed file is that
stream, and it holds the patterns the team is there to handle."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from oncall import alerts, estate
from oncall.estate import epoch

ROOT = Path(__file__).resolve().parents[2]
DATASET = ROOT / "scenarios" / "data" / "oncall_alerts.jsonl"
SCENARIO = ROOT / "scenarios" / "oncall.yaml"
KINDS = {
    "cpu_high",
    "disk_full",
    "error_rate_5xx",
    "latency_p99",
    "replica_lag",
    "cert_expiry",
    "oom_kill",
    "health_check",
    "service_down",
}


@pytest.fixture(scope="module")
def stream() -> list[dict[str, Any]]:
    """The committed stream's records (the lines that are JSON objects)."""
    out = []
    for line in DATASET.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


@pytest.fixture(scope="module")
def incidents(stream: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in stream:
        if r["expected"]["incident"] is not None:
            by[r["expected"]["incident"]].append(r)
    return by


# -- determinism -------------------------------------------------------------------------------


def test_same_seed_same_bytes_other_seed_other_stream() -> None:
    assert alerts.generate(5, 300) == alerts.generate(5, 300)
    assert alerts.generate(5, 300) != alerts.generate(6, 300)
    assert len(alerts.generate(6, 300).splitlines()) == 300


def test_the_committed_file_is_the_seeded_stream() -> None:
    # The scenario's header says how it was made; this is that command's output.
    assert "--seed 11 --count 800" in SCENARIO.read_text(encoding="utf-8")
    assert DATASET.read_text(encoding="utf-8") == alerts.generate(11, 800)


def test_the_cli_writes_the_stream(tmp_path: Path) -> None:
    out = tmp_path / "a.jsonl"
    script = ROOT / "scenarios" / "data" / "make_oncall_alerts.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--seed", "3", "--count", "60", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == alerts.generate(3, 60)


# -- shape -------------------------------------------------------------------------------------


def test_records_are_alerts_in_time_order_with_their_ground_truth(
    stream: list[dict[str, Any]],
) -> None:
    good = [r for r in stream if r["expected"]["decision"] != "reject"]
    assert len(good) > 780
    assert [r["id"] for r in stream] == sorted(r["id"] for r in stream)
    times = [epoch(r["ts"]) for r in good]
    assert times == sorted(times)
    assert times[-1] - times[0] > 36 * 3600  # two days of alerting, near enough
    assert {r["kind"] for r in good} == KINDS
    assert {r["severity"] for r in good} == {"info", "warning", "critical"}
    assert {r["status"] for r in good} == {"firing", "resolved"}
    assert {r["service"] for r in good} == set(estate.SERVICES)
    for r in good:
        assert r["host"] in estate.HOSTS[r["service"]]
        x = r["expected"]
        assert set(x) == {"incident", "decision", "action", "duplicate", "root"}
        if x["decision"] == "remediate":
            assert x["action"] in (
                "restart_service",
                "clear_disk",
                "failover_db",
                "renew_cert",
                "scale_out",
            )
        else:
            assert x["action"] == x["decision"]
    assert Counter(r["expected"]["decision"] for r in good).keys() == {
        "page",
        "remediate",
        "ignore",
    }


def test_some_lines_are_broken_the_way_webhooks_break() -> None:
    lines = DATASET.read_text(encoding="utf-8").splitlines()
    not_objects = [ln for ln in lines if not ln.startswith("{") or not ln.endswith("}")]
    assert any("502 Bad Gateway" in ln for ln in not_objects)
    assert len(not_objects) == 2  # the proxy's HTML page and a cut-off line
    rejects = [json.loads(ln) for ln in lines if '"decision":"reject"' in ln]
    assert len(rejects) == 3
    assert {("service" in r, r.get("severity"), r["ts"][:4]) for r in rejects} == {
        (False, "critical", "2024"),
        (True, "sev1", "2024"),
        (True, "critical", "Mon "),
    }


# -- the patterns ------------------------------------------------------------------------------


def test_re_notifications_are_a_large_share_and_repeat_a_firing_alert(
    stream: list[dict[str, Any]],
) -> None:
    dups = [r for r in stream if r["expected"]["duplicate"]]
    assert 0.3 < len(dups) / len(stream) < 0.6
    firing: dict[tuple[str, str, str], float] = {}
    for r in stream:
        if r["expected"]["decision"] == "reject":
            continue
        fp = (r["service"], r["host"], r["kind"])
        if r["expected"]["duplicate"]:
            assert fp in firing, f"{r['id']} repeats nothing"
            assert r["status"] == "firing"
        if r["status"] == "firing":
            firing[fp] = epoch(r["ts"])
        else:
            firing.pop(fp, None)
    # Now and then a notification is lost: the next repeat comes after the dedup window.
    gaps = []
    last: dict[tuple[str, str, str], float] = {}
    for r in stream:
        if r["expected"]["decision"] == "reject":
            continue
        fp = (r["service"], r["host"], r["kind"])
        if r["expected"]["duplicate"]:
            gaps.append(epoch(r["ts"]) - last[fp])
        last[fp] = epoch(r["ts"])
    assert max(gaps) > 300 and sorted(gaps)[len(gaps) // 2] < 180


def test_cascades_travel_along_the_dependency_graph_within_a_minute(
    incidents: dict[str, list[dict[str, Any]]],
) -> None:
    cascades = []
    for rs in incidents.values():
        [root] = [r for r in rs if r["expected"]["root"]]
        if root["kind"] != "service_down" or len({r["service"] for r in rs}) < 3:
            continue
        cascades.append((root, rs))
        callers = set().union(*map(set, estate.callers(root["service"])))
        first = {}
        for r in rs:
            if r["service"] != root["service"]:
                assert r["service"] in callers, (root["id"], r["id"])
                first.setdefault(r["service"], epoch(r["ts"]))
        assert all(t - epoch(root["ts"]) <= 60 for t in first.values())
    assert len(cascades) >= 6
    # db down -> api 5xx -> web latency, one incident, paged: the primary is not failed
    # over by a machine.
    db = [rs for root, rs in cascades if root["host"] == "db-1"]
    assert db and all(r["expected"]["action"] == "page" for rs in db for r in rs)
    kinds = {(r["service"], r["kind"]) for r in db[0]}
    assert {("db", "service_down"), ("api", "error_rate_5xx"), ("web", "latency_p99")} <= kinds
    # Some callers' alerts arrive before their root's.
    early = [root for root, rs in cascades if any(r["ts"] < root["ts"] for r in rs)]
    assert len(early) >= 2


def test_flapping_checks_fire_and_resolve_over_and_over_and_need_nobody(
    incidents: dict[str, list[dict[str, Any]]],
) -> None:
    flapping = [
        rs
        for rs in incidents.values()
        if sum(1 for r in rs if r["status"] == "resolved") >= 3
        and {r["kind"] for r in rs} == {"health_check"}
    ]
    assert len(flapping) >= 3
    for rs in flapping:
        statuses = [r["status"] for r in rs]
        assert statuses[:4] == ["firing", "resolved", "firing", "resolved"]
        assert {r["expected"]["action"] for r in rs} <= {"ignore", "page"}


def test_noise_is_ignored_and_belongs_to_no_incident(stream: list[dict[str, Any]]) -> None:
    info = [r for r in stream if r.get("severity") == "info"]
    assert len(info) >= 30
    assert all(
        r["expected"]["incident"] is None and r["expected"]["action"] == "ignore" for r in info
    )
    blips = [
        r for r in stream if r.get("severity") == "warning" and r["expected"]["incident"] is None
    ]
    assert len(blips) >= 30


def test_alerts_from_a_host_under_maintenance_are_silenced(stream: list[dict[str, Any]]) -> None:
    for window in estate.MAINTENANCE:
        inside = [
            r
            for r in stream
            if r.get("host") == window["host"]
            and epoch(window["start"]) <= epoch(r["ts"]) < epoch(window["end"])
        ]
        assert {r["kind"] for r in inside} >= {"service_down", "health_check"}
        assert all(r["expected"]["action"] == "ignore" for r in inside)
        assert all(r["expected"]["incident"] is None for r in inside)


def test_during_the_freeze_what_would_be_automatic_is_paged(
    incidents: dict[str, list[dict[str, Any]]],
) -> None:
    [freeze] = estate.FREEZES
    frozen = []
    for rs in incidents.values():
        [root] = [r for r in rs if r["expected"]["root"]]
        if epoch(freeze["start"]) <= epoch(root["ts"]) < epoch(freeze["end"]):
            frozen.append(root)
    automatic = {"oom_kill", "disk_full", "cert_expiry", "service_down"}
    paged = [r for r in frozen if r["kind"] in automatic and r["host"] != "db-1"]
    assert len(paged) >= 2
    assert all(r["expected"]["action"] == "page" for r in paged)


def test_a_crash_loop_is_restarted_twice_then_paged(
    incidents: dict[str, list[dict[str, Any]]],
) -> None:
    ooms: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rs in incidents.values():
        [root] = [r for r in rs if r["expected"]["root"]]
        if root["kind"] == "oom_kill":
            ooms[root["host"]].append(root)
    loops = []
    for roots in ooms.values():
        roots.sort(key=lambda r: r["ts"])
        for a, b, c in zip(roots, roots[1:], roots[2:], strict=False):
            if epoch(c["ts"]) - epoch(a["ts"]) <= 3600:
                loops.append((a, b, c))
    assert loops
    assert all(c["expected"]["action"] == "page" for _, _, c in loops)
    assert any(
        (a["expected"]["action"], b["expected"]["action"]) == ("restart_service",) * 2
        for a, b, _ in loops
    )


def test_the_scenario_knows_the_estate_the_stream_came_from() -> None:
    agents = yaml.safe_load(SCENARIO.read_text(encoding="utf-8"))["agents"]
    graph = agents["correlator"]["settings"]["depends_on"]
    assert {k: tuple(v) for k, v in graph.items()} == estate.DEPENDS_ON
    assert tuple(agents["correlator"]["settings"]["maintenance"]) == estate.MAINTENANCE
    freezes = agents["guardian"]["settings"]["policy_options"]["freezes"]
    assert tuple(freezes) == estate.FREEZES
