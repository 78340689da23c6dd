"""``diff_sessions(left_out=...)``: inputs of A that B did not re-run are left out of the
alignment, wherever they fall. Here B is the access desk run on A's 40 requests but the
20th (a replay of a session whose node died skips such inputs in the middle, where work on
the surviving nodes went on): aligned input by input, every request after the 20th would
pair with the wrong one."""

from __future__ import annotations

from pathlib import Path

from cli_run import pantheon
from untimed import copy_untimed

from pantheon.sessions import SessionStore, diff_sessions
from pantheon.sessions.internals import Lineage


def test_inputs_left_out_in_the_middle_are_skipped_by_the_alignment(tmp_path: Path) -> None:
    scenarios = copy_untimed(tmp_path)
    lines = (scenarios / "data" / "access_requests.jsonl").read_text().splitlines(True)[:40]
    text = (scenarios / "access_requests.yaml").read_text()
    assert "  path: data/access_requests.jsonl\n" in text
    for name, rows in (("all", lines), ("but_20th", lines[:19] + lines[20:])):
        (scenarios / "data" / f"{name}.jsonl").write_text("".join(rows))
        scenario = scenarios / f"{name}.yaml"
        scenario.write_text(text.replace("access_requests.jsonl", f"{name}.jsonl"))
        pantheon("run", str(scenario), "--store", "s.db", cwd=tmp_path)
    with SessionStore(tmp_path / "s.db", create=False) as store:
        a, b = (s.id for s in sorted(store.sessions(), key=lambda s: s.started))
        twentieth = Lineage(store.envelopes(a), store.effects(a)).inputs[19]
        assert twentieth.payload["request_id"] not in {
            e.payload.get("request_id") for e in store.envelopes(b) if e.source is None
        }
        misaligned = diff_sessions(store, a, b)
        aligned = diff_sessions(store, a, b, left_out={twentieth.id})
    assert misaligned.differences > 20  # every request after the 20th against the wrong one
    assert (aligned.identical, aligned.differences, aligned.left_out) == (True, 0, 1)
