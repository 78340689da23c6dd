"""Input kinds of a scenario, read for real: JSONL of any schema, generators imported from the
scenario's folder, standard input of a real ``pantheon run``; and the Observer that publishes
them at the configured rate, count, duration and priority."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

import pantheon
from agents import InputItem, Labels, Learner, Observer
from bus import Bus, Envelope, Priority
from bus.testing import capture_events
from pantheon._imports import ImportProblem, import_path
from pantheon.runner._build import build_team
from pantheon.runner._inputs import (
    GeneratorSource,
    InputSource,
    JsonlSource,
    StdinSource,
    count_inputs,
    open_input,
)
from pantheon.runner._runtime import run_scenario
from pantheon.scenario import (
    SUPPORT_INBOX,
    FileInputConfig,
    GeneratorInputConfig,
    JsonlInputConfig,
    Problem,
    Scenario,
    ScenarioError,
    StdinInputConfig,
    load_scenario,
    parse_scenario,
)
from pantheon.testing import JsonlLine, read_jsonl

ROOT = Path(__file__).resolve().parents[2]

# Incidents, not emails: routed by `kind`, ground truth in `truth`, keyed by `ref`.
INCIDENTS = [
    {"ref": "i1", "kind": "page", "service": "db", "truth": {"severity": "sev1"}},
    {"ref": "i2", "kind": "ticket", "service": "web", "truth": {"severity": "sev3"}},
    "not json at all",
    {"ref": "i3", "kind": "chat", "service": "api", "truth": {"severity": "sev2"}},
    [1, 2, 3],
    {"ref": "i4", "kind": "page", "service": "", "truth": {"severity": "sev1"}},
    {"ref": "i5", "service": "cache"},
    {"ref": "i6", "kind": "ticket", "service": "web"},
]

INCIDENT_SCENARIO = """\
version: 1
name: incidents
agents: {{observer: {{}}, learner: {{}}}}
input:
  kind: jsonl
  path: incidents.jsonl
  key: ref
  label: truth
  topic_field: kind
  topics:
    page: alert.paged
    ticket: ticket.opened
  malformed_topic: incident.rejected
  validate: "{module}:problem"
"""

CHECKS = """\
def problem(record):
    if not record.get("service"):
        return "no service named"
    return None
"""


def module_name(tmp_path: Path, stem: str) -> str:
    """A module name no other test uses: sys.modules outlives each test's folder."""
    return f"{stem}_{re.sub(r'[^0-9a-zA-Z_]', '_', tmp_path.name)}"


def write_incidents(tmp_path: Path, extra: str = "") -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in INCIDENTS]
    (tmp_path / "incidents.jsonl").write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    module = module_name(tmp_path, "checks")
    (tmp_path / f"{module}.py").write_text(CHECKS, encoding="utf-8")
    path = tmp_path / "incidents.yaml"
    path.write_text(INCIDENT_SCENARIO.format(module=module) + extra, encoding="utf-8")
    return path


async def publish(scenario: Scenario) -> tuple[Observer, list[Envelope]]:
    """Run the scenario's source through an Observer on a real bus; what it published."""
    observer = build_team(scenario).agents["observer"]
    assert isinstance(observer, Observer)
    async with Bus() as bus:
        await observer.attach(bus)
        with capture_events(bus, ">") as seen:
            await observer.start()
            await asyncio.wait_for(observer.done.wait(), 10)
            await bus.drain()
    return observer, list(seen)


# -- jsonl -------------------------------------------------------------------------------------


async def test_jsonl_of_any_schema_is_routed_labelled_and_checked(tmp_path: Path) -> None:
    scenario = load_scenario(write_incidents(tmp_path))
    assert isinstance(scenario.input, JsonlInputConfig)
    observer, seen = await publish(scenario)
    published = [(e.topic, e.payload) for e in seen]
    assert published == [
        ("alert.paged", {"ref": "i1", "kind": "page", "service": "db"}),
        ("ticket.opened", {"ref": "i2", "kind": "ticket", "service": "web"}),
        ("incident.rejected", {"line": 3, "reason": "not JSON: Expecting value", "key": None}),
        ("incident.rejected", {"line": 4, "reason": "kind 'chat' has no topic in input.topics",
                               "key": "i3"}),
        ("incident.rejected", {"line": 5, "reason": "not a JSON object", "key": None}),
        ("incident.rejected", {"line": 6, "reason": "no service named", "key": "i4"}),
        ("incident.rejected", {"line": 7, "reason": "no field 'kind' to pick a topic by",
                               "key": "i5"}),
        ("ticket.opened", {"ref": "i6", "kind": "ticket", "service": "web"}),
    ]  # fmt: skip
    assert (observer.emitted, observer.malformed, observer.error) == (3, 5, None)
    # Ground truth never reaches the bus, and is kept for every record that had it,
    # rejected ones included (a Learner scores a rejection too).
    assert all("truth" not in json.dumps(e.payload) for e in seen)
    assert dict(observer.labels) == {
        "i1": {"severity": "sev1"},
        "i2": {"severity": "sev3"},
        "i3": {"severity": "sev2"},
        "i4": {"severity": "sev1"},
    }
    assert count_inputs(scenario) == 8  # non-blank lines


async def test_jsonl_lines_the_json_module_refuses_are_rejected_not_raised(
    tmp_path: Path,
) -> None:
    """Valid JSON syntax that json.loads still refuses: nested 100,000 deep (RecursionError)
    and an integer of 5,000 digits (ValueError, not JSONDecodeError). Each is one rejected
    line; the run went down with a traceback before."""
    path = write_incidents(tmp_path)
    good = json.dumps({"ref": "i9", "kind": "page", "service": "db"})
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "incidents.jsonl").write_text(f'{deep}\n{{"n": 1{"0" * 5000}}}\n{good}\n')
    _, seen = await publish(load_scenario(path))
    assert [(e.topic, e.payload) for e in seen] == [
        ("incident.rejected", {"line": 1, "reason": "not JSON: nested too deep to read",
                               "key": None}),
        ("incident.rejected", {"line": 2, "reason": "not JSON: Exceeds the limit (4300 digits) "
                               "for integer string conversion: value has 5001 digits",
                               "key": None}),
        ("alert.paged", {"ref": "i9", "kind": "page", "service": "db"}),
    ]  # fmt: skip


async def test_read_jsonl_gives_a_team_the_lines_and_reasons_a_run_publishes(
    tmp_path: Path,
) -> None:
    """``pantheon.testing.read_jsonl`` is the reader a ``jsonl`` input runs on: the same line
    numbers (blank lines counted, not yielded), the same reasons, nothing raised."""
    path = write_incidents(tmp_path)
    good = {"ref": "i9", "kind": "page", "service": "db"}
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "incidents.jsonl").write_bytes(
        b"\n".join([
            b"{not json", b"", b"[1, 2]", deep.encode(), b'{"n": 1' + b"0" * 5000 + b"}",
            json.dumps(good).encode(), b'{"ref": "i\xff", "kind": "page", "service": "db"}', b"",
        ])
    )  # fmt: skip
    lines = list(read_jsonl(tmp_path / "incidents.jsonl"))
    assert lines == [
        JsonlLine(1, None, "not JSON: Expecting property name enclosed in double quotes"),
        JsonlLine(3, None, "not a JSON object"),
        JsonlLine(4, None, "not JSON: nested too deep to read"),
        JsonlLine(5, None, "not JSON: Exceeds the limit (4300 digits) for integer string "
                           "conversion: value has 5001 digits"),
        JsonlLine(6, good, None),
        JsonlLine(7, {"ref": "i\ufffd", "kind": "page", "service": "db"}, None),
    ]  # fmt: skip
    _, seen = await publish(load_scenario(path))
    rejected = [
        (e.payload["line"], e.payload["reason"]) for e in seen if e.topic == "incident.rejected"
    ]
    assert rejected == [(n, problem) for n, _, problem in lines if problem is not None]


async def test_default_topic_takes_values_without_a_mapping(tmp_path: Path) -> None:
    path = write_incidents(tmp_path, "  default_topic: incident.other\n")
    _, seen = await publish(load_scenario(path))
    topics = [e.topic for e in seen]
    assert topics.count("incident.other") == 2  # i3 (kind chat) and i5 (no kind at all)
    assert [e.payload["ref"] for e in seen if e.topic == "incident.other"] == ["i3", "i5"]


async def test_topics_match_values_that_are_not_strings(tmp_path: Path) -> None:
    records = [{"sev": 2}, {"sev": True}, {"sev": 2.5}, {"sev": None}, {"sev": "true"}]
    (tmp_path / "s.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    text = (
        "version: 1\nname: t\nagents: {observer: {}}\ninput:\n  kind: jsonl\n  path: s.jsonl\n"
        "  topic_field: sev\n"
        "  topics: {2: sev.two, true: sev.yes, 2.5: sev.half, null: sev.none}\n"
    )
    scenario = parse_scenario(text, base_dir=tmp_path)
    assert scenario.input.topics == {
        "2": "sev.two", "true": "sev.yes", "2.5": "sev.half", "null": "sev.none"
    }  # fmt: skip
    _, seen = await publish(scenario)
    # A string is looked up as itself, so "true" meets the YAML key true as the boolean does.
    assert [e.topic for e in seen] == ["sev.two", "sev.yes", "sev.half", "sev.none", "sev.yes"]


async def test_labels_reach_a_learner_in_another_process(tmp_path: Path) -> None:
    """A JSONL input's labels are read ahead at build time too: a Learner that is not in
    the Observer's process (a ZeroMQ node) has them without the Observer running."""
    team = build_team(load_scenario(write_incidents(tmp_path)))
    learner = team.agents["learner"]
    assert isinstance(learner, Learner)
    assert learner.labels["i2"] == {"severity": "sev3"}
    assert learner.labels is team.agents["observer"].labels  # type: ignore[attr-defined]


async def test_count_stops_early_and_counts_malformed_lines(tmp_path: Path) -> None:
    path = write_incidents(tmp_path, "  count: 4\n")
    scenario = load_scenario(path)
    observer, seen = await publish(scenario)
    assert len(seen) == 4 and (observer.emitted, observer.malformed) == (2, 2)
    assert count_inputs(scenario) == 4


async def test_legacy_file_kind_is_the_support_inbox(tmp_path: Path) -> None:
    """Scenarios (and recorded sessions) from before `jsonl` say `kind: file`, or no kind."""
    (tmp_path / "in.jsonl").write_text(
        json.dumps(
            {"id": "e1", "from": "a@x.example", "subject": "hi", "body": "how do I pay",
             "expected": {"intent": "question", "action": "reply"}}
        ) + '\n{"id": "e2", "from": "nobody", "subject": "s", "body": "b"}\n',
        encoding="utf-8",
    )  # fmt: skip
    for kind in ("", "  kind: file\n"):
        text = f"version: 1\nname: t\nagents: {{observer: {{}}}}\ninput:\n{kind}  path: in.jsonl\n"
        scenario = parse_scenario(text, base_dir=tmp_path)
        assert isinstance(scenario.input, FileInputConfig)
        assert scenario.input.validator == SUPPORT_INBOX["validate"]
        observer, seen = await publish(scenario)
        assert [(e.topic, e.payload.get("id", e.payload.get("key"))) for e in seen] == [
            ("observation.email.received", "e1"),
            ("observation.email.malformed", "e2"),
        ]
        assert "expected" not in seen[0].payload
        assert seen[1].payload["reason"] == "sender 'nobody' is not an address"
        assert observer.labels["e1"] == {"intent": "question", "action": "reply"}


def test_a_jsonl_scenario_dumps_and_loads_again(tmp_path: Path) -> None:
    """`validate` is a field alias (the name shadows pydantic's): the dump must use it."""
    scenario = load_scenario(write_incidents(tmp_path))
    dumped = scenario.model_dump(mode="json")
    assert dumped["input"]["validate"].endswith(":problem") and "validator" not in dumped["input"]
    again = parse_scenario(yaml.safe_dump(dumped), base_dir=tmp_path)
    assert again.input == scenario.input


# -- generator ---------------------------------------------------------------------------------

GENERATOR = '''\
import asyncio

calls = []


def emails(seed, settings):
    """Support-shaped records with labels, then a pair, then a payload with no topic."""
    calls.append((seed, dict(settings)))
    for n in range(settings["n"]):
        yield {
            "id": f"g{n}",
            "from": f"user{n}@example.com",
            "subject": "Refund please" if n % 2 else "How do I export?",
            "body": f"seed {seed}, message {n}",
            "attachments": [],
            "expected": {"intent": "refund" if n % 2 else "question",
                         "action": "reply" if n % 2 else "reply"},
        }
    yield ("custom.topic", {"pair": True})
    yield ("Not A Topic!", {"pair": False})


def newline_topic(seed, settings):
    yield ("custom.topic\\n", {"n": 1})
    yield ("custom.topic", {"n": 2})


async def ticks(seed, settings):
    n = 0
    while True:
        n += 1
        await asyncio.sleep(settings.get("sleep", 0))
        yield {"n": n}


def broken(seed, settings):
    yield {"n": 1}
    raise RuntimeError("the feed went away")


def not_a_generator(seed, settings):
    return [1, 2, 3]


NOT_CALLABLE = 42
'''


#: The nine built-in roles, given the support team's logic (scenarios/support/) and
#: otherwise at their defaults: a scenario's team is what it lists.
SUPPORT_TEAM = (
    "observer",
    'sensor: {settings: {extract: "support.emails:extract_features"}}',
    "memory",
    'reasoner: {settings: {question: "support.intents:classify", actions: {question: reply, '
    "complaint: ticket, refund: reply, bug: ticket, spam: ignore, outage: escalate}}}",
    "planner",
    'guardian: {settings: {pii: "support.pii:scrub"}}',
    "actor",
    "learner: {settings: {intents: [question, complaint, refund, bug, spam, outage]}}",
    "monitor",
)


def write_generator(
    tmp_path: Path, body: str, team: tuple[str, ...] = ("observer",)
) -> tuple[Path, str]:
    module = module_name(tmp_path, "gen")
    (tmp_path / f"{module}.py").write_text(GENERATOR, encoding="utf-8")
    path = tmp_path / "gen.yaml"
    agents = "".join(f"  {a}\n" if ":" in a else f"  {a}: {{}}\n" for a in team)
    path.write_text(
        f"version: 1\nname: gen\nseed: 11\nagents:\n{agents}input:\n  kind: generator\n"
        + textwrap.indent(body.format(module=module), "  "),
        encoding="utf-8",
    )
    return path, module


async def test_generator_from_the_scenario_folder_feeds_the_support_team(tmp_path: Path) -> None:
    path, module = write_generator(
        tmp_path,
        'function: "{module}:emails"\n'
        "settings: {{n: 6}}\n"
        "topic: observation.email.received\n"
        "label: expected\n"
        "malformed_topic: observation.email.malformed\n",
        team=SUPPORT_TEAM,
    )
    scenario = load_scenario(path)
    assert isinstance(scenario.input, GeneratorInputConfig)
    assert count_inputs(scenario) is None  # no count: the generator decides
    summary = await run_scenario(scenario)
    calls = sys.modules[module].calls
    assert calls == [(11, {"n": 6})]  # called once, with the run's seed and the settings
    assert (summary.inputs, summary.malformed, summary.input_errors) == (7, 1, [])
    assert summary.topics["observation.email.received"] == 6
    assert summary.topics["custom.topic"] == 1
    assert summary.topics["observation.email.malformed"] == 1
    # The Learner scored every generated email against the labels the generator yielded.
    assert summary.accuracy["scored"] == 6
    # No rules: the Reasoner calls everything a question, so the refund half is wrong.
    assert summary.accuracy["intent_accuracy"] == 0.5
    # A different seed is a different run of the generator.
    await run_scenario(scenario, seed=3)
    assert calls[-1] == (3, {"n": 6})


async def test_generator_pairs_and_bad_topics(tmp_path: Path) -> None:
    path, _ = write_generator(
        tmp_path, 'function: "{module}:emails"\nsettings: {{n: 1}}\ntopic: x.y\nlabel: expected\n'
    )
    observer, seen = await publish(load_scenario(path))
    assert [(e.topic, e.payload.get("id", e.payload.get("reason"))) for e in seen] == [
        ("x.y", "g0"),
        ("custom.topic", None),
        ("input.malformed", "yielded topic 'Not A Topic!' is not a dotted name"),
    ]
    assert seen[1].payload == {"pair": True}
    assert observer.labels["g0"]["intent"] == "question"


async def test_a_yielded_topic_with_a_final_newline_is_malformed(tmp_path: Path) -> None:
    # The check's "$" used to match before a final newline, so "custom.topic\n" passed.
    path, _ = write_generator(tmp_path, 'function: "{module}:newline_topic"\ntopic: x.y\n')
    _, seen = await publish(load_scenario(path))
    assert [(e.topic, e.payload.get("n", e.payload.get("reason"))) for e in seen] == [
        ("input.malformed", "yielded topic 'custom.topic\\n' is not a dotted name"),
        ("custom.topic", 2),
    ]


async def test_async_generator_with_rate_and_count(tmp_path: Path) -> None:
    path, _ = write_generator(
        tmp_path, 'function: "{module}:ticks"\ntopic: tick\ncount: 11\nrate: 100\n'
    )
    scenario = load_scenario(path)
    assert count_inputs(scenario) == 11
    started = time.perf_counter()
    _, seen = await publish(scenario)
    elapsed = time.perf_counter() - started
    assert [e.payload["n"] for e in seen] == list(range(1, 12))
    # 11 messages at 100/s: the last goes out 100 ms after the first, not at once.
    assert elapsed >= 0.095
    gaps = [(b.created - a.created) / 1e6 for a, b in itertools.pairwise(seen)]
    assert sum(gaps) >= 95  # ms between first and last, by the envelopes' own clocks


async def test_rate_zero_is_as_fast_as_the_bus_takes_them(tmp_path: Path) -> None:
    path, _ = write_generator(tmp_path, 'function: "{module}:ticks"\ntopic: tick\ncount: 2000\n')
    started = time.perf_counter()
    observer, seen = await publish(load_scenario(path))
    assert len(seen) == 2000 and observer.emitted == 2000
    assert time.perf_counter() - started < 5  # no pacing: 2000 at 100/s would take 20 s


async def test_duration_ends_an_endless_generator(tmp_path: Path) -> None:
    path, _ = write_generator(
        tmp_path,
        'function: "{module}:ticks"\nsettings: {{sleep: 0.01}}\ntopic: tick\nduration: 0.3\n',
    )
    started = time.perf_counter()
    observer, seen = await publish(load_scenario(path))
    elapsed = time.perf_counter() - started
    assert 0.25 <= elapsed < 3
    assert 5 <= observer.emitted == len(seen) <= 40


async def test_priority_is_on_every_published_envelope(tmp_path: Path) -> None:
    path, _ = write_generator(
        tmp_path,
        'function: "{module}:emails"\nsettings: {{n: 2}}\ntopic: x.y\npriority: critical\n',
    )
    _, seen = await publish(load_scenario(path))
    assert len(seen) == 4
    assert {e.priority for e in seen} == {Priority.CRITICAL}  # the malformed one too
    path, _ = write_generator(tmp_path, "topic: x.y\ncount: 2\npayload: {{a: 1}}\npriority: high\n")
    _, seen = await publish(load_scenario(path))
    assert [e.priority for e in seen] == [Priority.HIGH, Priority.HIGH]


async def test_payload_copies_are_independent(tmp_path: Path) -> None:
    path, _ = write_generator(tmp_path, "topic: a.b\ncount: 3\npayload: {{n: 1, tags: [x]}}\n")
    scenario = load_scenario(path)
    assert count_inputs(scenario) == 3
    _, seen = await publish(scenario)
    assert [e.payload for e in seen] == [{"n": 1, "tags": ["x"]}] * 3
    assert seen[0].payload["tags"] is not seen[1].payload["tags"]


async def test_a_generator_that_raises_fails_the_run(tmp_path: Path) -> None:
    path, _ = write_generator(tmp_path, 'function: "{module}:broken"\ntopic: a.b\n')
    summary = await run_scenario(load_scenario(path))
    assert summary.inputs == 1  # what came before the error went out
    assert summary.input_errors == ["observer: RuntimeError: the feed went away"]
    [failed] = [e for e in summary.expectations if not e["passed"]]
    assert failed["name"] == "input ran to its end"
    assert "the feed went away" in failed["actual"]
    assert not summary.passed


async def test_replay_does_not_run_the_generator_again(tmp_path: Path) -> None:
    path, module = write_generator(
        tmp_path, 'function: "{module}:emails"\nsettings: {{n: 3}}\ntopic: a.b\n'
    )
    store = tmp_path / "s.db"
    summary = await pantheon.run(load_scenario(path), store=store)
    assert summary.topics["a.b"] == 3
    report = await pantheon.replay(summary.session_id or "", store=store)
    assert report.matched, report.divergence
    assert len(sys.modules[module].calls) == 1  # the replay re-published the recording
    assert build_team(load_scenario(path), replay=True).agents["observer"].source is None  # type: ignore[attr-defined]


# -- stdin -------------------------------------------------------------------------------------

STDIN_SCENARIO = """\
version: 1
name: piped
agents: {observer: {}}
input:
  kind: stdin
  topic_field: type
  topics: {"page": alert.paged}
  default_topic: text.line
  label: truth
  priority: high
expect:
  topics:
    alert.paged: {min: 2, max: 2}
    text.line: {min: 3, max: 3}
"""


def test_stdin_of_a_real_pantheon_run(tmp_path: Path) -> None:
    (tmp_path / "piped.yaml").write_text(STDIN_SCENARIO, encoding="utf-8")
    lines = [
        '{"type": "page", "id": "p1", "truth": "sev1"}',
        "plain words, not JSON",
        "",
        "42",
        '{"type": "page", "id": "p2"}',
        '{"no": "type"}',
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", "piped.yaml", "--json", "--store", "s.db"],
        cwd=tmp_path,
        input="\n".join(lines),  # the last line has no newline: still a line
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["passed"] and summary["inputs"] == 5 and summary["malformed"] == 0
    assert summary["topics"]["alert.paged"] == 2 and summary["topics"]["text.line"] == 3

    from pantheon.sessions import SessionStore

    with SessionStore(tmp_path / "s.db") as store:
        inputs = [
            e
            for e in store.envelopes(store.resolve(summary["session_id"]))
            if e.topic in ("alert.paged", "text.line")
        ]
    assert [(e.topic, e.payload) for e in inputs] == [
        ("alert.paged", {"type": "page", "id": "p1"}),  # label taken out
        ("text.line", {"text": "plain words, not JSON"}),
        ("text.line", 42),
        ("alert.paged", {"type": "page", "id": "p2"}),
        ("text.line", {"no": "type"}),
    ]
    assert {e.priority for e in inputs} == {Priority.HIGH}


async def test_stdin_left_open_ends_at_count(tmp_path: Path) -> None:
    """A run that wants 2 lines must not wait for a third that never comes."""
    read, write = os.pipe()
    try:
        os.write(write, b'{"a": 1}\n{"a": 2}\n{"a": 3')  # the third is unfinished
        scenario = parse_scenario("version: 1\nname: t\ninput: {kind: stdin, topic: a.b}\n")
        assert count_inputs(scenario) is None
        source = open_input(scenario, stdin_fd=read)
        assert isinstance(source, StdinSource)
        observer = Observer(source=source, settings={"count": 2})
        async with Bus() as bus:
            await observer.attach(bus)
            with capture_events(bus, "a.b") as seen:
                await observer.start()
                await asyncio.wait_for(observer.done.wait(), 5)
                await bus.drain()
        assert [e.payload for e in seen] == [{"a": 1}, {"a": 2}]
    finally:
        os.close(write)
        os.close(read)


async def test_a_stdin_line_nested_too_deep_is_text() -> None:
    """A line the json module refuses with RecursionError is text, as any other line
    that is not JSON; it ended the run with a traceback before."""
    read, write = os.pipe()
    deep = "[" * 5_000 + "]" * 5_000
    try:
        os.write(write, f'{deep}\n{{"a": 2}}\n'.encode())
        os.close(write)
        write = -1
        scenario = parse_scenario("version: 1\nname: t\ninput: {kind: stdin, topic: a.b}\n")
        source = open_input(scenario, stdin_fd=read)
        observer = Observer(source=source, settings={"count": 2})
        async with Bus() as bus:
            await observer.attach(bus)
            with capture_events(bus, "a.b") as seen:
                await observer.start()
                await asyncio.wait_for(observer.done.wait(), 5)
                await bus.drain()
        assert [e.payload for e in seen] == [{"text": deep}, {"a": 2}]
    finally:
        if write != -1:
            os.close(write)
        os.close(read)


async def test_stdin_left_open_ends_at_duration() -> None:
    read, write = os.pipe()
    try:
        os.write(write, b"one\n")
        scenario = parse_scenario(
            "version: 1\nname: t\ninput: {kind: stdin, topic: a.b, duration: 0.2}\n"
        )
        observer = Observer(source=open_input(scenario, stdin_fd=read), settings={"duration": 0.2})
        async with Bus() as bus:
            await observer.attach(bus)
            started = time.perf_counter()
            await observer.start()
            await asyncio.wait_for(observer.done.wait(), 5)
            assert 0.15 <= time.perf_counter() - started < 2
        assert observer.emitted == 1
    finally:
        os.close(write)
        os.close(read)


# -- the Observer and its pieces ---------------------------------------------------------------


async def test_observer_takes_any_async_iterable() -> None:
    async def items():  # type: ignore[no-untyped-def]
        yield InputItem("a.b", {"id": 1}, key=1, label="yes")
        yield InputItem("a.bad", {"line": 2, "reason": "r", "key": None}, malformed=True)

    labels = Labels()
    observer = Observer(source=items(), labels=labels)
    async with Bus() as bus:
        await observer.attach(bus)
        with capture_events(bus, ">") as seen:
            await observer.start()
            await observer.done.wait()
            await bus.drain()
    assert [e.topic for e in seen] == ["a.b", "a.bad"]
    assert (observer.emitted, observer.malformed) == (1, 1)
    assert dict(labels) == {"1": "yes"}


async def test_observer_without_a_source_publishes_nothing() -> None:
    observer = Observer()
    async with Bus() as bus:
        await observer.attach(bus)
        await observer.start()
        assert observer.done.is_set() and observer.emitted == 0


def test_sources_satisfy_the_protocol(tmp_path: Path) -> None:
    scenario = load_scenario(write_incidents(tmp_path))
    source = open_input(scenario)
    assert isinstance(source, JsonlSource) and isinstance(source, InputSource)
    path, _ = write_generator(tmp_path, "topic: a.b\ncount: 1\n")
    assert isinstance(open_input(load_scenario(path)), GeneratorSource)


def test_labels_are_bounded() -> None:
    labels = Labels({"a": 1, "b": 2}, max_size=2)
    labels.put("c", 3)
    assert dict(labels) == {"b": 2, "c": 3} and labels.evicted == 1
    labels.put(7, "seven")  # keys are strings, as outcomes carry them
    assert labels["7"] == "seven" and len(labels) == 2
    with pytest.raises(ValueError, match="max_size"):
        Labels(max_size=0)


def test_import_path_errors_say_what_failed(tmp_path: Path) -> None:
    module = module_name(tmp_path, "raises")
    (tmp_path / f"{module}.py").write_text("raise RuntimeError('boom at import')\n")
    cases = {
        "no_such_module_xyz:f": "cannot import module 'no_such_module_xyz'",
        "json:no_such_name": "module 'json' has no attribute 'no_such_name'",
        "json": "is not an import path",
        f"{module}:f": f"importing module {module!r} failed: RuntimeError: boom at import",
    }
    for spec, message in cases.items():
        with pytest.raises(ImportProblem, match=re.escape(message)):
            import_path(spec, tmp_path)
    assert import_path("json:dumps") is json.dumps
    # A module written after its folder was first searched is still found.
    late = module_name(tmp_path, "late")
    (tmp_path / f"{late}.py").write_text("def gen(seed, settings):\n    yield 1\n")
    assert import_path(f"{late}:gen", tmp_path).__name__ == "gen"


# -- located errors for bad input configs ------------------------------------------------------

BAD_INPUTS: dict[str, tuple[str, str, str]] = {
    # case: (input section, field, message)
    "unknown module": (
        'kind: generator\nfunction: "nowhere_to_be_found:gen"\ntopic: a.b\n',
        "input.function",
        "cannot import module 'nowhere_to_be_found'",
    ),
    "missing attribute": (
        'kind: generator\nfunction: "{module}:nope"\ntopic: a.b\n',
        "input.function",
        "has no attribute 'nope'",
    ),
    "not a generator function": (
        'kind: generator\nfunction: "{module}:not_a_generator"\ntopic: a.b\n',
        "input.function",
        "is not a generator function",
    ),
    "validate not callable": (
        'kind: jsonl\npath: data.jsonl\ntopic: a.b\nvalidate: "{module}:NOT_CALLABLE"\n',
        "input.validate",
        "is a int, not a function",
    ),
    "validate not an import path": (
        "kind: jsonl\npath: data.jsonl\ntopic: a.b\nvalidate: checks.py\n",
        "input.validate",
        "is not an import path: write it as 'module:name'",
    ),
    "misspelt validate": (
        'kind: jsonl\npath: data.jsonl\ntopic: a.b\nvalidator: "{module}:emails"\n',
        "input.validator",
        "unknown key 'validator' (did you mean 'validate'?)",
    ),
    "jsonl without a topic": (
        "kind: jsonl\npath: data.jsonl\n",
        "input",
        "a jsonl input needs topic, or topic_field with topics",
    ),
    "topic and topic_field": (
        "kind: stdin\ntopic: a.b\ntopic_field: type\ntopics: {{x: a.c}}\n",
        "input",
        "not both",
    ),
    "topics without topic_field": (
        "kind: stdin\ntopic: a.b\ntopics: {{x: a.c}}\n",
        "input",
        "pick a topic by topic_field",
    ),
    "bad topic in topics": (
        "kind: stdin\ntopic_field: type\ntopics:\n  x: 'not a topic'\n",
        "input.topics.x",
        "dotted topic name",
    ),
    "function and payload": (
        'kind: generator\nfunction: "{module}:emails"\npayload: {{a: 1}}\ntopic: a.b\n',
        "input",
        "give function or payload, not both",
    ),
    "payload without end": (
        "kind: generator\ntopic: a.b\npayload: {{a: 1}}\n",
        "input",
        "needs count or duration",
    ),
    "unknown kind": (
        "kind: kafka\ntopic: a.b\n",
        "input.kind",
        "Input should be 'jsonl', 'file', 'generator', 'stdin' or 'http'",
    ),
    "bad priority": (
        "kind: stdin\ntopic: a.b\npriority: urgent\n",
        "input.priority",
        "Input should be 'critical', 'high' or 'normal'",
    ),
    "negative rate": (
        "kind: stdin\ntopic: a.b\nrate: -1\n",
        "input.rate",
        "greater than or equal to 0",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_config_is_located(tmp_path: Path, case: str) -> None:
    _, module = write_generator(tmp_path, "topic: a.b\ncount: 1\n")
    (tmp_path / "data.jsonl").write_text("{}\n")
    body, field, message = BAD_INPUTS[case]
    text = "version: 1\nname: t\ninput:\n" + textwrap.indent(body.format(module=module), "  ")
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    problems: list[Problem] = info.value.problems
    assert len(problems) == 1, problems
    (p,) = problems
    assert p.field == field and message in p.message, p
    key = field.rsplit(".", 1)[-1] if field != "input" else "input"
    want = next(n for n, ln in enumerate(text.splitlines(), 1) if ln.lstrip().startswith(key))
    assert (p.file, p.line) == (str(path), want)


def test_a_bad_generator_stops_pantheon_run_before_anything_runs(tmp_path: Path) -> None:
    path, module = write_generator(tmp_path, 'function: "{module}:missing"\ntopic: a.b\n')
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"COLUMNS": "250"},  # rich wraps at the terminal's width
    )
    assert proc.returncode == 2
    line = next(n for n, ln in enumerate(path.read_text().splitlines(), 1) if "function:" in ln)
    assert f"gen.yaml:{line}:" in proc.stderr
    assert f"input.function: module {module!r} has no attribute 'missing'" in proc.stderr
    assert not (tmp_path / ".pantheon").exists()


def test_replays_need_no_importable_code() -> None:
    """A recorded scenario is rebuilt without its code, which a replay never calls."""
    text = (
        "version: 1\nname: t\nagents: {observer: {}}\ninput:\n  kind: generator\n"
        "  function: 'gone_module:gen'\n"
        "  topic: a.b\n  validate: 'gone_module:check'\n"
    )
    with pytest.raises(ScenarioError, match="cannot import module 'gone_module'"):
        parse_scenario(text)
    scenario = parse_scenario(text, check_files=False)
    assert isinstance(scenario.input, GeneratorInputConfig)
    assert build_team(scenario, replay=True).agents["observer"].source is None  # type: ignore[attr-defined]


def test_stdin_config_shape() -> None:
    s = parse_scenario("version: 1\nname: t\ninput: {kind: stdin, topic: a.b, count: 5}\n")
    assert isinstance(s.input, StdinInputConfig) and s.input.count == 5
    assert count_inputs(s) is None  # stdin may end before count: unknown
