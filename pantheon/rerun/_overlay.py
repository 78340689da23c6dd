"""Overlays: a small YAML file of changes laid over a recorded scenario, for what-if replay.

An overlay is a partial scenario. It is merged over the scenario text a session recorded,
and the result is validated as a whole scenario, so every mistake is reported before
anything runs, at the overlay's own ``file:line:column``::

    # changes.yaml: try a higher refund limit and a stricter Reasoner
    policy:
      refund_limit: 500
    agents:
      reasoner:
        settings: {threshold: 0.5}
      learner:
        enabled: false            # an agent removed
    add_agents:
      audit:                      # an agent added (a name the recorded team does not have)
        class: "myteam.agents:Audit"
        subscribe: [guardian.decision]

How it merges: a mapping is merged key by key, recursively (what the overlay does not
name is kept as recorded); anything else, lists included, replaces the recorded value whole
(to add a pattern to ``provider.rules.spam``, give the whole list). ``agents`` may only
name agents the recorded team has (``enabled: false`` removes one); ``add_agents`` may only
name new ones. ``input`` and ``transport`` cannot change: a what-if replay feeds the
recorded inputs to a team on one in-process bus.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pantheon.scenario import (
    MAX_SCENARIO_BYTES,
    Problem,
    Scenario,
    ScenarioError,
    parse_scenario,
)
from pantheon.scenario.internals import (
    Loc,
    agent_class,
    dotted,
    locate,
    read_marked,
    suggest,
)

__all__ = ["FIXED_SECTIONS", "Overlay", "agent_fingerprints", "apply_overlay", "read_overlay"]

#: Sections an overlay may not change, and why (said in the error).
FIXED_SECTIONS = {
    "input": "a what-if replay feeds the recorded inputs; run the scenario to try other input",
    "transport": "a what-if replay runs the team on one in-process bus",
    "version": "the scenario version is the recorded one's",
}


@dataclass(frozen=True, slots=True)
class Overlay:
    """A validated overlay: its text and source, the merged scenario text and the
    :class:`~pantheon.scenario.Scenario` it makes."""

    text: str
    source: str
    merged_text: str
    scenario: Scenario


def read_overlay(path: str | Path) -> str:
    """The overlay file's text (at most :data:`MAX_SCENARIO_BYTES`), as a one-line
    :class:`ScenarioError` naming the file when it is too large or not UTF-8."""
    path = Path(path)
    with path.open("rb") as stream:
        raw = stream.read(MAX_SCENARIO_BYTES + 1)
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ScenarioError([Problem(str(path), 1, 1, "", "too large for an overlay")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError([Problem(str(path), 1, 1, "", "not UTF-8 text")]) from None


def _parse(text: str, source: str) -> tuple[Any, dict[Loc, tuple[int, int]]]:
    """The overlay's data and the position of every key path in it."""
    data, marks, duplicates = read_marked(
        text,
        source,
        empty="the overlay is empty (write {} to replay with no change)",
        what="overlay",
    )
    if duplicates:
        raise ScenarioError(duplicates)
    return data, marks


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    return over


def apply_overlay(
    recorded_text: str,
    overlay_text: str,
    *,
    source: str = "<overlay>",
    base_dir: Path | None = None,
) -> Overlay:
    """Merge ``overlay_text`` over ``recorded_text`` (see the module docstring) and
    validate the result. Raises :class:`ScenarioError` whose problems are located in the
    overlay (``source:line:column: field: message``), also for a problem the merged
    scenario has, at the overlay key that caused it (line 1 when no key of the overlay
    is to blame, e.g. an expectation about an agent the overlay removed)."""
    data, marks = _parse(overlay_text, source)

    def problem(loc: Loc, message: str) -> Problem:
        return Problem(source, *locate(marks, loc), dotted(loc), message)

    if not isinstance(data, Mapping):
        raise ScenarioError(
            [problem((), f"an overlay is a mapping of scenario keys, not a {type(data).__name__}")]
        )
    recorded = yaml.safe_load(recorded_text)
    if not isinstance(recorded, Mapping):
        raise ScenarioError([problem((), "the recorded scenario is not a mapping")])
    problems: list[Problem] = []
    for key, why in FIXED_SECTIONS.items():
        if key in data:
            problems.append(problem((key,), f"cannot change in a what-if replay: {why}"))
    known = recorded.get("agents") or {}
    agents = data.get("agents")
    added = data.get("add_agents")
    for section, value in (("agents", agents), ("add_agents", added)):
        if value is not None and not isinstance(value, Mapping):
            problems.append(problem((section,), "should be a mapping of agent names"))
    if isinstance(agents, Mapping):
        for name, cfg in agents.items():
            if name not in known:
                have = ", ".join(sorted(map(str, known))) or "none"
                problems.append(
                    problem(
                        ("agents", name),
                        f"no agent {name!r} in the recorded team{suggest(str(name), known)} "
                        f"(it has {have}); a new agent goes under add_agents",
                    )
                )
            elif cfg is not None and not isinstance(cfg, Mapping):
                problems.append(problem(("agents", name), "should be a mapping of agent keys"))
    if isinstance(added, Mapping):
        problems.extend(
            problem(
                ("add_agents", name),
                f"the recorded team already has an agent {name!r}; change it under agents",
            )
            for name in added
            if name in known
        )
    if problems:
        raise ScenarioError(problems)
    changes = {k: v for k, v in data.items() if k != "add_agents"}
    merged = _merge(recorded, changes)
    if isinstance(added, Mapping) and added:
        merged["agents"] = {**(merged.get("agents") or {}), **added}
    merged_text = yaml.safe_dump(merged, sort_keys=False, allow_unicode=True)
    try:
        scenario = parse_scenario(merged_text, source, base_dir, check_files=False)
    except ScenarioError as exc:
        raise ScenarioError(_relocate(exc, merged_text, source, marks, added)) from None
    return Overlay(overlay_text, source, merged_text, scenario)


def _relocate(
    exc: ScenarioError,
    merged_text: str,
    source: str,
    marks: Mapping[Loc, tuple[int, int]],
    added: Any,
) -> list[Problem]:
    """Problems of the merged scenario, moved to where the overlay says what caused them."""
    # The merged text is our own dump of a parsed scenario: it reads back whole.
    _, merged_marks, _ = read_marked(merged_text, source, empty="", what="overlay")
    at: dict[tuple[int, int], Loc] = {}
    for loc, pos in merged_marks.items():
        at.setdefault(pos, loc)
    new_agents = set(added) if isinstance(added, Mapping) else set()
    out = []
    for p in exc.problems:
        loc = at.get((p.line, p.column), ())
        if len(loc) >= 2 and loc[0] == "agents" and loc[1] in new_agents:
            loc = ("add_agents", *loc[1:])
        # The overlay's own key for it, or the nearest one above it (not the whole file).
        while loc and loc not in marks:
            loc = loc[:-1]
        line, column = locate(marks, loc) if loc else (1, 1)
        out.append(Problem(source, line, column, p.field, p.message))
    return out


def agent_fingerprints(
    scenario: Scenario, *, import_classes: bool = True
) -> dict[str, tuple[str, str]]:
    """Per enabled agent, two digests of what decides its effect calls: its own
    configuration (class, settings, options, faults, the policy a Guardian enforces, the
    seed), and that plus the model provider, for its ``model.*`` calls.

    A what-if replay serves an effect from the record only where the agent's digest is the
    same in both scenarios: a changed rule set makes the model calls run live, while the
    same agent's memory lookups are still served. ``import_classes=False`` (a reader of two
    records, which imports no team's code) counts the policy in every agent's digest, not
    only a Guardian's."""
    from agents import Guardian

    provider = _digest(scenario.provider.model_dump(mode="json", by_alias=True))
    out = {}
    for name, cfg in scenario.agents.items():
        if not cfg.enabled:
            continue
        own: dict[str, Any] = {
            "agent": cfg.model_dump(mode="json", by_alias=True),
            "fault": (
                None
                if (f := scenario.faults.agents.get(name)) is None
                else f.model_dump(mode="json", by_alias=True)
            ),
            "seed": scenario.seed,
        }
        if not import_classes or issubclass(agent_class(name, cfg), Guardian):
            own["policy"] = scenario.policy.model_dump(mode="json", by_alias=True)
        plain = _digest(own)
        out[name] = (plain, _digest([plain, provider]))
    return out


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
