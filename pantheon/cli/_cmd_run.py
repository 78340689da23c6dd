"""``pantheon validate | run | serve``: a scenario checked, run once, or served behind the
gateway until stopped; a run prints its summary and exits 1 when an expectation fails."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from agents import ProviderUnavailable
from bus import Bus
from pantheon.cli._common import (
    RecordOpt,
    RunStoreOpt,
    SeedOpt,
    StrictTimingOpt,
    SummaryJsonOpt,
    approvals_notice,
    console,
    load_scenario_file,
    run_async,
    strict,
)
from pantheon.cli._summary_text import print_summary
from pantheon.runner import AgentSetupError, RunSummary
from pantheon.scenario import Scenario
from pantheon.sessions import SessionError, resolve_store_path

__all__ = ["register"]


def validate(file: Annotated[Path, typer.Argument(help="Scenario YAML file.")]) -> None:
    """Check a scenario without running it; errors name the file, line and field."""
    scenario = load_scenario_file(file)
    agents = [n for n in scenario.agents] or ["(defaults)"]
    typer.echo(f"{file}: ok (scenario {scenario.name!r}, agents: {', '.join(agents)})")


def run(
    file: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    seed: SeedOpt = None,
    as_json: SummaryJsonOpt = False,
    store: RunStoreOpt = None,
    record: RecordOpt = True,
    tui: Annotated[
        bool, typer.Option("--tui", help="Watch the run in the terminal monitor (tui extra).")
    ] = False,
    strict_timing: StrictTimingOpt = False,
) -> None:
    """Run a scenario, record it as a session, print a summary; exit 1 if an expectation
    fails."""
    scenario = strict(load_scenario_file(file), strict_timing)
    if tui:
        from pantheon.cli._cmd_monitor import run_tui

        raise typer.Exit(
            run_tui(
                file,
                seed=seed,
                store=store,
                record=record,
                as_json=as_json,
                strict_timing=strict_timing,
            )
        )
    # The transport's client library is checked before anything starts, not mid-run.
    client = {"zmq": ("zmq", "pyzmq"), "nats": ("nats", "nats-py")}.get(scenario.transport.kind)
    if client is not None and importlib.util.find_spec(client[0]) is None:
        kind = scenario.transport.kind
        console.print(
            f"[red]{file}: transport.kind: {kind} needs {client[1]}[/red]: "
            + escape(f"pip install 'pantheon[{kind}]'")
        )
        raise typer.Exit(2) from None
    gateway_errors: tuple[type[Exception], ...] = ()
    if scenario.gateway is not None:
        try:
            from pantheon.gateway import GatewayError
        except ImportError as exc:
            console.print(f"[red]{file}: gateway:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(2) from None
        gateway_errors = (GatewayError,)
    telemetry = _telemetry(scenario)
    from pantheon.runner import ClusterError, RunStuck, TransportUnreachable

    # Caught before ClusterError: TransportUnreachable is one.
    nothing_ran: tuple[type[Exception], ...] = (
        *gateway_errors, TransportUnreachable, ProviderUnavailable, AgentSetupError,
    )  # fmt: skip
    started: list[str] = []  # the session, once the run has one
    try:
        summary = run_async(
            _run(
                scenario, seed, store, record, progress=not as_json, telemetry=telemetry,
                started=started,
            )
        )  # fmt: skip
    except nothing_ran as exc:
        console.print(f"[red]{file}: nothing ran:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    except ClusterError as exc:
        console.print(
            f"[red]{file}: the multi-process run failed:[/red] {escape(str(exc))}", soft_wrap=True
        )
        raise typer.Exit(2) from None
    except RunStuck as exc:
        console.print(
            f"[red]{file}: the run did not finish:[/red] {escape(str(exc))}", soft_wrap=True
        )
        raise typer.Exit(2) from None
    except (asyncio.CancelledError, KeyboardInterrupt):
        # A second Ctrl-C: the run was cancelled where it stood, its session closed. A
        # ZeroMQ run's nodes were cut off with their records (resume refuses it, as after
        # a crash of its driver); a NATS run's records wait on the stream.
        sid = started[0] if started else "SESSION"
        console.print(
            "[yellow]interrupted at once[/yellow]: "
            + (
                "the run was not recorded"
                if not record
                else f"the session is recorded as aborted (a ZeroMQ run cut short cannot be "
                f"resumed: its nodes' records ended with it; pantheon replay {sid} shows what "
                "it did)"
                if scenario.transport.kind == "zmq"
                else f"the session is recorded as aborted (pantheon resume {sid} finishes it)"
            ),
            soft_wrap=True,
            highlight=False,
        )
        raise typer.Exit(130) from None
    except SessionError as exc:  # the --store given cannot hold the session
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    _report(summary, as_json)


def serve(
    file: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    host: Annotated[
        str | None, typer.Option(help="Interface to listen on (default: gateway.host, 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (default: gateway.port, 8787; 0 picks a free one).")
    ] = None,
    seed: SeedOpt = None,
    as_json: SummaryJsonOpt = False,
    store: RunStoreOpt = None,
    record: RecordOpt = True,
    strict_timing: StrictTimingOpt = False,
) -> None:
    """Run a scenario behind the HTTP/WebSocket gateway until Ctrl-C (or SIGTERM), then
    finish the run, record the session and print its summary."""
    scenario = strict(load_scenario_file(file), strict_timing)
    if scenario.transport.kind == "zmq":
        console.print(f"[red]{file}: pantheon serve runs in-process scenarios only[/red]")
        raise typer.Exit(2)
    from pantheon.scenario import GatewayConfig

    settings = (scenario.gateway or GatewayConfig()).model_dump()
    if host is not None:
        settings["host"] = host
    if port is not None:
        settings["port"] = port
    try:
        gateway = GatewayConfig.model_validate(settings)
    except ValueError as exc:
        console.print(f"[red]{file}: gateway:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    try:
        from pantheon.gateway import GatewayError
    except ImportError as exc:
        console.print(f"[red]{file}: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None
    telemetry = _telemetry(scenario)
    from pantheon.runner import TransportUnreachable

    try:
        summary = run_async(
            _run(
                scenario, seed, store, record, progress=False, telemetry=telemetry,
                gateway=gateway, serve=True,
            )
        )  # fmt: skip
    except (
        GatewayError,
        ProviderUnavailable,
        SessionError,
        AgentSetupError,
        TransportUnreachable,
    ) as exc:
        console.print(f"[red]{file}: nothing ran:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    _report(summary, as_json)


def _announce(gateway: Any) -> None:
    console.print(
        f"gateway on {gateway.url}  (page: {gateway.url}/, metrics: {gateway.url}/metrics); "
        "Ctrl-C finishes the run",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


async def _run(
    scenario: Scenario,
    seed: int | None,
    store: Path | None,
    record: bool,
    progress: bool,
    telemetry: Any = None,
    *,
    gateway: Any = None,
    serve: bool = False,
    started: list[str] | None = None,
) -> RunSummary:
    """The run; ``telemetry`` (a :class:`pantheon.telemetry.Telemetry`) observes its bus;
    ``gateway`` (a :class:`~pantheon.scenario.GatewayConfig`) serves it, and ``serve``
    keeps it running until a signal. ``started`` gets the session's id as soon as it has
    one: a run cancelled where it stood returns nothing to name it by."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    import pantheon

    shown = progress and sys.stderr.isatty()
    bar = Progress(
        # A column, not the string: a string cell takes the markup setting of whatever
        # prints while the bar is up, and a line printed with markup=False (an approvals
        # notice) drew the bar as "[progress.description]...".
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not shown,
        transient=True,
    )
    inputs = f"{scenario.outcome_spec().noun}s in"
    # Added once the run's session is known (on_bus), which the bar then names.
    tasks: list[TaskID] = []
    # The session, until a line has said it started (no bar: a pipe, --json).
    unsaid: list[str] = []

    def on_progress(done: int, total: int | None) -> None:
        for task in tasks:
            bar.update(task, completed=done, total=total)
        # Said once the team has started (the first report): a team that cannot be built
        # is one "nothing ran" line, not a start and then that.
        while unsaid:
            console.print(
                f"{scenario.name}: session {unsaid.pop()} started", markup=False, highlight=False
            )

    def on_bus(bus: Bus) -> None:
        if telemetry is not None:
            _observe(telemetry, bus)
        sid = bus.session_id
        if sid is not None and started is not None:
            started.append(sid)
        # The session to approve in, watch or resume, from the start: in the bar on a
        # terminal (the summary names it once the bar is gone), else as a line.
        name = f"{scenario.name} {sid}" if sid is not None else scenario.name
        tasks.append(bar.add_task(f"{name}: {inputs}", total=None))
        if sid is not None and not shown:
            unsaid.append(sid)

    with bar:
        summary = await pantheon.run(
            scenario,
            seed=seed,
            store=store,
            record=record,
            on_progress=on_progress,
            on_bus=on_bus,
            gateway=gateway,
            serve=serve,
            on_gateway=_announce,
            on_approvals=approvals_notice(resolve_store_path(store) if record else None),
        )
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


def register(app: typer.Typer) -> None:
    """Add ``validate``, ``run`` and ``serve`` to ``app``."""
    app.command()(validate)
    app.command()(run)
    app.command()(serve)


def _report(summary: RunSummary, as_json: bool) -> None:
    """A finished run's summary (JSON for scripts), and exit 1 when an expectation failed:
    ``run`` and ``serve`` end alike. A run whose input a signal stopped exits 130 (as a
    shell reports Ctrl-C), whatever its checks said of the part that ran."""
    if as_json:
        typer.echo(json.dumps(asdict(summary) | {"passed": summary.passed}, indent=2))
    else:
        print_summary(summary)
    if summary.interrupted is not None:
        sid = summary.session_id
        console.print(
            f"[yellow]interrupted ({summary.interrupted})[/yellow] after "
            f"{summary.inputs + summary.malformed} inputs: what was in flight finished"
            + (
                f"; session {sid} is recorded as aborted: pantheon resume {sid} finishes it"
                if sid is not None
                else " (not recorded)"
            ),
            soft_wrap=True,
            highlight=False,
        )
        raise typer.Exit(130)
    if not summary.passed:
        raise typer.Exit(1)
