"""A whole team under test: run a scenario from a plain test function, say which expectations
failed and by how much, and check that the recorded session replays exactly.

The helpers are synchronous because a scenario run is a whole program (its own bus, its own
event loop), which a plain ``def test_...`` states most simply; in an ``async def`` test use
``await pantheon.run(...)`` and ``await pantheon.replay(...)`` directly.

Sessions go to a scratch store unless a test names one: a temporary directory made once per
process and removed when it exits, so tests neither write into the team's folder nor see
sessions from earlier runs. Every helper here reads and writes that same store by default.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import tempfile
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

import pantheon
from pantheon._api import Session
from pantheon.runner import RunSummary
from pantheon.scenario import Scenario, parse_scenario
from pantheon.standin import ModelServer

if TYPE_CHECKING:
    from pantheon.rerun import OutcomeDiff, ReplayReport, WhatIfReport

__all__ = [
    "assert_outcomes_changed",
    "assert_passed",
    "assert_replays",
    "open_session",
    "replay_matches",
    "run_scenario",
    "scratch_store",
    "whatif",
    "with_provider",
]

T = TypeVar("T")

_scratch: Path | None = None
_scratch_lock = threading.Lock()


def scratch_store() -> Path:
    """The session store the helpers use when given none: ``sessions.db`` in a temporary
    directory made on first use and removed when the process exits."""
    global _scratch
    with _scratch_lock:
        if _scratch is None:
            folder = Path(tempfile.mkdtemp(prefix="pantheon-test-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _scratch = folder / "sessions.db"
        return _scratch


def _run(coro: Coroutine[Any, Any, T], helper: str, instead: str) -> T:
    """``asyncio.run`` with an error that says what to do when a loop is already running
    (an ``async def`` test), rather than asyncio's bare "cannot be called from a running
    event loop"."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()  # never awaited; closing it keeps Python from warning that it was not
    raise RuntimeError(
        f"{helper}() runs its own event loop and cannot be called from an async test; "
        f"there, use {instead}"
    )


def run_scenario(
    scenario: Scenario | str | Path,
    *,
    store: str | Path | None = None,
    record: bool = True,
    seed: int | None = None,
    provider: ModelServer | Mapping[str, Any] | None = None,
) -> RunSummary:
    """Run ``scenario`` (a file path or a loaded :class:`pantheon.Scenario`) to the end, as
    ``pantheon run`` does, and return its summary; a failed expectation is in the summary,
    not an exception (:func:`assert_passed` turns it into a test failure).

    Recorded in ``store`` (default: :func:`scratch_store`) unless ``record`` is false;
    ``seed`` overrides the scenario's. ``provider`` points the team at another model for
    this run: a running :class:`ModelServer` (see :func:`with_provider`), or a whole
    ``provider:`` section as a mapping. A scenario that does not load raises
    :class:`pantheon.ScenarioError` with every problem located in the file.
    """
    if provider is not None:
        scenario = with_provider(scenario, provider)
    return _run(
        pantheon.run(
            scenario,
            seed=seed,
            store=scratch_store() if store is None and record else store,
            record=record,
        ),
        "run_scenario",
        "'await pantheon.run(...)'",
    )


def with_provider(
    scenario: Scenario | str | Path, provider: ModelServer | Mapping[str, Any]
) -> Scenario:
    """``scenario`` with its ``provider:`` section replaced, loaded and checked.

    A :class:`ModelServer` keeps an OpenAI or Anthropic section's other settings (its model
    name, which ``prices`` look up) and changes only ``base_url`` (the server speaks both
    protocols; a ``stand_in`` the section names gives way to it); any other section becomes ``{kind:
    openai, base_url, model}`` with the server's model (``stand-in`` when it echoes the one
    asked for). The result's text is what a run records, so the session replays with the
    provider it ran with. A scenario that had no ``provider:`` gets one appended, which
    keeps the lines of every problem found in the rest of the file where they are."""
    if isinstance(scenario, Scenario):
        text, source, base_dir = scenario.text, scenario.source, scenario.base_dir
    else:
        path = Path(scenario)
        text, source = path.read_text(encoding="utf-8"), str(scenario)
        base_dir = path.resolve().parent
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict):
        # No mapping of sections to change: the loader says where and why.
        return parse_scenario(text, source, base_dir)
    had = data.get("provider")
    if isinstance(provider, ModelServer):
        kind = had.get("kind") if isinstance(had, dict) else None
        section = dict(had) if isinstance(had, dict) and kind in ("openai", "anthropic") else {}
        section.pop("stand_in", None)  # the server given replaces a scripted stand-in
        if kind == "anthropic":
            section["base_url"] = provider.anthropic_base_url
        else:
            section |= {"kind": "openai", "base_url": provider.base_url}
        section.setdefault("model", provider.model or "stand-in")
    else:
        section = dict(provider)
    if had is None:
        text = f"{text.rstrip()}\nprovider: {json.dumps(section)}\n"
    else:
        text = yaml.safe_dump(data | {"provider": section}, sort_keys=False, allow_unicode=True)
    return parse_scenario(text, source, base_dir)


def assert_passed(summary: RunSummary) -> None:
    """Fail (``AssertionError``) unless every expectation of the run held, listing each one
    that did not with its expected and actual values, and the run's dead letters, which are
    usually why."""
    failed = [e for e in summary.expectations if not e["passed"]]
    if not failed:
        return
    lines = [f"scenario {summary.scenario!r}: {len(failed)} expectation(s) failed"]
    lines += [f"- {e['name']}: expected {e['expected']!r}, actual {e['actual']!r}" for e in failed]
    if summary.dead_letters:
        lines.append("dead letters:")
        lines += [
            f"- {d['subscriber']} on {d['topic']!r} ({d['reason']}): {d['error']}"
            for d in summary.dead_letters
        ]
    if summary.session_id is not None:
        lines.append(f"session {summary.session_id} (pantheon sessions show / dlq list)")
    raise AssertionError("\n".join(lines))


def _session_ref(run: RunSummary | Session | str) -> str:
    ref = run.session_id if isinstance(run, RunSummary) else run
    ref = ref.id if isinstance(ref, Session) else ref
    if ref is None:
        raise ValueError("this run was not recorded (record=False): there is no session")
    return ref


def _store(run: RunSummary | Session | str, store: str | Path | None) -> Path:
    if isinstance(run, Session) and store is None:
        return run.store
    return scratch_store() if store is None else Path(store)


def open_session(run: RunSummary | Session | str, store: str | Path | None = None) -> Session:
    """The recorded :class:`pantheon.Session` of a run (its summary, or a session id or
    unique prefix): its envelopes, dead letters and effects, to assert on what happened
    inside the team. ``store`` defaults to :func:`scratch_store`."""
    return Session.open(_session_ref(run), _store(run, store))


def assert_replays(
    run: RunSummary | Session | str, store: str | Path | None = None
) -> ReplayReport:
    """Replay a recorded run with every effect served from its record and fail
    (``AssertionError``) at the first message, effect or outcome that differs, saying where
    and how; returns the :class:`pantheon.rerun.ReplayReport` when it matched.

    A team that reaches outside its effects (reads the clock, draws a random number or
    calls a service directly in a handler) is what this catches."""
    ref = _session_ref(run)
    report: ReplayReport = _run(
        pantheon.replay(ref, store=_store(run, store)),
        "assert_replays",
        "'report = await pantheon.replay(...)' and check report.matched",
    )
    if not report.matched:
        raise AssertionError(
            f"session {ref} did not replay exactly: {report.divergence}"
            if report.divergence is not None
            else f"session {ref} did not replay exactly"
        )
    return report


def replay_matches(run: RunSummary | Session | str, store: str | Path | None = None) -> bool:
    """Whether a recorded run replays exactly (see :func:`assert_replays`, which says where
    it does not)."""
    try:
        assert_replays(run, store)
    except AssertionError:
        return False
    return True


def whatif(
    run: RunSummary | Session | str, overlay: str | Path, store: str | Path | None = None
) -> WhatIfReport:
    """A what-if of a recorded run (``pantheon replay --with``): its recorded inputs through
    the team changed by ``overlay`` (the overlay's YAML text, or a path to its file), served
    from the record wherever a call is the recorded one, so the model server and the people
    who approved need not be there. Returns the report: ``report.decisions`` (see
    :func:`assert_outcomes_changed`), ``report.passed``, ``report.expectations``."""
    report: WhatIfReport = _run(
        pantheon.replay(_session_ref(run), store=_store(run, store), with_=overlay),
        "whatif",
        "'report = await pantheon.replay(..., with_=overlay)'",
    )
    return report


def assert_outcomes_changed(
    report: WhatIfReport | OutcomeDiff, expected: Mapping[str, list[str]]
) -> None:
    """Fail (``AssertionError``) unless the items whose outcome changed are exactly
    ``expected``: ``{"hold→approve": ["INV-2", "INV-7"]}``, before→after as the what-if
    prints it (``-`` where a run decided nothing), items in the order printed (sorted).
    Takes a what-if's report or a ``pantheon.rerun.diff_outcomes`` result."""
    from pantheon.rerun import OutcomeDiff

    diff = report if isinstance(report, OutcomeDiff) else report.decisions
    got = {f"{before}→{after}": items for before, after, items in diff.groups}
    if got == dict(expected):
        return
    lines = [f"outcomes changed other than expected ({diff.headline()}):"]
    for change in sorted(set(got) | set(expected)):
        want, have = list(expected.get(change, [])), got.get(change, [])
        if want != have:
            lines.append(f"- {change}: expected {want}, got {have}")
    raise AssertionError("\n".join(lines))
