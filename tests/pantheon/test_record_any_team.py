"""The record holds for a team in a third domain: the accounts-payable team of
tests/_support/ap_team.py (a model agent, an approver that asks a person, a custom check,
labels), built in the test's folder as a user would build it.

A run fails (accuracy and the custom check); ``pantheon replay SESSION --with changes.yaml``,
with the model server stopped, reports the changed outcomes in the team's words, re-checks
every expectation (the custom check now passes), loses nothing and exits 0; ``pantheon
diff`` and the web what-if page give the same counts. The word "email" appears nowhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ap_team import AMOUNTS, ledger_code, write_team, wrongly_held
from cli_run import pantheon
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon.sessions import STORE_ENV, ApprovalBook, SessionStore
from pantheon.testing import ModelServer


def test_a_failed_invoice_run_is_fixed_by_a_what_if_in_its_own_terms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s.db"
    model = ModelServer(ledger_code).start()
    try:
        scenario = write_team(tmp_path / "ap", model.base_url)
        failed = pantheon("run", str(scenario), "--store", str(store), cwd=tmp_path)
        asked = len(model.requests)
    finally:
        model.close()
    assert failed.returncode == 1, failed.stderr
    assert "FAIL custom: ap_agents:few_holds" in failed.stdout
    assert "FAIL accuracy >= 0.9" in failed.stdout
    assert asked == len(AMOUNTS)  # one model call per invoice
    with SessionStore(store, create=False) as st:
        (original,) = st.sessions()
    session = original.id

    # The model server is gone: every model call of the what-if must be served.
    done = pantheon(
        "replay", session, "--with", "changes.yaml", "--store", str(store), cwd=scenario.parent
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    moved = wrongly_held()
    n = len(moved)
    assert f"{n} invoices changed decision: {n} hold→approve" in out
    assert f"  hold→approve ({n}): {', '.join(moved)}" in out
    wrong = len(AMOUNTS) - n
    assert f"accuracy {wrong / len(AMOUNTS):.3f} -> 1.000 ({n} fixed, 0 broken)" in out
    assert "PASS custom: ap_agents:few_holds" in out
    assert "PASS accuracy >= 0.9" in out
    assert "PASS zero lost" in out
    assert "dead letters 0" in out
    assert "all expectations passed" in out
    assert "email" not in (out + done.stderr).lower()

    with SessionStore(store, create=False) as st:
        (whatif,) = [s for s in st.sessions() if s.forked_from == session]
        # The two large invoices' approvals were unchanged requests: served, nobody asked.
        assert ApprovalBook(st).entries(whatif.id) == []
    assert whatif.status == "completed"
    assert whatif.summary["accuracy"]["decision_accuracy"] == 1.0

    diff = pantheon("diff", session, whatif.id, "--store", str(store), "--json", cwd=tmp_path)
    decisions = json.loads(diff.stdout)["decisions"]
    assert decisions["changed"] == n
    assert decisions["groups"] == [{"before": "hold", "after": "approve", "items": moved}]
    text = pantheon("diff", session, whatif.id, "--store", str(store), cwd=tmp_path).stdout
    assert f"{n} invoices changed decision: {n} hold→approve" in text
    assert "email" not in text.lower()

    # The web page of the what-if session says the same.
    monkeypatch.setenv(STORE_ENV, str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["session"] = whatif.id
    at.run()
    assert not at.exception, at.exception
    assert f"{n} invoices changed decision: {n} hold→approve" in [m.value for m in at.markdown]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["changed"] == str(n)
    (table,) = [d.value for d in at.dataframe if "items" in d.value.columns]
    assert table.to_dict("records") == [
        {"before": "hold", "after": "approve", "count": n, "items": ", ".join(moved)}
    ]
