"""The ``gateway:`` section and the ``http`` input: bounded knobs, located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pantheon.scenario import GatewayConfig, HttpInputConfig, ScenarioError, parse_scenario

BASE = """
version: 1
name: gw
input: {kind: http, topic: inbox.x}
"""


def test_defaults_bind_to_loopback() -> None:
    scenario = parse_scenario(BASE + "gateway: {}\n")
    assert isinstance(scenario.input, HttpInputConfig) and scenario.input.buffer == 256
    gw = scenario.gateway
    assert gw == GatewayConfig()
    assert (gw.host, gw.port, gw.max_body, gw.send_queue) == ("127.0.0.1", 8787, 1 << 20, 4096)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("gateway: {port: 70000}", "gateway.port: Input should be less than or equal to 65535"),
        (
            "gateway: {max_body: 100}",
            "gateway.max_body: Input should be greater than or equal to 1024",
        ),
        (
            "gateway: {max_batch: 0}",
            "gateway.max_batch: Input should be greater than or equal to 1",
        ),
        (
            "gateway: {send_queue: 2000000}",
            "gateway.send_queue: Input should be less than or equal",
        ),
        ("gateway: {request_timeout: .inf}", "gateway.request_timeout: Input should be less than"),
        ("gateway: {tokens_env: 'not a name'}", "gateway.tokens_env: String should match pattern"),
        (
            "gateway: {sendqueue: 5}",
            "gateway.sendqueue: unknown key 'sendqueue' (did you mean 'send_queue'?)",
        ),
        (
            "gateway: {host: 0.0.0.0}",
            "host '0.0.0.0' is reachable from other machines: give tokens_file or tokens_env",
        ),
    ],
)
def test_bad_gateway_settings_are_located(section: str, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(BASE + section + "\n")
    assert message in str(caught.value)


def test_an_http_input_needs_a_gateway() -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(BASE)
    assert "input.kind: an http input is fed through the gateway: add a gateway: section" in str(
        caught.value
    )


def test_the_gateway_needs_the_inprocess_transport() -> None:
    text = BASE + "gateway: {}\ntransport: {kind: zmq, nodes: {n1: [observer]}}\n"
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text)
    assert "gateway: the gateway needs transport kind 'inprocess'" in str(caught.value)


def test_an_inbox_buffer_is_bounded() -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(
            BASE.replace("topic: inbox.x", "topic: inbox.x, buffer: 0") + "gateway: {}\n"
        )
    assert "input.buffer: Input should be greater than or equal to 1" in str(caught.value)


def test_a_tokens_file_that_is_a_directory_is_located(tmp_path: Path) -> None:
    (tmp_path / "tokens").mkdir()
    text = BASE + "gateway: {tokens_file: tokens}\n"
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, source="gw.yaml", base_dir=tmp_path)
    (problem,) = caught.value.problems
    assert (problem.line, problem.field) == (5, "gateway.tokens_file")
    assert problem.message == (
        f"{tmp_path.resolve() / 'tokens'} is a directory, not a file: name the tokens file in it"
    )
