"""The Streamlit app under ``AppTest``, on a store recorded by real ``pantheon run``s.

Every number the pages show is checked against :mod:`pantheon.readmodel` over the same
store; replay and redrive go through the real ``pantheon`` CLI in a subprocess.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from cli_run import pantheon
from dashboard_store import Recorded
from model_session import record_model_session
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from dashboard.web import _session as web_session
from pantheon import readmodel as rm
from pantheon.sessions import STORE_ENV, SessionStore, diff_sessions

DEADLINE_S = 90.0


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], AppTest]:
    def make(path: Path) -> AppTest:
        monkeypatch.setenv(STORE_ENV, str(path))
        return AppTest.from_file(str(APP), default_timeout=60)

    return make


def _frame_with(at: AppTest, column: str) -> pd.DataFrame:
    frames = [d.value for d in at.dataframe if column in d.value.columns]
    assert len(frames) == 1, f"{len(frames)} tables with a {column!r} column"
    return frames[0]


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _texts(at: AppTest) -> list[str]:
    kinds = (at.error, at.success, at.info, at.warning, at.markdown)
    return [e.value for kind in kinds for e in kind]


def _run_until(at: AppTest, done: Callable[[AppTest], bool]) -> None:
    """Re-render until ``done`` (a replay runs in another process); fail at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        at.run()
        assert not at.exception, at.exception
        if done(at):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not done after {DEADLINE_S} s; page says: {_texts(at)}")
        time.sleep(0.2)  # polling interval, not synchronisation: the deadline decides


def _session_app(app: Callable[[Path], AppTest], path: Path, sid: str) -> AppTest:
    at = app(path)
    at.query_params["session"] = sid
    at.run()
    assert not at.exception, at.exception
    return at


def test_sessions_page_lists_every_session(
    app: Callable[[Path], AppTest], recorded: Recorded
) -> None:
    with SessionStore(recorded.path, create=False) as store:
        rows = rm.session_rows(store)
    at = app(recorded.path)
    at.run()
    assert not at.exception, at.exception
    assert _metrics(at) == {
        "sessions": "2",
        "failed": "1",
        "running": "0",
        "dead letters": str(sum(r.dead_letters for r in rows)),
    }
    table = at.dataframe[0].value
    assert list(table["id"]) == [r.id for r in rows]
    assert list(table["messages"]) == [r.messages for r in rows]
    assert list(table["dead letters"]) == [r.dead_letters for r in rows]
    failed = table[table["id"] == recorded.failed].iloc[0]
    assert failed[""] == "✖ failed"
    assert failed["failed expectations"] == "dead letters other than shed <= 0"
    assert table[table["id"] == recorded.passed].iloc[0][""] == "✔ completed"
    assert recorded.failed in at.error[0].value  # failed sessions stand out above the table

    at.multiselect(key="f_status").select("completed").run()
    assert list(at.dataframe[0].value["id"]) == [recorded.passed]
    at.multiselect(key="f_status").unselect("completed").run()
    at.text_input(key="f_search").input(recorded.failed[-6:]).run()
    assert list(at.dataframe[0].value["id"]) == [recorded.failed]
    at.text_input(key="f_search").input("no-such-id").run()
    assert any("No session matches" in i.value for i in at.info)

    # "Open a session" picks the failed one first.
    at.text_input(key="f_search").input("").run()
    assert at.selectbox(key="open_choice").value == recorded.failed
    at.button(key="open_session").click().run()
    assert at.query_params["session"] == recorded.failed
    assert at.title[0].value == f"Session {recorded.failed}"


def test_session_page_shows_the_recorded_numbers(
    app: Callable[[Path], AppTest], pristine: Recorded
) -> None:
    sid = pristine.failed
    with SessionStore(pristine.path, create=False) as store:
        row = rm.session_row(store, sid)
        hops = rm.hop_latency(store, sid)
        letters = rm.dead_letters(store, sid)
        out = rm.outcomes(store, sid)
        requests = rm.requests(store, sid)
    at = _session_app(app, pristine.path, sid)
    metrics = _metrics(at)
    assert metrics["status"] == "failed"
    assert metrics["messages"] == str(row.messages)
    assert metrics["dead letters"] == str(row.dead_letters) == str(len(letters))
    assert metrics["expectations"] == "failed"
    assert "Failed expectations: `dead letters other than shed <= 0`" in [e.value for e in at.error]

    # Latency: every quantile the table shows is the read model's, exactly.
    shown = _frame_with(at, "wait_p99_ms").set_index(["kind", "name"])
    assert len(shown) == len(hops)
    for h in hops:
        r = shown.loc[(h.kind, h.name)]
        assert (r["count"], r["wait_p99_ms"], r["handle_p99_ms"]) == (
            h.count,
            h.wait_p99_ms,
            h.handle_p99_ms,
        )
        assert (r["wait_p50_ms"], r["handle_p95_ms"]) == (h.wait_p50_ms, h.handle_p95_ms)

    # Dead letters: the table, and the first one's payload and traceback.
    dlq = _frame_with(at, "attempts")
    assert list(dlq["entry"]) == [d.entry_id for d in letters]
    assert set(dlq["error"]) == {f"{d.error_type}: {d.error}" for d in letters}
    first = letters[0]
    assert json.loads(at.json[0].value) == first.payload
    assert any(first.error in c.value and "Traceback" in c.value for c in at.code)

    # Outcomes: accuracy, verdict counts and every Guardian decision with its reasons.
    assert metrics["action accuracy"] == f"{out.accuracy['action_accuracy']:.1%}"
    assert metrics["guardian decisions"] == str(len(out.guardian))
    guardian = _frame_with(at, "reasons")
    assert len(guardian) == len(out.guardian)
    assert list(guardian["reasons"]) == ["; ".join(g.reasons) for g in out.guardian]

    # Requests: a dead-lettered request is picked first and its hops drawn as a waterfall.
    picked = next(r for r in requests if r.outcome != "ok")
    assert picked.outcome == "dead_letter"
    assert at.selectbox(key="req_pick_None").value == picked.correlation_id
    with SessionStore(pristine.path, create=False) as store:
        bars = rm.waterfall(store, sid, picked.correlation_id)
    hops_shown = _frame_with(at, "queue_wait_ms")
    assert list(hops_shown["agent"]) == [b.agent for b in bars]
    assert list(hops_shown["outcome"]) == [b.outcome for b in bars]
    assert "failed" in set(hops_shown["outcome"])
    # Charts are Altair (Vega-Lite), not text: throughput x2, latency x2, verdicts, waterfall.
    charts = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    assert len(charts) >= 6
    # As served: Streamlit's default ``autosize: fit`` would squeeze legend and axes into
    # the height and leave the plot none; each chart's own sizing must reach the browser.
    assert [c["autosize"]["type"] for c in charts] == ["fit-x"] * len(charts)


def test_replay_button_replays_and_shows_the_match(
    app: Callable[[Path], AppTest], recorded: Recorded
) -> None:
    at = _session_app(app, recorded.path, recorded.failed)
    assert any("not been replayed" in i.value for i in at.info)
    at.button(key="replay_start").click().run()
    _run_until(at, lambda a: any("matched the original" in s.value for s in a.success))

    with SessionStore(recorded.path, create=False) as store:
        (replay,) = [s for s in store.sessions() if s.replay_of == recorded.failed]
        diff = diff_sessions(store, recorded.failed, replay.id)
        failures = replay.summary["replay"]["failures"]
    assert replay.kind == "replay" and replay.status == "completed"
    assert diff.divergence is None
    text = next(s.value for s in at.success if "matched the original" in s.value)
    assert replay.id in text and f"{diff.hops_compared} hops compared" in text
    assert any(f"**{len(failures)} recorded failure(s) reproduced" in t for t in _texts(at))
    sides = [d.value for d in at.dataframe if "payload" in d.value.columns]
    assert len(sides) == 2 and not any((side[""] != "").any() for side in sides)


def test_live_effects_replay_highlights_the_first_divergence(
    app: Callable[[Path], AppTest], recorded: Recorded
) -> None:
    at = _session_app(app, recorded.path, recorded.failed)
    at.checkbox(key="replay_live").check().run()
    at.button(key="replay_start").click().run()
    _run_until(at, lambda a: any("diverged from the original" in e.value for e in a.error))

    with SessionStore(recorded.path, create=False) as store:
        (replay,) = [s for s in store.sessions() if s.replay_of == recorded.failed]
        diff = diff_sessions(store, recorded.failed, replay.id)
        seq_a = {e.id: e.seq for e in store.envelopes(recorded.failed)}
        seq_b = {e.id: e.seq for e in store.envelopes(replay.id)}
    div = diff.divergence
    assert div is not None
    assert any(f"agent `{div.agent}`, topic `{div.topic}`" in t for t in _texts(at))
    # With live effects the breaker's cooldown runs on the wall clock, so what diverges first
    # depends on timing: a changed message (both sides highlighted), or one that only one
    # side has ("missing", "extra": the other side highlights nothing).
    original, replayed = (d.value for d in at.dataframe if "payload" in d.value.columns)
    want_a = [] if div.original_id is None else [seq_a[div.original_id]]
    want_b = [] if div.replay_id is None else [seq_b[div.replay_id]]
    assert want_a or want_b
    assert list(original.loc[original[""] != "", "seq"]) == want_a
    assert list(replayed.loc[replayed[""] != "", "seq"]) == want_b


def test_redrive_runs_and_reports_every_entry(
    app: Callable[[Path], AppTest], recorded: Recorded
) -> None:
    """The button runs ``pantheon dlq redrive`` on the team as it is, in the background:
    its tools still fail with the same seeded draws, so the report and the store must
    agree entry by entry."""
    at = _session_app(app, recorded.path, recorded.failed)
    total = len(_frame_with(at, "attempts"))
    at.button(key="redrive_all").click().run()
    assert not at.exception, at.exception
    _run_until(
        at, lambda a: any(e.value.startswith("Redrive recorded as") for e in [*a.error, *a.success])
    )
    with SessionStore(recorded.path, create=False) as store:
        (redrive,) = [s for s in store.sessions() if s.kind == "redrive"]
        letters = store.dead_letters(recorded.failed)
    redriven = [d for d in letters if d.redriven]
    assert redrive.replay_of == recorded.failed
    # The tools still fail with the same seeded draws: entries fail again, and the page
    # counts them in an error, not a success.
    failed = total - len(redriven)
    assert failed > 0
    (done,) = [e.value for e in at.error if e.value.startswith("Redrive recorded as")]
    assert not [s for s in at.success if s.value.startswith("Redrive recorded as")]
    assert done == (
        f"Redrive recorded as {redrive.id}: {len(redriven)} of {total} redriven, "
        f"{failed} failed again"
    )
    assert all(d.redriven_by == redrive.id for d in redriven)
    table = _frame_with(at, "attempts")
    assert (table["redriven"] == redrive.id).sum() == len(redriven)
    if len(redriven) < total:
        outcomes = _frame_with(at, "redrive outcome")
        assert sorted(outcomes["entry"]) == [d.entry_id for d in letters]
        again = outcomes[outcomes["redrive outcome"] != "delivered"]
        assert len(again) == failed
    # The sessions list marks the redrive with that outcome, not "completed".
    at = _page(app, recorded.path)
    marks = _frame_with(at, "kind").set_index("id")[""]
    assert marks[redrive.id] == f"✖ {len(redriven)} of {total} redriven, {failed} failed again"
    at = _session_app(app, recorded.path, redrive.id)
    assert _metrics(at)["status"] == f"{len(redriven)} of {total} redriven, {failed} failed again"


def test_a_running_session_is_read_live(app: Callable[[Path], AppTest], recorded: Recorded) -> None:
    # This process "records" it, so the store keeps it running (not reaped as aborted).
    with SessionStore(recorded.path) as store:
        sid = store.begin_session(scenario="live")
    at = app(recorded.path)
    at.run()
    table = at.dataframe[0].value
    assert table[table["id"] == sid].iloc[0][""] == "● running"
    assert _metrics(at)["running"] == "1"
    at = _session_app(app, recorded.path, sid)
    assert (_metrics(at)["status"], _metrics(at)["duration (s)"]) == ("running", "running")
    with SessionStore(recorded.path) as store:
        store.end_session(sid, "completed", {"passed": True})
    at.run()
    assert _metrics(at)["status"] == "completed"


def _page(app: Callable[[Path], AppTest], path: Path, session: str | None = None) -> AppTest:
    at = app(path)
    if session is not None:
        at.query_params["session"] = session
    at.run()
    assert not at.exception, at.exception  # a page, not a traceback
    return at


def test_bad_input_gives_a_clear_page(
    app: Callable[[Path], AppTest], recorded: Recorded, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere" / "sessions.db"
    at = _page(app, missing)
    assert at.title[0].value == "Cannot open the session store"
    assert at.error[0].value == f"no session store at {missing}"
    assert "pantheon run" in at.info[0].value
    assert not missing.exists()  # the dashboard never creates a store

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not an SQLite database\n" * 100)
    at = _page(app, garbage, session="anything")
    assert at.title[0].value == "Cannot open the session store"
    assert str(garbage) in at.error[0].value and "not a usable session store" in at.error[0].value
    assert "not a Pantheon session store" in at.info[0].value

    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    at = _page(app, foreign)
    assert "not a Pantheon session store" in at.error[0].value

    at = _page(app, recorded.path, session="19990101-000000-dead")
    assert at.title[0].value == "No such session"
    assert "19990101-000000-dead" in at.error[0].value
    assert any(str(recorded.path) in t for t in _texts(at))
    at.button(key="error_back").click().run()
    assert at.title[0].value == "Pantheon sessions"


def test_model_usage_on_the_session_page_and_the_list(
    app: Callable[[Path], AppTest], model_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session recorded against a model server with prices: the header's totals, the
    per-agent table, the slowest calls and a page of calls are the read model's."""
    monkeypatch.setattr(web_session, "CALLS_PAGE", 20)  # 48 calls: three pages
    path, sid = model_session.store, model_session.session_id
    with SessionStore(path, create=False) as store:
        usage = rm.usage(store, sid)
        (row,) = rm.session_rows(store)
    t = usage.total
    assert usage.as_dict() == model_session.summary["usage"]

    at = _session_app(app, path, sid)
    metrics = _metrics(at)
    assert metrics["model calls"] == f"{t.calls:,}"
    assert (metrics["tokens in"], metrics["tokens out"]) == (
        f"{t.input_tokens:,}",
        f"{t.output_tokens:,}",
    )
    assert metrics["model cost"] == rm.usd(t.cost_usd)
    assert at.tabs[6].label == f"Model usage ({t.calls})"

    agents = _frame_with(at, "priced")
    assert list(agents["agent"]) == list(usage.by_agent)
    for r in agents.itertuples(index=False):
        u = usage.by_agent[r.agent]
        assert (r.calls, r[2], r[3], r[4], r.priced) == (
            u.calls,
            u.input_tokens,
            u.output_tokens,
            u.cost_usd,
            u.priced,
        )

    slowest, page = [d.value for d in at.dataframe if "latency (ms)" in d.value.columns]
    by_latency = sorted(usage.calls, key=lambda c: (-c.latency_ms, c.seq))
    expected = by_latency[: web_session.SLOWEST_CALLS]
    assert list(slowest["latency (ms)"]) == [c.latency_ms for c in expected]
    assert list(slowest["cost (USD)"]) == [c.cost_usd for c in expected]
    assert list(page["tokens in"]) == [c.input_tokens for c in usage.calls[:20]]

    at.number_input(key="usage_page").set_value(3).run()
    assert not at.exception, at.exception
    page = [d.value for d in at.dataframe if "latency (ms)" in d.value.columns][1]
    last = usage.calls[40:]
    assert list(page["agent"]) == [c.agent for c in last]
    assert list(page["tokens out"]) == [c.output_tokens for c in last]
    assert list(page["cost (USD)"]) == [c.cost_usd for c in last]
    assert f"Calls 41-48 of {t.calls}" in [c.value for c in at.caption]

    # The sessions list: tokens and cost per session.
    at = app(path)
    at.run()
    assert not at.exception, at.exception
    listed = at.dataframe[0].value
    assert row.usage == t
    assert list(listed["tokens"]) == [t.total_tokens]
    assert list(listed["cost (USD)"]) == [t.cost_usd]


def test_a_session_of_token_free_calls_costs_zero(
    app: Callable[[Path], AppTest], pristine: Recorded
) -> None:
    """The rule provider's calls: counted, no tokens, and an exact $0 (a call that uses no
    tokens costs nothing whatever the price list says)."""
    with SessionStore(pristine.path, create=False) as store:
        usage = rm.usage(store, pristine.passed)
    assert usage.total.calls > 0 and usage.total.priced and usage.total.total_tokens == 0
    at = _session_app(app, pristine.path, pristine.passed)
    metrics = _metrics(at)
    assert (metrics["model calls"], metrics["tokens in"], metrics["model cost"]) == (
        f"{usage.total.calls:,}",
        "0",
        "$0",
    )
    agents = _frame_with(at, "priced")
    assert list(agents["agent"]) == ["reasoner"] and (agents["cost (USD)"] == 0).all()


def _mark_interrupted(store: Path, sid: str) -> None:
    """Record ``sid`` as a run that Ctrl-C stopped (``aborted``, the signal in its summary),
    as ``pantheon run`` records one."""
    with sqlite3.connect(store) as db:
        (summary,) = db.execute("SELECT summary FROM sessions WHERE id = ?", (sid,)).fetchone()
        marked = json.dumps(json.loads(summary) | {"interrupted": "SIGINT"})
        db.execute(
            "UPDATE sessions SET status = 'aborted', summary = ? WHERE id = ?", (marked, sid)
        )


def test_an_interrupted_session_says_it_was_a_ctrl_c_and_how_to_finish_it(
    app: Callable[[Path], AppTest], recorded: Recorded
) -> None:
    """A run stopped by Ctrl-C is recorded ``aborted`` like a crash, with the signal in its
    summary: the page says which, so nobody looks for a dead process."""
    copy, sid = recorded.path, recorded.failed
    _mark_interrupted(copy, sid)
    at = _session_app(app, copy, sid)
    assert _metrics(at)["status"] == "aborted"
    assert [c.value for c in at.caption if c.value.startswith("Interrupted")] == [
        "Interrupted (SIGINT): its input was stopped and what was in flight finished; the "
        f"record is whole. `pantheon resume {sid}` finishes the input."
    ]


def test_an_interrupted_session_that_was_resumed_names_its_resume_instead(
    app: Callable[[Path], AppTest], recorded: Recorded
) -> None:
    """Once ``pantheon resume`` has finished an interrupted session, its page says so and
    names the resuming session: telling the user to resume it again would start a second
    resume (refused) or send them looking for work that is done."""
    copy, sid = recorded.path, recorded.failed
    _mark_interrupted(copy, sid)
    done = pantheon("resume", sid, "--store", str(copy), "--json", cwd=copy.parent, timeout=300)
    report = json.loads(done.stdout)
    # 1 exactly when an expectation of the finished whole fails (this session's checks).
    assert done.returncode == (0 if report["passed"] else 1), done.stdout + done.stderr
    resume = report["resume"]["new_session_id"]
    with SessionStore(copy, create=False) as store:
        info = store.session(resume)
    assert (info.kind, info.replay_of) == ("resume", sid)
    at = _session_app(app, copy, sid)
    assert [c.value for c in at.caption if c.value.startswith("Interrupted")] == [
        "Interrupted (SIGINT): its input was stopped and what was in flight finished; the "
        f"record is whole. It was resumed as {resume} ({info.status}), which finished the "
        "input."
    ]
    assert not [c for c in at.caption if "pantheon resume" in c.value]
    at.button(key="open_resumed").click().run()
    assert at.query_params["session"] == resume
    assert at.title[0].value == f"Session {resume}"

    # A resume that stopped too is named, and it is the one to resume.
    with SessionStore(copy) as store:
        store.end_session(resume, "aborted", {"interrupted": "SIGINT"})
    at = _session_app(app, copy, sid)
    assert [c.value for c in at.caption if c.value.startswith("Interrupted")] == [
        "Interrupted (SIGINT): its input was stopped and what was in flight finished; the "
        f"record is whole. It was resumed as {resume}, which stopped too: "
        f"`pantheon resume {resume}` finishes the input."
    ]
    # Resumed again from the original (allowed once the first resume stopped), and still
    # running: that one is named.
    with SessionStore(copy) as store:
        again = store.begin_session(kind="resume", replay_of=sid, scenario="flaky_strict")
    at = _session_app(app, copy, sid)
    assert [c.value for c in at.caption if c.value.startswith("Interrupted")] == [
        "Interrupted (SIGINT): its input was stopped and what was in flight finished; the "
        f"record is whole. It is being resumed as {again}, which finishes the input."
    ]


def test_model_usage_of_a_session_with_no_prices_says_its_cost_is_not_known(
    app: Callable[[Path], AppTest], tmp_path: Path
) -> None:
    """QA: "$0 for the priced ones" when no model had a price read as free."""
    unpriced = record_model_session(tmp_path, prices=False, count=4)
    at = _session_app(app, unpriced.store, unpriced.session_id)
    t = unpriced.summary["usage"]
    assert (
        f"**{t['calls']:,} model call(s)**: {t['input_tokens']:,} tokens in, "
        f"{t['output_tokens']:,} out, no cost known: the scenario's prices name none of its "
        "models"
    ) in _texts(at)
    assert not [text for text in _texts(at) if "priced ones" in text]
