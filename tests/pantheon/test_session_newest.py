"""A session argument may be ``latest`` or ``-1`` (the newest session), ``-2`` (the one
before it), ...: resolved once, in ``SessionStore.resolve``, so every command and API call
that takes a session takes these too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sessions_team import email, make_setup
from typer.testing import CliRunner

import pantheon
from bus import Bus
from pantheon.cli import app
from pantheon.sessions import Recorder, SessionNotFound, SessionStore


async def _record(path: Path, seed: int) -> str:
    with SessionStore(path) as store:
        recorder = Recorder(store, scenario="emails", scenario_text="base", seed=seed)
        async with Bus() as bus:
            recorder.attach(bus)
            await make_setup("base")(bus)
            for i in range(3):
                await bus.emit("email.received", email(i))
            await bus.drain()
        await recorder.finish("completed", {"emails": 3})
        return recorder.session_id


@pytest.fixture
async def three(tmp_path: Path) -> tuple[Path, list[str]]:
    """A store with three sessions, oldest first."""
    path = tmp_path / "sessions.db"
    return path, [await _record(path, seed) for seed in (1, 2, 3)]


def test_the_store_counts_back_from_the_newest(three: tuple[Path, list[str]]) -> None:
    path, (first, second, third) = three
    with SessionStore(path) as store:
        assert [s.id for s in store.sessions()] == [third, second, first]
        assert store.resolve("latest") == store.resolve("-1") == third
        assert store.resolve("-2") == second and store.resolve("-3") == first
        assert store.session("latest").seed == 3
        for beyond in ("-4", "-0", "latest1"):
            with pytest.raises(SessionNotFound, match=f"no session '{beyond}'"):
                store.resolve(beyond)


async def test_an_empty_store_has_no_latest(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "empty.db") as store, pytest.raises(SessionNotFound):
        store.resolve("latest")


def test_the_api_takes_latest(three: tuple[Path, list[str]]) -> None:
    path, (_, second, third) = three
    assert pantheon.Session.open("latest", store=path).id == third
    assert pantheon.Session.open("-2", store=path).id == second


@pytest.mark.parametrize("ref", ["latest", "-1"])
def test_every_session_command_takes_the_newest(three: tuple[Path, list[str]], ref: str) -> None:
    path, (first, _, third) = three
    runner = CliRunner()
    store = ["--store", str(path)]
    shown = runner.invoke(app, ["sessions", "show", ref, *store])
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith(f"{third}  run  completed")
    # Before or after the options, and two of them in one command.
    exported = runner.invoke(app, ["export", *store, ref])
    assert exported.exit_code == 0, exported.output
    assert {json.loads(line)["session"] for line in exported.output.splitlines()} == {third}
    diffed = runner.invoke(app, ["diff", "-3", ref, *store, "--json"])
    assert diffed.exit_code == 0, diffed.output
    assert (json.loads(diffed.output)["a"], json.loads(diffed.output)["b"]) == (first, third)
    listed = runner.invoke(app, ["dlq", "list", ref, *store, "--json"])
    assert listed.exit_code == 0 and json.loads(listed.output) == [], listed.output


def test_past_the_oldest_is_no_session_and_other_dashes_stay_options(
    three: tuple[Path, list[str]],
) -> None:
    path, _ = three
    runner = CliRunner()
    missing = runner.invoke(app, ["sessions", "show", "-4", "--store", str(path)])
    assert missing.exit_code == 2 and f"no session '-4' in {path}" in missing.output
    unknown = runner.invoke(app, ["sessions", "show", "-x", "--store", str(path)])
    assert unknown.exit_code == 2 and "No such option: -x" in unknown.output
    # A negative number after an option that takes a value is that option's value.
    seeded = runner.invoke(app, ["run", str(path.with_name("none.yaml")), "--seed", "-1"])
    assert seeded.exit_code == 2 and "cannot read the scenario" in seeded.output, seeded.output
