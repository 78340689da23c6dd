"""A team of one's own: agent classes and handler functions by import path, from a folder
that is not installed, checked at load, run, recorded and replayed exactly."""

from __future__ import annotations

import json
import socket
import textwrap
from pathlib import Path

import pytest
from cli_run import pantheon

from pantheon import ScenarioError, load_scenario
from pantheon.sessions import SessionStore

# A team folder: one module and one data file beside the scenario. Module names are unique
# per test file, since a process imports a module once.
MODULE = '''
from agents import Agent, AgentSettings
from bus import Envelope


class Triage(Agent):
    """Sorts every email by whether it sounds urgent."""

    subscriptions = ("observation.email.received",)

    class Settings(AgentSettings):
        history: int = 10
        urgent_words: tuple[str, ...] = ("down", "broken")

    async def handle(self, env: Envelope) -> None:
        text = (env.payload["subject"] + " " + env.payload["body"]).lower()
        urgent = any(w in text for w in self.settings.urgent_words)
        await self.emit("ticket.urgent" if urgent else "ticket.normal", {"id": env.payload["id"]})


async def page(env, agent):
    stamp = await agent.effect("tool.page", lambda: {"paged": env.payload["id"]})
    await agent.emit("ticket.paged", stamp)


async def count(env):
    return None


def not_async(env):
    return None


class NotAnAgent:
    pass


class OldGlob(Triage):
    subscriptions = ("observation.email*",)
'''

EMAILS = [
    {"id": "e1", "from": "a@x.io", "subject": "Site is down", "body": "Nothing loads."},
    {"id": "e2", "from": "b@x.io", "subject": "Invoice", "body": "Where is my invoice?"},
    {"id": "e3", "from": "c@x.io", "subject": "Export broken", "body": "The export fails."},
]

#: ``input:`` with a path and no kind is the support inbox, checked by the support team's
#: ``support.emails:email_problem``: its folder, from wherever the scenario is written.
SUPPORT = Path(__file__).resolve().parents[2] / "scenarios"
SCENARIO = f"""\
version: 1
name: own_team
input:
  path: tickets.jsonl
agents:
  triage:
    class: "ownteam_mod:Triage"
    concurrency: 2
    settings:
      urgent_words: [down, broken]
  pager:
    handler: "ownteam_mod:page"
    subscribe: ["ticket.urgent"]
  counter:
    handler: "ownteam_mod:count"
    subscribe: ["ticket.*"]
expect:
  zero_lost: true
  max_dlq: 0
path: [{SUPPORT}]
"""


@pytest.fixture
def team(tmp_path: Path) -> Path:
    folder = tmp_path / "own_team"
    folder.mkdir()
    (folder / "ownteam_mod.py").write_text(MODULE, encoding="utf-8")
    (folder / "tickets.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in EMAILS), encoding="utf-8"
    )
    (folder / "scenario.yaml").write_text(SCENARIO, encoding="utf-8")
    return folder


def test_a_team_outside_the_package_runs_records_and_replays(team: Path, tmp_path: Path) -> None:
    # Run from elsewhere: the scenario's own folder is what makes its module importable.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = pantheon("run", str(team / "scenario.yaml"), "--json", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["passed"] is True
    assert summary["hops"]["triage"]["handled"] == 3
    assert summary["hops"]["pager"]["handled"] == 2  # "down" and "broken"
    assert summary["hops"]["counter"]["handled"] == 5  # ticket.* catches the 2 pages too
    sid = summary["session_id"]

    with SessionStore(elsewhere / ".pantheon" / "sessions.db") as st:
        info = st.session(sid)
        assert info.scenario_dir == str(team.resolve())
        topics = [e.topic for e in st.envelopes(sid)]
        assert topics.count("ticket.paged") == 2
        assert [e.name for e in st.effects(sid)].count("tool.page") == 2

    # Replay from a third place: the recorded folder, not the working directory, finds it.
    proc = pantheon(
        "replay", sid, "--store", str(elsewhere / ".pantheon" / "sessions.db"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "match" in proc.stdout.lower()


def test_settings_reach_the_agent_as_its_typed_model(team: Path) -> None:
    scenario = load_scenario(team / "scenario.yaml")
    from pantheon.runner._build import build_team

    built = build_team(scenario)
    triage = built.agents["triage"]
    assert triage.settings.urgent_words == ("down", "broken")
    assert triage.settings.history == 10
    assert built.agents["pager"].subscriptions == ("ticket.urgent",)
    assert list(built.agents) == ["observer", "triage", "pager", "counter"]


BAD = {
    "typo": (
        "  triage:\n    class: ownteam_mod:Triage\n    settings:\n      histroy: 3\n",
        "agents.triage.settings.histroy",
        "unknown setting 'histroy' (did you mean 'history'?)",
    ),
    "wrong_type": (
        "  triage:\n    class: ownteam_mod:Triage\n    settings:\n      history: abc\n",
        "agents.triage.settings.history",
        "valid integer",
    ),
    "builtin_typo": (
        "  memory:\n    settings:\n      histroy: 3\n",
        "agents.memory.settings.histroy",
        "did you mean 'history'?",
    ),
    "unknown_module": (
        "  triage:\n    class: nosuch_mod:Triage\n",
        "agents.triage.class",
        "cannot import module 'nosuch_mod'",
    ),
    "unknown_attr": (
        "  triage:\n    class: ownteam_mod:Triag\n",
        "agents.triage.class",
        "has no attribute 'Triag'",
    ),
    "not_an_agent": (
        "  triage:\n    class: ownteam_mod:NotAnAgent\n",
        "agents.triage.class",
        "is not an Agent subclass",
    ),
    "not_async": (
        "  triage:\n    handler: ownteam_mod:not_async\n    subscribe: [a.b]\n",
        "agents.triage.handler",
        "is not an async function",
    ),
    "handler_without_topics": (
        "  triage:\n    handler: ownteam_mod:count\n",
        "agents.triage",
        "needs subscribe",
    ),
    "old_glob_in_class": (
        "  triage:\n    class: ownteam_mod:OldGlob\n",
        "agents.triage.class",
        "OldGlob.subscriptions: topic pattern 'observation.email*': a wildcard must be a whole "
        "token ('*' is exactly one token and no longer crosses dots, '>' as the last token is "
        "one or more); use 'observation.email.>' for any number of tokens after 'email' (or "
        "give subscribe:)",
    ),
    "two_kinds": (
        "  triage:\n    handler: ownteam_mod:count\n    class: ownteam_mod:Triage\n",
        "agents.triage",
        "give one of role, class or handler",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_agents_are_located_errors(team: Path, case: str) -> None:
    body, field, message = BAD[case]
    text = "version: 1\nname: bad\ninput:\n  path: tickets.jsonl\nagents:\n" + body
    path = team / f"{case}.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    [problem] = info.value.problems
    assert problem.field == field
    assert message in problem.message
    assert problem.file == str(path)
    # The line the field (or its agent) is on.
    key = field.rsplit(".", 1)[-1]
    assert text.splitlines()[problem.line - 1].strip().startswith(f"{key}:")


def test_validate_and_run_refuse_a_bad_team_before_anything_runs(team: Path) -> None:
    text = textwrap.dedent(
        """\
        version: 1
        name: bad
        input:
          path: tickets.jsonl
        agents:
          triage:
            class: ownteam_mod:Triage
            settings:
              history: abc
          ghost:
            class: nosuch_mod:Ghost
        """
    )
    (team / "bad.yaml").write_text(text, encoding="utf-8")
    proc = pantheon("validate", "bad.yaml", cwd=team)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert "bad.yaml:9:7: agents.triage.settings.history: Input should be a valid integer" in (
        " ".join(lines)
    )
    assert any(
        line.startswith("bad.yaml:11:5: agents.ghost.class: cannot import") for line in lines
    )
    assert "Traceback" not in proc.stderr
    proc = pantheon("run", "bad.yaml", cwd=team)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert not (team / ".pantheon").exists()  # no session, no store: nothing ran


def test_an_installed_package_adds_agents_through_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installed distribution, as pip leaves one: a module and a dist-info with the
    # pantheon.agents entry point, on sys.path.
    site = tmp_path / "site"
    site.mkdir()
    (site / "epteam_mod.py").write_text(MODULE, encoding="utf-8")
    info = site / "epteam-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: epteam\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pantheon.agents]\ntriage = epteam_mod:Triage\n")
    monkeypatch.syspath_prepend(str(site))
    (tmp_path / "t.jsonl").write_text(json.dumps(EMAILS[0]) + "\n", encoding="utf-8")
    text = "version: 1\nname: ep\ninput:\n  path: t.jsonl\nagents:\n  sorter:\n    class: triage\n"
    (tmp_path / "ep.yaml").write_text(text, encoding="utf-8")
    from pantheon.runner._build import build_team

    sorter = build_team(load_scenario(tmp_path / "ep.yaml")).agents["sorter"]
    assert type(sorter).__name__ == "Triage" and type(sorter).__module__ == "epteam_mod"

    (tmp_path / "ep.yaml").write_text(text.replace("class: triage", "class: triag"))
    with pytest.raises(ScenarioError, match=r"neither an import path.*installed: triage"):
        load_scenario(tmp_path / "ep.yaml")


def test_a_dead_model_server_stops_the_run_before_it_starts(team: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = SCENARIO + f"provider:\n  kind: openai\n  base_url: http://127.0.0.1:{port}/v1\n"
    text += "  model: m\n"
    (team / "dead.yaml").write_text(text, encoding="utf-8")
    proc = pantheon("run", "dead.yaml", cwd=team)
    assert proc.returncode == 2
    message = " ".join(proc.stderr.split())
    assert f"cannot reach model server at http://127.0.0.1:{port}/v1/chat/completions" in message
    assert "connection refused" in message and "Traceback" not in proc.stderr
    assert not (team / ".pantheon").exists()  # nothing ran, nothing recorded


PROVIDER_MODULE = '''
from agents import ChatResult, Usage


class Echo:
    """A model of the team's own: answers with the last message, one token per word."""

    name = "echo"

    def __init__(self, model: str = "echo-1", shout: bool = False) -> None:
        self.model = model
        self.shout = shout

    async def chat(self, messages, **kwargs):
        text = messages[-1]["content"]
        words = len(text.split())
        return ChatResult(
            content=text.upper() if self.shout else text,
            usage=Usage(words, words),
            model=self.model,
        )

    async def aclose(self):
        pass


async def ask(env, agent):
    answer = await agent.chat([{"role": "user", "content": env.payload["body"]}])
    await agent.emit("ticket.answered", {"id": env.payload["id"], "answer": answer.content})


class NoChat:
    def __init__(self, model: str = "x") -> None:
        self.model = model
'''


def test_a_provider_of_ones_own_by_class_path(team: Path, tmp_path: Path) -> None:
    (team / "ownprov_mod.py").write_text(PROVIDER_MODULE, encoding="utf-8")
    text = (
        "version: 1\nname: own_model\ninput:\n  path: tickets.jsonl\n"
        f"path: [{SUPPORT}]\n"
        "provider:\n  kind: custom\n  class: ownprov_mod:Echo\n"
        "  settings: {model: echo-2, shout: true}\n"
        "prices:\n  echo-2: {input: 1.0, output: 2.0}\n"
        "agents:\n  asker:\n    handler: ownprov_mod:ask\n"
        "    subscribe: [observation.email.received]\n"
    )
    (team / "own_model.yaml").write_text(text, encoding="utf-8")
    proc = pantheon("run", "own_model.yaml", "--json", cwd=team)
    assert proc.returncode == 0, proc.stderr
    usage = json.loads(proc.stdout)["usage"]
    words = sum(len(e["body"].split()) for e in EMAILS)
    assert usage["calls"] == 3 and usage["input_tokens"] == usage["output_tokens"] == words
    assert usage["cost_usd"] == pytest.approx(words * 3.0 / 1e6) and usage["priced"]
    assert usage["by_agent"]["asker"]["calls"] == 3

    bad = text.replace("shout: true", "loud: true")
    (team / "bad_model.yaml").write_text(bad, encoding="utf-8")
    with pytest.raises(ScenarioError, match="does not take these settings") as info:
        load_scenario(team / "bad_model.yaml")
    assert info.value.problems[0].field == "provider"
    (team / "bad_model.yaml").write_text(text.replace("ownprov_mod:Echo", "ownprov_mod:NoChat"))
    with pytest.raises(ScenarioError, match="not a model provider"):
        load_scenario(team / "bad_model.yaml")


async def test_a_breaker_alert_replays_exactly(team: Path) -> None:
    """A Monitor's alert on a breaker event is caused by a system message, timing-driven
    like it: a replay leaves it out of the comparison instead of calling it extra."""
    import pantheon

    text = (
        "version: 1\nname: alerting\ninput:\n  path: tickets.jsonl\nagents:\n"
        "  triage:\n    class: ownteam_mod:Triage\n"
        "    breaker: {consecutive_failures: 1, cooldown: 30}\n"
        "  monitor: {}\n"
        "faults:\n  agents:\n    triage: {failure_rate: 1.0}\n"
    )
    (team / "alerting.yaml").write_text(text, encoding="utf-8")
    store = team / "s.db"
    summary = await pantheon.run(team / "alerting.yaml", store=store)
    assert summary.breaker_trips == 1 and summary.alerts == 1
    session = pantheon.Session.open(summary.session_id or "", store=store)
    assert [e.topic for e in session.envelopes()].count("monitor.alert.breaker_open") == 1
    report = await pantheon.replay(session)
    assert report.matched, report.divergence
