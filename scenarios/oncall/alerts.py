"""Generate the alert stream ``scenarios/oncall.yaml`` feeds the on-call team.

    python scenarios/data/make_oncall_alerts.py --seed 11 --count 800 \\
        -o scenarios/data/oncall_alerts.jsonl

Deterministic: the same seed and count give the same bytes (one ``random.Random``, no clock,
no hash-ordered iteration), so the committed file can be checked against its seed.

Two days of production alerting over the estate of :mod:`oncall.estate`, as a monitoring
stack sends it: one JSON object per notification, in time order, each with its ground truth
under ``expected`` (which the team never sees):

* ``incident``: the incident the alert belongs to (``INC-001``...), ``null`` for noise;
* ``decision``: ``page``, ``remediate`` or ``ignore`` (``reject`` for a malformed record);
* ``action``: the runbook action for ``remediate`` (``restart_service``, ``clear_disk``,
  ``failover_db``, ``renew_cert``, ``scale_out``), else the decision itself;
* ``duplicate``: a re-notification of an alert already firing (no resolve in between);
* ``root``: the alert that says what is actually broken.

What makes it realistic, and what makes a team fail on it:

* every firing alert is re-sent every one to three minutes while it lasts (now and
  then a notification is lost and the next comes after five minutes or more);
* cascades: a db, cache, queue or auth outage makes its callers fail within a minute, along
  the dependency graph (db down -> api 5xx -> web latency); one incident, decided by its
  root; in every third one a caller's alert is scraped before the root's;
* flapping health checks that fire and resolve every minute or so (ignore: nothing is wrong
  that a restart would fix, and a human will not thank you for the page);
* crash loops: a third OOM kill of the same service within the hour is paged, not restarted
  again;
* noise: short warning blips and info alerts that need nobody;
* maintenance windows (alerts from a host under planned work are silenced: ignored, filed
  under no incident, whatever else is going on) and a change freeze (whatever needs doing
  during it, a human does: page);
* a primary database failing over needs a human too (page);
* a few malformed records (a webhook proxy's HTML error page, a cut-off line, a bad time).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncall.estate import (
    FREEZES,
    HOSTS,
    MAINTENANCE,
    ROLES,
    START,
    callers,
    epoch,
    in_window,
    iso,
)

__all__ = ["SPAN_S", "generate", "main", "records"]

#: The stream covers two days from ``estate.START``.
SPAN_S = 2 * 24 * 3600
#: A remediation that already ran this many times on one host within the hour is paged.
MAX_REPEATS = 2
REPEAT_WINDOW_S = 3600
#: Two episodes never put the same check (service, host, kind) this close together.
APART_S = 900

SOURCE = {
    "cpu_high": "node_exporter",
    "disk_full": "node_exporter",
    "oom_kill": "node_exporter",
    "error_rate_5xx": "prometheus",
    "latency_p99": "prometheus",
    "replica_lag": "prometheus",
    "service_down": "prometheus",
    "health_check": "blackbox",
    "cert_expiry": "blackbox",
}
TEAM = {
    "web": "frontend",
    "api": "platform",
    "auth": "identity",
    "db": "data",
    "cache": "platform",
    "queue": "data",
    "worker": "platform",
}
# Which episode to draw, by weight. Counts per two days of a mid-sized estate.
EPISODES = {
    "cascade": 9,
    "oom": 8,
    "crash_loop": 2,
    "disk_full": 8,
    "cert_expiry": 4,
    "cpu_saturation": 5,
    "health_check": 4,
    "flapping": 4,
    "replica_lag": 3,
    "bad_deploy": 3,
    "slow": 2,
    "blip": 20,
    "info": 25,
}
CASCADE_ROOTS: tuple[tuple[str, int], ...] = (
    ("db-1", 5),
    ("cache", 5),
    ("queue", 3),
    ("auth", 3),
    ("replica", 4),
)
MALFORMED = ("html", "bad_ts", "no_service", "truncated", "bad_severity")


@dataclass
class Alert:
    """One notification as generated, before it gets its id and place in the stream."""

    at: float
    service: str
    host: str
    kind: str
    severity: str
    value: float
    summary: str
    status: str = "firing"
    root: bool = False
    episode: Episode | None = None
    seq: int = 0

    @property
    def fingerprint(self) -> tuple[str, str, str]:
        return (self.service, self.host, self.kind)


@dataclass
class Episode:
    """What happened: one incident (or one bit of noise) and every alert it caused."""

    name: str
    decision: str
    action: str
    incident: bool = True
    alerts: list[Alert] = field(default_factory=list)

    @property
    def root(self) -> Alert:
        return next(a for a in self.alerts if a.root)


def _summary(kind: str, service: str, host: str, value: float) -> str:
    return {
        "cpu_high": f"{host}: CPU {value:.0f}% for 10m",
        "disk_full": f"{host}: /var {value:.0f}% used",
        "oom_kill": f"{host}: {service} OOM-killed ({value:.0f} in 5m)",
        "error_rate_5xx": f"{service} on {host}: 5xx rate {value:.1f}% (> 2%)",
        "latency_p99": f"{service} on {host}: p99 latency {value:.0f} ms (> 1500 ms)",
        "replica_lag": f"{host}: replication lag {value:.0f}s",
        "service_down": f"{host}: {service} down (up == 0)",
        "health_check": f"{host}: health check /healthz failing",
        "cert_expiry": f"{service}: TLS certificate expires in {value:.0f} days",
    }[kind]


class Generator:
    """The stream of one seed: episodes placed over two days, then cut to ``count`` lines."""

    def __init__(self, seed: int, count: int) -> None:
        self.rng = random.Random(seed)
        self.count = count
        self.seq = 0
        self.cascades = 0

    # -- building blocks

    def alert(
        self,
        ep: Episode,
        at: float,
        host: str,
        kind: str,
        severity: str,
        value: float,
        *,
        status: str = "firing",
        root: bool = False,
    ) -> Alert:
        service = host.rsplit("-", 1)[0]
        value = round(value, 1)
        self.seq += 1
        a = Alert(
            at,
            service,
            host,
            kind,
            severity,
            value,
            _summary(kind, service, host, value),
            status,
            root,
            ep,
            self.seq,
        )
        ep.alerts.append(a)
        return a

    def firing(
        self,
        ep: Episode,
        start: float,
        end: float,
        host: str,
        kind: str,
        severity: str,
        value: float,
        *,
        root: bool = False,
        resolve: float = 0.6,
    ) -> None:
        """An alert firing from ``start`` to ``end``, re-sent while it lasts; resolved at
        the end with probability ``resolve``."""
        rng = self.rng
        at = start
        first = True
        while at < end or first:
            self.alert(
                ep, at, host, kind, severity, value * rng.uniform(0.97, 1.03), root=root and first
            )
            first = False
            # A lost notification now and then: the next one comes after the dedup window.
            at += rng.uniform(320, 500) if rng.random() < 0.04 else rng.uniform(60, 180)
        if rng.random() < resolve:
            self.alert(ep, end + rng.uniform(5, 60), host, kind, severity, value, status="resolved")

    def hosts(self, service: str, k: int) -> list[str]:
        pool = list(HOSTS[service])
        return self.rng.sample(pool, min(k, len(pool)))

    # -- episodes

    def cascade(self, t: float) -> Episode:
        rng = self.rng
        pick = rng.choices([n for n, _ in CASCADE_ROOTS], [w for _, w in CASCADE_ROOTS])[0]
        if pick == "db-1":
            host = "db-1"
        elif pick == "replica":
            host = rng.choice(("db-2", "db-3"))
        else:
            host = rng.choice(HOSTS[pick])
        service = host.rsplit("-", 1)[0]
        if ROLES.get(host) == "primary":
            ep = Episode(f"cascade:{host}", "page", "page")  # failover needs a human
        else:
            ep = Episode(f"cascade:{host}", "remediate", "restart_service")
        duration = rng.uniform(240, 720)
        self.firing(
            ep, t, t + duration, host, "service_down", "critical", 0, root=True, resolve=0.7
        )
        if ROLES.get(host) == "replica":
            # Reads fall back to the primary: slower, not broken.
            if rng.random() < 0.6:
                api = self.hosts("api", 1)[0]
                at = t + rng.uniform(10, 50)
                self.firing(
                    ep, at, t + duration, api, "latency_p99", "warning", rng.uniform(1600, 2500)
                )
            return ep
        # Every third cascade, one caller's alert is scraped before the root's.
        self.cascades += 1
        early = self.cascades % 3 == 2
        for depth, level in enumerate(callers(service), 1):
            if depth > 2:
                break
            for caller in level:
                for h in self.hosts(caller, rng.choice((1, 1, 2))):
                    if depth == 1 and early:
                        at, early = t - rng.uniform(2, 15), False
                    else:
                        at = t + (rng.uniform(5, 40) if depth == 1 else rng.uniform(20, 60))
                    if caller == "web":
                        kind, value = "latency_p99", rng.uniform(2500, 9000)
                    else:
                        kind, value = "error_rate_5xx", rng.uniform(8, 60)
                    self.firing(
                        ep,
                        at,
                        t + duration - rng.uniform(0, 60),
                        h,
                        kind,
                        "critical",
                        value,
                        resolve=0.5,
                    )
        return ep

    def single(
        self,
        t: float,
        name: str,
        host: str,
        kind: str,
        severity: str,
        value: float,
        decision: str,
        action: str,
        duration: float,
        *,
        incident: bool = True,
        resolve: float = 0.6,
    ) -> Episode:
        ep = Episode(name, decision, action, incident)
        self.firing(ep, t, t + duration, host, kind, severity, value, root=True, resolve=resolve)
        return ep

    def episode(self, kind: str, t: float) -> list[Episode]:
        rng = self.rng
        any_host = rng.choice([h for hs in HOSTS.values() for h in hs])
        if kind == "cascade":
            return [self.cascade(t)]
        if kind == "oom":
            host = rng.choice(HOSTS[rng.choice(("api", "worker", "web", "auth"))])
            return [
                self.single(
                    t,
                    "oom",
                    host,
                    "oom_kill",
                    "critical",
                    rng.randint(1, 3),
                    "remediate",
                    "restart_service",
                    rng.uniform(60, 240),
                )
            ]
        if kind == "crash_loop":
            host = rng.choice(HOSTS[rng.choice(("api", "worker"))])
            out = []
            for _ in range(3):
                out.append(
                    self.single(
                        t,
                        "crash_loop",
                        host,
                        "oom_kill",
                        "critical",
                        rng.randint(1, 4),
                        "remediate",
                        "restart_service",
                        rng.uniform(60, 200),
                    )
                )
                t += rng.uniform(15, 25) * 60
            return out
        if kind == "disk_full":
            sev, value = rng.choice(
                (("warning", rng.uniform(85, 94)), ("critical", rng.uniform(95, 99.5)))
            )
            return [
                self.single(
                    t,
                    "disk_full",
                    any_host,
                    "disk_full",
                    sev,
                    value,
                    "remediate",
                    "clear_disk",
                    rng.uniform(120, 600),
                )
            ]
        if kind == "cert_expiry":
            host = rng.choice(HOSTS[rng.choice(("web", "api", "auth"))])
            return [
                self.single(
                    t,
                    "cert_expiry",
                    host,
                    "cert_expiry",
                    "warning",
                    rng.randint(3, 14),
                    "remediate",
                    "renew_cert",
                    rng.uniform(60, 300),
                    resolve=0.2,
                )
            ]
        if kind == "cpu_saturation":
            if rng.random() < 0.2:
                return [
                    self.single(
                        t,
                        "cpu_saturation",
                        "db-1",
                        "cpu_high",
                        "critical",
                        rng.uniform(92, 99),
                        "page",
                        "page",
                        rng.uniform(180, 600),
                    )
                ]
            host = rng.choice(HOSTS[rng.choice(("web", "api", "worker"))])
            return [
                self.single(
                    t,
                    "cpu_saturation",
                    host,
                    "cpu_high",
                    "critical",
                    rng.uniform(92, 99),
                    "remediate",
                    "scale_out",
                    rng.uniform(180, 600),
                )
            ]
        if kind == "health_check":
            host = rng.choice(HOSTS[rng.choice(("web", "api", "auth", "cache"))])
            return [
                self.single(
                    t,
                    "health_check",
                    host,
                    "health_check",
                    "critical",
                    0,
                    "remediate",
                    "restart_service",
                    rng.uniform(120, 300),
                    resolve=0.8,
                )
            ]
        if kind == "flapping":
            host = rng.choice(HOSTS[rng.choice(("web", "api", "auth", "cache"))])
            ep = Episode("flapping", "ignore", "ignore")
            for cycle in range(rng.randint(3, 6)):
                self.alert(ep, t, host, "health_check", "critical", 0, root=cycle == 0)
                t += rng.uniform(15, 60)
                self.alert(ep, t, host, "health_check", "critical", 0, status="resolved")
                t += rng.uniform(20, 90)
            return [ep]
        if kind == "replica_lag":
            return [
                self.single(
                    t,
                    "replica_lag",
                    rng.choice(("db-2", "db-3")),
                    "replica_lag",
                    "critical",
                    rng.uniform(300, 900),
                    "page",
                    "page",
                    rng.uniform(300, 900),
                )
            ]
        if kind == "bad_deploy":
            service = rng.choice(("api", "web"))
            ep = Episode("bad_deploy", "page", "page")
            for i, h in enumerate(self.hosts(service, 2)):
                self.firing(
                    ep,
                    t + i * rng.uniform(5, 30),
                    t + rng.uniform(300, 900),
                    h,
                    "error_rate_5xx",
                    "critical",
                    rng.uniform(5, 40),
                    root=i == 0,
                )
            return [ep]
        if kind == "slow":
            host = rng.choice(HOSTS[rng.choice(("api", "web"))])
            return [
                self.single(
                    t,
                    "slow",
                    host,
                    "latency_p99",
                    "critical",
                    rng.uniform(2000, 6000),
                    "page",
                    "page",
                    rng.uniform(180, 600),
                )
            ]
        if kind == "blip":
            k = rng.choice(("cpu_high", "latency_p99", "error_rate_5xx", "replica_lag"))
            if k == "replica_lag":
                host, value = rng.choice(("db-2", "db-3")), rng.uniform(30, 120)
            elif k == "cpu_high":
                host, value = any_host, rng.uniform(80, 90)
            else:
                host = rng.choice(HOSTS[rng.choice(("api", "web"))])
                value = rng.uniform(600, 1400) if k == "latency_p99" else rng.uniform(2, 5)
            return [
                self.single(
                    t,
                    "blip",
                    host,
                    k,
                    "warning",
                    value,
                    "ignore",
                    "ignore",
                    rng.uniform(0, 90),
                    incident=False,
                    resolve=0.7,
                )
            ]
        if kind == "info":
            k, value = rng.choice(
                (
                    ("cpu_high", rng.uniform(60, 75)),
                    ("disk_full", rng.uniform(70, 80)),
                    ("cert_expiry", rng.randint(25, 45)),
                    ("latency_p99", rng.uniform(400, 900)),
                )
            )
            return [
                self.single(
                    t,
                    "info",
                    any_host,
                    k,
                    "info",
                    value,
                    "ignore",
                    "ignore",
                    0,
                    incident=False,
                    resolve=0.3,
                )
            ]
        raise ValueError(f"unknown episode kind {kind!r}")

    def maintenance(self) -> list[Episode]:
        """What planned work looks like from the monitoring side: the host goes down and
        its health check fails until the work is done."""
        rng = self.rng
        out = []
        for w in MAINTENANCE:
            start, end = epoch(w["start"]), epoch(w["end"])
            ep = Episode("maintenance", "ignore", "ignore", incident=False)
            down = start + rng.uniform(60, 600)
            up = min(end - 60, down + rng.uniform(300, 900))
            self.firing(
                ep, down, up, w["host"], "service_down", "critical", 0, root=True, resolve=1.0
            )
            self.firing(
                ep,
                down + rng.uniform(5, 40),
                up,
                w["host"],
                "health_check",
                "critical",
                0,
                resolve=1.0,
            )
            out.append(ep)
        return out

    # -- the whole stream

    def episodes(self, needed: int) -> list[Episode]:
        rng = self.rng
        t0 = START.timestamp()
        eps = self.maintenance()
        busy: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
        for ep in eps:
            self.occupy(busy, ep)
        total = sum(len(e.alerts) for e in eps)
        kinds, weights = list(EPISODES), list(EPISODES.values())
        while total < needed:
            at = t0 + rng.uniform(0, SPAN_S - 3600)
            drawn = self.episode(rng.choices(kinds, weights)[0], round(at))
            # The same check failing again within minutes of another episode is, to anyone
            # on call, the same problem: draw again rather than label it a second one.
            if any(self.clashes(busy, ep) for ep in drawn):
                continue
            for ep in drawn:
                self.occupy(busy, ep)
                eps.append(ep)
                total += len(ep.alerts)
        return eps

    @staticmethod
    def spans(ep: Episode) -> dict[tuple[str, str, str], tuple[float, float]]:
        out: dict[tuple[str, str, str], tuple[float, float]] = {}
        for a in ep.alerts:
            lo, hi = out.get(a.fingerprint, (a.at, a.at))
            out[a.fingerprint] = (min(lo, a.at), max(hi, a.at))
        return out

    def clashes(
        self, busy: dict[tuple[str, str, str], list[tuple[float, float]]], ep: Episode
    ) -> bool:
        return any(
            lo - APART_S < end and start < hi + APART_S
            for fp, (lo, hi) in self.spans(ep).items()
            for start, end in busy.get(fp, ())
        )

    def occupy(
        self, busy: dict[tuple[str, str, str], list[tuple[float, float]]], ep: Episode
    ) -> None:
        for fp, span in self.spans(ep).items():
            busy.setdefault(fp, []).append(span)

    def label(self, eps: list[Episode]) -> None:
        """What the calendar and the policy make of each incident, in the order they began:
        anything rooted on a host under maintenance is ignored; remediations during a freeze
        and too many repeats become pages."""
        history: dict[tuple[str, str], list[float]] = {}
        for ep in sorted(eps, key=lambda e: (e.root.at, e.root.seq)):
            root = ep.root
            if ep.name != "maintenance" and in_window(MAINTENANCE, root.at, root.host):
                ep.decision, ep.action, ep.incident = "ignore", "ignore", False
                ep.name = f"{ep.name}:maintenance"
            if ep.decision != "remediate":
                continue
            done = history.setdefault((ep.action, root.host), [])
            if sum(1 for t in done if root.at - t <= REPEAT_WINDOW_S) >= MAX_REPEATS:
                ep.decision, ep.action, ep.name = "page", "page", f"{ep.name}:repeated"
                continue
            done.append(root.at)
            if in_window(FREEZES, root.at):
                ep.decision, ep.action, ep.name = "page", "page", f"{ep.name}:freeze"

    def records(self) -> Iterator[dict[str, Any] | str]:
        """Every line of the file, in order: a record, or the raw text of a broken one."""
        n_bad = min(len(MALFORMED), max(1, self.count // 160))
        eps = self.episodes(self.count - n_bad)
        self.label(eps)
        alerts = sorted((a for e in eps for a in e.alerts), key=lambda a: (a.at, a.seq))
        alerts = alerts[: self.count - n_bad]
        bad = dict(
            zip(
                sorted(self.rng.sample(range(self.count // 10, self.count), n_bad)),
                MALFORMED[:n_bad],
                strict=True,
            )
        )
        incidents: dict[int, str] = {}
        state: dict[tuple[int, tuple[str, str, str]], str] = {}
        it = iter(alerts)
        for slot in range(self.count):
            if slot in bad:
                yield self.malformed(slot, bad[slot])
                continue
            a = next(it)
            ep = a.episode
            assert ep is not None
            key = (id(ep), a.fingerprint)
            duplicate = a.status == "firing" and state.get(key) == "firing"
            state[key] = a.status
            incident = None
            decision, action = ep.decision, ep.action
            if in_window(MAINTENANCE, a.at, a.host):  # silenced, whatever it belongs to
                decision, action = "ignore", "ignore"
            elif ep.incident:
                incident = incidents.setdefault(id(ep), f"INC-{len(incidents) + 1:03d}")
            yield {
                "id": f"a-{slot + 1:05d}",
                "ts": iso(a.at),
                "source": SOURCE[a.kind],
                "service": a.service,
                "host": a.host,
                "kind": a.kind,
                "severity": a.severity,
                "status": a.status,
                "value": a.value,
                "summary": a.summary,
                "labels": {"env": "prod", "team": TEAM[a.service]}
                | ({"role": ROLES[a.host]} if a.host in ROLES else {}),
                "expected": {
                    "incident": incident,
                    "decision": decision,
                    "action": action,
                    "duplicate": duplicate,
                    "root": a.root,
                },
            }

    def malformed(self, slot: int, kind: str) -> dict[str, Any] | str:
        if kind == "html":
            return "<html><body><h1>502 Bad Gateway</h1></body></html>"
        rec: dict[str, Any] = {
            "id": f"a-{slot + 1:05d}",
            "ts": iso(START.timestamp() + slot * SPAN_S / self.count),
            "source": "prometheus",
            "service": "api",
            "host": "api-1",
            "kind": "error_rate_5xx",
            "severity": "critical",
            "status": "firing",
            "value": 12.5,
            "summary": "api on api-1: 5xx rate 12.5% (> 2%)",
            "labels": {"env": "prod", "team": "platform"},
            "expected": {
                "incident": None,
                "decision": "reject",
                "action": "reject",
                "duplicate": False,
                "root": False,
            },
        }
        if kind == "truncated":
            text = json.dumps(rec)
            return text[: len(text) // 2]
        if kind == "bad_ts":
            rec["ts"] = "Mon May  6 14:03:11 2024"
        elif kind == "no_service":
            del rec["service"]
        elif kind == "bad_severity":
            rec["severity"] = "sev1"
        return rec


def records(seed: int = 11, count: int = 800) -> list[dict[str, Any] | str]:
    """The stream as records (and the raw text of the lines that are not JSON objects)."""
    if count < 10:
        raise ValueError("count must be >= 10")
    return list(Generator(seed, count).records())


def generate(seed: int = 11, count: int = 800) -> str:
    """The stream as JSON-lines text."""
    return "".join(
        (r if isinstance(r, str) else json.dumps(r, separators=(",", ":"))) + "\n"
        for r in records(seed, count)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--count", type=int, default=800)
    parser.add_argument("-o", "--output", default="-", help="file to write; '-' for stdout")
    args = parser.parse_args(argv)
    text = generate(args.seed, args.count)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8", newline="\n")
    return 0
