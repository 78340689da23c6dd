"""The worker loop: pop, handle, settle; retries, dead letters and timing samples.

Each subscription has ``concurrency`` long-lived workers. A worker pops the highest
priority message, awaits the handler, and bumps integer counters and histogram slots
inline. An idle worker parks on a future that the next offer resolves.

A failed message that has retries left does not keep its worker (nor a mailbox slot) while
it waits out the backoff: a task holds it outside the mailbox and then hands it back
(``Subscription.requeue``); a worker takes such a retry after each fresh message, so
retries never run back to back. A worker sleeping through a backoff was what let 1%
poison in a default ``block`` mailbox hold it full and stall the publisher every other
subscriber shares. At most ``max_queue`` messages per subscription wait that way; past that
a worker waits inline, which slows only this subscription's intake.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

from bus._breaker import CLOSED, HALF_OPEN
from bus._clock import Clock
from bus._dlq import traceback_text
from bus._envelope import Envelope
from bus._errors import BusClosedError, CircuitOpenError
from bus._hooks import SAMPLED_DIGITS, UNSAMPLED, Delivery, Hooks, Tracer
from bus._metrics import Histogram
from bus._sched import run_delay_ns
from bus._subscription import Subscription, give_back
from bus._transport import Receipt

__all__ = ["current_envelope", "current_handler", "current_subscription", "work"]

#: A worker that has held the loop this long without suspending yields to it, so a
#: subscriber whose handler never suspends cannot starve the others. A time budget rather
#: than a message count: yielding every 128 messages cost cheap handlers a loop pass (a
#: selector poll) every ~100 µs and kept a fast publisher's mailbox full, while a 100 µs
#: handler still held the loop for 12.8 ms at a time.
FAIRNESS_NS = 1_000_000
#: The clock is read for that at most every this many back-to-back messages. A worker whose
#: handlers turn out slow (the budget overshot by 2x) looks twice as often, down to every
#: message, so a 5 ms handler holds the loop for one or two handlings, not sixteen; cheap
#: handlers take it back to this.
FAIRNESS_CHECK = 16
#: Each worker times every message it handles up to this many, then one in TIME_SAMPLE
#: (always every message while a delivery observer listens). Counters are exact either way.
TIME_ALL_UNTIL = 4096
TIME_SAMPLE = 16
#: The loop thread's CPU time and run-queue wait are read around the first this many
#: handlings a subscription delivers (however many workers it has), then one in CPU_SAMPLE of
#: each worker's (a subset of the timed ones). Each read is a system call, several times the
#: cost of the monotonic clock, so they are sampled more sparsely; the timing checks need
#: their p99 only to say whether a handler's own time exceeds a bound. The CPU clock alone
#: cost about 0.6% of a no-op subscriber's CPU, nothing measurable on the pipeline
#: (benchmarks/timing_bench.py); with the run-queue reads see benchmarks/RESULTS.md.
CPU_ALL_UNTIL = 256
CPU_SAMPLE = 256

_monotonic_ns = time.monotonic_ns
_thread_ns = time.thread_time_ns
_run_delay_ns = run_delay_ns
#: The outcome of an attempt that failed and waits outside the mailbox for another (the
#: worker tests it by identity; observers never see it, the tracer does).
RETRYING = "retrying"


class Running:
    """What a running handler knows about itself: emits read it to fill in causation, and
    an effects runner numbers the handling's effects with ``effects``."""

    __slots__ = ("effects", "env", "sub")

    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        self.env: Envelope | None = None
        #: Effects (``agents.Effects`` calls) this handling has made so far, over all its
        #: attempts: a recorded effect's position is (message, subscriber, this count), and
        #: a retry goes on from the last attempt's. Kept here, where the handling is, the
        #: count costs a recorder no table of its own: a dict of counters by (message,
        #: subscriber), dropped at each delivery, cost a recorded pipeline run 25,000
        #: instructions an email on the loop's thread (benchmarks/RESULTS.md, "Session 17").
        self.effects = 0


#: Set in each worker's task; ``None`` elsewhere. Public for a caller on the hot path that
#: needs both the envelope and the subscription (a recorded effect, ~20,000 a pipeline run):
#: one read of the context, where a helper returning both cost 0.11 µs more a call (98 vs
#: 210 ns, min of 7 x 200,000).
current_handler: contextvars.ContextVar[Running | None] = contextvars.ContextVar(
    "pantheon_bus_worker", default=None
)


def current_envelope() -> Envelope | None:
    """The envelope whose handler is running in this task, or ``None`` outside handlers."""
    running = current_handler.get()
    return None if running is None else running.env


def current_subscription() -> str | None:
    """The name of the subscription whose handler is running in this task, or ``None``."""
    running = current_handler.get()
    return None if running is None else running.sub.name


def _cancelling() -> int:
    """Non-zero when this task is being cancelled, as opposed to a handler's own await
    raising CancelledError (e.g. it awaited a future someone else cancelled)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


async def work(sub: Subscription, hooks: Hooks, clock: Clock) -> None:
    """One worker of ``sub``, until cancelled."""
    running = Running(sub)
    current_handler.set(running)
    q0, q1, q2 = sub.queues
    handler = sub.handler
    breaker = sub.breaker
    idle = sub.idle
    ledger = sub.ledger
    attempts = sub.attempts
    now = _monotonic_ns
    loop = asyncio.get_running_loop()
    due = sub.due
    seen = 0
    start = 0
    turn = now()  # when this worker last got the loop back
    every = countdown = FAIRNESS_CHECK  # messages between looks at the clock
    fresh = True  # the last message taken was not a retry: a due retry may go next
    timed: object  # take the clock for this message (a bool, or the observer tuple)
    cpu0 = 0
    rq0: int | None = None
    while True:
        if due and fresh:
            env = due.popleft()
            fresh = False
        elif q0:
            env = q0.popleft()
            fresh = True
        elif q1:
            env = q1.popleft()
            fresh = True
        elif q2:
            env = q2.popleft()
            fresh = True
        elif due:
            env = due.popleft()
        else:
            fut = loop.create_future()
            idle.append(fut)
            await fut
            turn = now()
            continue
        sub.size -= 1
        if sub.putters:
            sub.wake_putter()
        sub.in_flight += 1
        running.env = env
        seen += 1
        # Histograms take every message until they have a solid base, then one in
        # TIME_SAMPLE: two clock reads and two bucket updates were half the worker's cost.
        # A delivery observer (a recorder) still gets every message's timestamps.
        delivery = hooks.delivery
        sampled = seen <= TIME_ALL_UNTIL or not seen % TIME_SAMPLE
        cpu_timed = sampled and (sub.delivered < CPU_ALL_UNTIL or not seen % CPU_SAMPLE)
        tracer = hooks.tracer
        span = error = None
        if attempts and id(env) in attempts:
            # Another attempt at a message that failed before: same span, same delivery.
            done, first, span, error, running.effects = attempts.pop(id(env))
            sub.retries += 1
            timed = True
            start = now()
            if span is not None and tracer is not None:
                tracer.resume_process(span)
        else:
            done = 1
            running.effects = 0
            timed = sampled or delivery
            if timed:
                start = first = now()
            if tracer is not None:
                trace = env.trace
                if trace is not UNSAMPLED and trace is not None and trace[-1] in SAMPLED_DIGITS:
                    span = tracer.start_process(sub.name, env)
        outcome = "delivered"
        if cpu_timed:
            rq0 = _run_delay_ns()
            cpu0 = _thread_ns()
        if breaker.state is not CLOSED and not breaker.try_acquire():
            outcome = "circuit_open"
            sub.dead_lettered += 1
            exc = CircuitOpenError(sub.name, breaker.retry_after())
            sub.dlq.add(env, sub.name, "circuit_open", exc)
            fail_request(env, exc)
        else:
            try:
                result = await handler(env)
            except (Exception, SystemExit) as exc:
                # SystemExit too: a handler's sys.exit() is a failed message, dead-lettered
                # with its traceback, not the process ending with its code and no word.
                # (KeyboardInterrupt is left to stop the loop: a second Ctrl-C under
                # asyncio.run arrives as one, in whatever handler happens to be running.)
                error = error or exc
                outcome = await _failed(sub, env, exc, clock, done)
            except asyncio.CancelledError as exc:
                if _cancelling():  # aclose cancelled this worker: account, then stop
                    abandon(sub, env)
                    if span is not None and tracer is not None:
                        tracer.end_process(span, "bus_closed", exc)
                    raise
                # The handler's own await was cancelled: a failure like any other.
                error = error or exc
                outcome = await _failed(sub, env, exc, clock, done)
            else:
                sub.delivered += 1
                if breaker.dirty:
                    breaker.record_success()
                reply = env.reply
                if reply is not None:
                    if isinstance(reply, Receipt):
                        reply.settle(result, None)
                    elif result is not None and not reply.done():
                        reply.set_result(result)
        if outcome is RETRYING:
            # Out of the worker's hands until the retry is due: in flight still, unsettled.
            attempts[id(env)] = (done + 1, first, span, error, running.effects)
            _retry_later(sub, env, clock, tracer)
            if span is not None and tracer is not None:
                tracer.end_process(span, outcome, error)
        else:
            if timed:
                end = now()
                if sampled:
                    if cpu_timed:
                        rq1 = _run_delay_ns()
                        sub.handling_cpu.record(_thread_ns() - cpu0)
                        if rq0 is not None and rq1 is not None:
                            sub.handling_own.record(max(end - start - (rq1 - rq0), 0))
                    _timed(sub, env, start, end - start)
                if delivery:
                    # Read again: an observer may have rebound its method while the handler
                    # ran (a recorder swapping buffers), and the old one's list is gone.
                    d = Delivery(sub.name, env, first, end, outcome)
                    for observer in hooks.delivery:
                        observer(d)
            if span is not None and tracer is not None:
                tracer.end_process(span, outcome, error)
            sub.in_flight -= 1
            ledger.outstanding -= 1
            if not ledger.outstanding and ledger.drain_waiters:
                ledger.wake()
        countdown -= 1
        if not countdown:
            held = now() - turn
            if held >= FAIRNESS_NS:
                if held >= 2 * FAIRNESS_NS and every > 1:
                    every //= 2
                await asyncio.sleep(0)
                turn = now()
            elif held < FAIRNESS_NS // 2 and every < FAIRNESS_CHECK:
                every *= 2
            countdown = every


def _timed(sub: Subscription, env: Envelope, start: int, took: int) -> None:
    """Record one sampled delivery: queue wait on its edge and handling time.

    Bucket arithmetic is inlined (see bus._metrics.bucket): under a recorder this runs for
    every message, and two calls per record cost as much as the rest of it."""
    hist = sub.edges.get(env.source)
    if hist is None:
        hist = sub.edges[env.source] = Histogram()
    for h, d in ((hist, start - env.created), (sub.handling, took)):
        if d < 16:
            h.counts[d if d > 0 else 0] += 1
        else:
            shift = d.bit_length() - 4
            slot = (shift << 3) + (d >> shift)
            h.counts[slot if slot < 511 else 511] += 1
        h.total += d
        if d > h.max:
            h.max = d


async def _failed(
    sub: Subscription, env: Envelope, exc: BaseException, clock: Clock, done: int
) -> str:
    """Attempt number ``done`` failed: retry per the subscription's policy, or dead-letter.

    Returns the outcome: ``retrying`` (the caller hands the message to a delayed re-offer),
    ``delivered`` (an inline retry succeeded) or ``failed``."""
    retry = sub.retry
    breaker = sub.breaker
    refusal = getattr(exc, "dead_letter_reason", None)
    if type(refusal) is str:
        # A refusal (a spent model budget, say): retrying cannot change the answer and the
        # subscriber is not failing, so the message is dead-lettered at once under the
        # refusal's own reason and the breaker hears nothing (a half-open probe gives its
        # slot back): refusals must not open a breaker and turn into ``circuit_open``.
        breaker.release()
        sub.dead_lettered += 1
        sub.dlq.add(env, sub.name, refusal, exc, traceback_text(exc), done)
        fail_request(env, exc)
        return "failed"
    while True:
        sub.failures += 1
        # The breaker hears of a message once, when it fails for good: attempts of several
        # messages retried after their backoffs may run back to back, and counting each
        # made a few poison messages look like "5 consecutive failures", opening the
        # breaker for every message. A half-open probe's failure still counts at once.
        last = done >= retry.attempts
        if last or breaker.state is not CLOSED:
            breaker.record_failure(sub.delivered)
            break
        if len(sub.attempts) < sub.max_queue:
            return RETRYING  # sub.retries counts it when it is tried again
        # Too many already wait outside: this one waits here, slowing only this mailbox.
        try:
            await clock.sleep(retry.delay(done))
        except asyncio.CancelledError:
            abandon(sub, env)
            raise
        done += 1
        sub.retries += 1
        try:
            result = await sub.handler(env)
        except (Exception, SystemExit) as again:
            exc = again
            continue
        except asyncio.CancelledError as again:
            if _cancelling():
                abandon(sub, env)
                raise
            exc = again
            continue
        sub.delivered += 1
        if breaker.dirty:
            breaker.record_success()
        if env.reply is not None:
            answer(env, result)
        return "delivered"
    sub.dead_lettered += 1
    sub.dlq.add(env, sub.name, "failed", exc, traceback_text(exc), done)
    fail_request(env, exc)
    return "failed"


def _retry_later(sub: Subscription, env: Envelope, clock: Clock, tracer: Tracer | None) -> None:
    """Hold ``env`` outside the mailbox for its backoff, then put it back for another try.
    ``sub.attempts`` has its next attempt's number; the task is cancelled if the bus closes."""
    delay = sub.retry.delay(sub.attempts[id(env)][0] - 1)

    async def later() -> None:
        try:
            await clock.sleep(delay)
        except asyncio.CancelledError:
            retried = sub.attempts.pop(id(env), None)
            abandon(sub, env, probe=False)
            if retried is not None and retried[2] is not None and tracer is not None:
                tracer.end_process(retried[2], "bus_closed", retried[3])
            raise
        sub.requeue(env)

    task = asyncio.get_running_loop().create_task(later(), name=f"bus:{sub.name}:retry")
    sub.waiting.add(task)
    task.add_done_callback(sub.waiting.discard)


def abandon(sub: Subscription, env: Envelope, *, probe: bool = True) -> None:
    """The worker handling ``env`` (or the task holding it for a retry, ``probe=False``)
    was cancelled because the bus is closing: give a remote message back for another member
    of its group (at least once: its handler may have begun), dead-letter a local one with
    reason ``bus_closed``, so closing never loses an in-flight message silently."""
    sub.in_flight -= 1
    if probe and sub.breaker.state is HALF_OPEN:
        sub.breaker.release()  # a cancelled probe has no outcome: free its slot
    if give_back(env):
        sub.released += 1
    else:
        sub.dead_lettered += 1
        sub.dlq.add(env, sub.name, "bus_closed")
        fail_request(env, BusClosedError(f"subscription {sub.name!r} closed"))
    sub.ledger.settled()


def answer(env: Envelope, result: Any) -> None:
    """A handler returned: answer a local request, or settle a remote message's receipt."""
    reply = env.reply
    if isinstance(reply, Receipt):
        reply.settle(result, None)
    elif result is not None and not reply.done():
        reply.set_result(result)


def fail_request(env: Envelope, exc: BaseException) -> None:
    reply = env.reply
    if reply is None:
        return
    if isinstance(reply, Receipt):
        reply.settle(None, exc)
    elif not reply.done():
        reply.set_exception(exc)
