"""Why the record's cost by time will not settle on a shared VM: two probes.

    python benchmarks/record_timing_probe.py writer [--emails 3000] [--triples 8]
    python benchmarks/record_timing_probe.py pinned [--emails 3000] [--runs 8] [--passes 3]
    python benchmarks/record_timing_probe.py gc [--emails 3000] [--runs 5]
    python benchmarks/record_timing_probe.py chunks [--emails 3000] [--triples 12]
    python benchmarks/record_timing_probe.py parts [--emails 3000] [--rounds 10]

``writer``: in one process, off / recording / recording with its writer held off until
``finish`` (commit interval 10,000 s), alternating, ``pipeline_bench.py``'s run at 1 ms model
latency: the loop thread's CPU per request of each, as ratios to off within a triple. If the
writer's concurrency made recorded runs slower than their instruction count, the held-off
writer would do better.

``pinned``: off and recording at the same moment, each process pinned to its own vCPU
(``taskset``), swapping vCPUs halfway: both see the same host at the same instant, so a
drift in the machine's speed cancels, if that is what the noise is.

``gc``: off and recording alternating in one process; for each run, the cycle collector's
collections per generation inside the run and the CPU of the thread that ran each (the
loop's, but for a rare one the writer's allocations set off; ``gc.callbacks``), beside
the run's loop CPU: time the recorder costs that no count of its own instructions shows,
since a collection's cost grows with the whole heap.

``chunks``: off, then recording with journal chunks of 2,048 rows (the default) and of 128,
alternating: whether writing ~3 MB chunks, more than a core's L2, slows the loop beyond its
instruction count (a smaller chunk stays in cache).

``parts``: off, recording, and recording with each part of the record switched off as
``record_cycles.py --modes recording-without-<part>`` does (envelopes, deliveries,
effects, digests, and the first three together), in one process, each round in a fresh
random order: the loop's CPU per request of each, as median ratios to the round's off run.
The timed side of ``record_cycles.py``'s modelled one.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pipeline_bench
import uvloop


def _per_request(r: dict[str, Any]) -> float:
    return float(r["loop_cpu_s"]) / int(r["requests"]) * 1e6


def writer(emails: int, triples: int) -> None:
    real = pipeline_bench.Recorder
    held = functools.partial(real, commit_interval=10_000.0, commit_rows=10**9, max_pending=10**9)
    ratios: dict[str, list[float]] = {"recording": [], "held": []}
    with tempfile.TemporaryDirectory() as tmp:
        inbox = pipeline_bench.make_inbox(emails, Path(tmp))
        for _ in range(triples):
            row = {}
            for mode in ("off", "recording", "held"):
                pipeline_bench.Recorder = held if mode == "held" else real  # type: ignore[misc]
                run = "off" if mode == "off" else "recording"
                row[mode] = _per_request(uvloop.run(pipeline_bench.one_run(inbox, 1.0, 64, run)))
            for mode, out in ratios.items():
                out.append(row[mode] / row["off"] - 1)
            print("  ".join(f"{m} {us:.0f} us" for m, us in row.items()), flush=True)
    pipeline_bench.Recorder = real  # type: ignore[misc]
    for mode, out in ratios.items():
        print(f"{mode}: loop CPU per request +{statistics.median(out):.1%} over off "
              f"(median of {triples}; {', '.join(f'{r:+.0%}' for r in out)})")  # fmt: skip


def one_mode(mode: str, runs: int, emails: int) -> None:
    """A child of ``pinned``: ``runs`` runs of one mode, per request loop CPU as JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        inbox = pipeline_bench.make_inbox(emails, Path(tmp))
        uvloop.run(pipeline_bench.one_run(inbox, 1.0, 64, mode))  # warm-up
        out = [
            _per_request(uvloop.run(pipeline_bench.one_run(inbox, 1.0, 64, mode)))
            for _ in range(runs)
        ]
    print(json.dumps(out))


def pinned(emails: int, runs: int, passes: int) -> None:
    for p in range(passes):
        got: dict[str, list[float]] = {"off": [], "recording": []}
        for swap in (0, 1):
            cpus = {"off": str(swap), "recording": str(1 - swap)}
            procs = {
                mode: subprocess.Popen(
                    [
                        "taskset",
                        "-c",
                        cpus[mode],
                        sys.executable,
                        __file__,
                        "_one",
                        mode,
                        "--runs",
                        str(runs),
                        "--emails",
                        str(emails),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for mode in got
            }
            for mode, proc in procs.items():
                got[mode].extend(json.loads(proc.communicate()[0]))
        ratios = [r / o - 1 for r, o in zip(got["recording"], got["off"], strict=True)]
        spread = f"{min(ratios):+.0%}..{max(ratios):+.0%}"
        median = statistics.median(ratios)
        print(f"pass {p}: loop CPU per request +{median:.1%} over off (pairs {spread})")


def collections_(emails: int, runs: int) -> None:
    state: dict[int, list[float]] = {}
    started = [0.0]

    def hook(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            got = state.setdefault(info["generation"], [0, 0.0])
            got[0] += 1
            got[1] += time.thread_time() - started[0]

    gc.callbacks.append(hook)
    with tempfile.TemporaryDirectory() as tmp:
        inbox = pipeline_bench.make_inbox(emails, Path(tmp))
        uvloop.run(pipeline_bench.one_run(inbox, 1.0, 64, "off"))  # warm-up
        for _ in range(runs):
            for mode in ("off", "recording"):
                state.clear()
                r = uvloop.run(pipeline_bench.one_run(inbox, 1.0, 64, mode))
                seen = {g: state.get(g, [0, 0.0]) for g in (0, 1, 2)}
                gens = "  ".join(
                    f"gen{g} {int(n)} ({cpu * 1e3:.0f} ms)" for g, (n, cpu) in seen.items()
                )
                print(f"{mode:9s} loop CPU {r['loop_cpu_s']:.3f} s  {gens}", flush=True)
    gc.callbacks.remove(hook)


def chunks(emails: int, triples: int) -> None:
    from pantheon.sessions import _journal

    sizes = (_journal.CHUNK_ROWS, 128)
    ratios: dict[int, list[float]] = {size: [] for size in sizes}
    with tempfile.TemporaryDirectory() as tmp:
        inbox = pipeline_bench.make_inbox(emails, Path(tmp))
        uvloop.run(pipeline_bench.one_run(inbox, 1.0, 64, "off"))  # warm-up
        try:
            for _ in range(triples):
                off = _per_request(uvloop.run(pipeline_bench.one_run(inbox, 1.0, 64, "off")))
                for size in sizes:
                    _journal.CHUNK_ROWS = size
                    run = uvloop.run(pipeline_bench.one_run(inbox, 1.0, 64, "recording"))
                    ratios[size].append(_per_request(run) / off - 1)
        finally:
            _journal.CHUNK_ROWS = sizes[0]
    for size, out in ratios.items():
        print(f"chunks of {size} rows: loop CPU per request +{statistics.median(out):.1%} "
              f"over off (median of {triples})")  # fmt: skip


def parts(emails: int, rounds: int) -> None:
    from record_cycles import PARTS, switched_off

    modes: list[tuple[str, ...]] = [
        (),
        *((p,) for p in PARTS),
        ("envelopes", "deliveries", "effects"),
    ]
    ratios: dict[tuple[str, ...], list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        inbox = pipeline_bench.make_inbox(emails, Path(tmp))
        uvloop.run(pipeline_bench.one_run(inbox, 1.0, 64, "recording"))  # warm-up
        for _ in range(rounds):
            order: list[tuple[str, ...] | None] = [None, *modes]
            random.shuffle(order)
            row: dict[tuple[str, ...] | None, float] = {}
            for mode in order:
                with switched_off(mode or ()):
                    run = pipeline_bench.one_run(
                        inbox, 1.0, 64, "off" if mode is None else "recording"
                    )
                    row[mode] = _per_request(uvloop.run(run))
            for mode in modes:
                ratios[mode].append(row[mode] / row[None] - 1)
    for mode, out in ratios.items():
        name = "recording" + ("-without-" + "+".join(mode) if mode else "")
        print(f"{name:>48}: loop CPU per request {statistics.median(out):+.1%} over off "
              f"(median of {rounds}; {min(out):+.0%} to {max(out):+.0%})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("probe", choices=["writer", "pinned", "gc", "chunks", "parts", "_one"])
    parser.add_argument("mode", nargs="?", default="off")
    parser.add_argument("--emails", type=int, default=3000)
    parser.add_argument("--triples", type=int, default=8)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if args.probe == "writer":
        writer(args.emails, args.triples)
    elif args.probe == "pinned":
        pinned(args.emails, args.runs, args.passes)
    elif args.probe == "gc":
        collections_(args.emails, args.runs)
    elif args.probe == "chunks":
        chunks(args.emails, args.triples)
    elif args.probe == "parts":
        parts(args.emails, args.rounds)
    else:
        one_mode(args.mode, args.runs, args.emails)


if __name__ == "__main__":
    main()
