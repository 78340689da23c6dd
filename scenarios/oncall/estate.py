"""The estate the on-call team looks after: services, hosts, who calls whom, and the change
calendar (maintenance windows, change freezes).

Both sides read it: the alert generator (``oncall.alerts``) to make cascades travel along the
real dependencies and to label alerts inside a maintenance window, and the team, whose
Correlator takes the dependency graph and whose Decider and Guardian take the calendar from
``scenarios/oncall.yaml``. A test checks that the scenario's copy is this one, so the team is
judged against the world the data came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

__all__ = [
    "DEPENDS_ON",
    "FREEZES",
    "HOSTS",
    "MAINTENANCE",
    "ROLES",
    "SERVICES",
    "START",
    "callers",
    "depends_on",
    "epoch",
    "in_window",
    "iso",
]

#: Hosts per service.
HOSTS: dict[str, tuple[str, ...]] = {
    "web": ("web-1", "web-2", "web-3", "web-4"),
    "api": ("api-1", "api-2", "api-3"),
    "auth": ("auth-1", "auth-2"),
    "db": ("db-1", "db-2", "db-3"),
    "cache": ("cache-1", "cache-2"),
    "queue": ("queue-1", "queue-2"),
    "worker": ("worker-1", "worker-2", "worker-3"),
}
SERVICES: tuple[str, ...] = tuple(HOSTS)

#: The one host with a role that matters to policy: failing over the primary loses writes
#: in flight, so a human decides.
ROLES: dict[str, str] = {"db-1": "primary", "db-2": "replica", "db-3": "replica"}

#: Caller -> the services it calls. A fault travels the other way: when the db is down,
#: api (which calls it) fails next, then web (which calls api).
DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "web": ("api", "auth"),
    "api": ("db", "cache", "queue", "auth"),
    "auth": ("db", "cache"),
    "worker": ("queue", "db"),
    "db": (),
    "cache": (),
    "queue": (),
}

#: The first second of the generated stream; the calendar below is within its two days.
START = datetime(2024, 5, 6, 0, 0, tzinfo=UTC)

#: Planned work, per host: alerts from a host inside its window are expected and ignored.
MAINTENANCE: tuple[dict[str, str], ...] = (
    {
        "host": "db-3",
        "start": "2024-05-06T03:00:00Z",
        "end": "2024-05-06T04:00:00Z",
        "reason": "replica rebuild",
    },
    {
        "host": "cache-2",
        "start": "2024-05-06T14:00:00Z",
        "end": "2024-05-06T14:30:00Z",
        "reason": "redis upgrade",
    },
    {
        "host": "web-4",
        "start": "2024-05-07T02:00:00Z",
        "end": "2024-05-07T02:45:00Z",
        "reason": "kernel patch reboot",
    },
    {
        "host": "queue-1",
        "start": "2024-05-07T21:00:00Z",
        "end": "2024-05-07T21:40:00Z",
        "reason": "broker upgrade",
    },
)

#: Change freezes: no automatic change of any kind; whatever needs doing, a human does.
FREEZES: tuple[dict[str, str], ...] = (
    {
        "start": "2024-05-07T12:00:00Z",
        "end": "2024-05-07T18:00:00Z",
        "reason": "release 24.19 freeze",
    },
)


def epoch(ts: str) -> float:
    """Seconds since the epoch of an ISO-8601 time (``Z`` or an offset); the team reasons in
    the alerts' own time, never the machine's clock, so a run and its replay agree."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def iso(seconds: float) -> str:
    """The ISO-8601 UTC time (whole seconds, ``Z``) of epoch ``seconds``."""
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def in_window(windows: Iterable[Mapping[str, str]], at: float, host: str | None = None) -> str:
    """The reason of the first window holding time ``at`` (and ``host``, for windows that
    name one), or ``""`` when none does."""
    for w in windows:
        if host is not None and w.get("host") not in (None, host):
            continue
        if epoch(w["start"]) <= at < epoch(w["end"]):
            return w.get("reason") or "window"
    return ""


def depends_on(service: str, graph: Mapping[str, Iterable[str]] = DEPENDS_ON) -> set[str]:
    """Every service ``service`` calls, directly or through others."""
    seen: set[str] = set()
    todo = list(graph.get(service, ()))
    while todo:
        s = todo.pop()
        if s not in seen:
            seen.add(s)
            todo.extend(graph.get(s, ()))
    return seen


def callers(service: str, graph: Mapping[str, Iterable[str]] = DEPENDS_ON) -> list[list[str]]:
    """The services that call ``service``, by distance: ``[[direct callers], [their
    callers], ...]``, each service at its shortest distance, sorted within a level."""
    levels: list[list[str]] = []
    seen = {service}
    frontier = [service]
    while frontier:
        near = set(frontier)
        nxt = sorted({c for c, deps in graph.items() if c not in seen and near & set(deps)})
        if not nxt:
            break
        levels.append(nxt)
        seen.update(nxt)
        frontier = nxt
    return levels
