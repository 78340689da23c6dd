"""The on-call team's own agents, on Pantheon's public API only.

    Observer -> Dedup -> Correlator -> Decider -> Guardian -> Actor -> Scorer

The Observer, Guardian and Actor are the built-in roles: the Observer publishes the
scenario's JSONL input with the ground truth taken out (``alert_problem`` rejects what cannot
be triaged), the Guardian applies :class:`oncall.policy.OnCallPolicy` and the Actor calls
:mod:`oncall.tools`.

Every alert goes the whole way and comes out as one ``action.executed``: its disposition
(page, remediate with a runbook action, ignore), whatever the Actor did about it, and the
incident the team filed it under, which the Scorer compares with the ground truth.

Why the chain is a chain: Dedup, Correlator and Decider keep state, and each has one
subscription fed by one agent that handles one message at a time, so each sees the alerts in
stream order on every run and on replay. They reason in the alerts' own time (``ts``), never
the machine's clock. That is what makes the team's decisions the same run after run, and a
recorded session replay exactly without a single effect for their state.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from agents import Agent, AgentSettings, Learner
from bus import Envelope
from oncall.estate import DEPENDS_ON, depends_on, epoch
from oncall.policy import RUNBOOK, Rule

__all__ = ["Correlator", "Decider", "Dedup", "MaintenanceWindow", "Scorer", "alert_problem"]

SEVERITIES = ("info", "warning", "critical")
STATUSES = ("firing", "resolved")
_REQUIRED = ("id", "ts", "service", "host", "kind", "severity", "status")


def alert_problem(record: Mapping[str, Any]) -> str | None:
    """Why a record of the alert stream cannot be triaged, or ``None`` when it can.

    The scenario's ``input.validate``: the Observer publishes a record it rejects on
    ``observation.alert.malformed`` (with its label, for the Scorer) instead of handing the
    team an alert without a host or a time that is not a time.
    """
    for key in _REQUIRED:
        if not isinstance(record.get(key), str) or not record[key]:
            return f"missing or empty field {key!r}"
    if record["severity"] not in SEVERITIES:
        return f"severity {record['severity']!r} is not one of {', '.join(SEVERITIES)}"
    if record["status"] not in STATUSES:
        return f"status {record['status']!r} is not one of {', '.join(STATUSES)}"
    try:
        epoch(record["ts"])
    except ValueError:
        return f"ts {record['ts']!r} is not an ISO-8601 time"
    return None


# -- Dedup -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Track:
    """What Dedup remembers of one fingerprint."""

    last: float
    open_id: str | None = None
    resolved_at: float | None = None
    refires: deque[float] = field(default_factory=lambda: deque(maxlen=16))


class Dedup(Agent):
    """Tells a new alert from a re-notification of one already firing, and spots flapping.

    Alerts with the same ``fingerprint`` fields are one alert: a firing within ``window_s``
    of the previous one, with no resolve between, is a duplicate (``alert.duplicate``); a
    resolve is ``alert.resolved``; anything else is ``alert.new``, marked ``resumed`` when it
    comes within ``pause_s`` of the last firing with no resolve between (a notification was
    lost; the alert never stopped). A check that fires again soon after it resolved,
    ``flap_after`` times within ``flap_window_s``, is flapping, and every alert of it says
    so until it settles. All of them go on, marked, so the team still accounts for every
    alert. At most ``max_fingerprints`` are remembered, the least recently seen forgotten
    first (its next alert then counts as new).
    """

    role = "dedup"
    subscriptions = ("observation.alert.received",)

    class Settings(AgentSettings):
        window_s: Annotated[float, Field(gt=0)] = 300.0
        """A firing this soon after the fingerprint's last one is a duplicate."""
        pause_s: Annotated[float, Field(gt=0)] = 600.0
        """A firing past ``window_s`` but this soon, with no resolve between, is resumed."""
        flap_window_s: Annotated[float, Field(gt=0)] = 600.0
        flap_after: Annotated[int, Field(ge=1)] = 2
        """Re-firings after a resolve, within ``flap_window_s``, that make a check flapping."""
        fingerprint: tuple[str, ...] = ("service", "host", "kind")
        max_fingerprints: Annotated[int, Field(ge=1)] = 10_000

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._tracks: OrderedDict[str, _Track] = OrderedDict()
        self.duplicates = 0

    async def handle(self, env: Envelope) -> None:
        await self.emit(*self.classify(env.payload))

    def classify(self, alert: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """The topic and payload for one alert; updates what is remembered of its
        fingerprint."""
        s = self.settings
        at = epoch(alert["ts"])
        fp = "/".join(str(alert.get(f, "")) for f in s.fingerprint)
        track = self._tracks.get(fp)
        if track is None:
            track = self._tracks[fp] = _Track(at)
            if len(self._tracks) > s.max_fingerprints:
                self._tracks.popitem(last=False)
        else:
            self._tracks.move_to_end(fp)
        first = track.open_id
        resumed = False
        if alert["status"] == "resolved":
            topic = "alert.resolved"
            track.open_id, track.resolved_at = None, at
        elif first is not None and at - track.last <= s.window_s:
            topic = "alert.duplicate"
            self.duplicates += 1
        else:
            topic, first = "alert.new", None
            if track.open_id is not None:
                resumed = at - track.last <= s.pause_s
            elif track.resolved_at is not None and at - track.resolved_at <= s.flap_window_s:
                track.refires.append(at)  # back soon after a resolve
            track.open_id = alert["id"]
        track.last = at
        flapping = sum(1 for t in track.refires if at - t <= s.flap_window_s) >= s.flap_after
        return topic, {
            **alert,
            "fingerprint": fp,
            "duplicate": topic == "alert.duplicate",
            "first": first,
            "resumed": resumed,
            "flapping": flapping,
        }


# -- Correlator --------------------------------------------------------------------------------


class MaintenanceWindow(BaseModel):
    """Planned work on ``host`` from ``start`` to ``end`` (ISO-8601)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    start: str
    end: str
    reason: str = "maintenance"


# How much an alert of each kind says about the cause, among alerts of one service: a service
# that is down explains its own errors, and errors explain slowness.
_CAUSAL_RANK = {"service_down": 3, "error_rate_5xx": 2, "latency_p99": 1}
_ROOT_FIELDS = ("id", "ts", "service", "host", "kind", "severity", "summary", "labels")


@dataclass(slots=True)
class _Incident:
    id: str
    root: dict[str, Any]
    last: float
    services: set[str] = field(default_factory=set)
    symptomatic: set[str] = field(default_factory=set)
    size: int = 0
    flapping: bool = False


class Correlator(Agent):
    """Files every alert under an incident, so one outage is one page, not thirty.

    Alerts from a host inside one of its ``maintenance`` windows are silenced first: filed
    under nothing, with the reason, before they can join (or start) a real incident, as
    silences work in an alert manager. Info alerts are filed under nothing too. Any other
    alert joins, in this order: the incident its fingerprint is already in (a duplicate, a
    resolve, an alert that kept firing, or the same check firing again within ``window_s``
    of the incident's last alert); else, if it is a
    ``symptoms`` kind, an incident active within ``window_s`` whose symptomatic services it
    calls or is called by (``depends_on``), so db down, api 5xx and web latency within a
    minute are one incident; else it opens one. The incident's root is the alert that best
    explains it: one on a service the others depend on, or a more telling kind on the same
    service; it moves when such an alert arrives late.

    An incident idle for ``close_after_s`` is closed; at most ``max_open`` stay open, the
    longest idle closed first. Publishes ``incident.alert`` for every alert.
    """

    role = "correlator"
    subscriptions = ("alert.*",)

    class Settings(AgentSettings):
        window_s: Annotated[float, Field(gt=0)] = 120.0
        """How close in time related alerts must be to be one incident."""
        close_after_s: Annotated[float, Field(gt=0)] = 1800.0
        symptoms: tuple[str, ...] = ("service_down", "error_rate_5xx", "latency_p99")
        """Alert kinds that travel along dependencies (a resource alert stays on its host)."""
        depends_on: dict[str, tuple[str, ...]] = Field(default_factory=lambda: dict(DEPENDS_ON))
        """Caller -> the services it calls."""
        maintenance: tuple[MaintenanceWindow, ...] = ()
        """The change calendar's planned work, per host."""
        max_open: Annotated[int, Field(ge=1)] = 1000

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._maintenance = [
            (w.host, epoch(w.start), epoch(w.end), w.reason) for w in self.settings.maintenance
        ]
        graph = self.settings.depends_on
        self._calls = {s: set(deps) for s, deps in graph.items()}
        self._upstream = {s: depends_on(s, graph) for s in graph}
        self._open: OrderedDict[str, _Incident] = OrderedDict()  # least recently active first
        self._by_fp: dict[str, str] = {}
        self.opened = 0

    async def handle(self, env: Envelope) -> None:
        await self.emit("incident.alert", self.file(env.payload))

    @property
    def open_incidents(self) -> list[str]:
        """The ids of the incidents still open, the longest idle first."""
        return list(self._open)

    def file(self, alert: Mapping[str, Any]) -> dict[str, Any]:
        """The incident ``alert`` belongs to, as the ``incident.alert`` payload."""
        s = self.settings
        at = epoch(alert["ts"])
        self._close_idle(at)
        out: dict[str, Any] = {
            "alert": dict(alert),
            "incident": None,
            "root": None,
            "opened": False,
            "root_changed": False,
            "flapping": False,
        }
        host = alert["host"]
        for where, start, end, reason in self._maintenance:
            if where == host and start <= at < end:
                return out | {"silenced": f"{host} under maintenance: {reason}"}
        if alert["severity"] == "info":
            return out | {"silenced": "info"}
        fp = alert["fingerprint"]
        inc = self._open.get(self._by_fp.get(fp, ""))
        back = alert["status"] == "firing" and not alert["duplicate"] and not alert["resumed"]
        if inc is not None and back and at - inc.last > s.window_s:
            inc = None  # the same check firing again after a resolve, long after: a new problem
        if inc is None and alert["status"] == "resolved":
            return out | {"silenced": "resolves nothing open"}
        if inc is None and alert["kind"] in s.symptoms:
            inc = self._related(alert, at)
        opened = root_changed = False
        if inc is None:
            self.opened += 1
            inc = _Incident(f"I-{self.opened:04d}", self._root(alert), at)
            self._open[inc.id] = inc
            if len(self._open) > s.max_open:
                self._forget(next(iter(self._open)))
            opened = True
        elif self._explains(alert, inc.root):
            inc.root = self._root(alert)
            root_changed = True
        self._open.move_to_end(inc.id)
        self._by_fp[fp] = inc.id
        inc.last = max(inc.last, at)
        inc.size += 1
        inc.services.add(alert["service"])
        if alert["kind"] in s.symptoms:
            inc.symptomatic.add(alert["service"])
        inc.flapping = inc.flapping or bool(alert.get("flapping"))
        return out | {
            "silenced": "",
            "incident": inc.id,
            "root": inc.root,
            "opened": opened,
            "root_changed": root_changed,
            "flapping": inc.flapping,
            "services": sorted(inc.services),
            "size": inc.size,
        }

    def _related(self, alert: Mapping[str, Any], at: float) -> _Incident | None:
        service = alert["service"]
        calls = self._calls.get(service, set())
        for inc in reversed(self._open.values()):  # most recently active first
            if at - inc.last > self.settings.window_s:
                break
            for other in inc.symptomatic:
                if other == service or other in calls or service in self._calls.get(other, ()):
                    return inc
        return None

    def _explains(self, alert: Mapping[str, Any], root: Mapping[str, Any]) -> bool:
        if alert["status"] != "firing" or alert["kind"] not in self.settings.symptoms:
            return False
        if alert["service"] != root["service"]:
            return alert["service"] in self._upstream.get(root["service"], ())
        return _CAUSAL_RANK.get(alert["kind"], 0) > _CAUSAL_RANK.get(root["kind"], 0)

    @staticmethod
    def _root(alert: Mapping[str, Any]) -> dict[str, Any]:
        return {k: alert.get(k) for k in _ROOT_FIELDS}

    def _close_idle(self, at: float) -> None:
        horizon = at - self.settings.close_after_s
        while self._open:
            inc = next(iter(self._open.values()))
            if inc.last >= horizon:
                break
            self._forget(inc.id)

    def _forget(self, incident_id: str) -> None:
        del self._open[incident_id]
        # Fingerprints pointing at a closed incident fall through `_open.get` as unknown.
        if len(self._by_fp) > 4 * self.settings.max_open:
            self._by_fp = {fp: i for fp, i in self._by_fp.items() if i in self._open}


# -- Decider -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Decision:
    basis: tuple[str, str, str]  # the runbook's (decision, action, target host)
    decision: str
    action: str
    why: str
    decided_at: str


class Decider(Agent):
    """Decides what each incident calls for, from its root alert: page, remediate with a
    runbook action, or ignore.

    Ignored: alerts the Correlator filed under no incident (silenced), flapping checks, and
    whatever the ``runbook`` (first matching rule) says is noise. A remediation that ran
    ``max_repeats`` times on the same host within ``repeat_window_s`` did not work: page
    instead. Decided again whenever the incident's root moves; each change carries the steps
    that start it (a page, a runbook action), and every other alert of the incident is
    covered by the decision in force, with no steps. Publishes ``decision.proposed`` per
    alert, for the Guardian.
    """

    role = "decider"
    subscriptions = ("incident.alert",)

    class Settings(AgentSettings):
        runbook: tuple[Rule, ...] = RUNBOOK
        max_repeats: Annotated[int, Field(ge=1)] = 2
        repeat_window_s: Annotated[float, Field(gt=0)] = 3600.0
        max_incidents: Annotated[int, Field(ge=1)] = 10_000
        """Incidents whose decision is remembered, the least recently active forgotten."""

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._current: OrderedDict[str, _Decision] = OrderedDict()
        self._history: dict[tuple[str, str], deque[float]] = {}

    async def handle(self, env: Envelope) -> None:
        await self.emit("decision.proposed", self.propose(env.payload))

    def evaluate(self, root: Mapping[str, Any], flapping: bool) -> tuple[str, str, str]:
        """(decision, action, why) for an incident with this root, before any history."""
        if flapping:
            return "ignore", "ignore", f"{root['kind']} on {root['host']} is flapping"
        for rule in self.settings.runbook:
            if rule.matches(root):
                action = rule.action or rule.decision
                return rule.decision, action, f"runbook: {root['kind']} {root['severity']}"
        return "ignore", "ignore", "no runbook rule"

    def propose(self, filed: Mapping[str, Any]) -> dict[str, Any]:
        """The ``decision.proposed`` payload for one filed alert."""
        alert, incident, root = filed["alert"], filed["incident"], filed["root"]
        base = {
            "alert_id": alert["id"],
            "ts": alert["ts"],
            "incident": incident,
            "duplicate": alert["duplicate"],
            "service": alert["service"],
            "host": alert["host"],
            "kind": alert["kind"],
            "status": alert["status"],
        }
        if incident is None:
            why = f"silenced: {filed['silenced']}"
            target = {"service": alert["service"], "host": alert["host"], "role": None}
            return base | {
                "root": None,
                "decision": "ignore",
                "action": "ignore",
                "why": why,
                "target": target,
                "decided_at": alert["ts"],
                "summary": alert.get("summary", ""),
                "steps": [],
            }
        labels = root.get("labels") or {}
        target = {"service": root["service"], "host": root["host"], "role": labels.get("role")}
        decision, action, why = self.evaluate(root, filed["flapping"])
        basis = (decision, action, root["host"])
        prev = self._current.get(incident)
        steps: list[dict[str, Any]] = []
        if prev is None or prev.basis != basis:
            if decision == "remediate":
                decision, why = self._check_repeats(action, root["host"], alert["ts"], why)
                action = action if decision == "remediate" else "page"
            changed = prev is None or (prev.decision, prev.action) != (decision, action)
            if changed and decision != "ignore":
                step = {
                    "tool": action,
                    "incident": incident,
                    "service": root["service"],
                    "host": root["host"],
                }
                if action == "page":
                    step |= {"summary": root.get("summary", ""), "why": why}
                steps.append(step)
            decided_at = alert["ts"] if changed or prev is None else prev.decided_at
            prev = self._current[incident] = _Decision(basis, decision, action, why, decided_at)
            if len(self._current) > self.settings.max_incidents:
                self._current.popitem(last=False)
        self._current.move_to_end(incident)
        return base | {
            "root": root["id"],
            "decision": prev.decision,
            "action": prev.action,
            "why": prev.why,
            "target": target,
            "decided_at": prev.decided_at,
            "summary": root.get("summary", ""),
            "steps": steps,
        }

    def _check_repeats(self, action: str, host: str, ts: str, why: str) -> tuple[str, str]:
        at = epoch(ts)
        s = self.settings
        done = self._history.setdefault((action, host), deque(maxlen=s.max_repeats))
        recent = sum(1 for t in done if at - t <= s.repeat_window_s)
        if recent >= s.max_repeats:
            minutes = s.repeat_window_s / 60
            return "page", f"{action} on {host} already ran {recent} times in {minutes:.0f} min"
        done.append(at)
        return "remediate", why


# -- Scorer ------------------------------------------------------------------------------------


def _pairs(n: int) -> int:
    return n * (n - 1) // 2


class Scorer(Learner):
    """Scores every alert's disposition against the stream's ground truth (the input's
    ``label`` field, which the Observer files for every Learner), for the run summary.

    ``action_accuracy``: the disposition is the right one (page, ignore, or remediate with
    the right runbook action); ``decision_accuracy``: page/remediate/ignore right, whatever
    the action; ``dedup_accuracy``: duplicate or not, right. Grouping is scored pairwise over
    the alerts that belong to a real incident (precision: alerts filed together that belong
    together; recall: the other way round). Pages are counted per real incident: ``missed``
    ones needed a page and got none, ``false`` ones went out for alerts that needed none.

    It only scores: the Learner's threshold tuning has nothing to tune here, since the
    Decider's runbook is policy, not a model's confidence.
    """

    subscriptions = ("action.executed", "observation.alert.malformed")

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.correct: Counter[str] = Counter()
        self.mistakes: Counter[str] = Counter()
        self.executed: Counter[str] = Counter()
        self._together: Counter[tuple[str, str]] = Counter()  # (true incident, team's)
        self._truth_sizes: Counter[str] = Counter()
        self._team_sizes: Counter[str] = Counter()
        self._team_incidents: set[str] = set()
        self._need_page: set[str] = set()
        self._paged: set[str] = set()
        self._false_pages = 0
        self._triaged = 0

    def observe(self, topic: str, outcome: Mapping[str, Any]) -> list[dict[str, Any]]:
        # An outcome names its alert; a malformed input names the record by its ``key``.
        key = outcome["alert_id"] if "alert_id" in outcome else outcome.get("key")
        label = self.labels.get(str(key))
        if label is None:
            self.unlabelled += 1
            return []
        self.scored += 1
        want = str(label["action"])
        if topic == "observation.alert.malformed":
            self._count(want, "reject", want == "reject", label.get("decision") == "reject")
            return []
        got = str(outcome["action"])
        self._count(want, got, got == want, outcome["decision"] == label.get("decision"))
        self._triaged += 1
        self.correct["dedup"] += bool(outcome["duplicate"]) == bool(label["duplicate"])
        if outcome["incident"] is not None:
            self._team_incidents.add(outcome["incident"])
        truth = label.get("incident")
        if truth is not None:
            if want == "page":
                self._need_page.add(truth)
            # An alert filed under nothing is a group of its own.
            team = outcome["incident"] or f"alone:{outcome['alert_id']}"
            self._together[(truth, team)] += 1
            self._truth_sizes[truth] += 1
            self._team_sizes[team] += 1
        for result in outcome["results"]:
            if result.get("status") != "done":
                continue
            self.executed[result["tool"]] += 1
            if result["tool"] == "page":
                if want == "page" and truth is not None:
                    self._paged.add(truth)
                elif want != "page":
                    self._false_pages += 1
        return []

    def _count(self, want: str, got: str, action_ok: bool, decision_ok: bool) -> None:
        self.correct["action"] += action_ok
        self.correct["decision"] += decision_ok
        if not action_ok:
            self.mistakes[f"{want} -> {got}"] += 1

    def report(self) -> dict[str, Any]:
        n, m = self.scored, self._triaged
        together = sum(_pairs(k) for k in self._together.values())
        filed = sum(
            _pairs(k) for team, k in self._team_sizes.items() if not team.startswith("alone:")
        )
        belong = sum(_pairs(k) for k in self._truth_sizes.values())
        return {
            "scored": n,
            "unlabelled": self.unlabelled,
            "action_accuracy": self.correct["action"] / n if n else None,
            "decision_accuracy": self.correct["decision"] / n if n else None,
            "dedup_accuracy": self.correct["dedup"] / m if m else None,
            "grouping_precision": together / filed if filed else None,
            "grouping_recall": together / belong if belong else None,
            "incidents": {"real": len(self._truth_sizes), "filed": len(self._team_incidents)},
            "pages": {
                "needed": len(self._need_page),
                "sent": self.executed["page"],
                "missed": len(self._need_page - self._paged),
                "false": self._false_pages,
            },
            "executed": dict(sorted(self.executed.items())),
            "mistakes": dict(self.mistakes.most_common(10)),
        }
