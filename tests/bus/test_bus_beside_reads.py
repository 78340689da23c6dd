"""The waits of the threads beside the loop (the session writer), read around every timed
handling of a recorded run, are read from ``schedstat`` at most once per
``BESIDE_READ_NS``, and afresh the moment such a thread enters or leaves: a thread that
left counts once, in what it left behind, never again through a kept reading.

The readers are faked (one number of run-queue ns per reader), so the figures are exact."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import bus._sched as sched
from bus import beside_the_loop

MS = 1_000_000


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[int, int]]:
    """Run-queue ns per reader (by id), 0 unless set; every reading is recorded."""
    figures: dict[int, int] = {}
    monkeypatch.setattr(sched._RunDelay, "read", lambda self: figures.get(id(self), 0))
    monkeypatch.setattr(sched, "_beside_read", (0, (), 0))
    monkeypatch.setattr(sched, "_left_ns", sched._left_ns)  # put back after: the test adds
    yield figures


def test_a_writer_beside_the_loop_is_read_once_a_millisecond_and_counted_once_when_gone(
    waits: dict[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sched, "BESIDE_READ_NS", 3600 * 10**9)  # nothing expires on its own
    entered, leave = threading.Event(), threading.Event()

    def writer() -> None:
        with beside_the_loop():
            entered.set()
            leave.wait()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        entered.wait()
        left_before = sched._left_ns
        (reader,) = [r for r, _ in sched._beside]
        waits[id(reader)] = 5 * MS  # the writer queued 5 ms for a CPU
        assert sched.run_delay_ns() == 5 * MS + left_before  # a new thread: read at once
        waits[id(reader)] = 7 * MS
        assert sched.run_delay_ns() == 5 * MS + left_before  # kept: not read again
        monkeypatch.setattr(sched, "BESIDE_READ_NS", 0)
        assert sched.run_delay_ns() == 7 * MS + left_before  # expired: read again
        monkeypatch.setattr(sched, "BESIDE_READ_NS", 3600 * 10**9)
    finally:
        leave.set()
        thread.join()
    # Gone: its 7 ms are in what it left, and the kept reading of it is not added as well.
    assert sched._left_ns == left_before + 7 * MS
    assert sched.run_delay_ns() == 7 * MS + left_before
