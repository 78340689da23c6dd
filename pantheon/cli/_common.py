"""What every command group of ``pantheon`` shares: the error exit, the options several
groups take, running a coroutine, and loading what a command is pointed at (a scenario file,
a replay's team)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import shlex
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from pantheon.scenario import Scenario, ScenarioError, load_scenario
from pantheon.sessions import DEFAULT_STORE_PATH, STORE_ENV, Setup

if TYPE_CHECKING:
    from pantheon.sessions import Approval

__all__ = [
    "JsonOpt",
    "RecordOpt",
    "RunStoreOpt",
    "SeedOpt",
    "SessionArg",
    "SetupOpt",
    "StoreOpt",
    "StrictTimingOpt",
    "SummaryJsonOpt",
    "approvals_notice",
    "console",
    "fail",
    "load_scenario_file",
    "load_setup",
    "run_async",
    "store_option",
    "strict",
]

T = TypeVar("T")

#: Where the commands say what went wrong or what they are doing (stdout is the result).
console = Console(stderr=True)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when it is installed (measurably faster bus, see benchmarks/), else
    on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def load_scenario_file(path: Path) -> Scenario:
    """The scenario at ``path``, or exit 2 saying why it cannot be run (invalid, a
    directory, unreadable)."""
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


def strict(scenario: Scenario, strict_timing: bool) -> Scenario:
    """``scenario`` with ``expect.strict_timing`` set when ``--strict-timing`` asks for it
    (the file's own setting stands otherwise)."""
    if not strict_timing:
        return scenario
    expect = scenario.expect.model_copy(update={"strict_timing": True})
    return scenario.model_copy(update={"expect": expect})


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr and return the exit to raise. Escaped: messages
    quote names, paths, extras (``pantheon[tui]``) and stderr lines, where ``[x]`` is not
    markup."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[red]error:[/red] {escape(message)}"
    )
    return typer.Exit(code)


StoreOpt = Annotated[
    Path | None,
    typer.Option(
        "--store",
        envvar=STORE_ENV,
        help="Session store file (default .pantheon/sessions.db under the current directory).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
SessionArg = Annotated[
    str, typer.Argument(help="Session id, unique prefix, or latest (-1; -2 the one before).")
]
SeedOpt = Annotated[
    int | None,
    typer.Option(
        help="Override the scenario's seed.", min=-(2**63), max=2**63 - 1, show_default=False
    ),
]
# A run's own options (``run``, ``serve``): where it records and how it reports.
SummaryJsonOpt = Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]
RunStoreOpt = Annotated[
    Path | None,
    typer.Option(help="Session store (default .pantheon/sessions.db, or $PANTHEON_STORE)."),
]
RecordOpt = Annotated[bool, typer.Option(help="Record the session in the store.")]
SetupOpt = Annotated[
    str | None,
    typer.Option(
        "--setup",
        help="MODULE:FACTORY (or path/to/file.py:FACTORY) called with the scenario text to "
        "build the team's setup(bus); default: pantheon.runner.team_setup.",
        show_default=False,
    ),
]


def load_setup(
    spec: str | None,
    scenario_text: str | None,
    scenario_dir: str | None = None,
    *,
    session: str = "the session",
) -> Setup:
    """The team for a replay/redrive: ``spec``'s factory, or the one the scenario names
    (its own modules imported from ``scenario_dir``, where it was loaded from).
    ``session`` names the session in the error when there is no scenario to rebuild."""
    if spec is None and not scenario_text:
        raise fail(
            f"{session} has no scenario text, so its team cannot be rebuilt from the record: "
            "pass --setup MODULE:FACTORY"
        )
    if spec is None:
        from pantheon.runner import team_setup
        from pantheon.scenario import ScenarioError

        try:
            return team_setup(
                scenario_text or "",
                base_dir=None if scenario_dir is None else Path(scenario_dir),
            )
        except ScenarioError as exc:
            raise fail(f"cannot rebuild the recorded team:\n{exc}") from None
    else:
        module_name, _, attr = spec.rpartition(":")
        if not module_name or not attr:
            raise fail(f"--setup must look like MODULE:FACTORY, got {spec!r}")
        try:
            if module_name.endswith(".py"):
                path = Path(module_name).resolve()
                loaded = sys.modules.get(path.stem)
                if loaded is not None and Path(getattr(loaded, "__file__", "")) == path:
                    module = loaded
                else:
                    mod_spec = importlib.util.spec_from_file_location(path.stem, path)
                    if mod_spec is None or mod_spec.loader is None:
                        raise ImportError(f"cannot load {path}")
                    module = importlib.util.module_from_spec(mod_spec)
                    mod_spec.loader.exec_module(module)
            else:
                module = importlib.import_module(module_name)
            factory = getattr(module, attr)
        except (ImportError, AttributeError, OSError) as exc:
            raise fail(f"--setup {spec!r}: {exc}") from None
    return factory(scenario_text)


#: Requests a notice of waiting approvals names one by one; the rest it counts.
NOTICE_ROWS = 5
#: Characters of a request's summary a notice's command line shows after it, as a comment.
NOTICE_WIDTH = 36


def store_option(path: Path) -> str:
    """`` --store PATH`` for a command the user types next, unless ``path`` is the default
    store of the current directory (nothing to add): the path as short as it is exact."""
    path = path.resolve()
    if path == (Path.cwd() / DEFAULT_STORE_PATH).resolve():
        return ""
    try:
        shown = str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    return f" --store {shlex.quote(shown)}"


def approvals_notice(store: Path | None) -> Callable[[Sequence[Approval]], None]:
    """What ``pantheon run``, ``dlq redrive``, ``resume`` and a what-if ``replay --with``
    print on stderr once approval requests have waited a second for a person
    (:class:`pantheon.approvals.StoreDesk`): how many wait, and the exact command that
    decides each new one, since nothing else shows the run is stopped for them (a progress
    bar just stands still, and the others print nothing until they end). The commands name
    the session that waits, the one being recorded: a resumed run's own (``approve`` finds
    the run it resumes, whose approvals it shares, from it). ``store`` is where the
    requests are; None for a run that is not recorded, whose requests nobody can reach
    (their timeout decides them)."""
    told: set[int] = set()

    def notice(waiting: Sequence[Approval]) -> None:
        if not waiting:
            return
        first = waiting[0]
        n = len(waiting)
        asks = f"{n} approval request{'s' if n != 1 else ''}"
        wait, them = ("waits", "it") if n == 1 else ("wait", "them")
        timeout = max(first.deadline - first.asked, 0.0)
        then = "approved" if first.default_approve else "rejected"
        lines: list[str]
        if store is None:
            lines = [
                f"{asks} {wait} for a person, but nobody can decide {them}: the run is not "
                f"recorded (--no-record), so each is {then} after {timeout:.0f}s"
            ]
        else:
            session, where = first.session, store_option(store)
            new = [a for a in waiting if a.id not in told]
            # Short lines (an 80-column terminal): the session is in every command. What
            # was said before is not said again: a later notice names its new requests.
            if told:
                more = f"{len(new)} more approval request{'s' if len(new) != 1 else ''}"
                lines = [f"{more} {'waits' if len(new) == 1 else 'wait'} ({n} in all):"]
            else:
                lines = [
                    f"{asks} {wait} for a person (each {then} after {timeout:.0f}s undecided):"
                ]
            for a in new[:NOTICE_ROWS]:
                command = f"  pantheon approve {session} {a.id}{where}   # "
                # What tells one request from the next is often at the summary's end (a
                # host, an amount): as much as the terminal has room for, never less.
                room = max(NOTICE_WIDTH, console.width - len(command))
                what = " ".join(f"{a.asker}: {a.summary}".split())
                what = what if len(what) <= room else what[: room - 1] + "…"
                lines.append(command + what)
            unnamed = len(new) - NOTICE_ROWS
            listed = f"pantheon approvals {session}{where} lists them"
            if unnamed > 0:
                lines.append(
                    f"  and {unnamed} more; " + ("" if told else "--reject refuses; ") + listed
                )
            elif not told:
                lines.append(f"  --reject refuses; {listed}")
            told.update(a.id for a in waiting)
        for line in lines:
            console.print(line, markup=False, emoji=False, highlight=False, soft_wrap=True)

    return notice
