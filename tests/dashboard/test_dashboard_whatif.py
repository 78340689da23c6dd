"""The session page's "Try a change" form, under ``AppTest`` and in headless Chromium, on a
failed run of the support team (scenarios/support_email_refunds.yaml: refund limit 50)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from whatif_run import expected_moves, failed_run  # noqa: F401 - a shared fixture

from dashboard.web import APP
from pantheon.sessions import STORE_ENV, SessionStore

FIX = "policy:\n  refund_limit: 200.0\n"


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path, str], AppTest]:
    def make(path: Path, session: str) -> AppTest:
        monkeypatch.setenv(STORE_ENV, str(path))
        at = AppTest.from_file(str(APP), default_timeout=120)
        at.query_params["session"] = session
        at.run()
        assert not at.exception, at.exception
        return at

    return make


def test_try_a_change_form_runs_the_what_if_and_names_the_moved_emails(
    app: Callable[[Path, str], AppTest],
    failed_run: tuple[Path, str],  # noqa: F811 - the fixture
) -> None:
    path, session = failed_run
    expected = expected_moves(path, session)
    assert len(expected) >= 10
    at = app(path, session)
    form = at.text_area(key=f"whatif_overlay_{session}")
    # The form starts from the recorded policy, ready to edit.
    assert "refund_limit: 50.0" in form.value
    form.input(FIX)
    at.button(key="whatif_run").click().run()
    assert not at.exception, at.exception

    with SessionStore(path, create=False) as store:
        (whatif,) = [s for s in store.sessions() if s.forked_from == session]
    assert whatif.kind == "whatif" and whatif.status == "completed"
    n = len(expected)
    (message,) = [s.value for s in at.success if s.value.startswith("What-if")]
    assert message == (
        f"What-if recorded as {whatif.id}: {n} emails changed action: {n} escalate→reply"
        " · meets accuracy ≥ 0.8"
    )
    (table,) = [d.value for d in at.dataframe if "items" in d.value.columns]
    assert table.to_dict("records") == [
        {"before": "escalate", "after": "reply", "count": n, "items": ", ".join(sorted(expected))}
    ]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["changed"] == str(n)
    assert float(metrics["accuracy after"]) > float(metrics["accuracy before"])

    at.button(key="whatif_open").click().run()
    assert not at.exception, at.exception
    assert at.query_params["session"] == whatif.id
    subheaders = [h.value for h in at.subheader]
    assert f"What-if of {session}" in subheaders
    (table,) = [d.value for d in at.dataframe if "items" in d.value.columns]
    assert set(table.loc[0, "items"].split(", ")) == expected
    # The overlay as YAML (the Trace tab's blocks beside it are the items' stories).
    assert [c.value for c in at.code if c.language == "yaml"] == [FIX.strip()]
    # Its own form starts from its own policy, not from the text typed on the other page.
    assert "refund_limit: 200.0" in at.text_area(key=f"whatif_overlay_{whatif.id}").value
    assert at.text_area(key=f"whatif_overlay_{whatif.id}").value.startswith("# Changes")


def test_an_invalid_overlay_in_the_form_is_located_and_runs_nothing(
    app: Callable[[Path, str], AppTest],
    failed_run: tuple[Path, str],  # noqa: F811 - the fixture
) -> None:
    path, session = failed_run
    with SessionStore(path, create=False) as store:
        before = len(store.sessions())
    at = app(path, session)
    at.text_area(key=f"whatif_overlay_{session}").input(
        "policy:\n  refund_limit: 200\nagents:\n  guardain: {}\n"
    )
    at.button(key="whatif_run").click().run()
    assert not at.exception, at.exception
    (error,) = [e.value for e in at.error if "overlay" in e.value]
    assert "The overlay is not valid" in error
    assert "overlay:4:3: agents.guardain: no agent 'guardain' in the recorded team" in error
    with SessionStore(path, create=False) as store:
        assert len(store.sessions()) == before
