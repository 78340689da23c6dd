"""A NATS server that is not there: one error at once, naming the refusal, and nothing
started or recorded (it took twenty seconds of a warning per retry, and left a failed
session behind, before)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_run import pantheon
from invoice_team import write_team

from bus import Bus
from bus.backends.nats import ConnectError, NatsTransport

#: Where the run's processes would meet: a NATS server at ``{url}``.
TRANSPORT = """\
transport:
  kind: nats
  url: "{url}"
  nodes:
    checking: [checker]
    paying: [payer]
"""


@pytest.fixture
def closed_url() -> Iterator[str]:
    """A loopback URL where nothing listens: its port bound and held but never listened on,
    so every connection is refused and no other test's server can take the port meanwhile
    (other tests start servers on free ports at the same time)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"nats://127.0.0.1:{held.getsockname()[1]}"


def test_a_run_on_a_server_nobody_runs_is_one_line_and_records_nothing(
    tmp_path: Path, closed_url: str
) -> None:
    url = closed_url
    path = write_team(tmp_path)  # a team that runs (in one process, or on a server)
    with path.open("a", encoding="utf-8") as scenario:
        scenario.write(TRANSPORT.format(url=url))
    done = pantheon("run", str(path), "--store", "s.db", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    # As a dead model server is said: where, and the cause, in one line (no JSON warning per
    # retry, no cleanup warning for consumer groups nobody made).
    assert done.stderr.splitlines() == [
        f"{path}: nothing ran: cannot connect to NATS at {url}: connection refused "
        "(nothing listens there)"
    ]
    assert done.stdout == ""
    assert not (tmp_path / "s.db").exists(), "a session was recorded for a run that never ran"


async def test_a_refused_connection_is_said_at_once_not_at_the_timeout(
    caplog: pytest.LogCaptureFixture, closed_url: str
) -> None:
    url = closed_url
    transport = NatsTransport(url, team="t", connect_timeout=15)
    bus = Bus(transport=transport)
    with caplog.at_level(logging.INFO, logger="bus.nats"), pytest.raises(ConnectError) as raised:
        await bus.start()
    # Not "within 15s: TimeoutError": the refusals ended the wait.
    assert str(raised.value) == (
        f"cannot connect to NATS at {url}: connection refused (nothing listens there)"
    )
    assert [r.getMessage() for r in caplog.records] == []
    assert transport.started is False
    with pytest.raises(ConnectError, match="connection refused"):
        await NatsTransport(url, team="t", connect_timeout=15).probe()
