"""A model agent's settings checked at load, each problem on its own line of the scenario, so
``pantheon validate`` and ``pantheon run`` refuse (exit 2) before anything runs: an inline
JSON schema the answer check cannot honour, a tool list given as a string, a tool whose
parameter has no JSON schema or whose docstring describes a parameter it lacks. A template or
``carry`` field that none of the records the input sends the agent has. And a run whose model
writes a tool's arguments as text dead-letters saying so, on replay too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import pantheon

import pantheon as pantheon_api
from pantheon.scenario import ScenarioError, load_scenario
from pantheon.scenario import _fields as fields_module
from pantheon.sessions import SessionStore

MODULE = '''
from typing import Literal

from pantheon.testing import Reply

from pydantic import BaseModel


class Triage(BaseModel):
    action: Literal["restart", "escalate", "ignore"]
    reason: str


def disk_usage(host: str) -> dict:
    """Disk usage of a host, in percent.

    Args:
        host: The host name, e.g. "web1".
    """
    return {"host": host, "disk_pct": 50}


class Host:
    def __init__(self, name):
        self.name = name


def by_host(host: Host) -> dict:
    """Takes a plain class.

    Args:
        host: The host.
    """
    return {}


def misdocumented(host: str) -> dict:
    """Disk usage.

    Args:
        hostname: The host.
    """
    return {}


def reply(request):
    """The scripted model: the same answer to every ask, whatever the output type."""
    return {"action": "ignore", "reason": "fine"}


def string_args(request):
    """A model that writes a tool's arguments as text, not JSON, every time."""
    return Reply(tool_calls=[{"name": "disk_usage", "arguments": "host=web1"}])
'''

ALERTS = [
    {"id": "A-1", "host": "web1", "service": "nginx", "symptom": "5xx", "expected": "restart"},
    {"id": "A-2", "host": "db1", "service": "postgres", "symptom": "slow", "expected": "ignore"},
]

SCENARIO = """\
version: 1
name: opsdesk
input:
  kind: jsonl
  path: alerts.jsonl
  label: expected
  topic: alert.raised
agents:
  triage:
    class: "agents:ModelAgent"
    subscribe: [alert.raised]
    settings:
      prompt: "Alert {id}: {service} on {host}: {symptom}"
      tools: ["ops_mod:disk_usage"]
      output: "ops_mod:Triage"
      output_topic: alert.triaged
      carry: [id, host]
provider:
  kind: openai
  model: stand-in
  stand_in: "ops_mod:reply"
expect:
  zero_lost: true
  max_dlq: 0
"""


@pytest.fixture
def desk(tmp_path: Path) -> Path:
    (tmp_path / "ops_mod.py").write_text(MODULE, encoding="utf-8")
    lines = "".join(json.dumps(a) + "\n" for a in ALERTS)
    (tmp_path / "alerts.jsonl").write_text(lines, encoding="utf-8")
    return tmp_path


def write(desk: Path, *edits: str) -> Path:
    """The scenario with each ``old, new`` pair of ``edits`` replaced, as desk.yaml."""
    text = SCENARIO
    for old, new in zip(edits[::2], edits[1::2], strict=True):
        assert old in text
        text = text.replace(old, new)
    path = desk / "desk.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def problems(path: Path) -> list[tuple[int, int, str, str]]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return [(p.line, p.column, p.field, p.message) for p in info.value.problems]


TYPES = "JSON Schema's types are object, array, string, integer, number, boolean, null"


def test_the_desk_as_written_loads(desk: Path) -> None:
    path = write(desk, "", "")
    assert list(load_scenario(path).agents) == ["observer", "triage"]


def test_an_inline_schema_with_a_misspelt_type_fails_on_that_type(desk: Path) -> None:
    path = write(desk, 'output: "ops_mod:Triage"', "output: {type: objekt}")
    assert problems(path) == [
        (
            15,
            16,
            "agents.triage.settings.output.type",
            f"unknown type 'objekt' (did you mean 'object'?); {TYPES}",
        )
    ]
    nested = """output:
        type: object
        properties:
          action: {type: strng}
          level: {type: integer, minimun: 1}
        required: [action]"""
    path = write(desk, 'output: "ops_mod:Triage"', nested)
    assert problems(path) == [
        (
            18,
            20,
            "agents.triage.settings.output.properties.action.type",
            f"unknown type 'strng' (did you mean 'string'?); {TYPES}",
        ),
        (
            19,
            34,
            "agents.triage.settings.output.properties.level.minimun",
            "unknown keyword 'minimun' (did you mean 'minimum'?); it checks type, properties, "
            "required, additionalProperties, items, enum, const, anyOf, minimum, maximum, "
            "minLength, maxLength",
        ),
    ]


def test_validate_and_run_refuse_the_schema_before_anything_runs(desk: Path) -> None:
    write(desk, 'output: "ops_mod:Triage"', "output: {type: objekt}")
    line = (
        "desk.yaml:15:16: agents.triage.settings.output.type: unknown type 'objekt' "
        f"(did you mean 'object'?); {TYPES}"
    )
    for command in ("validate", "run"):
        proc = pantheon(command, "desk.yaml", cwd=desk)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines() == ["invalid scenario", line]
    assert not (desk / ".pantheon").exists()  # no session, no store: nothing ran


def test_tools_given_as_a_string_says_to_write_a_list(desk: Path) -> None:
    path = write(desk, 'tools: ["ops_mod:disk_usage"]', 'tools: "ops_mod:disk_usage"')
    assert problems(path) == [
        (
            14,
            7,
            "agents.triage.settings.tools",
            'a list, got a string; write tools: ["ops_mod:disk_usage"]',
        )
    ]
    path = write(desk, "subscribe: [alert.raised]", "subscribe: {alert.raised: 1}")
    assert problems(path) == [
        (11, 5, "agents.triage.subscribe", "a list, got a mapping; write subscribe: [...]")
    ]


def test_a_tool_that_cannot_be_shown_to_the_model_is_one_located_line(desk: Path) -> None:
    tools = 'tools: ["ops_mod:disk_usage", "ops_mod:by_host", "ops_mod:misdocumented"]'
    path = write(desk, 'tools: ["ops_mod:disk_usage"]', tools)
    assert problems(path) == [
        (
            14,
            7,
            "agents.triage.settings.tools",
            "tool 'by_host' (ops_mod:by_host): parameter 'host' is typed ops_mod.Host, which "
            "has no JSON schema to show the model; type it with str, int, float, bool, None, a "
            "list or dict of those, Literal[...], an Enum, a TypedDict, a dataclass or a "
            "pydantic model",
        )
    ]
    path = write(desk, 'tools: ["ops_mod:disk_usage"]', 'tools: ["ops_mod:misdocumented"]')
    assert problems(path) == [
        (
            14,
            7,
            "agents.triage.settings.tools",
            "tool 'misdocumented' (ops_mod:misdocumented): its docstring describes 'hostname' "
            "(did you mean 'host'?) under Args:, but the function has no such parameter (its "
            "parameters: host)",
        )
    ]


async def test_tool_arguments_as_text_dead_letter_saying_so_and_replay_the_same(
    desk: Path,
) -> None:
    path = write(desk, 'stand_in: "ops_mod:reply"', 'stand_in: "ops_mod:string_args"')
    store = desk / "sessions.db"
    summary = await pantheon_api.run(load_scenario(path), store=store)
    heading = (
        "AnswerInvalid: model agent 'triage': the model called a tool with arguments that are "
        "not JSON after 3 tries (max_output_retries 2): "
    )
    errors = [d["error"] for d in summary.dead_letters]
    assert len(errors) == 2
    for error in errors:
        assert error.startswith(heading), error
        url = error.removeprefix(heading).split(" ", 1)[0]
        detail = "called tool 'disk_usage' with arguments that are not JSON: host=web1"
        assert error == f"{heading}{url} {detail}"
    report = await pantheon_api.replay(summary.session_id, store=store)
    assert report.matched, report.divergence
    assert report.effects_called == 0
    with SessionStore(store) as st:
        again = [d.error for d in st.dead_letters(report.new_session_id)]
    assert sorted(again) == sorted(e.removeprefix("AnswerInvalid: ") for e in errors)


FIELDS = "their fields: host, id, service, symptom"


def test_a_template_field_no_input_record_has_fails_on_the_template_s_line(desk: Path) -> None:
    path = write(desk, "{symptom}", "{symptoms}")
    assert problems(path) == [
        (
            13,
            7,
            "agents.triage.settings.prompt",
            "template field {symptoms}: none of the 2 records this agent gets from "
            "alerts.jsonl has 'symptoms' (did you mean 'symptom'?), so every message would "
            f"fail; {FIELDS}",
        )
    ]
    # The label is taken out before a record is published: no agent ever sees it.
    path = write(desk, 'prompt: "', 'instructions: "Expect {expected}."\n      prompt: "')
    assert problems(path) == [
        (
            13,
            7,
            "agents.triage.settings.instructions",
            "template field {expected}: none of the 2 records this agent gets from "
            f"alerts.jsonl has 'expected', so every message would fail; {FIELDS} ('expected' "
            "is the input's label, taken out before a record is published)",
        )
    ]


def test_a_carried_field_no_input_record_has_fails_on_its_item(desk: Path) -> None:
    path = write(desk, "carry: [id, host]", "carry: [id, hostname]")
    assert problems(path) == [
        (
            17,
            19,
            "agents.triage.settings.carry[1]",
            "carried field 'hostname' (did you mean 'host'?): none of the 2 records this agent "
            f"gets from alerts.jsonl has it, so it would never be carried; {FIELDS}",
        )
    ]


def test_fields_are_judged_only_by_the_records_the_agent_gets(desk: Path) -> None:
    # A field some records have is left to the run: those without it fail, or go uncarried.
    (desk / "alerts.jsonl").write_text(
        json.dumps(ALERTS[0]) + "\n" + json.dumps({**ALERTS[1], "owner": "dba"}) + "\n"
    )
    owner = ("carry: [id, host]", "carry: [id, owner]")
    assert list(load_scenario(write(desk, *owner)).agents) == ["observer", "triage"]
    # Routed by a field: only the records sent on a topic the agent subscribes to count.
    routed = (
        "topic: alert.raised",
        "topic_field: service\n  topics: {nginx: a.web, postgres: a.db}",
    )
    subscribed = ("subscribe: [alert.raised]", "subscribe: [a.web]")
    assert problems(write(desk, *owner, *routed, *subscribed)) == [
        (
            18,
            19,
            "agents.triage.settings.carry[1]",
            "carried field 'owner': the one record this agent gets from alerts.jsonl lacks "
            f"it, so it would never be carried; {FIELDS}",
        )
    ]
    subscribed = ("subscribe: [alert.raised]", "subscribe: [a.web, a.db]")
    path = write(desk, *owner, *routed, *subscribed)
    assert list(load_scenario(path).agents) == ["observer", "triage"]
    # An agent fed by another agent's answers is not judged by the input's records.
    path = write(
        desk, "subscribe: [alert.raised]", "subscribe: [alert.screened]", "{symptom}", "{finding}"
    )
    assert list(load_scenario(path).agents) == ["observer", "triage"]


def test_a_generator_s_fixed_payload_is_judged_and_a_file_past_the_bound_is_not(
    desk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generator = (
        "  kind: jsonl\n  path: alerts.jsonl\n  label: expected\n",
        "  kind: generator\n  payload: {id: A-1, host: web1}\n  count: 3\n",
    )
    assert problems(write(desk, *generator)) == [
        (
            13,
            7,
            "agents.triage.settings.prompt",
            f"template field {{{name}}}: the one record this agent gets from the input's "
            f"payload lacks {name!r}, so every message would fail; their fields: host, id",
        )
        for name in ("service", "symptom")
    ]
    # Only so much of a file is read: a field its first records lack may come later.
    monkeypatch.setattr(fields_module, "MAX_FIELD_SCAN_BYTES", 500)
    many = [{**ALERTS[0], "id": f"A-{n}"} for n in range(20)] + [{**ALERTS[1], "owner": "x"}]
    (desk / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in many))
    path = write(desk, "carry: [id, host]", "carry: [id, owner]")
    assert list(load_scenario(path).agents) == ["observer", "triage"]
    monkeypatch.setattr(fields_module, "MAX_FIELD_SCAN_BYTES", 64 * 1024 * 1024)
    assert list(load_scenario(path).agents) == ["observer", "triage"]  # found, last
    (desk / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in many[:-1]))
    assert len(problems(path)) == 1


def test_validate_and_run_refuse_a_misspelt_field_before_anything_runs(desk: Path) -> None:
    write(desk, "{symptom}", "{symptoms}")
    for command in ("validate", "run"):
        proc = pantheon(command, "desk.yaml", cwd=desk)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines() == [
            "invalid scenario",
            "desk.yaml:13:7: agents.triage.settings.prompt: template field {symptoms}: none of "
            "the 2 records this agent gets from alerts.jsonl has 'symptoms' (did you mean "
            f"'symptom'?), so every message would fail; {FIELDS}",
        ]
    assert not (desk / ".pantheon").exists()
