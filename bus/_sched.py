"""How long the thread running the bus waited for a CPU while it had work to do.

A latency figure mixes two things: the time the code took, and the time the operating
system gave the process no CPU. On a quiet machine the second is nil; beside other busy
processes it can dwarf the first. The bus measures it so that a timing check can tell
"the code is slow" from "the machine was busy" (``pantheon.runner._report.judge``).

Every handler, every queue wait and the bus itself run on one thread: the event loop's.
So the figure is that thread's, from the bus's ``start`` to the reading:

- ``cpu_s``: the time it ran on a CPU;
- ``wait_s``: the time it was runnable but waited on a run queue;
- ``share = wait_s / (wait_s + cpu_s)``: of the time the loop had work, the share it spent
  waiting for a CPU. Not ``wait_s / wall_s``: a paced input leaves the loop idle most of
  the run, and an idle loop waits for nothing, yet each burst of work it does is stretched
  by ``1 / (1 - share)``. Other threads (the session writer) do not count: they delay
  handlers only through the GIL, which is the process's own work, not the machine's.

Linux gives both exactly in ``/proc/self/task/<tid>/schedstat`` (on CPU ns, run-queue wait
ns, timeslices; present whenever the kernel has ``CONFIG_SCHED_INFO``, as distribution
kernels do). Elsewhere the figure is an estimate, and weaker: the process's CPU time, and
``share = 1 - cpus / load`` from the 1-minute load average (the machine's queue, not this
thread's; it lags a minute behind and counts this process itself). Without a load average
(Windows) there is no figure (``source == "none"``, ``share`` is ``None``) and no timing
check can be called inconclusive.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LoopScheduling",
    "SchedulingStats",
    "beside_the_loop",
    "read_schedstat",
    "run_delay_ns",
]


@dataclass(frozen=True, slots=True)
class SchedulingStats:
    """The loop thread's time since the bus started (see the module docstring).

    ``source`` says how it was measured: ``schedstat`` (exact, Linux), ``loadavg`` (an
    estimate from the process's CPU time and the load average) or ``none``."""

    source: str
    wall_s: float
    cpu_s: float
    wait_s: float
    share: float | None


def read_schedstat(path: str | Path) -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting on a run queue) from a ``schedstat`` file, or ``None`` when
    there is no such file or it does not hold two integers."""
    try:
        with open(path, "rb") as f:
            fields = f.read(128).split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


class _RunDelay:
    """The calling thread's ``schedstat``, kept open: a ``pread`` costs about what
    ``time.thread_time`` does (5 us on the loaded 2-core test machine), where opening the file
    for each reading cost 33 us. Thread-local, so the file read is always the reader's own;
    closed when its thread ends."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = -1

    def read(self) -> int | None:
        if self.fd < 0:
            return None
        try:
            return int(os.pread(self.fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


_thread = threading.local()
#: The threads inside :func:`beside_the_loop`, each with its reading when it entered, and
#: the waits of those that left: the sum only grows, so two readings always subtract.
_beside: tuple[tuple[_RunDelay, int], ...] = ()
_left_ns = 0
_beside_lock = threading.Lock()
#: The threads beside the loop are read at most this often (ns): a recorded run reads the run
#: delay around each CPU-timed handling, and reading the session writer's ``schedstat`` as
#: well doubled the ``pread`` calls (a 600-email pipeline run: 7.9 -> 15.5 an email, each a
#: system call and an int parsed). A reading up to this old moves each end of a handling's
#: window by as much: its figure may count, or miss, the writer's waits in that millisecond,
#: nothing like the 50 ms a timing check's bound is made of.
BESIDE_READ_NS = 1_000_000
#: Their last reading: (when, monotonic ns; the ``_beside`` it read; their waits then). A
#: thread entering or leaving replaces ``_beside``, which makes the next reading fresh.
_beside_read: tuple[int, tuple[tuple[_RunDelay, int], ...], int] = (0, (), 0)


@contextlib.contextmanager
def beside_the_loop() -> Iterator[None]:
    """Count the calling thread's waits for a CPU in :func:`run_delay_ns` while inside.

    For a thread of the process that takes the GIL while handlers run (the session writer):
    when the machine keeps it from a CPU with the GIL in hand, the loop's thread sleeps on
    the GIL, off the run queue, and the handler looks slow by however long the machine made
    the other thread wait. Measured on the 2-core test machine beside two busy loops
    (benchmarks/RESULTS.md): a recorded support_email run's Reasoner, 13 ms of CPU per
    handling at p99, spent up to 105 ms at p99 neither on a CPU nor on the loop's run queue;
    10-12 ms unrecorded. Counting the writer's waits errs the lenient way when it waited
    without the GIL, by at most its own waits."""
    global _beside, _left_ns
    reader = _RunDelay()
    base = reader.read()
    if base is None:
        yield
        return
    entry = (reader, base)
    with _beside_lock:
        _beside = (*_beside, entry)
    try:
        yield
    finally:
        last = reader.read()
        with _beside_lock:
            _beside = tuple(e for e in _beside if e is not entry)
            _left_ns += max((last or base) - base, 0)


def _forked() -> None:
    """In a forked child the kept files are the parent's threads': read this one afresh."""
    global _beside, _left_ns, _beside_read
    _thread.run_delay = None
    _beside, _left_ns, _beside_read = (), 0, (0, (), 0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def run_delay_ns() -> int | None:
    """Nanoseconds the calling thread has waited on a run queue since it started (Linux's
    ``run_delay``), plus the waits of the threads :func:`beside_the_loop`; ``None`` where the
    kernel does not say. The difference of two readings around a handling is the part of
    its wall time the machine, not the code, took: the kernel adds a wait to the figure when
    the thread gets its CPU back, so a reading by the running thread itself is never short
    of one."""
    global _beside_read
    reader: _RunDelay | None = getattr(_thread, "run_delay", None)
    if reader is None:
        reader = _thread.run_delay = _RunDelay()
    own = reader.read()
    if own is None or (not _beside and not _left_ns):
        return own
    beside = _beside
    at, read_for, waits = _beside_read
    now = time.monotonic_ns()
    if read_for is not beside or now - at >= BESIDE_READ_NS:
        waits = 0
        for other, base in beside:
            reading = other.read()
            waits += 0 if reading is None else reading - base
        _beside_read = (now, beside, waits)
    return own + waits + _left_ns


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


class LoopScheduling:
    """Readings of the calling thread's scheduling, from construction to each :meth:`read`.

    Construct it on the thread to measure (the bus does, in ``start``); :meth:`read` may be
    called from any thread. ``proc``, ``loadavg`` and ``cpus`` are there for tests: a fake
    ``/proc`` tree, a load average, a CPU count."""

    __slots__ = ("_cpu0", "_cpus", "_load0", "_loadavg", "_path", "_wait0", "_wall0", "source")

    def __init__(
        self,
        *,
        proc: str | Path = "/proc",
        loadavg: Callable[[], float | None] = _loadavg,
        cpus: int | None = None,
    ) -> None:
        self._path = Path(proc, "self", "task", str(threading.get_native_id()), "schedstat")
        self._loadavg = loadavg
        self._cpus = cpus or os.cpu_count() or 1
        self._wall0 = time.monotonic()
        first = read_schedstat(self._path)
        self._load0: float | None = None
        if first is not None:
            self.source = "schedstat"
            self._cpu0, self._wait0 = first
        else:
            self._load0 = loadavg()
            self.source = "none" if self._load0 is None else "loadavg"
            self._cpu0, self._wait0 = time.process_time_ns(), 0

    def read(self) -> SchedulingStats:
        """What the thread did since construction."""
        wall = time.monotonic() - self._wall0
        if self.source == "schedstat":
            now = read_schedstat(self._path)
            if now is not None and (now[0] > self._cpu0 or now[1] > self._wait0):
                cpu = (now[0] - self._cpu0) / 1e9
                wait = (now[1] - self._wait0) / 1e9
                return SchedulingStats("schedstat", wall, cpu, wait, wait / (cpu + wait))
            # The thread is gone (the bus outlived its loop's thread), or the kernel does not
            # account (a file of zeros): no figure rather than a share of 0.
            return SchedulingStats("none", wall, 0.0, 0.0, None)
        cpu = (time.process_time_ns() - self._cpu0) / 1e9
        if self.source == "none":
            return SchedulingStats("none", wall, cpu, 0.0, None)
        load = max((x for x in (self._load0, self._loadavg()) if x is not None), default=0.0)
        share = 1.0 - self._cpus / load if load > self._cpus else 0.0
        wait = cpu * share / (1.0 - share) if share < 1.0 else 0.0
        return SchedulingStats("loadavg", wall, cpu, wait, share)
