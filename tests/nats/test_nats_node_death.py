"""A NATS node that dies unplanned (SIGKILL from outside, as the OOM killer does), not by the
scenario's ``faults.kill_node``: the run says what it left exactly as for a scripted kill,
and ``pantheon resume`` finishes the items it left waiting in the stream.

Real processes: a ``nats-server -js`` of the test's own on free loopback ports (the run
connects to it by ``transport.url``, as a user's own server), ``pantheon run`` and its node
processes, the session in a real SQLite file. The kill comes from the test, by pid, while the
node's Reasoner still has a backlog."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from cli_run import pantheon
from store_poll import query, until
from untimed import copy_untimed

from bus.backends.nats import NatsServer
from pantheon.sessions import SessionStore

_WAIT = 60.0


def _node_pid(session: str, node: str) -> int:
    """The pid of ``pantheon node --node NODE ... --session SESSION`` (what ``pgrep -f``
    finds by hand)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if [b"--node", node.encode()] in _pairs(argv) and session.encode() in argv:
            found.append(int(entry.name))
    (pid,) = found
    return pid


def _pairs(argv: list[bytes]) -> list[list[bytes]]:
    return [argv[i : i + 2] for i in range(len(argv) - 1)]


def _scenario(workdir: Path, url: str | None) -> str:
    """The NATS support scenario on the server at ``url`` (None: its own throwaway one,
    ``server: auto``): the Reasoner alone on node ``think`` (no standby), everything else
    on ``keep``, 120 emails at 200/s and a slow Reasoner (8 at a time, 300 ms each: about
    4.5 s of work), so a kill soon after the first decisions leaves a backlog waiting for
    it in the stream."""
    path = workdir / "scenarios" / "support_email_nats.yaml"
    text = path.read_text()
    for old, new in (
        ("  server: auto ", "  server: auto " if url is None else f"  url: {url}\n  # server: "),
        ("  nodes:\n    perception: [sensor, monitor]\n"
         "    cognition: [reasoner, memory, planner]\n    action: [guardian, actor]\n",
         "  ack_wait: 2\n  nodes:\n"
         "    keep: [sensor, monitor, memory, planner, guardian, actor]\n"
         "    think: [reasoner]\n"),
        ("name: support_email_nats", "name: death"),
        ("  rate: 1000 ", "  count: 120\n  rate: 200 "),
    ):  # fmt: skip
        assert old in text, old
        text = text.replace(old, new)
    text += "\nfaults:\n  agents:\n    reasoner: {latency_ms: 300}\n"
    (workdir / "scenarios" / "death.yaml").write_text(text)
    return "scenarios/death.yaml"


def _run_and_kill(workdir: Path, url: str | None) -> tuple[str, str, int]:
    """``pantheon run`` of :func:`_scenario` whose node ``think`` is SIGKILLed from outside
    once decisions are being made: (session, printed summary, exit code)."""
    db = workdir / "s.db"
    run = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", _scenario(workdir, url),
         "--store", "s.db"],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"COLUMNS": "250"},
    )  # fmt: skip
    try:
        until("the session", lambda: query(db, "SELECT id FROM sessions WHERE kind = 'run'"), _WAIT)
        (session,) = query(db, "SELECT id FROM sessions WHERE kind = 'run'")[0]
        assert isinstance(session, str)
        # Decisions are being made (the Actor's tool calls are in its node's outbox) and
        # the Reasoner has seconds of work left: kill its node the way the OOM killer would.
        outbox = workdir / "outbox" / f"{session}.keep.jsonl"
        until(
            "ten tool calls",
            lambda: outbox.exists() and len(outbox.read_bytes().splitlines()) >= 10,
            _WAIT,
        )
        os.kill(_node_pid(session, "think"), signal.SIGKILL)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 1, out + err
    return session, out, run.returncode


def _said_as_for_a_scripted_kill(db: Path, session: str, out: str) -> list[str]:
    """Check that the session's summary (``stream``, ``zero lost``, ``nodes``) and the printed
    one say what a ``faults.kill_node`` of ``think`` makes them say; returns the emails
    left waiting (those with no outcome in the record)."""
    inputs, actions = _decided(db, session)
    assert len(inputs) > 100 and max(actions.values()) == 1
    never = sorted(set(inputs) - set(actions))
    assert never, "the kill left nothing behind: it came too late"
    with SessionStore(db) as s:
        info = s.session(session)
    assert info.status == "failed"
    summary = info.summary
    think = summary["nodes"]["think"]
    assert (think["status"], think["exit_code"], think["killed_at_s"]) == ("died", -9, None)
    # What `pantheon sessions show` prints as `stream:`.
    stream = summary["stream"]
    assert stream["killed"] == ["think"]
    assert stream["no_live_member"] == ["reasoner"] and stream["taken_over"] == {}
    assert stream["complete"] is True and stream["handed_over"] == {}
    assert stream["items"] == stream["waiting"]["reasoner"] == never
    checks = {e["name"]: e for e in summary["expectations"]}
    assert checks["zero lost"]["passed"] is False
    assert checks["zero lost"]["actual"].startswith(
        f"{len(never):,} items wait in the stream for reasoner (no live member): "
    )
    # The death was not the scenario's, and is said as such.
    assert checks["every node ran to the end (or was killed by the scenario)"]["actual"] == [
        "think"
    ]
    assert "takeover after think: none" in out
    assert (
        f"no live member of reasoner: {stream['messages']:,} messages of {len(never):,} "
        "items wait in the stream" in out
    )
    assert f"  reasoner: {', '.join(never)}\n" in out
    assert f"FAIL zero lost (actual {len(never):,} items wait in the stream for reasoner" in out
    return never


def _decided(db: Path, session: str) -> tuple[list[str], collections.Counter[str]]:
    """The valid emails session ``session`` has as inputs, and how many outcomes
    (``action.executed``) its record holds per email."""
    with SessionStore(db) as s:
        envelopes = s.envelopes(s.resolve(session))
    inputs = [e.payload["id"] for e in envelopes if e.topic == "observation.email.received"]
    actions = collections.Counter(
        e.payload["email_id"] for e in envelopes if e.topic == "action.executed"
    )
    return inputs, actions


def _calls(outbox: Path, session: str) -> collections.Counter[tuple[str, int, str]]:
    """The tool calls (email, step, tool) in ``session``'s outbox files (a node's too)."""
    out: collections.Counter[tuple[str, int, str]] = collections.Counter()
    for path in outbox.glob(f"{session}*.jsonl"):
        for line in path.read_text().splitlines():
            call = json.loads(line)
            out[(call["email_id"], call["step"], call["tool"])] += 1
    return out


def test_a_node_killed_from_outside_names_the_items_waiting_and_resume_finishes_them(
    tmp_path: Path,
) -> None:
    """SIGKILL of the Reasoner's node from outside the run, on a server of the user's. The
    summary names the items whose messages wait in the stream for it and fails ``zero
    lost`` with that list, as for ``faults.kill_node`` (it said only "actual unknown: node
    'think' ended without its accounting", with ``stream: {}``); the session records the
    list (``stream.waiting``); the summary says how to finish them; and ``pantheon resume``
    does: every input decided exactly once across the two sessions, every tool call made
    once, the resume's own calls only for the waiting items (what the dead node published
    after its last shipment, read back from the stream, lets the rest be served). A second
    resume is refused."""
    copy_untimed(tmp_path)
    db = tmp_path / "s.db"
    server = NatsServer().start()
    try:
        session, out, _ = _run_and_kill(tmp_path, server.url)
        never = _said_as_for_a_scripted_kill(db, session, out)
        assert f"to finish them: pantheon resume {session} (in one process" in out
        resumed = pantheon("resume", session, "--store", "s.db", "--json", cwd=tmp_path)
    finally:
        server.stop()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    result = json.loads(resumed.stdout)
    assert result["resume"]["original_session_id"] == session
    assert result["resume"]["effects_served"] > 0 and result["resume"]["effects_called"] > 0
    zero_lost = [e for e in result["expectations"] if e["name"] == "zero lost"]
    assert zero_lost[0]["passed"] is True, (zero_lost, result["dead_letters"], result["dlq"])
    # The whole story decides every email, each once.
    inputs, _ = _decided(db, session)
    resumed_inputs, resumed_actions = _decided(db, result["session_id"])
    assert sorted(resumed_inputs) == sorted(inputs)
    assert resumed_actions == collections.Counter(inputs)
    # Side effects: every call once across both sessions; what the dead run did was served,
    # so the resume's own calls are for the items that waited, and the run's for none of them.
    before = _calls(tmp_path / "outbox", session)
    after = _calls(tmp_path / "outbox", result["session_id"])
    assert before and after
    assert max((before + after).values()) == 1
    assert {email for email, _, _ in after} <= set(never)
    assert not {email for email, _, _ in before} & set(never)

    again = pantheon("resume", session, "--store", "s.db", cwd=tmp_path)
    assert again.returncode == 2
    assert f"session {session} was resumed already, as {result['session_id']}" in again.stderr


def test_on_a_throwaway_server_a_node_killed_from_outside_is_named_and_resume_says_why_not(
    tmp_path: Path,
) -> None:
    """The same death on the run's own server (``server: auto``): the summary names the
    waiting items as for a scripted kill, but the server took with it what the dead node
    published last, so the summary says to run again, and ``pantheon resume`` refuses
    saying why and what to do, with nothing recorded for it."""
    copy_untimed(tmp_path)
    db = tmp_path / "s.db"
    session, out, _ = _run_and_kill(tmp_path, None)
    _said_as_for_a_scripted_kill(db, session, out)
    assert "to finish them: run the scenario again (its throwaway server" in out
    assert "pantheon resume" not in out

    refused = pantheon("resume", session, "--store", "s.db", cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert f"session {session} ran on its own throwaway NATS server" in said
    assert "what node 'think' published after its last journal shipment went with it" in said
    assert "Run the scenario again" in said and "(transport.url)" in said
    with SessionStore(db) as s:
        assert [i.kind for i in s.sessions()] == ["run"]
