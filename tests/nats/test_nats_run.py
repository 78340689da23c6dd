"""``pantheon run`` of a NATS scenario: a throwaway nats-server (``server: auto``) and real
node processes on loopback, deciding every email as the in-process run does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from decisions import moved_by_timing, outcomes
from untimed import copy_untimed

from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[2]


def run_json(workdir: Path, scenario: str) -> dict[str, Any]:
    """``pantheon run --json`` of a scenario copied by ``copy_untimed``: its exit code is
    its verdict, and that verdict is never about the machine's speed."""
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", scenario, "--json", "--store", "s.db"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ | {"COLUMNS": "250", "TMPDIR": str(workdir)},
    )
    summary: dict[str, Any] = json.loads(proc.stdout)
    assert proc.returncode == (0 if summary["passed"] else 1), proc.stderr
    return summary


def test_nats_nodes_decide_every_email_as_in_process(tmp_path: Path) -> None:
    copy_untimed(tmp_path)
    alone = run_json(tmp_path, "scenarios/support_email.yaml")
    over_nats = run_json(tmp_path, "scenarios/support_email_nats.yaml")

    # The same decisions per email as in one process, but for what timing moves (the diff
    # must say so for each): the Reasoner's threshold reads, Memory's lookups.
    moved = moved_by_timing(tmp_path, "s.db", alone["session_id"], over_nats["session_id"])
    for key in ("inputs", "malformed", "seed") + (
        () if moved else ("decisions", "outbox", "accuracy")
    ):
        assert over_nats[key] == alone[key], key

    def team_topics(s: dict[str, Any]) -> dict[str, int]:
        """A moved decision also moves what the Learner publishes of it."""
        return {
            t: n
            for t, n in s["topics"].items()
            if not t.startswith(("monitor.", "system."))
            and not (moved and t.startswith("learner."))
        }

    assert team_topics(over_nats) == team_topics(alone)
    assert over_nats["accounting_ok"] is True
    assert alone["passed"] is over_nats["passed"] is True, over_nats["expectations"]
    nodes = over_nats["nodes"]
    assert set(nodes) == {"driver", "perception", "cognition", "action"}
    assert all(n["status"] == "ok" for n in nodes.values())
    assert len({n["pid"] for n in nodes.values()}) == 4
    # Every process went over the run's own server: their transports say so.
    urls = {n["transport"]["url"] for n in nodes.values()}
    assert len(urls) == 1 and urls.pop().startswith("nats://127.0.0.1:")

    # Every node's journal came through the stream, whole; the session replays in this one
    # process (the run's server is gone by now) with every effect served from the record.
    with SessionStore(tmp_path / "s.db") as store:
        journals = store.node_journals(over_nats["session_id"])
    assert {n: j.ended for n, j in journals.items()} == {
        "perception": True, "cognition": True, "action": True,
    }  # fmt: skip
    # The summary counts each node's shipments as the store holds them (they came over
    # the stream, not the node's control link).
    shipped = {n: nodes[n]["journal"]["shipments"] for n in journals}
    assert shipped == {n: j.shipments for n, j in journals.items()} and min(shipped.values()) > 0
    # No node was orphaned: none wrote an orphan's log.
    assert not (tmp_path / "pantheon-orphans").exists()
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "replay", over_nats["session_id"], "--store",
         "s.db", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["matched"], report["effects_called"]) == (0, True, 0)
    assert report["inputs_replayed"] == 600 and report["effects_served"] > 0


def test_a_sigkilled_node_in_a_nats_run_loses_nothing(tmp_path: Path) -> None:
    """``faults.kill_node`` on a NATS run: the Reasoner runs on two nodes (one consumer
    group); one is SIGKILLed mid-run and what it held unacknowledged goes to the other
    after ``ack_wait``: every email is decided or dead-lettered, none lost."""
    copy_untimed(tmp_path)
    text = (tmp_path / "scenarios" / "support_email_nats.yaml").read_text()
    placement = (
        "  nodes:\n    perception: [sensor, monitor]\n"
        "    cognition: [reasoner, memory, planner]\n    action: [guardian, actor]\n"
    )
    assert placement in text
    text = text.replace(
        placement,
        "  ack_wait: 2\n  nodes:\n    keep: [sensor, memory, planner, monitor, guardian, actor]\n"
        "    work1: [reasoner]\n    work2: [reasoner]\n",
    ).replace("name: support_email_nats", "name: kill_one")
    text = text.replace("  rate: 1000 ", "  count: 300\n  rate: 1000 ")
    text += (
        "\nfaults:\n  agents:\n    reasoner: {latency_ms: 5}\n"
        "  kill_node: {node: work2, at: 0.15}\n"
    )
    (tmp_path / "scenarios" / "kill.yaml").write_text(text)

    summary = run_json(tmp_path, "scenarios/kill.yaml")
    nodes = summary["nodes"]
    assert nodes["work2"]["status"] == "killed"
    assert nodes["work1"]["status"] == nodes["keep"]["status"] == "ok"
    assert summary["accounting_ok"] is True
    # What work2 held when it died came to work1 again (a delivery count above one), unless
    # the kill came before work2 took anything (a loaded machine starts it late): then its
    # journal is empty too.
    with SessionStore(tmp_path / "s.db") as s:
        work2 = s.node_journals(summary["session_id"]).get("work2")
    redelivered = nodes["work1"]["transport"]["redelivered"]
    assert redelivered > 0 or work2 is None or work2.records == 0, (redelivered, work2)
    assert summary["inputs"] == 300 - summary["malformed"]
    done = outcomes(tmp_path / "s.db", summary["session_id"])
    dead = {d["email_id"] for d in summary["dead_letters"]}
    with SessionStore(tmp_path / "s.db") as s:
        ids = {
            e.payload["id"]
            for e in s.envelopes(summary["session_id"])
            if e.topic == "observation.email.received"
        }
    assert len(ids) == summary["inputs"]
    assert ids <= set(done) | dead  # delivered + DLQ covers published
    assert sum(summary["decisions"].values()) == len(done)


def test_an_undecodable_message_mid_run_is_counted_and_the_run_finishes(tmp_path: Path) -> None:
    """Any client of the server can publish into the team's stream. A message nested
    100,000 deep, published while ``pantheon run`` is going: the receiving nodes count it
    as malformed and dead-letter it, and the run finishes with its summary. Before, it
    hung for ever (nothing printed; SIGINT exited 130 with no summary)."""
    import asyncio
    import threading

    import nats

    from bus.backends.nats import NatsServer

    server = NatsServer().start()
    try:
        copy_untimed(tmp_path)
        path = tmp_path / "scenarios" / "support_email_nats.yaml"
        text = path.read_text()
        auto = "  server: auto "
        assert auto in text
        line = text[text.index(auto) : text.index("\n", text.index(auto)) + 1]
        text = text.replace(line, f"  url: {server.url}\n").replace(
            "name: support_email_nats", "name: junk_run"
        )
        (tmp_path / "scenarios" / "junk.yaml").write_text(text)
        injected = threading.Event()

        async def inject() -> None:
            client = await nats.connect(server.url)
            try:
                js = client.jetstream()
                # Once a consumer of that subject exists (they start at new messages), the
                # message is its to read: on the run's session's subject, which it filters.
                head = "pantheon.junk_run.normal."
                tail = ".observation.email.received"
                async with asyncio.timeout(120):
                    subject = ""
                    while not subject:
                        try:
                            infos = await js.consumers_info("PANTHEON_junk_run")
                        except Exception:  # the stream does not exist yet
                            infos = []
                        for c in infos:
                            found = c.config.filter_subject or ""
                            if found.startswith(head) and found.endswith(tail):
                                subject = found
                        await asyncio.sleep(0.05)
                await js.publish(subject, b"\x91" * 100_000 + b"\xc0")
                injected.set()
            finally:
                await client.close()

        thread = threading.Thread(target=lambda: asyncio.run(inject()))
        thread.start()
        try:
            summary = run_json(tmp_path, "scenarios/junk.yaml")
        finally:
            thread.join(timeout=130)
        assert injected.is_set()
        counted = {n: node["transport"]["malformed"] for n, node in summary["nodes"].items()}
        assert sum(counted.values()) >= 1, counted
        assert summary["dlq"].get("malformed", 0) == sum(counted.values()), summary["dlq"]
        assert (summary["inputs"], summary["malformed"]) == (591, 9)  # the file's own
        assert summary["accounting_ok"] is True
    finally:
        server.stop()


def _servers_under(root: Path) -> list[int]:
    """nats-server processes whose configuration lives under ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"nats-server") and str(root).encode() in b" ".join(argv):
                found.append(int(entry.name))
    return found


def test_a_sigkilled_drivers_throwaway_server_stops_with_it(tmp_path: Path) -> None:
    """``server: auto`` is the run's own server: SIGKILL the driver mid-run and it goes too
    (it used to run on for good, with its store in the temp directory)."""
    copy_untimed(tmp_path)
    text = (tmp_path / "scenarios" / "support_email_nats.yaml").read_text()
    text = text.replace("  rate: 1000 ", "  count: 600\n  rate: 50 ")  # 12 s: killed well before
    (tmp_path / "scenarios" / "slow.yaml").write_text(text)
    driver = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", "scenarios/slow.yaml", "--store", "s.db"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=os.environ | {"TMPDIR": str(tmp_path)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "s.db").exists() or not _servers_under(tmp_path):
            assert driver.poll() is None and time.monotonic() < deadline, "no server came up"
            time.sleep(0.05)
        time.sleep(1.0)  # its nodes connected and working
        assert driver.poll() is None
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 10
    while _servers_under(tmp_path):
        assert time.monotonic() < deadline, f"nats-server {_servers_under(tmp_path)} outlived it"
        time.sleep(0.05)
