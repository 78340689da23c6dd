"""The ``pantheon`` command."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import re
import sys
from collections.abc import Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand

from agents import ProviderUnavailable
from pantheon.cli._cmd_approvals import register as register_approvals
from pantheon.cli._cmd_cluster import print_nodes, print_stream
from pantheon.cli._cmd_cluster import register as register_cluster
from pantheon.cli._cmd_dashboard import register as register_dashboard
from pantheon.cli._cmd_monitor import register as register_monitor
from pantheon.cli._cmd_new import register as register_new
from pantheon.cli._cmd_sessions import register as register_sessions
from pantheon.cli._cmd_sessions import usage_lines
from pantheon.cli._console import report_console
from pantheon.cli._summary_text import (
    budget_lines,
    dead_letter_lines,
    dead_letters_text,
    expectation_lines,
    verdict_line,
)
from pantheon.readmodel import SessionUsage
from pantheon.runner import AgentSetupError, RunSummary
from pantheon.scenario import Scenario, ScenarioError, load_scenario
from pantheon.sessions import SessionError

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


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"pantheon {version('pantheon')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("pantheon (not installed)")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Run teams of agents over an event bus; watch, replay and compare their sessions."""


register_sessions(app)
register_cluster(app)
register_dashboard(app)
register_monitor(app)
register_new(app)
register_approvals(app)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when it is installed (measurably faster bus, see benchmarks/), else
    on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _load(path: Path) -> Scenario:
    try:
        return load_scenario(path)
    except ScenarioError as exc:
        console.print("[red]invalid scenario[/red]")
        # Plain text: `rules.spam[2]` is no markup and `yaml:100:3` no emoji; one line each.
        console.print(str(exc), markup=False, emoji=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except IsADirectoryError:
        console.print(f"{path}: is a directory, not a scenario file", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        console.print(
            f"{path}: cannot read the scenario: {exc.strerror or exc}", markup=False, soft_wrap=True
        )
        raise typer.Exit(2) from None


StrictTimingOpt = Annotated[
    bool,
    typer.Option(
        "--strict-timing",
        help="Fail timing checks a busy machine may have failed (inconclusive ones), "
        "as expect.strict_timing does: for a dedicated CI machine.",
    ),
]


@app.command()
def validate(file: Annotated[Path, typer.Argument(help="Scenario YAML file.")]) -> None:
    """Check a scenario without running it; errors name the file, line and field."""
    scenario = _load(file)
    agents = [n for n in scenario.agents] or ["(defaults)"]
    typer.echo(f"{file}: ok (scenario {scenario.name!r}, agents: {', '.join(agents)})")


@app.command()
def run(
    file: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    seed: Annotated[
        int | None,
        typer.Option(
            help="Override the scenario's seed.", min=-(2**63), max=2**63 - 1, show_default=False
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    store: Annotated[
        Path | None,
        typer.Option(help="Session store (default .pantheon/sessions.db, or $PANTHEON_STORE)."),
    ] = None,
    record: Annotated[bool, typer.Option(help="Record the session in the store.")] = True,
    tui: Annotated[
        bool, typer.Option("--tui", help="Watch the run in the terminal monitor (tui extra).")
    ] = False,
    strict_timing: StrictTimingOpt = False,
) -> None:
    """Run a scenario, record it as a session, print a summary; exit 1 if an expectation
    fails."""
    scenario = _strict(_load(file), strict_timing)
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
    from pantheon.runner import ClusterError

    try:
        summary = run_async(
            _run(scenario, seed, store, record, progress=not as_json, telemetry=telemetry)
        )
    except gateway_errors as exc:
        console.print(f"[red]{file}: nothing ran:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    except ClusterError as exc:
        console.print(f"[red]{file}: the multi-process run failed:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    except (ProviderUnavailable, AgentSetupError) as exc:
        console.print(f"[red]{file}: nothing ran:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    except SessionError as exc:  # the --store given cannot hold the session
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(asdict(summary) | {"passed": summary.passed}, indent=2))
    else:
        _print_summary(summary)
    if not summary.passed:
        raise typer.Exit(1)


@app.command()
def serve(
    file: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    host: Annotated[
        str | None, typer.Option(help="Interface to listen on (default: gateway.host, 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (default: gateway.port, 8787; 0 picks a free one).")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Override the scenario's seed.", min=-(2**63), max=2**63 - 1, show_default=False
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    store: Annotated[
        Path | None,
        typer.Option(help="Session store (default .pantheon/sessions.db, or $PANTHEON_STORE)."),
    ] = None,
    record: Annotated[bool, typer.Option(help="Record the session in the store.")] = True,
    strict_timing: StrictTimingOpt = False,
) -> None:
    """Run a scenario behind the HTTP/WebSocket gateway until Ctrl-C (or SIGTERM), then
    finish the run, record the session and print its summary."""
    scenario = _strict(_load(file), strict_timing)
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
    try:
        summary = run_async(
            _run(
                scenario, seed, store, record, progress=False, telemetry=telemetry,
                gateway=gateway, serve=True,
            )
        )  # fmt: skip
    except (GatewayError, ProviderUnavailable, SessionError, AgentSetupError) as exc:
        console.print(f"[red]{file}: nothing ran:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(asdict(summary) | {"passed": summary.passed}, indent=2))
    else:
        _print_summary(summary)
    if not summary.passed:
        raise typer.Exit(1)


def _strict(scenario: Scenario, strict_timing: bool) -> Scenario:
    """``scenario`` with ``expect.strict_timing`` set when ``--strict-timing`` asks for it
    (the file's own setting stands otherwise)."""
    if not strict_timing:
        return scenario
    expect = scenario.expect.model_copy(update={"strict_timing": True})
    return scenario.model_copy(update={"expect": expect})


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
) -> RunSummary:
    """The run; ``telemetry`` (a :class:`pantheon.telemetry.Telemetry`) observes its bus;
    ``gateway`` (a :class:`~pantheon.scenario.GatewayConfig`) serves it, and ``serve``
    keeps it running until a signal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    import pantheon

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not progress or not sys.stderr.isatty(),
        transient=True,
    )
    task = bar.add_task(f"{scenario.name}: {scenario.outcome_spec().noun}s in", total=None)

    def on_progress(done: int, total: int | None) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        summary = await pantheon.run(
            scenario,
            seed=seed,
            store=store,
            record=record,
            on_progress=on_progress,
            on_bus=None if telemetry is None else lambda bus: _observe(telemetry, bus),
            gateway=gateway,
            serve=serve,
            on_gateway=_announce,
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


def _inputs_line(s: Any) -> str:
    """What came in, one story: every input is published, the malformed ones on their own
    topic (they are counted apart, and are not dead letters)."""
    text = f"inputs {s.inputs + s.malformed:,}: {s.inputs:,} published"
    if s.malformed:
        where = f"on {escape(s.malformed_topic)}, " if s.malformed_topic else ""
        text += f", {s.malformed:,} malformed ({where}not dead letters)"
    return text


def _print_summary(s: Any) -> None:
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
        lines.extend(usage_lines(SessionUsage.from_dict(s.usage)))
    lines.extend(budget_lines(s.budget))
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


#: What click would take for a short option but a session argument means: ``-1`` (newest).
_FROM_NEWEST = re.compile(r"-[1-9][0-9]*")


class _Command(TyperCommand):
    """A command whose positional arguments may be ``-1``, ``-2``, ...

    Session arguments take ``-1`` for the newest session (SessionStore.resolve), but click
    reads any token that starts with ``-`` as an option and stops with "No such option".
    When there is such a token, the options (each with its value) go first and the
    positional arguments, in their order, after a ``--``: click then takes ``-1`` as an
    argument, while ``--seed -1`` stays an option's value and ``-x`` an unknown option."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        if not any(_FROM_NEWEST.fullmatch(arg) for arg in args[:end]):
            return list(super().parse_args(ctx, args))
        valued = {
            name
            for param in self.params
            if getattr(param, "param_type_name", "") == "option"
            and not getattr(param, "is_flag", False)
            for name in (*param.opts, *param.secondary_opts)
        }
        options: list[str] = []
        positional: list[str] = []
        head = args[:end]
        i = 0
        while i < len(head):
            arg = head[i]
            if arg.startswith("-") and arg != "-" and not _FROM_NEWEST.fullmatch(arg):
                options.append(arg)
                if arg in valued and i + 1 < len(head):  # its value, whatever it looks like
                    i += 1
                    options.append(head[i])
            else:
                positional.append(arg)
            i += 1
        return list(super().parse_args(ctx, [*options, "--", *positional, *args[end + 1 :]]))


def _finish(group: typer.Typer) -> None:
    """Every command of ``group`` (and of its sub-groups) gets its docstring as paragraphs
    and takes ``-1`` for a session (:class:`_Command`).

    Docstrings are wrapped at the source's 100 columns; typer's rich help keeps those
    newlines in a command list and in every paragraph after the first, so at 80 columns a
    sentence broke where the source line did. One line per paragraph lets rich wrap each at
    the terminal's width; a blank line still separates paragraphs."""
    for command in group.registered_commands:
        text = command.help or inspect.getdoc(command.callback) or ""
        command.help = "\n\n".join(
            " ".join(line.strip() for line in paragraph.splitlines())
            for paragraph in inspect.cleandoc(text).split("\n\n")
        )
        if command.cls in (None, TyperCommand):
            command.cls = _Command
    for sub in group.registered_groups:
        if isinstance(sub.typer_instance, typer.Typer):
            _finish(sub.typer_instance)


_finish(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
