"""The ``pantheon`` app: its command groups, registered in the order help lists them, and
the parsing that lets a session argument be ``-1``."""

from __future__ import annotations

import inspect
import re
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from pantheon.cli._cmd_approvals import register as register_approvals
from pantheon.cli._cmd_cluster import register as register_cluster
from pantheon.cli._cmd_dashboard import register as register_dashboard
from pantheon.cli._cmd_monitor import register as register_monitor
from pantheon.cli._cmd_new import register as register_new
from pantheon.cli._cmd_run import register as register_run
from pantheon.cli._cmd_sessions import register as register_sessions
from pantheon.cli._cmd_trace import register as register_trace

__all__ = ["app", "main"]

app = typer.Typer(
    name="pantheon",
    help="Run teams of agents over an event bus; watch, replay and compare their sessions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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
register_trace(app)
register_cluster(app)
register_dashboard(app)
register_monitor(app)
register_new(app)
register_approvals(app)
register_run(app)


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
