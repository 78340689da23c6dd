"""A node's control pipe when its driver is gone: a line the node says then (the answer to
a ``status`` the driver asked just before it was SIGKILLed) is dropped, not raised. Raised,
it ended the node mid-command: no orphan's log, its journal left unfinished (the NATS
resume test found an orphan's log missing, about once in ten runs)."""

from __future__ import annotations

import contextlib
import os

from pantheon.runner._multiprocess import say_control


def test_saying_to_a_driver_that_is_gone_is_not_an_error() -> None:
    read, write = os.pipe()
    os.close(read)  # the driver died: nobody reads the node's stdout any more
    out = os.fdopen(write, "w", encoding="utf-8")
    try:
        say_control(out, "status", queued=0)  # raised BrokenPipeError before
        say_control(out, "report", report={})
    finally:
        with contextlib.suppress(BrokenPipeError):  # what is buffered has nowhere to go
            out.close()
