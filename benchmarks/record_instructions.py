"""What recording costs the nine-agent pipeline in CPU instructions per email: a figure a
busy or noisy machine cannot move.

    python benchmarks/record_instructions.py [--emails 100 600] [--modes off,recording]

Why: on the shared 2-vCPU VMs this project is measured on, the loop CPU of identical
unrecorded pipeline runs spans 1.2-2.1 s in one process, and per-repeat recorded/unrecorded
ratios of one pass run from -18% to +55% (benchmarks/RESULTS.md): a 15% target cannot be
shown or refuted by timing there, and a change worth 2% is invisible. The VMs have no
performance counters (``perf stat -e instructions`` reports none), so each run goes under
valgrind's callgrind, whose count of a run is the same on a quiet machine and a loaded one
(runs of one code agree within about 0.5%, off and recorded alike).

What is counted, from start-up to the end of ``bus.drain()``: every thread of the process
(the session writer's commits included), and the event loop's thread alone (callgrind's
``--separate-threads``). That thread runs every handler and every listener, so its count is
the pipeline's critical path; the writer's SQLite work runs on the other core without the
GIL. The process then exits at once, so the recorder's ``finish`` (materializing the journal
after the run) is left out, as ``pipeline_bench`` stops its clock there. Start-up cancels
out: the figure per email is the difference of two runs of different sizes divided by the
difference in emails. The model has no latency
(``--latency-ms 0`` of ``pipeline_bench``): a sleep costs no instructions, and a run that
sleeps only reorders the same work.

What differs from a timed run, stated with the figures:
- Under valgrind the run takes ~25x as long, so the recorder's clock-driven work (its
  10 ms ticker, the 50 ms group commit, the 1 s metrics snapshot; the bus's readings of
  the writer's run delay, at most one a millisecond) would run 25x as often per email,
  and the bus's workers would give the loop back 25x as often (they yield after 1 ms of
  wall time). ``--slow`` (default 25) stretches those intervals by as much.
- The writer never materializes journal chunks inside the run (see ``_child``).
- Large copies (glibc's ``rep movsb``) count one instruction per byte: copying costs far
  less per counted instruction than Python's own code does, so a change that only saves
  copies saves less time than its instruction count says.
- Only user-space instructions count: a system call's time in the kernel does not (the
  bus's ``/proc/thread-self/schedstat`` reads around timed handlings, say).
- Valgrind's CPU hides SHA-NI, so OpenSSL's hashes take their slower path here; blake2b
  (CPython's own) is the same code under valgrind as on the CPU.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _child(mode: str, emails: int, slow: float) -> None:
    """One pipeline run, ended at ``bus.drain()`` (runs under valgrind)."""
    sys.path.insert(0, str(HERE))
    import uvloop
    from pipeline_bench import make_inbox, one_run

    import bus._sched
    import bus._worker
    from bus import Bus
    from pantheon.sessions import _recorder

    drain = Bus.drain

    async def drain_then_exit(self: Bus, *args: object, **kwargs: object) -> None:
        await drain(self, *args, **kwargs)  # type: ignore[arg-type]
        os._exit(0)

    Bus.drain = drain_then_exit  # type: ignore[method-assign]
    _recorder._TICK *= slow
    # The bus's workers give the loop back after holding it this long (wall time).
    bus._worker.FAIRNESS_NS = int(bus._worker.FAIRNESS_NS * slow)
    # The writer's run delay is read at most once per this much wall time.
    bus._sched.BESIDE_READ_NS = int(bus._sched.BESIDE_READ_NS * slow)
    # Materializing inside the run is the writer's guess that the loop is idle, read from
    # the loop's CPU share and its ticker's lateness: under valgrind, and more so on a busy
    # machine, those guesses differ from run to run (a 3,000-email run materializes 1-3
    # chunks on a quiet machine). Left to the finish here, as the count stops before it.
    _recorder._Writer._loop_idle = lambda self, now: False  # type: ignore[method-assign]
    _recorder._MAX_LAG *= slow
    init = _recorder.Recorder.__init__

    def stretched(self: _recorder.Recorder, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("commit_interval", _recorder.DEFAULT_COMMIT_INTERVAL * slow)
        kwargs.setdefault("metrics_interval", _recorder.DEFAULT_METRICS_INTERVAL * slow)
        init(self, *args, **kwargs)  # type: ignore[arg-type]

    _recorder.Recorder.__init__ = stretched  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        inbox = make_inbox(emails, Path(tmp))
        uvloop.run(one_run(inbox, 0.0, 64, mode))
    raise SystemExit("the run ended without bus.drain()")


def _count(mode: str, emails: int, slow: float, out: Path) -> subprocess.Popen[str]:
    """The run under callgrind, one profile per thread in ``out`` (``cg.<pid>-<thread>``)."""
    args = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-instr=no"]
    args += [f"--callgrind-out-file={out}/cg.%p"]
    args += [sys.executable, __file__, "--child", mode, str(emails), "--slow", str(slow)]
    return subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _refs(proc: subprocess.Popen[str], out: Path) -> tuple[int, int]:
    """(the loop's thread, every thread): instructions of the run ``proc`` profiled."""
    log, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"valgrind run failed (exit {proc.returncode}):\n{log[-2000:]}")
    threads: dict[int, int] = {}
    for path in out.glob("cg.*-*"):
        found = re.search(r"^totals:\s+(\d+)", path.read_text(errors="replace"), re.M)
        if found is not None:
            threads[int(path.name.rpartition("-")[2])] = int(found.group(1))
    if 1 not in threads:
        raise SystemExit(f"no profile of the main thread in {out}:\n{log[-2000:]}")
    return threads[1], sum(threads.values())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, nargs=2, default=[100, 600], metavar=("FEW", "MANY"))
    parser.add_argument("--modes", default="off,recording")
    parser.add_argument("--slow", type=float, default=25.0)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "EMAILS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args.slow)
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (Debian: apt-get install valgrind)")
    few, many = args.emails
    if many <= few:
        parser.error("--emails FEW MANY: MANY must be larger")
    loop: dict[str, float] = {}
    total: dict[str, float] = {}
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            small_dir, large_dir = Path(tmp, "few"), Path(tmp, "many")
            small_dir.mkdir()
            large_dir.mkdir()
            # Both sizes at once: instruction counts do not depend on what else runs.
            small = _count(mode, few, args.slow, small_dir)
            large = _count(mode, many, args.slow, large_dir)
            (loop_s, total_s), (loop_l, total_l) = _refs(small, small_dir), _refs(large, large_dir)
        loop[mode] = (loop_l - loop_s) / (many - few)
        total[mode] = (total_l - total_s) / (many - few)
        line = (
            f"{mode:>10}: {total[mode] / 1e6:.3f} M instructions per email, "
            f"{loop[mode] / 1e6:.3f} M on the loop's thread"
        )
        if mode != "off" and "off" in total:
            line += (
                f" ({total[mode] / total['off'] - 1:+.1%} over off; "
                f"loop's thread {loop[mode] / loop['off'] - 1:+.1%})"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
