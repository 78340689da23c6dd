"""A what-if of the on-call team run on ZeroMQ processes, one of them killed mid-run.

The inputs the killed node was in the middle of have an unfinished record: nothing to serve
their effects from, no outcome to compare theirs with. An exact replay leaves them out; a
what-if must too, or an overlay that changes nothing "changes" every one of those alerts
and runs their runbook actions (restart_service, clear_disk, ...) live."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_run import pantheon as cli
from untimed import copy_untimed

#: 80 alerts at 200/s, the triage node (Dedup, Correlator) SIGKILLed 0.2 s in: most alerts
#: are still to come, so some are cut on every machine. A node ships its journal every
#: 50 ms, so some alerts it forwarded in its last moments were decided on node act though
#: its own record of them stops: the original has decisions for cut inputs, which a
#: what-if that skips them must not count as changed either.
COUNT = 80
NODES = (
    "transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n"
    "  nodes:\n    triage: [dedup, correlator]\n    act: [decider, guardian, actor]\n"
)
KILL = "\nfaults:\n  kill_node: {node: triage, at: 0.2}\n"
#: The Dedup's window as the scenario has it already: a what-if that changes nothing.
SAME = "agents:\n  dedup:\n    settings:\n      window_s: 300\n"


def _json(proc: Any) -> dict[str, Any]:
    assert proc.stdout.strip(), f"exit {proc.returncode}; stderr: {proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_a_whatif_leaves_out_what_the_killed_node_cut_as_a_replay_does(tmp_path: Path) -> None:
    scenarios = copy_untimed(tmp_path)
    text = (scenarios / "oncall.yaml").read_text(encoding="utf-8")
    assert "  rate: 2000 " in text and "      window_s: 300 " in text
    text = text.replace("  rate: 2000 ", f"  count: {COUNT}\n  rate: 200 ", 1)
    text = text.replace("\nagents:\n", f"\n{NODES}\nagents:\n", 1) + KILL
    (scenarios / "oncall_killed.yaml").write_text(text, encoding="utf-8")
    (tmp_path / "same.yaml").write_text(SAME, encoding="utf-8")

    run = _json(
        cli("run", "scenarios/oncall_killed.yaml", "--json", "--store", "s.db", cwd=tmp_path)
    )
    assert run["nodes"]["triage"]["status"] == "killed"
    session = run["session_id"]

    replay = _json(cli("replay", session, "--store", "s.db", "--json", cwd=tmp_path))
    assert replay["matched"] is True and list(replay["cut"]) == ["triage"]
    skipped = replay["inputs_skipped"]
    assert 0 < skipped == replay["cut_inputs"] < COUNT

    # pantheon diff of the session and its replay leaves out the same inputs, and says so:
    # their unfinished trees are not differences of the team.
    diff = _json(cli("diff", session, replay["new_session_id"], "--store", "s.db", "--json",
                     cwd=tmp_path))  # fmt: skip
    assert (diff["identical"], diff["differences"], diff["left_out"]) == (True, 0, skipped)
    text = cli("diff", session, replay["new_session_id"], "--store", "s.db", cwd=tmp_path)
    assert text.returncode == 0, text.stdout
    assert f"{skipped} inputs not compared: a node of A died in the middle of them" in text.stdout
    assert "no difference\n" in text.stdout
    # ... and the other way round: the replay first, the session it re-ran second.
    back = _json(cli("diff", replay["new_session_id"], session, "--store", "s.db", "--json",
                     cwd=tmp_path))  # fmt: skip
    assert (back["identical"], back["differences"], back["left_out"]) == (True, 0, 0)
    assert back["left_out_b"] == skipped and back["decisions"]["changed"] == 0
    text = cli("diff", replay["new_session_id"], session, "--store", "s.db", cwd=tmp_path)
    assert text.returncode == 0, text.stdout
    assert f"{skipped} inputs not compared: a node of B died in the middle of them" in text.stdout
    assert "no difference\n" in text.stdout and "no alert changed action\n" in text.stdout

    whatif = _json(
        cli("replay", session, "--store", "s.db", "--with", "same.yaml", "--json", cwd=tmp_path)
    )
    # Nothing changed, nothing ran live: the cut inputs are neither re-run nor "changed"...
    assert (whatif["effects_called"], whatif["called_by_name"]) == (0, {})
    decisions = whatif["decisions"]
    assert decisions["changed"] == 0 and decisions["headline"] == "no alert changed action"
    assert decisions["accuracy_a"] == decisions["accuracy_b"]
    assert decisions["fixed"] == decisions["broken"] == []
    # ... but skipped, as the plain replay skips them, and for the same reason.
    assert whatif["effects_served"] == replay["effects_served"]
    assert whatif["inputs_replayed"] == replay["inputs_replayed"] == COUNT - skipped
    assert whatif["cut"] == replay["cut"]
    assert whatif["inputs_skipped"] == whatif["cut_inputs"] == skipped

    # The terminal says the same, and why.
    proc = cli("replay", session, "--store", "s.db", "--with", "same.yaml", cwd=tmp_path)
    out = proc.stdout
    assert f": {COUNT - skipped} inputs ({skipped} skipped), effects served " in out, out
    assert ", called live 0\n" in out
    reach = replay["cut"]["triage"]
    assert (
        f"node triage's journal stops before its end ({reach}): the {skipped} inputs it was "
        "in the middle of are not replayed (counted as skipped)\n"
    ) in out
    assert "no alert changed action\n" in out and "(0 fixed, 0 broken)\n" in out
