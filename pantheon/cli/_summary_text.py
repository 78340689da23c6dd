"""A run summary on the terminal: :func:`print_summary` for ``pantheon run``, ``serve`` and
``resume``, and its lines (rich markup: dead letters, expectations, model usage, the
processes of a multi-process run) printed the same way by a what-if, ``sessions show`` and
anything else that reports a :class:`~pantheon.RunSummary`."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from agents import AgentUsage
from pantheon import readmodel
from pantheon.cli._console import report_console
from pantheon.runner import expectation_state

__all__ = [
    "MAX_DEAD_LETTER_LINES",
    "STATE_MARKS",
    "budget_lines",
    "cut_lines",
    "dead_letter_lines",
    "dead_letters_text",
    "expectation_lines",
    "others_line",
    "print_nodes",
    "print_stream",
    "print_summary",
    "rate_limit_lines",
    "usage_lines",
    "verdict_line",
]

#: How a check's state reads in a report: the third one is neither green nor red.
STATE_MARKS = {
    "passed": "[green]PASS[/green]",
    "failed": "[red]FAIL[/red]",
    "inconclusive": "[yellow]INCONCLUSIVE[/yellow]",
}

#: Subscriber/reason pairs explained one per line under the dead-letter count; the rest
#: are summed on one more line.
MAX_DEAD_LETTER_LINES = 3


def dead_letters_text(s: Any) -> str:
    """Every dead letter of the run by reason (the same counts the expectations judge), how
    many of them the summary lists (the lines under it add up to that), and where the rest
    are kept."""
    total = sum(s.dlq.values())
    text = f"dead letters {total:,}"
    reasons = sorted(s.dlq.items(), key=lambda r: -r[1])
    notes = [", ".join(f"{n:,} {escape(reason)}" for reason, n in reasons)] if reasons else []
    # Shed messages come in floods and are never listed one by one.
    listed = len(s.dead_letters)
    partial = []
    if listed < total - s.dlq.get("shed", 0):
        partial.append(f"{listed:,} listed")
    if s.dlq_evicted:
        # Evicted past a queue's bound (the oldest go), or a killed node's, whose queue
        # died with it: none may be left in memory.
        kept = total - s.dlq_evicted
        partial.append(f"the last {kept:,} kept in memory" if kept else "none kept in memory")
    if partial:
        where = "all in the session store" if s.session_id else "the run was not recorded"
        notes.append(", ".join([*partial, where]))
    return text + (f" ({'; '.join(notes)})" if notes else "")


def dead_letter_lines(s: Any) -> list[str]:
    """Why the listed messages died: once per subscriber and reason, with one example; the
    counts add up to the number listed."""
    why = Counter((d["subscriber"], d["reason"]) for d in s.dead_letters)
    example = {(d["subscriber"], d["reason"]): d["error"] for d in s.dead_letters}
    lines = []
    for (sub, reason), n in why.most_common(MAX_DEAD_LETTER_LINES):
        e = example[sub, reason]
        lines.append(f"  {n} x {escape(sub)} ({reason})" + (f", e.g. {escape(e)}" if e else ""))
    rest = why.most_common()[MAX_DEAD_LETTER_LINES:]
    if rest:
        lines.append(
            f"  {sum(n for _, n in rest):,} more in {len(rest)} other subscriber/reason pairs"
            + (f" (pantheon dlq list {s.session_id})" if s.session_id else "")
        )
    return lines


def expectation_lines(s: Any) -> list[str]:
    """One line per expectation, ``PASS``/``FAIL``/``INCONCLUSIVE`` with the actual value, and
    under one that did not pass, why (a timing check's share of the run spent waiting)."""
    lines = []
    for e in s.expectations:
        state = expectation_state(e)
        lines.append(
            f"{STATE_MARKS[state]} {escape(str(e['name']))} (actual {escape(str(e['actual']))})"
        )
        if state != "passed" and e.get("why"):
            lines.append(f"     {escape(str(e['why']))}")
    return lines


def verdict_line(s: Any) -> str:
    """The last line: every expectation passed (saying how many timing checks could not
    judge a starved run), or not; for a run whose input a signal stopped, that they were
    not judged (they judge a whole run), and what they said of the part that ran."""
    unsure = sum(expectation_state(e) == "inconclusive" for e in s.expectations)
    if getattr(s, "interrupted", None) is not None:
        part = "all expectations passed" if s.passed else "[red]expectations failed[/red]"
        return f"[yellow]not judged[/yellow] (its input was stopped): on the part that ran, {part}"
    if not s.passed:
        return "[red]expectations failed[/red]"
    if unsure:
        # Still "all passed": an inconclusive check passes unless timing is strict.
        return (
            f"[green]all expectations passed[/green] [yellow]({unsure} timing "
            f"check{'s' if unsure != 1 else ''} inconclusive: the process waited for a "
            "CPU)[/yellow]"
        )
    return "[green]all expectations passed[/green]"


def rate_limit_lines(rate: dict[str, Any]) -> list[str]:
    """The provider's rate limit and how many of the team's calls waited their turn."""
    if not rate:
        return []
    window = f"{rate['window_s']:g} s"
    limits = [
        f"{rate[key]:,} {what}"
        for key, what in (("requests_per_minute", "calls"), ("tokens_per_minute", "tokens"))
        if rate.get(key) is not None
    ]
    return [
        f"rate limit {' and '.join(limits)} per {window}: {rate['admitted']:,} calls admitted, "
        f"{rate['waited']:,} waited their turn"
    ]


def budget_lines(budget: dict[str, dict[str, Any]]) -> list[str]:
    """One line per budget scope: what it spent of its limits, and whether it stopped calls
    (how many it refused)."""
    lines = []
    for scope, b in budget.items():
        spent = []
        if b.get("limit_tokens") is not None:
            spent.append(f"{b['tokens']:,} of {b['limit_tokens']:,} tokens")
        if b.get("limit_cost_usd") is not None:
            spent.append(f"${b['cost_usd']:.4f} of ${b['limit_cost_usd']}")
        verdict = (
            f"[red]stopped[/red] {b['refused']:,} calls" if b.get("stopped") else "within budget"
        )
        lines.append(f"budget    {escape(scope)}: {', '.join(spent)}, {verdict}")
    return lines


def cut_lines(cut: dict[str, str] | None, inputs: int) -> list[str]:
    """Why a replay or a what-if left inputs out: one line per node whose journal stops
    before its end (killed, or dead), with how far it reached, worded the same by both."""
    return [
        f"[yellow]node {escape(node)}'s journal stops before its end ({escape(reach)}): "
        f"the {inputs} inputs it was in the middle of are not replayed (counted as "
        "skipped)[/yellow]"
        for node, reach in (cut or {}).items()
    ]


def others_line(others: dict[str, int]) -> str:
    """The outside messages a replay or a what-if fed again that are not the input's (a
    Monitor's sampled alerts, a gateway client's direct publishes), by topic: said apart
    so the inputs count as the run counted them."""
    from pantheon.rerun import counts_line

    return counts_line("fed again beside the inputs", others) + " (no Observer published them)"


def _inputs_line(s: Any) -> str:
    """What came in, one story: every input is published, the malformed ones on their own
    topic (they are counted apart, and are not dead letters)."""
    text = f"inputs {s.inputs + s.malformed:,}: {s.inputs:,} published"
    if s.malformed:
        where = f"on {escape(s.malformed_topic)}, " if s.malformed_topic else ""
        text += f", {s.malformed:,} malformed ({where}not dead letters)"
    return text


def print_summary(s: Any) -> None:
    """A run's summary on the terminal: what ran, accuracy, dead letters, usage, the
    per-hop latency table, the processes of a multi-process run, and every expectation."""
    out = report_console()
    acc = s.accuracy or {}

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1%}"

    lines = [
        f"[bold]{escape(s.scenario)}[/bold]  session {s.session_id or '(not recorded)'}  "
        f"seed {s.seed}",
        f"messages {s.messages:,} in {s.elapsed_s:.2f}s ({s.throughput:,.0f} msg/s)",
        _inputs_line(s),
    ]
    if acc.get("scored"):
        # Every `*_accuracy` in the report's order: the team's decision fields first (what
        # `min_accuracy` judges), then whatever else its Learner scores.
        rates = [
            (key.removesuffix("_accuracy"), value)
            for key, value in acc.items()
            if key.endswith("_accuracy")
        ] or [("all fields", acc.get("accuracy"))]
        lines.append(
            "accuracy vs ground truth: "
            + ", ".join(f"{name} {pct(value)}" for name, value in rates)
            + f" over {acc.get('scored', 0):,} labelled"
            + (f" ({acc['unlabelled']:,} outcomes had no label)" if acc.get("unlabelled") else "")
        )
    lines.append(
        f"{dead_letters_text(s)}  breaker trips {s.breaker_trips}  alerts {s.alerts}  "
        f"accounting {'ok' if s.accounting_ok else 'BROKEN'}"
        + (
            f" on the processes that reported (not on {', '.join(map(repr, s.unverified))})"
            if s.unverified
            else ""
        )
    )
    if s.decisions or s.outbox:
        lines.append(f"guardian {_counts(s.decisions)}  outbox {_counts(s.outbox)}")
    lines.extend(dead_letter_lines(s))
    if s.usage.get("calls"):
        lines.extend(usage_lines(readmodel.SessionUsage.from_dict(s.usage)))
    lines.extend(budget_lines(s.budget))
    lines.extend(rate_limit_lines(s.rate_limit))
    for line in lines:
        _print_wrapped(out, line)
    table = _latency_table(s.hops, p95=True)
    natural = Measurement.get(out, out.options.update_width(10_000), table).maximum
    if natural > out.width:
        # Too wide for the terminal: without the p95 columns every agent's name still
        # fits at 80 columns, where rich would otherwise cut them all to "reasoner:…".
        table = _latency_table(s.hops, p95=False)
    out.print(table)
    print_nodes(out, s)
    print_stream(out, s)
    for line in expectation_lines(s):
        out.print(line, soft_wrap=True)
    out.print(verdict_line(s))


def _counts(counts: dict[str, int]) -> str:
    """``approved 500, escalated 89``: a count per name, in the summary's order."""
    return ", ".join(f"{escape(str(name))} {n:,}" for name, n in counts.items()) or "none"


def _print_wrapped(out: Console, line: str) -> None:
    """One summary line (rich markup), wrapped at words to the console's width with its
    continuation indented, so at 80 columns a line does not break mid-word in the terminal
    (the report console soft-wraps: long lines are the terminal's to fold)."""
    text = Text.from_markup(line)
    indent = Text(" " * (len(text.plain) - len(text.plain.lstrip(" ")) + 2))
    first, *rest = text.wrap(out, max(20, out.width - len(indent)))
    first.rstrip()
    out.print(first, soft_wrap=True)
    for more in rest:
        out.print(indent + more, soft_wrap=True)


def _latency_table(hops: dict[str, dict[str, float]], *, p95: bool) -> Table:
    """Queue wait and handling per subscription; ``p95=False`` leaves those columns out."""
    table = Table(title="per-hop latency (ms): queue wait | handling")
    quantiles = ("p50", "p95", "p99") if p95 else ("p50", "p99")
    # Numbers are never cut; a name too long for what is left folds onto more lines.
    table.add_column("agent", overflow="fold")
    table.add_column("handled", justify="right", no_wrap=True)
    for prefix in ("wait", "handle"):
        for i, q in enumerate(quantiles):
            table.add_column(f"{prefix} {q}" if i == 0 else q, justify="right", no_wrap=True)
    for name, h in hops.items():
        table.add_row(
            escape(name),
            str(h["handled"]),
            *(f"{h[f'{k}_{q}_ms']:.3f}" for k in ("wait", "handle") for q in quantiles),
        )
    return table


def print_nodes(out: Console, summary: Any) -> None:
    """The per-process lines of a ZeroMQ run's summary (nothing for an in-process run)."""
    for name, n in (getattr(summary, "nodes", None) or {}).items():
        status = n["status"]
        if n.get("killed_at_s") is not None:
            status = f"killed (SIGKILL) at {n['killed_at_s']:.2f}s"
        elif n.get("exit_code") not in (None, 0):
            status = f"{status} (exit code {n['exit_code']})"
        offset = n.get("clock_offset_us")
        transport = n.get("transport") or {}
        over_nats = "team" in transport  # NatsTransport's stats: no broker, no clock sync
        clock = (
            "  clock shared with the broker (same machine: queue waits are exact)"
            if transport.get("clock_shared")
            else f"  clock offset {offset:+.1f} µs (estimated, ± half a heartbeat's round trip)"
            if offset is not None
            else "  clock offset not measured (shorter than one heartbeat)"
            if n["status"] == "ok" and not over_nats
            else ""
        )
        colour = "green" if n["status"] == "ok" else "yellow" if n["status"] == "killed" else "red"
        out.print(
            f"node {name} (pid {n['pid']}): [{colour}]{status}[/{colour}]  "
            f"{', '.join(n['agents']) or '(no agents)'}{clock}"
        )
        broker = n.get("broker")
        if broker and over_nats:
            out.print(
                f"NATS server {broker.get('endpoint')} (team {transport['team']}): "
                f"redelivered here {transport.get('redelivered', 0)}, released "
                f"{transport.get('released', 0)}, dead-lettered {transport.get('dead_lettered', 0)}"
                f"; processes ready in {n.get('startup_s', 0):.2f}s"
            )
        elif broker:
            links = n.get("links", {})
            out.print(
                f"broker {broker.get('endpoint')}: nodes lost {broker.get('nodes_lost', 0)}, "
                f"malformed {broker.get('malformed', 0)}; publishers redelivered "
                f"{links.get('redelivered', 0)}, dead-lettered node_lost "
                f"{links.get('node_lost', 0)}; processes ready in {n.get('startup_s', 0):.2f}s"
            )


def print_stream(out: Console, summary: Any) -> None:
    """On NATS: what other sessions had left in the team's stream (not handled here), and
    what a node that died (killed by the scenario or not) left: who took its agents over,
    what waits in the stream for those nobody could, and how to finish those items
    (nothing for any other run)."""
    for session, messages in (getattr(summary, "leftovers", None) or {}).items():
        out.print(
            f"[yellow]left alone[/yellow]: {messages:,} unacknowledged messages of session "
            f"{escape(session)} in the team's stream (not this run's; `pantheon resume "
            f"{escape(session)}` finishes that run)",
            soft_wrap=True,
        )
    stream = getattr(summary, "stream", None) or {}
    if not stream:
        return
    taken = "; ".join(f"{a} -> {', '.join(h)}" for a, h in stream["taken_over"].items())
    out.print(
        f"takeover after {', '.join(stream['killed'])}: {taken or 'none'}"
        f"; quiet at {stream['quiet_at_s']:.2f}s",
        soft_wrap=True,
    )
    if stream["no_live_member"]:
        whole = "" if stream["complete"] else " (at least; more had not come back)"
        out.print(
            f"[red]no live member[/red] of {', '.join(stream['no_live_member'])}: "
            f"{stream['messages']:,} messages of {len(stream['items']):,} items wait in the "
            f"stream{whole}",
            soft_wrap=True,
        )
        for agent, items in stream["waiting"].items():
            out.print(f"  {escape(agent)}: {escape(', '.join(items))}", soft_wrap=True)
        for agent, items in stream.get("handed_over", {}).items():
            out.print(
                f"  {escape(agent)}, handed over in the killed node's memory (at least): "
                f"{escape(', '.join(items))}",
                soft_wrap=True,
            )
    if stream.get("items") or stream.get("handed_over"):
        # What pantheon.rerun.resume accepts (left_in_stream) and refuses, said here.
        sid = getattr(summary, "session_id", None)
        if sid is None:
            hint = "run the scenario again (this run was not recorded: nothing resumes it)"
        elif stream.get("throwaway"):
            hint = (
                "run the scenario again (its throwaway server, transport.server: auto, took "
                "the stream with it, and with it what the dead node published last: nothing "
                "can resume this run; with transport.url it could)"
            )
        else:
            hint = (
                f"pantheon resume {escape(sid)} (in one process: what was done is served, "
                "the rest done live)"
            )
        out.print(f"to finish them: {hint}", soft_wrap=True, highlight=False)


def usage_lines(usage: readmodel.SessionUsage) -> list[str]:
    """The model usage block of ``sessions show`` and ``run``: the session's model calls,
    tokens and cost, then one line per agent that called a model."""
    if not usage.total.calls:
        return ["models    no calls"]
    width = max(len(name) for name in usage.by_agent)
    lines = [f"models    {_usage_text(usage.total)}"]
    lines.extend(
        f"  {escape(name):<{width}}  {_usage_text(u)}" for name, u in usage.by_agent.items()
    )
    return lines


def _usage_text(u: AgentUsage) -> str:
    cost = readmodel.usd(u.cost_usd) + ("" if u.priced else " (a model has no price)")
    return (
        f"{u.calls:,} call{'s' if u.calls != 1 else ''}, tokens {u.input_tokens:,} in / "
        f"{u.output_tokens:,} out, cost {cost}"
    )
