"""What recording costs the nine-agent pipeline in modelled CPU cycles per email, and which
part of the record costs what: the figure that explains why timed runs show more than
the instruction count.

    python benchmarks/record_cycles.py [--emails 100 600] [--modes off,recording]
        [--without envelopes,deliveries,effects,digests]

Why: ``record_instructions.py`` counts a recorded email at ~14-16% more instructions than
an unrecorded one, yet timed runs on the 2-vCPU VMs measure 18-27% more loop CPU, run after
run (benchmarks/RESULTS.md, sessions 12-17). Instructions are not equal: one that misses
the instruction or data cache, or follows a mispredicted branch, costs several times one
that does not. Valgrind's cachegrind simulates both caches and the branch predictor, as
deterministically as callgrind counts, so this runs the same pipeline (``record_instructions``'
child: start-up to ``bus.drain()``, clock-driven work stretched by ``--slow``, two sizes
subtracted) under ``cachegrind --cache-sim=yes --branch-sim=yes`` and weighs its events:

    cycles = 0.4 x instructions + 12 x (I1 misses + D1 misses) + 150 x LL misses
             + 15 x mispredicted branches

The weights are nominal (a core retiring ~2.5 instructions a cycle, an L2 hit after an L1
miss, a DRAM access, a Zen-class misprediction), so the absolute cycles mean little; the
ratio between modes is the figure, and it tracked the timed ratios within 1-3 points for
every part switched off (RESULTS "Session 17"). Runs of one code agree within ~1 point.

``--without`` records a run with parts of the record switched off, to see what each part
costs (a run without them records less than a session needs: a measuring device only):
``envelopes`` (the publish listener), ``deliveries`` (the delivery listener), ``effects``
(the effects runner calls each function and records nothing), ``digests`` (effects
recorded without their request digest). Cachegrind profiles every thread together: the
writer's share is small here (its journal commits; the count stops before materializing).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTS = ("envelopes", "deliveries", "effects", "digests")
#: Nominal cycles per event (see the module docstring).
WEIGHTS = {"Ir": 0.4, "I1mr": 12, "D1mr": 12, "D1mw": 12, "ILmr": 150, "DLmr": 150, "DLmw": 150}
MISPREDICT = 15


@contextlib.contextmanager
def switched_off(parts: Sequence[str]) -> Iterator[None]:
    """Inside, recorders leave ``parts`` out (``PARTS``); restored on leaving.
    ``record_timing_probe.py parts`` times the same switches."""
    from pantheon.sessions import _effects, _journal

    async def call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = fn(*args, **kwargs)
        if _effects._awaitable(result):
            result = await result
        return result

    def effect(self: Any, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return call(fn, args, kwargs)

    switches: dict[str, tuple[Any, str, Any]] = {
        "envelopes": (_journal.EnvelopeRows, "add_envelope", lambda self, env: None),
        "deliveries": (_journal.DeliveryRows, "add_delivery", lambda self, d: None),
        "digests": (_effects, "request_digest", lambda fn, args, kwargs: None),
        "effects": (_effects.RecordingEffects, "effect", effect),
    }
    kept = [(owner, name, getattr(owner, name)) for owner, name, _ in map(switches.get, parts)]
    try:
        for part in parts:
            owner, name, stand_in = switches[part]
            setattr(owner, name, stand_in)
        yield
    finally:
        for owner, name, original in kept:
            setattr(owner, name, original)


def _profile(mode: str, emails: int, slow: float, without: str, out: Path) -> subprocess.Popen[str]:
    args = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--branch-sim=yes"]
    args += [f"--cachegrind-out-file={out}/cachegrind.out"]
    args += [sys.executable, __file__, "--child", mode, str(emails), "--slow", str(slow)]
    args += ["--without", without]
    return subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _events(proc: subprocess.Popen[str], out: Path) -> dict[str, int]:
    """The whole run's event totals (``summary:`` of cachegrind's output file)."""
    log, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"valgrind run failed (exit {proc.returncode}):\n{log[-2000:]}")
    text = (out / "cachegrind.out").read_text(errors="replace")
    names = re.search(r"^events:\s+(.+)$", text, re.M)
    totals = re.search(r"^summary:\s+(.+)$", text, re.M)
    if names is None or totals is None:
        raise SystemExit(f"no cachegrind summary in {out}:\n{log[-2000:]}")
    return dict(zip(names.group(1).split(), map(int, totals.group(1).split()), strict=True))


def _cycles(ev: dict[str, float]) -> float:
    return sum(w * ev.get(k, 0) for k, w in WEIGHTS.items()) + MISPREDICT * (
        ev.get("Bcm", 0) + ev.get("Bim", 0)
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, nargs=2, default=[100, 600], metavar=("FEW", "MANY"))
    parser.add_argument(
        "--modes",
        default="off,recording",
        help=f"off, recording, or recording-without-<part>[+<part>] (parts: {', '.join(PARTS)})",
    )
    parser.add_argument("--slow", type=float, default=25.0)
    parser.add_argument("--without", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "EMAILS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(HERE))
        from record_instructions import _child

        with switched_off([p for p in args.without.split("+") if p]):
            _child(args.child[0], int(args.child[1]), args.slow)
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (Debian: apt-get install valgrind)")
    few, many = args.emails
    if many <= few:
        parser.error("--emails FEW MANY: MANY must be larger")
    base: float | None = None
    for mode in args.modes.split(","):
        run, _, without = mode.partition("-without-")
        unknown = [p for p in without.split("+") if p and p not in PARTS]
        if run not in ("off", "recording") or unknown or (run == "off" and without):
            parser.error(f"--modes: {mode!r} is not off, recording or recording-without-<part>")
        with tempfile.TemporaryDirectory() as tmp:
            dirs = [Path(tmp, "few"), Path(tmp, "many")]
            for d in dirs:
                d.mkdir()
            sizes = zip((few, many), dirs, strict=True)
            procs = [_profile(run, n, args.slow, without, d) for n, d in sizes]
            small, large = (_events(p, d) for p, d in zip(procs, dirs, strict=True))
        per = {k: (large[k] - small[k]) / (many - few) for k in large}
        cycles = _cycles(per)
        line = (
            f"{mode:>24}: {cycles / 1e6:.3f} M modelled cycles per email "
            f"({per['Ir'] / 1e6:.3f} M instructions, I1 misses {per['I1mr'] / 1e3:.1f} k, "
            f"D1 misses {(per['D1mr'] + per['D1mw']) / 1e3:.1f} k, "
            f"mispredicted branches {(per['Bcm'] + per['Bim']) / 1e3:.1f} k)"
        )
        if base is None and run == "off":
            base = cycles
        elif base is not None:
            line += f", {cycles / base - 1:+.1%} over off"
        print(line, flush=True)


if __name__ == "__main__":
    main()
