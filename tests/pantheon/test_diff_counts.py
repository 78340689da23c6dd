"""``pantheon diff`` counts a session's messages as its run summary, ``sessions show`` and
``export`` do, and says which it did not compare and why.

Before, the "messages" of ``N hops compared (A vs B messages)`` were the messages the
alignment walks: a run whose breaker opened (a ``system.breaker.actor`` message and the
Monitor's alert it caused) and whose Reasoner looked senders up in Memory (requests an
effect published) printed fewer messages than its own summary, unexplained."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import pantheon
from tripping import run_json, tripping
from untimed import copy_untimed


def test_diff_counts_every_message_and_says_which_were_not_compared(tmp_path: Path) -> None:
    scenario = tripping(copy_untimed(tmp_path), "trip")
    summaries = [run_json(tmp_path, scenario) for _ in range(2)]
    a, b = (str(s["session_id"]) for s in summaries)
    exported = []
    for sid in (a, b):
        out = pantheon("export", sid, "--store", "s.db", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        exported.append([json.loads(line) for line in out.stdout.splitlines()])
    assert [len(e) for e in exported] == [s["messages"] for s in summaries]
    assert any(e["topic"] == "system.breaker.actor" for e in exported[0])

    out = pantheon("diff", a, b, "--json", "--store", "s.db", cwd=tmp_path)
    diff = json.loads(out.stdout)
    # The same figure as the summary and export: every recorded message.
    assert [diff["messages_a"], diff["messages_b"]] == [s["messages"] for s in summaries]
    for side in ("a", "b"):
        left = diff[f"not_compared_{side}"]
        assert left["system"] >= 1  # the breaker's message (and the alert it caused)
        assert left["effect"] >= 1  # the Memory lookups' requests
        assert diff[f"compared_{side}"] == diff[f"messages_{side}"] - sum(left.values())
    assert diff["hops_compared"] <= min(diff["compared_a"], diff["compared_b"])

    out = pantheon("diff", a, b, "--store", "s.db", cwd=tmp_path)
    first = out.stdout.splitlines()[0]
    na, nb = diff["not_compared_a"], diff["not_compared_b"]
    # A Monitor's sample of the dead letters comes only if the run outlasts its interval
    # (a loaded machine): then it is not compared either, and said so.
    sampled = (
        f"{na.get('sampled', 0)} vs {nb.get('sampled', 0)} sampled Monitor alerts and what "
        "they caused, "
        if na.get("sampled") or nb.get("sampled")
        else ""
    )
    assert first == (
        f"{a} -> {b}: {diff['hops_compared']} hops compared "
        f"({diff['messages_a']} vs {diff['messages_b']} messages; not compared: "
        f"{na['system']} vs {nb['system']} system.* and what they caused, {sampled}"
        f"{na['effect']} vs {nb['effect']} published by effects)"
    )
