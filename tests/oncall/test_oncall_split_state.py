"""The on-call Dedup placed on two ZeroMQ nodes: two instances, each remembering only the
alerts its share brought, so the run's duplicates differ from one Dedup's. Its session
replays in one process with one Dedup, which cannot be the two: the replay diverges, and
says that the agent ran in two processes rather than blaming the clock or randomness."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import pantheon as cli
from untimed import copy_untimed

#: Both nodes host the Dedup (a consumer group of two); node a the rest of the triage.
NODES = (
    "transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n  nodes:\n"
    "    a: [dedup, correlator, decider, guardian, actor]\n    b: [dedup]\n"
)


def test_a_replay_of_an_agent_split_across_processes_says_so(tmp_path: Path) -> None:
    scenarios = copy_untimed(tmp_path)
    text = (scenarios / "oncall.yaml").read_text(encoding="utf-8")
    assert "  rate: 2000 " in text
    # 200 alerts: re-notifications of one alert reach both instances many times over.
    text = text.replace("  rate: 2000 ", "  count: 200\n  rate: 2000 ", 1)
    (scenarios / "split.yaml").write_text(text.replace("\nagents:\n", f"\n{NODES}\nagents:\n", 1))
    run = cli("run", "scenarios/split.yaml", "--json", "--store", "s.db", cwd=tmp_path)
    session = json.loads(run.stdout)["session_id"]

    proc = cli("replay", session, "--store", "s.db", "--json", cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["matched"], report["effects_called"]) == (1, False, 0)
    divergence = report["divergence"]
    # The first difference is the Dedup's, or the Correlator's after it: the Dedups' two
    # streams reached it in an order one process does not give. Either way the hint names
    # the split, not the clock.
    assert divergence["agent"] in ("dedup", "correlator"), divergence
    # ... of one alert, named by its key, as the input file has it.
    item = divergence["item"]
    assert item is not None and item.startswith("a-"), divergence
    assert f" for item {item!r} from agent " in divergence["message"], divergence
    hint = divergence["hint"]
    assert "in the original run 'dedup' ran in 2 processes (a, b): each instance kept its" in hint
    assert "reads randomness or the clock" not in hint
