"""Numbers from the command line are range-checked before they reach SQLite or a replay:
a seed past 64 bits was an OverflowError traceback from the store, ``--from nan`` a replay
that silently skipped every input."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pantheon.cli import app

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = str(ROOT / "scenarios" / "support_email.yaml")


@pytest.mark.parametrize("seed", [str(2**63), str(-(2**63) - 1), "1" + "0" * 30])
def test_a_seed_outside_64_bits_is_refused_before_anything_runs(tmp_path: Path, seed: str) -> None:
    store = tmp_path / "s.db"
    result = CliRunner().invoke(app, ["run", SCENARIO, "--seed", seed, "--store", str(store)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is not None
    assert isinstance(result.exception, SystemExit)
    assert "Invalid value for '--seed'" in result.output
    assert not store.exists()  # refused before a session was begun


@pytest.mark.parametrize("start", ["nan", "inf", "1e400", "-1"])
def test_replay_from_must_be_seconds_into_the_run(tmp_path: Path, start: str) -> None:
    args = ["replay", "any", "--from", start, "--store", str(tmp_path / "s.db")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    shown = str(float(start))
    assert result.output.strip() == (
        f"error: --from {shown}: give the seconds into the run to start at, 0 or more"
    )


def test_zeromq_heartbeats_must_be_finite() -> None:
    from bus.backends.zeromq import Broker, ZmqTransport

    with pytest.raises(ValueError, match=r"Broker: heartbeat must be > 0 .* got nan, 3"):
        Broker("tcp://127.0.0.1:0", heartbeat=float("nan"))
    with pytest.raises(ValueError, match=r"ZmqTransport: heartbeat must be > 0 .* got inf, 3"):
        ZmqTransport("tcp://127.0.0.1:1", heartbeat=float("inf"))


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["broker", "--bind", "tcp://127.0.0.1:0", "--stats-every", "nan"],
            "error: --stats-every nan: give seconds, 0 or more (0: never)",
        ),
        (
            ["node", "--agents", "reasoner", "--connect", "tcp://127.0.0.1:1", "--timeout", "nan"],
            "error: --timeout nan: give seconds, more than 0",
        ),
        (
            ["node", "--agents", "reasoner", "--connect", "tcp://127.0.0.1:1",
             "--status-every", "-1"],
            "error: --status-every -1.0: give seconds, 0 or more (0: never)",
        ),
    ],
)  # fmt: skip
def test_cluster_seconds_are_range_checked(args: list[str], line: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == line
