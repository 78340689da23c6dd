"""The ``pantheon`` command."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pantheon._cli_cluster import print_nodes
from pantheon._cli_cluster import register as register_cluster
from pantheon._cli_dashboard import register as register_dashboard
from pantheon._cli_monitor import register as register_monitor
from pantheon._cli_sessions import register as register_sessions
from pantheon.scenario import ScenarioError, load_scenario

__all__ = ["app", "main", "run_async"]

T = TypeVar("T")

app = typer.Typer(
    name="pantheon",
    help="Run teams of agents over an event bus; watch, replay and compare their sessions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
register_sessions(app)
register_cluster(app)
register_dashboard(app)
register_monitor(app)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when it is installed (measurably faster bus, see benchmarks/), else
    on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _load(path: Path):  # type: ignore[no-untyped-def]
    try:
        return load_scenario(path)
    except ScenarioError as exc:
        console.print(f"[red]invalid scenario[/red]\n{exc}")
        raise typer.Exit(2) from None


@app.command()
def validate(file: Annotated[Path, typer.Argument(help="Scenario YAML file.")]) -> None:
    """Check a scenario without running it; errors name the file, line and field."""
    scenario = _load(file)
    agents = [n for n in scenario.agents] or ["(defaults)"]
    typer.echo(f"{file}: ok (scenario {scenario.name!r}, agents: {', '.join(agents)})")


@app.command()
def run(
    file: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    seed: Annotated[int | None, typer.Option(help="Override the scenario's seed.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    store: Annotated[
        Path | None,
        typer.Option(help="Session store (default .pantheon/sessions.db, or $PANTHEON_STORE)."),
    ] = None,
    record: Annotated[bool, typer.Option(help="Record the session in the store.")] = True,
    tui: Annotated[
        bool, typer.Option("--tui", help="Watch the run in the terminal monitor (tui extra).")
    ] = False,
) -> None:
    """Run a scenario, record it as a session, print a summary; exit 1 if an expectation
    fails."""
    scenario = _load(file)
    if tui:
        from pantheon._cli_monitor import run_tui

        raise typer.Exit(run_tui(file, seed=seed, store=store, record=record, as_json=as_json))
    if scenario.transport.kind == "zmq":
        try:
            import zmq  # noqa: F401 - checked before anything starts, not mid-run
        except ImportError:
            console.print(
                f"[red]{file}: transport.kind: zmq needs pyzmq[/red]: "
                + escape("pip install 'pantheon[zmq]'")
            )
            raise typer.Exit(2) from None
    telemetry = _telemetry(scenario)
    from pantheon._cluster import ClusterError

    try:
        summary = run_async(
            _run(scenario, seed, store, record, progress=not as_json, telemetry=telemetry)
        )
    except ClusterError as exc:
        console.print(f"[red]{file}: the multi-process run failed:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(asdict(summary) | {"passed": summary.passed}, indent=2))
    else:
        _print_summary(summary)
    if not summary.passed:
        raise typer.Exit(1)


async def _run(  # type: ignore[no-untyped-def]
    scenario: Any,
    seed: int | None,
    store: Path | None,
    record: bool,
    progress: bool,
    telemetry: Any = None,
):
    """The run; ``telemetry`` (a :class:`pantheon.telemetry.Telemetry`) observes its bus."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from pantheon._cluster import cluster_transport
    from pantheon._runtime import run_scenario
    from pantheon._session_run import recording
    from pantheon.live import live_run

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not progress or not sys.stderr.isatty(),
        transient=True,
    )
    task = bar.add_task(f"{scenario.name}: emails in", total=None)
    source = str(Path(scenario.source).resolve())  # noqa: ASYNC240 - once, before the run

    def on_progress(done: int, total: int | None) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        async with (
            cluster_transport(scenario) as transport,  # None unless transport.kind is zmq
            recording(scenario, store, seed, enabled=record, transport=transport) as rec,
            live_run(rec, scenario.name, enabled=record) as live,
        ):
            if telemetry is not None:
                _observe(telemetry, rec.bus)
            summary = await run_scenario(
                scenario,
                seed=seed,
                on_progress=on_progress,
                bus=rec.bus,
                attach=live.attach,
                outbox_dir=rec.outbox_dir,
            )
            await rec.finish(summary, source=source)
            await live.close("completed" if summary.passed else "failed")
    if telemetry is not None:
        await asyncio.to_thread(telemetry.shutdown)  # exports buffered spans and metrics
    return summary


def _telemetry(scenario: Any) -> Any:
    """Set up logging, and the OTel exporters the ``OTEL_*`` variables ask for (none by
    default); a setting that cannot be honoured exits 2 before anything runs."""
    from pantheon.telemetry import Telemetry, TelemetryConfigError, configure_logging

    try:
        configure_logging()
        return Telemetry.for_scenario(scenario)
    except (TelemetryConfigError, ValueError, ImportError) as exc:
        console.print(f"[red]observability:[/red] {exc}")
        raise typer.Exit(2) from None


def _observe(telemetry: Any, bus: Any) -> None:
    """Trace the run's bus and bind its session to every log line of the run."""
    import structlog

    telemetry.instrument(bus)
    if bus.session_id is not None:
        structlog.contextvars.bind_contextvars(session=bus.session_id)


def _print_summary(s: Any) -> None:
    out = Console()
    acc = s.accuracy or {}

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1%}"

    out.print(
        f"[bold]{s.scenario}[/bold]  session {s.session_id or '(not recorded)'}  seed {s.seed}\n"
        f"messages {s.messages:,} in {s.elapsed_s:.2f}s ({s.throughput:,.0f} msg/s)  "
        f"emails {s.inputs} (+{s.malformed} malformed)\n"
        f"accuracy vs ground truth: action {pct(acc.get('action_accuracy'))}, "
        f"intent {pct(acc.get('intent_accuracy'))} over {acc.get('scored', 0)} labelled\n"
        f"dead letters {sum(s.dlq.values())} {dict(s.dlq) or ''}  breaker trips {s.breaker_trips}"
        f"  alerts {s.alerts}  accounting {'ok' if s.accounting_ok else 'BROKEN'}\n"
        f"guardian {s.decisions}  outbox {s.outbox}"
    )
    u = s.usage
    if u:
        cost = f"${u['cost_usd']:.4f}" if u["priced"] else "n/a (a model has no price)"
        out.print(
            f"model calls {u['calls']:,}  tokens {u['input_tokens']:,} in / "
            f"{u['output_tokens']:,} out  cost {cost}"
        )
    table = Table(title="per-hop latency (ms): queue wait | handling")
    for col in ("agent", "handled", "wait p50", "p95", "p99", "handle p50", "p95", "p99"):
        table.add_column(col, justify="right" if col != "agent" else "left")
    for name, h in s.hops.items():
        table.add_row(
            name,
            str(h["handled"]),
            *(f"{h[k]:.3f}" for k in ("wait_p50_ms", "wait_p95_ms", "wait_p99_ms")),
            *(f"{h[k]:.3f}" for k in ("handle_p50_ms", "handle_p95_ms", "handle_p99_ms")),
        )
    out.print(table)
    print_nodes(out, s)
    for e in s.expectations:
        mark = "[green]PASS[/green]" if e["passed"] else "[red]FAIL[/red]"
        out.print(f"{mark} {e['name']} (actual {e['actual']})")
    out.print(
        "[green]all expectations passed[/green]" if s.passed else "[red]expectations failed[/red]"
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
