"""``pantheon new NAME``: start a team of your own from a folder that already runs and passes.

Exit codes: 0 the folder was written, 2 a bad name or the path is taken (nothing written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pantheon.cli._scaffold import TeamNameError, new_team, team_values

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``new`` to ``app``."""

    @app.command("new")
    def new(
        name: Annotated[
            str,
            typer.Argument(
                metavar="NAME",
                help="The team's name: its folder, its scenario's name and (with '-' as "
                "'_') its module NAME_agents.py. Lower-case letters, digits, '_' and '-'.",
            ),
        ],
        directory: Annotated[
            Path,
            typer.Option(
                "--dir",
                metavar="PATH",
                help="Where to create the NAME folder (made if missing).",
                file_okay=False,
            ),
        ] = Path("."),
    ) -> None:
        """Create a team folder: a scenario, two agent classes and a handler, sample
        tickets, a README and tests; it runs and its tests pass as written."""
        try:
            written = new_team(name, directory)
        except TeamNameError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        except FileExistsError:
            typer.echo(
                f"error: {directory / name} already exists; pantheon new never writes into an "
                "existing path (choose another name or --dir)",
                err=True,
            )
            raise typer.Exit(2) from None
        except OSError as exc:
            typer.echo(f"error: cannot create {directory / name}: {exc.strerror or exc}", err=True)
            raise typer.Exit(2) from None
        root = directory / name
        typer.echo(f"Created team {name!r} in {root}/")
        for path in written:
            typer.echo(f"  {path.relative_to(root)}")
        module = team_values(name)["module"]
        typer.echo(
            "\nNext:\n"
            f"  cd {root}\n"
            "  pantheon run scenario.yaml      # run the team, recorded as a session\n"
            "  python -m pytest                # its tests: one agent, the team, a replay\n"
            f"Then make it yours: {module}.py, scenario.yaml and README.md say how."
        )
