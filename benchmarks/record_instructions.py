"""What recording costs the nine-agent pipeline in CPU instructions per email: a figure a
busy or noisy machine cannot move.

    python benchmarks/record_instructions.py [--emails 100 600] [--modes off,recording]

Why: on the shared 2-vCPU VMs this project is measured on, the loop CPU of identical
unrecorded pipeline runs spans 1.2-2.1 s in one process, and per-repeat recorded/unrecorded
ratios of one pass run from -18% to +55% (benchmarks/RESULTS.md): a 15% target cannot be
shown or refuted by timing there, and a change worth 2% is invisible. The VMs have no
performance counters (``perf stat -e instructions`` reports none), so each run goes under
valgrind's cachegrind (``--cache-sim=no``: instruction counts only), whose count of a
run is the same on a quiet machine and a loaded one (off-mode figures of three passes
agreed within 0.5%).

What is counted: every thread of the process (the session writer's commits included) from
start-up to the end of ``bus.drain()``; the process then exits at once, so the recorder's
``finish`` (materializing the journal after the run) is left out, as ``pipeline_bench``
stops its clock there. Start-up cancels out: the figure per email is the difference of two
runs of different sizes divided by the difference in emails. The model has no latency
(``--latency-ms 0`` of ``pipeline_bench``): a sleep costs no instructions, and a run that
sleeps only reorders the same work.

Two things differ from a timed run and are stated with the figures:
- Under valgrind the run takes ~25x as long, so the recorder's clock-driven work (its
  10 ms ticker, the 50 ms group commit, the 1 s metrics snapshot) would run 25x as often
  per email, and the bus's workers would give the loop back 25x as often (they yield
  after 1 ms of wall time). ``--slow`` (default 25) stretches those intervals by as much.
- The writer never materializes journal chunks inside the run (see ``_child``).
- Large copies (glibc's ``rep movsb``) count one instruction per byte: copying costs far
  less per counted instruction than Python's own code does, so a change that only saves
  copies saves less time than its instruction count says.
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


def _count(mode: str, emails: int, slow: float) -> subprocess.Popen[str]:
    args = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    args += [sys.executable, __file__, "--child", mode, str(emails), "--slow", str(slow)]
    return subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _refs(proc: subprocess.Popen[str]) -> int:
    out, _ = proc.communicate()
    found = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run failed (exit {proc.returncode}):\n{out[-2000:]}")
    return int(found.group(1).replace(",", ""))


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
    per_email: dict[str, float] = {}
    for mode in args.modes.split(","):
        # Both sizes at once: instruction counts do not depend on what else runs.
        small, large = _count(mode, few, args.slow), _count(mode, many, args.slow)
        per_email[mode] = (_refs(large) - _refs(small)) / (many - few)
        line = f"{mode:>10}: {per_email[mode] / 1e6:.3f} M instructions per email"
        if mode != "off" and "off" in per_email:
            line += f" ({per_email[mode] / per_email['off'] - 1:+.1%} over off)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
