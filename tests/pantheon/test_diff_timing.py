"""Two runs of the support scenario with the same seed: ``pantheon diff`` finds them equal,
or different only where an effect answered differently (the Reasoner's Memory lookup while
an earlier email of the same sender is still in flight), which it calls timing-dependent
and exits 0 on; a difference in the team's own logic stays a divergence (exit 1, see
``test_sessions_cli.test_replay_and_diff``)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner
from untimed import copy_untimed

from pantheon.cli import app
from pantheon.sessions import SessionStore


def test_two_same_seed_runs_diff_as_equal_or_timing_only(tmp_path: Path) -> None:
    runner = CliRunner()
    store = tmp_path / "sessions.db"
    # Without its timing bounds: what this test reads does not depend on the machine's speed.
    support = copy_untimed(tmp_path) / "support_email.yaml"
    for _ in range(2):
        result = runner.invoke(app, ["run", str(support), "--store", str(store)])
        assert result.exit_code == 0, result.output
    with SessionStore(store, create=False) as st:
        a, b = sorted((s.id for s in st.sessions()), key=lambda sid: st.session(sid).started)

    result = runner.invoke(app, ["diff", a, b, "--store", str(store), "--json"])
    assert result.exit_code == 0, result.output
    diff = json.loads(result.output)
    if not diff["identical"]:
        # What the Reasoner's lookup answered depends on what had got to Memory first.
        assert diff["timing_only"] is True
        assert diff["timing_effects"] == ["memory.lookup"]
        assert diff["differences"] >= 1
        assert "replay" not in diff["divergence"]["message"]

    result = runner.invoke(app, ["diff", a, b, "--store", str(store)])
    assert result.exit_code == 0, result.output
    first = result.output.split("per-hop latency", 1)[0]
    for wording in ("replay diverged", "replay message", "first divergence", "expected"):
        assert wording not in first
    assert "no difference" in first or "timing-dependent" in first

    # A session against itself is identical.
    result = runner.invoke(app, ["diff", a, a, "--store", str(store), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["identical"] is True
