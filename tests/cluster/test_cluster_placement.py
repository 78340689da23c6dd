"""Node placement: which process hosts which agent, and the errors caught before any runs."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from cli_run import pantheon

from agents import Learner
from bus import Bus
from pantheon.runner._multiprocess import ClusterError, Placement, _subscribed
from pantheon.scenario import DRIVER_NODE, ScenarioError, load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[2]
THREE_NODE = ROOT / "scenarios" / "support_email_3node.yaml"


@pytest.fixture
def scenario_copy(tmp_path: Path) -> Path:
    """The three-node scenario and its data in a scratch directory, ready to be edited."""
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    return tmp_path / "scenarios" / THREE_NODE.name


def test_three_node_scenario_differs_from_the_in_process_one_only_in_transport() -> None:
    three = load_scenario(THREE_NODE)
    one = load_scenario(ROOT / "scenarios" / "support_email.yaml")
    assert three.model_dump(exclude={"transport", "name"}) == one.model_dump(
        exclude={"transport", "name"}
    )
    assert three.transport.kind == "zmq" and one.transport.kind == "inprocess"


def test_placement_puts_unplaced_agents_on_the_driver() -> None:
    placement = Placement.of(load_scenario(THREE_NODE))
    assert placement.hosts == {
        DRIVER_NODE: ("observer", "learner"),
        "perception": ("sensor", "monitor"),
        "cognition": ("reasoner", "memory", "planner"),
        "action": ("guardian", "actor"),
    }
    # Subscription names follow Agent.attach: the agent's name, then "<name>:<pattern>".
    assert placement.subscriptions["cognition"]["memory"] == "memory.lookup"
    assert placement.subscriptions["cognition"]["memory:action.executed"] == "action.executed"
    assert placement.subscriptions["perception"]["monitor"] == "system.>"


def test_probes_cover_every_pattern_subscribed_elsewhere() -> None:
    placement = Placement.of(load_scenario(THREE_NODE))
    # The driver must see the Sensor's subscription before the Observer publishes...
    assert "observation.email.received" in placement.probes(DRIVER_NODE)
    # ...and a glob is probed with a topic it matches.
    assert "system.x" in placement.probes(DRIVER_NODE)
    # A node never waits for its own subscriptions.
    assert "memory.lookup" not in placement.probes("cognition")
    assert "memory.lookup" in placement.probes("action")


def test_a_learner_is_placed_with_the_subscriptions_the_team_gives_it() -> None:
    """A Learner subscribes by the team's outcome, not its class default: on the on-call
    team it hears the alert decisions, so no node waits for a route to the support desk's
    ``observation.email.malformed`` that nobody ever subscribes to."""
    text = (ROOT / "scenarios" / "oncall.yaml").read_text()
    with_learner = text.replace("\nagents:\n", "\nagents:\n  learner: {}\n", 1)
    scenario = parse_scenario(with_learner, base_dir=ROOT / "scenarios")
    built = Learner("learner", outcome=scenario.outcome_spec())
    placement = Placement.of(scenario)
    learner = {n: p for n, p in placement.subscriptions[DRIVER_NODE].items() if "learner" in n}
    assert tuple(learner.values()) == built.subscriptions
    assert "observation.email.malformed" not in learner.values()


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        (
            "cognition: [reasoner, memory, planner]",
            "cognition: [reasoner, memroy, planner]",
            "transport.nodes.cognition[1]",
            "node 'cognition' hosts unknown agent 'memroy' (did you mean 'memory'?)",
        ),
        (
            "action: [guardian, actor]",
            "driver: [guardian, actor]",
            "transport.nodes.driver",
            "node name 'driver' is reserved",
        ),
        (
            "action: [guardian, actor]",
            "action: [guardian, actor, guardian]",
            "transport.nodes.action[2]",
            "node 'action' lists agent 'guardian' twice",
        ),
    ],
)
def test_bad_placement_is_a_scenario_error_before_anything_runs(
    scenario_copy: Path, old: str, new: str, field: str, message: str
) -> None:
    text = scenario_copy.read_text()
    assert old in text
    scenario_copy.write_text(text.replace(old, new))
    line = next(n for n, ln in enumerate(scenario_copy.read_text().splitlines(), 1) if new in ln)
    with pytest.raises(ScenarioError) as info:
        load_scenario(scenario_copy)
    [problem] = info.value.problems
    assert (problem.field, problem.line) == (field, line)
    assert message in problem.message

    # `pantheon run` reports the same, file:line:column first, and starts nothing.
    proc = pantheon("run", str(scenario_copy), "--no-record", cwd=scenario_copy.parent)
    assert proc.returncode == 2
    assert f"{scenario_copy}:{line}:" in proc.stdout + proc.stderr
    assert field in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_disabled_agent_cannot_be_placed(scenario_copy: Path) -> None:
    text = scenario_copy.read_text().replace("  planner: {}\n", "  planner: {enabled: false}\n")
    scenario_copy.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(scenario_copy)
    [problem] = info.value.problems
    assert problem.field == "transport.nodes.cognition[2]"
    assert "disabled" in problem.message


def test_kill_node_must_name_a_placed_node(scenario_copy: Path) -> None:
    text = scenario_copy.read_text() + "\nfaults:\n  kill_node: {node: cognitoin, at: 0.5}\n"
    scenario_copy.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(scenario_copy)
    [problem] = info.value.problems
    assert problem.field == "faults.kill_node.node"
    assert "did you mean 'cognition'?" in problem.message


def test_node_refuses_an_unknown_agent_before_connecting(tmp_path: Path) -> None:
    # Nothing listens on this endpoint: the name check must come first, and say what exists.
    proc = pantheon(
        "node", "--connect", "tcp://127.0.0.1:9", "--agents", "reasoner,gaurdian",
        "--scenario", str(THREE_NODE), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "unknown agent 'gaurdian' (did you mean 'guardian'?)" in proc.stderr
    assert "observer" in proc.stderr  # the list of agents the scenario has


def test_node_needs_agents_or_a_placed_node_name(tmp_path: Path) -> None:
    proc = pantheon("node", "--connect", "tcp://127.0.0.1:9", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--agents" in proc.stderr
    proc = pantheon(
        "node", "--connect", "tcp://127.0.0.1:9", "--scenario", str(THREE_NODE),
        "--node", "nowhere", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "node 'nowhere' is not placed" in proc.stderr
    assert "perception, cognition, action" in proc.stderr


async def test_a_start_up_confirmation_that_never_comes_fails_the_run_naming_it() -> None:
    """The driver waits for the other processes to route by its subscriptions before any
    input goes out; a confirmation lost for good once hung a run with no word at all."""

    class Unconfirmed:
        async def sync(self) -> None:
            await asyncio.Event().wait()

    with pytest.raises(
        ClusterError, match=r"did not confirm this process's subscriptions within 0\.2 s"
    ):
        await _subscribed(cast("Bus", SimpleNamespace(transport=Unconfirmed())), 0.2)
