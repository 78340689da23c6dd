"""``transport: {kind: nats}`` in a scenario: defaults, bounded knobs, file:line errors."""

from __future__ import annotations

import os
from pathlib import Path

import nkeys
import pytest

from bus import Bus
from bus.backends.nats import AuthorizationError, ConnectError, NatsTransport
from pantheon.runner._multiprocess import Placement, cluster_transport
from pantheon.runner._takeover import fed_groups, warm_groups
from pantheon.scenario import NatsTransportConfig, ScenarioError, load_scenario

BASE = """\
version: 1
name: t
input:
  path: emails.jsonl
transport:
  kind: nats
"""


@pytest.fixture
def write(tmp_path: Path):
    (tmp_path / "emails.jsonl").write_text('{"id": "e1"}\n', encoding="utf-8")

    def write(extra: str) -> Path:
        path = tmp_path / "s.yaml"
        path.write_text(BASE + extra, encoding="utf-8")
        return path

    return write


def test_defaults_connect_to_the_local_server(write) -> None:
    t = load_scenario(write("")).transport
    assert isinstance(t, NatsTransportConfig)
    assert (t.url, t.server, t.storage, t.replicas, t.credit, t.max_deliver) == (
        "nats://127.0.0.1:4222",
        "external",
        "file",
        1,
        256,
        1,
    )
    assert t.credentials is None and t.team is None


def test_a_full_section_loads(write) -> None:
    t = load_scenario(
        write(
            "  url: nats://10.0.0.1:4222,nats://10.0.0.2:4222\n"
            "  team: support\n"
            "  replicas: 3\n"
            "  ack_wait: 5\n"
            "  credentials: {user: alice, password: s3cret}\n"
        )
    ).transport
    assert isinstance(t, NatsTransportConfig)
    assert t.replicas == 3 and t.team == "support" and t.ack_wait == 5.0
    assert t.credentials is not None and t.credentials.user == "alice"


@pytest.mark.parametrize(
    ("extra", "line", "field", "message"),
    [
        ("  credit: 0\n", 7, "transport.credit", "greater than or equal to 1"),
        ("  max_deliver: 5000\n", 7, "transport.max_deliver", "less than or equal to 1000"),
        ("  ack_wait: 0\n", 7, "transport.ack_wait", "greater than 0"),
        ("  url: http://x:4222\n", 7, "transport.url", "should match pattern"),
        ("  storage: disk\n", 7, "transport.storage", "'file' or 'memory'"),
        ("  team: a.b\n", 7, "transport.team", "should match pattern"),
        ("  credentials: {user: alice}\n", 7, "transport.credentials", "user and password go"),
        (
            "  server: auto\n  credentials: {token: t0k}\n",
            5,
            "transport",
            "server: auto configures user/password or nkey_seed credentials only",
        ),
    ],
)
def test_bad_knobs_are_one_line_with_file_and_line(
    write, extra: str, line: int, field: str, message: str
) -> None:
    path = write(extra)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.field) == (str(path), line, field)
    assert message in problem.message
    assert "\n" not in str(problem)


async def test_server_auto_admits_the_scenario_s_nkey_only(write, tmp_path: Path) -> None:
    """``server: auto`` with an nkey seed: the run's own server admits that key and refuses
    a client without it; it is gone once the run ends."""
    seed = tmp_path / "user.nk"
    seed.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    scenario = load_scenario(write(f"  server: auto\n  credentials: {{nkey_seed: {seed}}}\n"))
    async with cluster_transport(scenario) as transport:
        assert isinstance(transport, NatsTransport)
        url = transport.endpoint
        assert url.startswith("nats://127.0.0.1:") and not url.endswith(":4222")
        async with Bus(transport=transport) as bus:
            assert bus.transport.stats()["connected"] is True  # type: ignore[attr-defined]
            stranger = Bus(transport=NatsTransport(url, team="t", connect_timeout=3))
            with pytest.raises(AuthorizationError):
                await stranger.start()
    gone = Bus(transport=NatsTransport(url, team="t", connect_timeout=1))
    with pytest.raises(ConnectError, match="cannot connect to NATS"):
        await gone.start()


TEAM = """\
agents:
  reasoner: {}
  memory: {}
  planner: {}
  actor: {enabled: false}
"""
NODES = "  nodes:\n    a: [reasoner, memory]\n    b: [planner]\n"


def test_standby_members_join_the_placement_and_their_groups_go_through_the_stream(
    write,
) -> None:
    """A named standby process hosts its agents beside the placement (a process of its
    own when ``transport.nodes`` has no such node); every subscription hosted twice is fed
    from the stream alone; ``kill_node`` may name a standby-only process."""
    s = load_scenario(
        write(
            NODES
            + "  standby:\n    b: [reasoner]\n    spare: [memory]\n"
            + TEAM
            + "faults:\n  kill_node: {node: spare, at: 1}\n"
        )
    )
    placement = Placement.of(s)
    assert placement.nodes == {
        "a": ("reasoner", "memory"),
        "b": ("planner", "reasoner"),
        "spare": ("memory",),
    }
    assert placement.hosts["driver"] == ("observer",)
    # The processes whose journals the recorder takes, in the order that numbers their
    # dead letters: the same as the ones the placement starts.
    assert s.nodes() == ("a", "b", "spare") == tuple(placement.nodes)
    assert fed_groups(placement.subscriptions) == {
        "reasoner",
        "reasoner:learner.threshold.updated",
        "memory",
        "memory:action.executed",
    }

    driver = load_scenario(write(NODES + "  standby: driver\n" + TEAM))
    every = Placement.of(driver)
    assert every.hosts["driver"] == ("observer", "reasoner", "memory", "planner")
    assert every.nodes == {"a": ("reasoner", "memory"), "b": ("planner",)}
    assert driver.nodes() == ("a", "b")
    assert "observer" not in fed_groups(every.subscriptions)
    assert "planner" in fed_groups(every.subscriptions)


@pytest.mark.parametrize(
    ("standby", "field", "message"),
    [
        ("    b: [reasoner, reasoner]\n", "transport.standby.b[1]", "lists agent 'reasoner' twice"),
        ("    b: [planer]\n", "transport.standby.b[0]", "unknown agent 'planer' (did you mean"),
        ("    b: [actor]\n", "transport.standby.b[0]", "agent 'actor', which is disabled"),
        ("    b: [observer]\n", "transport.standby.b[0]", "not placed on a node (the driver"),
        ("    a: [memory]\n", "transport.standby.a[0]", "node 'a' already hosts agent 'memory'"),
    ],
)
def test_a_bad_standby_is_one_located_line(write, standby: str, field: str, message: str) -> None:
    path = write(NODES + "  standby:\n" + standby + TEAM)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.field) == (str(path), 11, field)
    assert message in problem.message
    assert "\n" not in str(problem)


@pytest.mark.parametrize(
    ("transport", "line", "field", "message"),
    [
        (
            "  nodes:\n    check: []\n    b: [planner]\n",
            8,
            "transport.nodes.check",
            "node 'check' hosts no agents: list the agents it runs, or remove it",
        ),
        (
            NODES + "  standby:\n    spare: []\n",
            11,
            "transport.standby.spare",
            "standby on 'spare' lists no agents: list the agents of transport.nodes it stands "
            "by for, or remove it",
        ),
    ],
)
def test_a_process_with_no_agents_is_one_located_line(
    write, transport: str, line: int, field: str, message: str
) -> None:
    # Its process would start with nothing to run, and the run end with "a node needs at
    # least one agent" after validation had said the scenario was fine.
    path = write(transport + TEAM)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.field) == (str(path), line, field)
    assert problem.message == message


def test_a_node_with_no_agents_of_its_own_may_host_standbys(write) -> None:
    s = load_scenario(write(NODES + "    spare: []\n  standby:\n    spare: [memory]\n" + TEAM))
    assert s.hosts()["spare"] == ("memory",)


@pytest.mark.parametrize("standby", ["everywhere", "[reasoner, memory]", "5", "''"])
def test_a_standby_of_neither_form_is_one_line_in_the_file_s_terms(write, standby: str) -> None:
    # Not pydantic's two lines per union member, each naming an internal type
    # (transport.standby.dict[constrained-str,tuple[constrained-str, ...]]: ...).
    path = write(NODES + f"  standby: {standby}\n" + TEAM)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.field) == (str(path), 10, "transport.standby")
    assert problem.message == "Input should be 'driver' or a mapping of process -> agents"


def test_a_mapping_standby_is_checked_as_a_mapping(write) -> None:
    # A mapping took the mapping member: its own error, at its key, and nothing about 'driver'.
    path = write(NODES + "  standby:\n    b: reasoner\n" + TEAM)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (problem,) = info.value.problems
    assert (problem.line, problem.field) == (11, "transport.standby.b")
    assert problem.message == 'a list, got a string; write b: ["reasoner"]'


def test_a_warm_standby_waits_behind_its_agent_s_node_then_the_standbys_listed_before_it(
    write,
) -> None:
    """``standby_mode: warm``: each standby's groups pull only once every process ahead of
    it is gone, so two standbys of one agent take over one after the other, not together."""
    s = load_scenario(
        write(
            NODES
            + "  standby:\n    b: [reasoner]\n    spare: [memory, reasoner]\n"
            + "  standby_mode: warm\n"
            + TEAM
        )
    )
    cfg = s.transport
    assert isinstance(cfg, NatsTransportConfig)
    assert cfg.warm_ahead("b") == {"reasoner": ("a",)}
    assert cfg.warm_ahead("spare") == {"memory": ("a",), "reasoner": ("a", "b")}
    assert cfg.warm_ahead("a") == {}
    subs = Placement.of(s).subscriptions
    assert warm_groups(subs["spare"], cfg.warm_ahead("spare")) == {
        "memory": ("a",),
        "memory:action.executed": ("a",),
        "reasoner": ("a", "b"),
        "reasoner:learner.threshold.updated": ("a", "b"),
    }
    # The default shares from the start: nobody is ahead of anyone.
    hot = load_scenario(write(NODES + "  standby:\n    b: [reasoner]\n" + TEAM))
    assert isinstance(hot.transport, NatsTransportConfig)
    assert hot.transport.warm_ahead("b") == {}


def test_warm_without_a_standby_is_one_located_line(write) -> None:
    path = write(NODES + "  standby_mode: warm\n" + TEAM)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.field) == (
        str(path),
        10,
        "transport.standby_mode",
    )
    assert "standby_mode: warm applies to standbys: add transport.standby" in problem.message
