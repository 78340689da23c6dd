"""``provider.stand_in``: a scenario names its scripted model, and the run serves it from a
real local ModelServer started at the first model call and stopped with the run; a bad path
fails at load, located; ``python -m pantheon.testing --reply`` serves the same function."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import pantheon
from agents import ProviderResponseError
from pantheon.scenario import ScenarioError, parse_scenario
from pantheon.sessions import SessionStore
from pantheon.standin import StandInProvider
from pantheon.testing import ModelServer, Reply

MODULE = '''
from pantheon.testing import Reply

SEEN = []


def reply(request):
    """Answer each ask with its own text, upper-cased: one model call per message."""
    SEEN.append(request)
    ask = next(m["content"] for m in request["messages"] if m["role"] == "user")
    return Reply(ask.upper())


NOT_A_FUNCTION = 42
'''

SCENARIO = """\
version: 1
name: shouting
input:
  kind: jsonl
  path: asks.jsonl
  topic: ask
agents:
  shout:
    class: "agents:ModelAgent"
    subscribe: [ask]
    settings:
      prompt: "{text}"
      output_topic: shouted
provider:
  kind: openai
  model: stand-in
  stand_in: "STAND_IN"
expect:
  zero_lost: true
  max_dlq: 0
"""


@pytest.fixture
def team(tmp_path: Path) -> Path:
    (tmp_path / "shout_model.py").write_text(MODULE, encoding="utf-8")
    asks = [{"text": "hello"}, {"text": "quiet please"}]
    (tmp_path / "asks.jsonl").write_text("".join(json.dumps(a) + "\n" for a in asks))
    return tmp_path


def _scenario(team: Path, stand_in: str, extra: str = "") -> pantheon.Scenario:
    text = SCENARIO.replace("STAND_IN", stand_in).replace("  model: stand-in\n", extra)
    return parse_scenario(text, str(team / "shout.yaml"), team)


async def test_the_run_serves_the_scenarios_stand_in_and_a_replay_does_not_start_it(
    team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = _scenario(team, "shout_model:reply", "  model: stand-in\n")
    store = team / "sessions.db"
    started: list[int] = []
    start = ModelServer.start

    def noted(server: ModelServer) -> ModelServer:
        started.append(start(server).port)
        return server

    monkeypatch.setattr(ModelServer, "start", noted)
    summary = await pantheon.run(scenario, store=store)
    assert summary.passed, summary.expectations
    # One server, for the run (the pre-run check has nothing to reach), stopped at its end.
    [port] = started
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass
    import shout_model

    assert len(shout_model.SEEN) == 2  # each ask's one model call reached the function
    with SessionStore(store) as st:
        envelopes = st.envelopes(summary.session_id)
    shouted = sorted(e.payload["answer"] for e in envelopes if e.topic == "shouted")
    assert shouted == ["HELLO", "QUIET PLEASE"]

    def refuse(*args: Any) -> Any:
        raise AssertionError("the replay started the stand-in")

    monkeypatch.setattr(ModelServer, "start", refuse)
    report = await pantheon.replay(summary.session_id, store=store)
    assert report.matched and report.effects_called == 0
    # A what-if whose model calls are all the recorded ones does not start it either.
    whatif = await pantheon.replay(summary.session_id, store=store, with_="expect: {max_dlq: 0}")
    assert whatif.effects_called == 0 and whatif.passed


def test_a_stand_in_that_does_not_resolve_fails_at_load_located(team: Path) -> None:
    with pytest.raises(ScenarioError) as missing:
        _scenario(team, "shout_model:nope", "  model: stand-in\n")
    assert "shout.yaml:17:3: provider.stand_in: module 'shout_model' has no attribute 'nope'" in (
        str(missing.value)
    )
    with pytest.raises(ScenarioError) as not_callable:
        _scenario(team, "shout_model:NOT_A_FUNCTION", "  model: stand-in\n")
    assert "provider.stand_in: 'shout_model:NOT_A_FUNCTION' is not a function" in str(
        not_callable.value
    )
    with pytest.raises(ScenarioError) as both:
        _scenario(
            team, "shout_model:reply", "  model: stand-in\n  base_url: http://127.0.0.1:9/v1\n"
        )
    assert "give base_url (a model server to call) or stand_in" in str(both.value)


async def test_the_provider_starts_its_server_on_the_first_call_and_stops_it_when_closed() -> None:
    provider = StandInProvider(lambda request: Reply("hi"), "stand-in", max_retries=0)
    assert provider.server is None  # built, not started: what a replay's team costs
    result = await provider.chat([{"role": "user", "content": "hello"}])
    assert result.content == "hi"
    server = provider.server
    assert server is not None and len(server.requests) == 1
    port = server.port
    await provider.aclose()
    assert provider.server is None
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass


async def test_a_reply_function_that_raises_is_named_where_and_not_asked_again() -> None:
    """QA: "HTTP 500 ... the reply failed: KeyError: 'web9'", with no line of the reply
    function, asked five times over though it fails the same way every time."""

    def reply(request: Any) -> Reply:
        hosts: dict[str, str] = {}
        return Reply(hosts["web9"])

    provider = StandInProvider(reply, "stand-in", max_retries=4)
    with pytest.raises(ProviderResponseError) as caught:
        await provider.chat([{"role": "user", "content": "status of web9?"}])
    line = reply.__code__.co_firstlineno + 2
    assert str(caught.value).endswith(
        f"answered HTTP 500: the reply failed: KeyError: 'web9' (at {__file__}:{line}, in reply)"
    ), caught.value
    server = provider.server
    assert server is not None and len(server.requests) == 1  # asked once, not five times
    await provider.aclose()

    def parses(request: Any) -> Reply:
        return Reply(json.loads("host=web9"))  # fails inside json: the line is this one

    provider = StandInProvider(parses, "stand-in", max_retries=0)
    with pytest.raises(ProviderResponseError) as caught:
        await provider.chat([{"role": "user", "content": "status of web9?"}])
    line = parses.__code__.co_firstlineno + 1
    assert f"(at {__file__}:{line}, in parses)" in str(caught.value), caught.value
    await provider.aclose()


#: ``python -m pantheon.testing`` on any free port, answering at once, with a reply function.
SERVE = ("--port", "0", "--delay", "0", "--reply")


def test_python_m_pantheon_testing_serves_a_reply_function(team: Path) -> None:
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pantheon.testing",
            *SERVE,
            "shout_model:reply",
            "--path",
            str(team),
        ],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            base_url = proc.stdout.readline().split()[3]  # "model server at URL (...)"
            body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
            request = urllib.request.Request(
                f"{base_url}/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.load(response)
        finally:
            proc.terminate()  # the server this test started, by its handle
    assert answer["choices"][0]["message"]["content"] == "HELLO THERE"


def test_python_m_pantheon_testing_refuses_a_reply_that_does_not_resolve(team: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pantheon.testing",
            "--reply",
            "shout_model:nope",
            "--path",
            str(team),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--reply: module 'shout_model' has no attribute 'nope'" in proc.stderr


async def test_the_anthropic_route_says_it_asked_once_for_a_reply_that_raised() -> None:
    """The Anthropic SDK honours ``x-should-retry: false``; the error says it asked once,
    not "after 3 attempts" (review)."""
    from agents import AnthropicProvider

    def reply(request: Any) -> Reply:
        return Reply(json.loads(request["messages"][-1]["content"])["host"])

    with ModelServer(reply) as server:
        provider = AnthropicProvider(server.anthropic_base_url, model="claude-test", max_retries=2)
        with pytest.raises(ProviderResponseError) as caught:
            await provider.chat([{"role": "user", "content": "not json"}])
        await provider.aclose()
        assert len(server.requests) == 1
    message = str(caught.value)
    assert "answered HTTP 500: the reply failed: JSONDecodeError" in message, message
    assert "attempts" not in message and f"(at {__file__}:" in message
