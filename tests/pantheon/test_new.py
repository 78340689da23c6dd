"""``pantheon new NAME``: the folder it writes runs, passes its own tests, lints clean, and
nothing already on disk is ever written over."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner
from untimed import assert_passed_but_timing

from pantheon import load_scenario
from pantheon.cli._cmd_new import register
from pantheon.cli._scaffold import (
    TeamNameError,
    check_team_name,
    new_team,
    render,
    team_values,
    template_files,
)

FILES = [
    ".gitignore",
    "README.md",
    "data/tickets.jsonl",
    "pyproject.toml",
    "scenario.yaml",
    "tests/test_{ident}.py",
    "{ident}_agents.py",
]


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command()
    def other() -> None:  # a second command, so Typer keeps `new` as a subcommand
        """Unused."""

    return app


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # A clean environment for the child pytest: nothing of this run's pytest leaks in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


def test_a_new_team_runs_passes_its_tests_and_lints_clean(tmp_path: Path) -> None:
    """What a user does first, each step a process of its own as from a shell:
    ``pantheon new x && cd x && pantheon run scenario.yaml && python -m pytest``."""
    proc = run("-m", "pantheon.cli", "new", "x", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    team = tmp_path / "x"
    assert sorted(str(p.relative_to(team)) for p in team.rglob("*") if p.is_file()) == sorted(
        f.format(ident="x") for f in FILES
    )
    assert "pantheon run scenario.yaml" in proc.stdout

    proc = run("-m", "pantheon.cli", "validate", "scenario.yaml", cwd=team)
    assert proc.returncode == 0, proc.stderr
    proc = run("-m", "pantheon.cli", "run", "scenario.yaml", "--json", cwd=team)
    summary = json.loads(proc.stdout)
    assert proc.returncode == (0 if summary["passed"] else 1), proc.stderr
    # Every expectation holds; its p99 bound is there, judged on the machine's speed.
    timing = assert_passed_but_timing(summary["expectations"])
    agents = dict.fromkeys(name.split(":", 1)[0] for name in summary["hops"])
    assert [e["name"] for e in timing] == [
        f"timing: p99 handling {agent} <= 250.0 ms" for agent in agents
    ]
    assert summary["inputs"] == 11 and summary["malformed"] == 1
    assert {"triage", "router", "pager", "monitor"} <= set(summary["hops"])
    assert (team / ".pantheon" / "sessions.db").is_file()

    # The team's own pytest settings, not Pantheon's: rootdir and configfile are the team's.
    proc = run("-m", "pytest", "-p", "no:cacheprovider", cwd=team)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"rootdir: {team}" in proc.stdout and "configfile: pyproject.toml" in proc.stdout
    tests = (team / "tests" / "test_x.py").read_text(encoding="utf-8")
    count = tests.count("\ndef test_") + tests.count("\nasync def test_")
    assert f"{count} passed" in proc.stdout and count >= 5

    # ruff with the team's own settings (its pyproject.toml), as the team would run it.
    proc = run("-m", "ruff", "check", "--no-cache", ".", cwd=team)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run("-m", "ruff", "format", "--check", "--no-cache", ".", cwd=team)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_names_become_folder_scenario_module_and_test_names(tmp_path: Path) -> None:
    written = new_team("order-desk", tmp_path)
    team = tmp_path / "order-desk"
    assert [str(p.relative_to(team)) for p in written] == sorted(
        f.format(ident="order_desk") for f in FILES
    )
    scenario = load_scenario(team / "scenario.yaml")
    assert scenario.name == "order-desk"
    assert scenario.agent("triage").class_ == "order_desk_agents:Triage"
    assert scenario.agent("pager").handler == "order_desk_agents:page_on_call"
    text = "\n".join(p.read_text(encoding="utf-8") for p in written)
    assert re.search(r"\{\{\w+\}\}", text) is None  # every placeholder filled


def test_the_team_module_never_shadows_pantheons_agents_package(tmp_path: Path) -> None:
    # `agents` is the name a user would reach for first; it must not become `agents.py`.
    new_team("agents", tmp_path)
    assert not (tmp_path / "agents" / "agents.py").exists()
    assert (tmp_path / "agents" / "agents_agents.py").is_file()


def test_an_existing_path_is_refused_and_left_alone(app: typer.Typer, tmp_path: Path) -> None:
    taken = tmp_path / "x"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine", encoding="utf-8")
    result = CliRunner().invoke(app, ["new", "x", "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "already exists" in result.output and "never writes into an existing path" in (
        result.output
    )
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    assert (taken / "notes.txt").read_text(encoding="utf-8") == "mine"

    (tmp_path / "y").write_text("a file", encoding="utf-8")
    result = CliRunner().invoke(app, ["new", "y", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "already exists" in result.output


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("My Team", "'my_team'"),
        ("1st-team", "'st-team'"),
        ("team/evil", "'team_evil'"),
        ("../up", "'up'"),
        ("x" * 33, "'" + "x" * 32 + "'"),
        ("", None),
        ("__", None),
    ],
)
def test_a_bad_name_is_a_clear_error_and_writes_nothing(
    app: typer.Typer, tmp_path: Path, name: str, hint: str | None
) -> None:
    result = CliRunner().invoke(app, ["new", name, "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert f"invalid team name {name!r}" in result.output
    assert "lower-case letters, digits, '_' and '-', starting with a letter" in result.output
    if hint is not None:
        assert f"(e.g. {hint})" in result.output
    else:
        assert "e.g." not in result.output
    assert list(tmp_path.iterdir()) == []


def test_dir_is_made_when_missing(app: typer.Typer, tmp_path: Path) -> None:
    where = tmp_path / "teams" / "2026"
    result = CliRunner().invoke(app, ["new", "desk", "--dir", str(where)])
    assert result.exit_code == 0, result.output
    assert (where / "desk" / "scenario.yaml").is_file()
    assert f"Created team 'desk' in {where / 'desk'}/" in result.output


def test_a_failure_halfway_leaves_no_half_written_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Path.write_text
    calls = 0

    def flaky(self: Path, *args: object, **kwargs: object) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", flaky)
    with pytest.raises(OSError, match="No space left"):
        new_team("desk", tmp_path)
    assert not (tmp_path / "desk").exists()


def test_check_team_name_accepts_what_works_everywhere() -> None:
    for good in ("x", "desk", "order-desk", "order_desk_2", "a" * 32):
        assert check_team_name(good) == good
    with pytest.raises(TeamNameError):
        check_team_name("Desk")
    assert issubclass(TeamNameError, ValueError)


def test_render_replaces_known_keys_and_refuses_unknown_ones() -> None:
    assert render("{{name}}: {{module}} {x} {{ name }}", team_values("a-b")) == (
        "a-b: a_b_agents {x} {{ name }}"
    )
    with pytest.raises(KeyError, match="nosuch"):
        render("{{nosuch}}", team_values("a"))


def test_every_template_ships_as_package_data() -> None:
    """pyproject's package-data globs must cover every template, or an installed (not
    editable) Pantheon would write an incomplete team."""
    import glob
    import tomllib

    root = Path(__file__).resolve().parents[2]
    package = root / "pantheon"
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["pantheon"]
    # setuptools expands package-data patterns with glob, relative to the package folder.
    shipped = {f for g in globs for f in glob.glob(g, root_dir=package, recursive=True)}
    on_disk = {
        str(p.relative_to(package))
        for p in (package / "_templates").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert on_disk and on_disk <= shipped, sorted(on_disk - shipped)
    assert len(template_files()) == len(on_disk)  # and nothing but templates lives there
