"""What recording costs a whole ``pantheon run``: in-process, on three ZeroMQ nodes, on three
NATS nodes.

    python benchmarks/record_cluster_bench.py [--repeats 5] [--runs inproc,zmq,nats]
        [--emails 600] [--rate SCENARIO] [--json PATH]

Runs the shipped support scenario (``scenarios/support_email.yaml``, ``_3node.yaml``,
``_nats.yaml``: the same team and inbox, only the transport differs) as the CLI does,
``pantheon run FILE --json``, with and without ``--no-record``; the two alternate (their order
flips every repeat) so a shared machine's load falls on both alike. Each run is a fresh
process with its own store in a temporary directory (and, for ``nats``, its own throwaway
``nats-server``: ``server: auto``).

What is compared is the summary's ``elapsed_s``: from the team's start (every node up and
subscribed) to the cluster gone quiet after stop, the run phase; the processes' start-up is
not in it. The process's whole wall time is reported beside it: a recorded run then also
ingests what the nodes shipped and finishes the session. The overhead is the median of the
per-repeat ratios (recorded / unrecorded elapsed - 1); the ratio of the two medians is
printed beside it. ``--pause`` waits between runs, so the last run's processes (a node's
exit, a nats-server's shutdown) are gone before the next starts: without it, on NATS at
load 5-6, the first run of a pair was mostly the slower one whichever it was (by up to 90%).

``--emails N`` repeats the inbox to N emails (ids made unique) and ``--rate R`` sets the
input rate (0: as fast as the bus takes them; the scenarios pace the inbox at 1,000 emails
per second, so at their rate a run's elapsed time is mostly the pacing). The scenario is
rewritten into the temporary directory with only those two fields changed.

Store bytes per message: the recorded store's file size once its WAL is checkpointed,
over the envelopes it holds (rows and journal chunks not yet materialized), with its free
pages (materialized journal chunks leave them) and each table's and index's share from
SQLite's ``dbstat`` (whole pages: every table and index takes at least one, 64 KiB here,
so a small session's figure is mostly that floor; use ``--emails`` for a per-message one).

The CPU time of every process of the run (the ``pantheon`` process and what it waited
for: nodes, broker, ``nats-server``) is reported too: on a shared machine it is steadier
than wall time, and it says what recording adds across processes.

The ``pantheon`` run is the one next to this interpreter; ``PYTHONPATH`` (inherited by the
node processes) picks which checkout's code runs, so an older commit is measured with the
same script: ``PYTHONPATH=/path/to/old/worktree python benchmarks/record_cluster_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {
    "inproc": ROOT / "scenarios/support_email.yaml",
    "zmq": ROOT / "scenarios/support_email_3node.yaml",
    "nats": ROOT / "scenarios/support_email_nats.yaml",
}
RUN_TIMEOUT_S = 600


def load() -> str:
    """The machine's load average (1, 5, 15 minutes): the machine is shared."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_inbox(n: int, path: Path) -> None:
    """The shipped inbox repeated to ``n`` lines, each email's id made unique."""
    source = [
        ln
        for ln in (ROOT / "scenarios/data/support_emails.jsonl").read_text().splitlines()
        if ln.strip()
    ]
    with path.open("w") as f:
        for i in range(n):
            line = source[i % len(source)]
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                f.write(line + "\n")  # a malformed line stays malformed
                continue
            if isinstance(record, dict) and "id" in record:
                record["id"] = f"{record['id']}-{i}"
            f.write(json.dumps(record) + "\n")


def scenario_file(name: str, tmp: Path, emails: int | None, rate: float | None) -> Path:
    """The scenario as shipped, or a copy with its inbox and rate changed."""
    shipped = SCENARIOS[name]
    if emails is None and rate is None:
        return shipped
    doc = yaml.safe_load(shipped.read_text())
    if emails is not None:
        inbox = tmp / f"inbox-{emails}.jsonl"
        if not inbox.exists():
            write_inbox(emails, inbox)
        doc["input"]["path"] = str(inbox)
    else:
        doc["input"]["path"] = str((shipped.parent / doc["input"]["path"]).resolve())
    if rate is not None:
        doc["input"]["rate"] = rate
    # The team's own package (scenarios/support/) is imported from the scenario's folder.
    doc["path"] = [str(shipped.parent), *doc.get("path", [])]
    out = tmp / shipped.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def store_stats(path: Path) -> dict[str, Any]:
    """The store's size, envelopes and bytes per table, once its WAL is checkpointed."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        envelopes = conn.execute("SELECT count(*) FROM envelopes").fetchone()[0]
        tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_master")}
        if "journal" in tables:
            pending = conn.execute(
                "SELECT coalesce(sum(count), 0) FROM journal WHERE kind = 'envelopes'"
            ).fetchone()[0]
            envelopes += int(pending)
        pages = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0] * page
    finally:
        conn.close()
    size = path.stat().st_size
    return {"bytes": size, "free_bytes": free, "envelopes": envelopes, "tables": pages}


def one_run(scenario: Path, record: bool, tmp: Path) -> dict[str, Any]:
    store = tmp / f"store-{time.monotonic_ns()}.db"
    cmd = [str(Path(sys.executable).parent / "pantheon"), "run", str(scenario), "--json"]
    cmd += ["--store", str(store)]
    if not record:
        cmd.append("--no-record")
    before = load()
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):  # 1: an expectation failed (timing, on a busy machine)
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout)
    out = {
        "record": record,
        "elapsed_s": summary["elapsed_s"],
        "wall_s": wall,
        # Every process of the run that was waited for: driver, nodes, broker, nats-server.
        "cpu_s": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
        "messages": summary["messages"],
        "passed": summary["passed"],
        "load": before,
    }
    if record:
        out["session"] = summary["session_id"]
        out["store"] = store_stats(store)
    store.unlink(missing_ok=True)
    return out


def report(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    on = [r for r in runs if r["record"]]
    off = [r for r in runs if not r["record"]]
    pairs = list(zip(on, off, strict=True))
    result: dict[str, Any] = {
        "elapsed_s": {
            "recorded": statistics.median(r["elapsed_s"] for r in on),
            "unrecorded": statistics.median(r["elapsed_s"] for r in off),
        },
        "overhead": statistics.median(a["elapsed_s"] / b["elapsed_s"] - 1 for a, b in pairs),
        "overhead_of_medians": statistics.median(r["elapsed_s"] for r in on)
        / statistics.median(r["elapsed_s"] for r in off)
        - 1,
        "wall_overhead": statistics.median(a["wall_s"] / b["wall_s"] - 1 for a, b in pairs),
        "cpu_s": {
            "recorded": statistics.median(r["cpu_s"] for r in on),
            "unrecorded": statistics.median(r["cpu_s"] for r in off),
        },
        "cpu_overhead": statistics.median(a["cpu_s"] / b["cpu_s"] - 1 for a, b in pairs),
        "per_repeat": [a["elapsed_s"] / b["elapsed_s"] - 1 for a, b in pairs],
        "messages": statistics.median(r["messages"] for r in runs),
        "bytes_per_envelope": statistics.median(
            r["store"]["bytes"] / r["store"]["envelopes"] for r in on
        ),
        "bytes_per_message": statistics.median(r["store"]["bytes"] / r["messages"] for r in on),
        "free_bytes_per_envelope": statistics.median(
            r["store"]["free_bytes"] / r["store"]["envelopes"] for r in on
        ),
        "envelopes": statistics.median(r["store"]["envelopes"] for r in on),
        "loads": [r["load"] for r in runs],
        "runs": runs,
    }
    mid = sorted(on, key=lambda r: r["store"]["bytes"])[len(on) // 2]["store"]
    result["table_bytes_per_envelope"] = {
        t: b / mid["envelopes"] for t, b in sorted(mid["tables"].items(), key=lambda kv: -kv[1])
    }
    e = result["elapsed_s"]
    print(
        f"{name}: elapsed {e['unrecorded']:.3f} s unrecorded, {e['recorded']:.3f} s recorded "
        f"(medians); overhead {result['overhead']:+.1%} (median of per-repeat ratios: "
        + ", ".join(f"{x:+.1%}" for x in result["per_repeat"])
        + f"); ratio of the medians {result['overhead_of_medians']:+.1%}"
        + f"; whole process {result['wall_overhead']:+.1%}"
    )
    c = result["cpu_s"]
    print(
        f"  CPU of all the run's processes: {c['unrecorded']:.2f} s unrecorded, "
        f"{c['recorded']:.2f} s recorded (medians); {result['cpu_overhead']:+.1%} "
        "(median of per-repeat ratios)"
    )
    print(
        f"  {result['messages']:,.0f} bus messages, {result['envelopes']:,.0f} envelopes "
        f"stored, {result['bytes_per_envelope']:,.0f} store bytes per envelope (of which "
        f"{result['free_bytes_per_envelope']:,.0f} free pages), "
        f"{result['bytes_per_message']:,.0f} per bus message; by table: "
        + ", ".join(
            f"{t} {b:,.0f}"
            for t, b in list(result["table_bytes_per_envelope"].items())[:6]
            if b >= 1
        )
    )
    print(f"  load averages at each run's start: {'; '.join(result['loads'])}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", default="inproc,zmq,nats", help="comma-separated")
    parser.add_argument("--emails", type=int, default=None)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument(
        "--pause", type=float, default=0.0, help="seconds to wait between runs (default 0)"
    )
    parser.add_argument(
        "--json", type=Path, default=ROOT / "benchmarks/results/record_cluster_bench.json"
    )
    args = parser.parse_args()
    names = args.runs.split(",")
    if not names or not set(names) <= set(SCENARIOS):
        parser.error(f"--runs takes {', '.join(SCENARIOS)}: got {args.runs}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    code = subprocess.run(
        [sys.executable, "-c", "import pantheon; print(pantheon.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",  # not this checkout: its directory would come before PYTHONPATH
    ).stdout.strip()
    print(f"pantheon from {code}; load {load()}")
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "pantheon": code,
        "emails": args.emails,
        "rate": args.rate,
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        files = {n: scenario_file(n, tmp, args.emails, args.rate) for n in names}
        by_name: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for rep in range(args.repeats):
            for name in names:
                order = (True, False) if rep % 2 == 0 else (False, True)
                for record in order:
                    time.sleep(args.pause)
                    by_name[name].append(one_run(files[name], record, tmp))
        for name in names:
            results["runs"][name] = report(name, by_name[name])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}; load {load()}")


if __name__ == "__main__":
    main()
