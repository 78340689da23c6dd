"""Does the reference scenario pass on a busy machine? Issue 13 asks for 20 runs of 20.

    python benchmarks/busy_machine.py [--runs 20] [--busy 2] [--scenario PATH]

Starts ``--busy`` CPU-bound processes (``while True: pass``; two keep both of this machine's
cores busy, so the scenario shares them), waits a second for the scheduler to feel them,
then runs ``pantheon run <scenario> --no-record --json`` (the support scenario unless told)
``--runs`` times in a row, each a fresh process: the README's first command plus ``--json``.
For every run it prints whether it passed, the failed checks, how many timing checks were
inconclusive (the process waited for a CPU; they pass unless ``--strict-timing``), and the
worst p99 handling and queue wait with their agents; at the end, per agent, the worst p99
handling and queue wait over all runs, the load average, and the share of the machine's CPU
that was busy during the runs (from ``/proc/stat``). The busy processes are stopped in any
case. JSON with every run goes to ``benchmarks/results/busy_machine.json``; the exit status
is 0 only if every run passed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    total = sum(fields[:8])
    return total - fields[3] - fields[4], total


def pantheon_command() -> list[str]:
    beside = Path(sys.executable).with_name("pantheon")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("pantheon")
    if found is None:
        sys.exit("no pantheon command: install the project (pip install -e .)")
    return [found]


def per_agent(hops: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Worst p99 handling and queue wait of each agent over its subscriptions (hop names are
    ``agent`` or ``agent:topic``), as the scenario's timing checks judge them."""
    out: dict[str, dict[str, float]] = {}
    for name, hop in hops.items():
        agent = out.setdefault(name.split(":", 1)[0], {"handle_p99_ms": 0.0, "wait_p99_ms": 0.0})
        for key in agent:
            agent[key] = max(agent[key], float(hop[key]))
    return out


def one_run(command: list[str], scenario: Path) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run(
        [*command, "run", str(scenario), "--no-record", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        return {"passed": False, "wall_s": wall, "error": proc.stderr[-2000:], "agents": {}}
    return {
        "passed": proc.returncode == 0 and bool(summary.get("passed")),
        "returncode": proc.returncode,
        "wall_s": wall,
        "elapsed_s": summary.get("elapsed_s"),
        "failed": [e["name"] for e in summary.get("expectations", ()) if not e["passed"]],
        "inconclusive": [
            e["name"] for e in summary.get("expectations", ()) if e.get("state") == "inconclusive"
        ],
        "cpu_wait_share": (summary.get("scheduling") or {}).get("share"),
        "agents": per_agent(summary.get("hops", {})),
    }


def worst(agents: dict[str, dict[str, float]], key: str) -> tuple[str, float]:
    if not agents:
        return "-", float("nan")
    name = max(agents, key=lambda a: agents[a][key])
    return name, agents[name][key]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes to start")
    parser.add_argument("--scenario", type=Path, default=Path("scenarios/support_email.yaml"))
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/busy_machine.json")
    args = parser.parse_args()

    command = pantheon_command()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    runs: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)
        busy0, total0 = cpu_jiffies()
        loadavg_start = os.getloadavg()
        for i in range(1, args.runs + 1):
            run = one_run(command, args.scenario)
            runs.append(run)
            h_agent, h = worst(run["agents"], "handle_p99_ms")
            w_agent, w = worst(run["agents"], "wait_p99_ms")
            status = "PASS" if run["passed"] else "FAIL " + "; ".join(run.get("failed") or ["?"])
            print(
                f"run {i:>2}: {status:<6} wall {run['wall_s']:5.2f} s   worst p99 handling "
                f"{h:7.2f} ms ({h_agent})   queue wait {w:7.2f} ms ({w_agent})",
                flush=True,
            )
            if run.get("inconclusive"):
                print(
                    f"        {len(run['inconclusive'])} inconclusive: the process waited "
                    f"{run['cpu_wait_share']:.0%} of its busy time for a CPU",
                    flush=True,
                )
            if "error" in run:
                print(run["error"], file=sys.stderr)
        busy1, total1 = cpu_jiffies()
        loadavg_end = os.getloadavg()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()

    passes = sum(r["passed"] for r in runs)
    overall: dict[str, dict[str, float]] = {}
    for run in runs:
        for agent, values in run["agents"].items():
            slot = overall.setdefault(agent, {"handle_p99_ms": 0.0, "wait_p99_ms": 0.0})
            for key, value in values.items():
                slot[key] = max(slot[key], value)
    busy_share = (busy1 - busy0) / max(1, total1 - total0)
    print(f"\n{passes} of {len(runs)} runs passed ({args.scenario}, {args.busy} busy loops)")
    print(f"{'agent':<10}{'worst p99 handling ms':>24}{'worst p99 queue wait ms':>26}")
    for agent, values in sorted(overall.items()):
        print(f"{agent:<10}{values['handle_p99_ms']:>24.2f}{values['wait_p99_ms']:>26.2f}")
    print(
        f"loadavg at start {' '.join(f'{x:.2f}' for x in loadavg_start)}, at end "
        f"{' '.join(f'{x:.2f}' for x in loadavg_end)}; CPU busy {busy_share:.0%} of "
        f"{os.cpu_count()} cores during the runs"
    )

    results = {
        "benchmark": "busy_machine",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "scenario": str(args.scenario),
        "busy_processes": args.busy,
        "loadavg_start": loadavg_start,
        "loadavg_end": loadavg_end,
        "cpu_busy_share": busy_share,
        "passes": passes,
        "runs_total": len(runs),
        "worst_by_agent": overall,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    sys.exit(0 if passes == len(runs) else 1)


if __name__ == "__main__":
    main()
