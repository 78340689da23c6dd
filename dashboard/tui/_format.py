"""How the monitor writes numbers and draws a request's waterfall (pure functions)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.text import Text

from agents import AgentUsage, BudgetState
from pantheon.live import HopBar, OutcomeTally, Snapshot
from pantheon.readmodel import SessionUsage, usd

__all__ = [
    "budget_line",
    "cost",
    "count",
    "ms",
    "outcomes_line",
    "payload_text",
    "rate",
    "totals_line",
    "usage_cells",
    "usage_line",
    "waterfall_text",
]

#: Columns of the waterfall left of the bars (agent name) and right of them (numbers).
_NAME = 16
_NUMBERS = 16
#: The widest node name a waterfall shows whole.
_NODE = 12


def ms(value: float | None) -> str:
    """A latency in ms in at most 7 characters, with the precision that matters at its
    size (microseconds under 10 ms); ``-`` when there is none."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.3f}"
    if value < 1000:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def count(value: int) -> str:
    return f"{value:,}"


def rate(per_s: float) -> str:
    """Messages per second, short."""
    if per_s >= 10_000:
        return f"{per_s / 1000:.0f}k/s"
    if per_s >= 1000:
        return f"{per_s / 1000:.1f}k/s"
    return f"{per_s:.0f}/s"


def cost(u: AgentUsage) -> str:
    """What some model calls cost; ``*`` marks a sum that leaves out calls to a model with
    no price (their tokens are counted, their cost cannot be)."""
    return usd(u.cost_usd) + ("" if u.priced else "*")


def usage_cells(u: AgentUsage) -> tuple[str, str, str, str]:
    """Calls, tokens in, tokens out and cost, as the usage table shows them."""
    return count(u.calls), count(u.input_tokens), count(u.output_tokens), cost(u)


def usage_line(usage: SessionUsage, live: bool) -> str:
    """The session's model usage in two lines: totals, then what the cost is made of."""
    t = usage.total
    if not t.calls:
        return "no model calls yet" if live else "no model calls in this session"
    head = (
        f"{count(t.calls)} model calls  tokens {count(t.input_tokens)} in / "
        f"{count(t.output_tokens)} out  cost {cost(t)}"
    )
    if t.priced:
        return head + "\npriced from the scenario's prices (USD per million tokens)"
    return head + "\n* a model has no price: its tokens are counted, its cost is not"


def budget_line(budget: Sequence[BudgetState]) -> str:
    """One line per budget scope: spent of its limits, and whether it stopped calls; empty
    for a session without a budget."""
    lines = []
    for b in budget:
        spent = []
        if b.limit_tokens is not None:
            spent.append(f"{count(b.tokens)} of {count(b.limit_tokens)} tokens")
        if b.limit_cost_usd is not None:
            spent.append(f"{usd(b.cost_usd)} of {usd(b.limit_cost_usd)}")
        verdict = f"STOPPED, {count(b.refused)} calls refused" if b.stopped else "within budget"
        lines.append(f"budget {b.scope}: {', '.join(spent)}  {verdict}")
    return "\n".join(lines)


def totals_line(snap: Snapshot) -> Text:
    """The summary above the panels: the bus's totals, then what the team has decided; each
    one line, cut at the screen's edge rather than wrapped into the next."""
    t = snap.totals
    state = "LIVE" if snap.live else snap.status
    line = (
        f"{state}  t={snap.t_s:.1f}s  published {count(t.published)}  "
        f"delivered {count(t.delivered)}  DLQ {count(t.dlq_size)}  shed {count(t.shed)}  "
        f"queued {count(t.queued + t.in_flight)}  retries {count(t.retries)}"
    )
    if snap.outcomes.decided:
        line += "\n" + outcomes_line(snap.outcomes)
    return Text(line, no_wrap=True, overflow="ellipsis")


def outcomes_line(o: OutcomeTally) -> str:
    """``decided 20 invoices, 60.0% right of 20 labelled: 12 approve, 8 hold``: the share
    right first, so it shows in 80 columns however many kinds of decision follow."""
    noun = o.noun + ("" if o.decided == 1 else "s")
    parts = ", ".join(f"{count(n)} {what}" for what, n in o.counts)
    shown = sum(n for _, n in o.counts)
    if shown < o.decided:
        parts += f", {count(o.decided - shown)} other"
    acc = o.accuracy
    right = "" if acc is None else f", {acc:.1%} right of {count(o.scored)} labelled"
    return f"decided {count(o.decided)} {noun}{right}: {parts}"


def payload_text(payload: Any) -> str:
    """A payload as indented JSON (its repr when it is not JSON)."""
    try:
        return json.dumps(payload, indent=2, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(payload)


def waterfall_text(hops: Sequence[HopBar], width: int) -> Text:
    """One line per delivery of a request: the agent, then on a shared time axis its queue
    wait (``░``, from publish to pick-up) and handling (``█``; red when it failed), then
    both in ms. The axis spans the request, first publish to last handling end."""
    out = Text(no_wrap=True, overflow="crop")
    if not hops:
        out.append("no hops recorded for this request", style="dim")
        return out
    t0 = min(h.enqueued_ms for h in hops)
    t1 = max(h.end_ms for h in hops)
    span = max(t1 - t0, 1e-6)
    # A multi-process session's hops say which process handled each (its node column).
    node = max((len(h.node) for h in hops if h.node), default=0)
    node = min(node, _NODE) if node else 0
    bars = max(10, width - _NAME - _NUMBERS - 2 - (node + 1 if node else 0))
    scale = bars / span
    out.append(f"{'agent':<{_NAME}} ", style="bold")
    if node:
        out.append(f"{'node':<{node}} ", style="bold")
    out.append("0 ms", style="bold")
    out.append(f"{ms(span) + ' ms':>{bars - 4}}", style="bold")
    out.append(f" {'wait':>7} {'handle':>7}\n", style="bold")
    for h in hops:
        q = min(bars - 1, int((h.enqueued_ms - t0) * scale))
        s = min(bars - 1, max(q, int((h.start_ms - t0) * scale)))
        e = min(bars, max(s + 1, round((h.end_ms - t0) * scale)))
        failed = h.outcome != "delivered"
        out.append(f"{h.agent[:_NAME]:<{_NAME}} ", style="red" if failed else "")
        if node:
            out.append(f"{(h.node or '')[:node]:<{node}} ", style="cyan")
        out.append(" " * q)
        out.append("░" * (s - q), style="yellow")
        out.append("█" * (e - s), style="red" if failed else "green")
        out.append(" " * (bars - e))
        out.append(f" {ms(h.queue_wait_ms):>7} {ms(h.handling_ms):>7}\n")
    return out
