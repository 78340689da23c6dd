"""Whatever a scenario file holds, loading it raises :class:`ScenarioError` (or ``OSError``)
and ``pantheon validate`` prints located lines and exits 0 or 2, never a traceback (issue #14,
item 8: 21 of 255 fuzzed files used to crash it)."""

from __future__ import annotations

import ast
import inspect
import itertools
import os
import random
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import pantheon.scenario._schema as schema_module
from pantheon.scenario import (
    MAX_SCENARIO_BYTES,
    MAX_SCENARIO_DEPTH,
    ScenarioError,
    load_scenario,
    parse_scenario,
)

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
SHIPPED = sorted(SCENARIOS.glob("*.yaml"))

GOOD = """\
version: 1
name: t
input:
  kind: generator
  topic: t.in
  count: 1
agents:
  actor:
    concurrency: 2
"""


def only_problem(text: str) -> tuple[int, int, str, str]:
    """(line, column, field, message) of the single problem ``text`` has."""
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, source="s.yaml", check_files=False)
    [problem] = info.value.problems
    assert str(problem).startswith("s.yaml:")
    assert "\n" not in str(problem)
    return problem.line, problem.column, problem.field, problem.message


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "pantheon"), "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


# -- each case the fuzzer found ----------------------------------------------------------------


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b"])
def test_control_character_is_located(char: str) -> None:
    line, column, field, message = only_problem(f"version: 1\nname: t{char}x\n")
    assert (line, column, field) == (2, 8, "")
    assert f"U+{ord(char):04X}" in message


@pytest.mark.parametrize(
    ("opening", "closing"), [("[", "]"), ("{a: ", "}"), ("- ", "")], ids=["flow", "map", "block"]
)
def test_nesting_1000_deep_is_refused(opening: str, closing: str) -> None:
    if opening == "- ":
        deep = "".join("  " * i + "-\n" for i in range(1000)) + "  " * 1000 + "- 1\n"
        text = "version: 1\nname: t\nx:\n" + deep
    else:
        text = f"version: 1\nname: t\nx: {opening * 1000}1{closing * 1000}\n"
    line, _, _, message = only_problem(text)
    assert line >= 3
    assert f"nested deeper than {MAX_SCENARIO_DEPTH} levels" in message


def test_aliases_of_aliases_cannot_nest_deeper_either() -> None:
    text = "version: 1\nname: t\na0: &a0 [1]\n"
    text += "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 300))
    _, _, _, message = only_problem(text)
    assert "nested deeper than" in message


def test_nesting_within_the_limit_is_fine() -> None:
    depth = MAX_SCENARIO_DEPTH - 10
    text = GOOD + f"  observer:\n    settings: {{}}\nx: {'[' * depth}{']' * depth}\n"
    # Only the unknown key is wrong: the depth itself is allowed.
    _, _, field, message = only_problem(text)
    assert field == "x" and "unknown key 'x'" in message


def test_a_100000_digit_integer_is_located() -> None:
    line, column, _, message = only_problem(f"version: 1\nname: t\nseed: {'9' * 100_000}\n")
    assert (line, column) == (3, 7)
    assert "too long" in message and "100000" in message
    assert "set_int_max_str_digits" not in message


@pytest.mark.parametrize("digits", ["0x" + "f" * 5000, "1" * 4300, "-" + "1" * 2000])
def test_an_integer_too_long_to_print_is_located(digits: str) -> None:
    # 5,000 hex digits convert, but 6,000 decimal ones are too many to put in a message.
    line, _, _, message = only_problem(f"version: {digits}\nname: t\n")
    assert line == 1 and "too long" in message


def test_an_impossible_date_is_located() -> None:
    line, column, _, message = only_problem("version: 1\nname: t\ndescription: 2020-13-45\n")
    assert (line, column) == (3, 14)
    assert "2020-13-45" in message


def test_a_file_over_the_cap_is_one_line_and_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:  # sparse: 64 MiB of holes costs no disk
        f.truncate(64 * MAX_SCENARIO_BYTES)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(info.value) == f"{path}:1:1: larger than 1 MiB; a scenario is a small YAML file"

    exact = tmp_path / "exact.yaml"
    exact.write_bytes(b"version: 1\nname: t\n#" + b"x" * (MAX_SCENARIO_BYTES - 21) + b"\n")
    assert exact.stat().st_size == MAX_SCENARIO_BYTES
    with pytest.raises(ScenarioError, match="input"):  # read and validated: input is missing
        load_scenario(exact)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_dev_zero_is_refused_quickly() -> None:
    with pytest.raises(ScenarioError, match="larger than 1 MiB"):
        load_scenario("/dev/zero")


#: (key path in GOOD's shape, a value just over the bound, the bound's own value, which passes)
BOUNDS = [
    ("agents.actor.concurrency", 100_000_000, 1024),
    ("agents.actor.max_queue", 10_000_001, 10_000_000),
    ("agents.actor.block_timeout", 3601, 3600),
    ("agents.actor.retry.attempts", 101, 100),
    ("agents.actor.retry.backoff", 3601, 3600),
    ("agents.actor.retry.multiplier", 101, 100),
    ("agents.actor.retry.max_backoff", ".inf", 3600),
    ("agents.actor.breaker.window", 10_001, 10_000),
    ("agents.actor.breaker.consecutive_failures", 10_001, 10_000),
    ("agents.actor.breaker.probes", 1001, 1000),
    ("agents.actor.breaker.cooldown", 3601, 3600),
    ("agents.actor.breaker.probe_timeout", 3601, 3600),
    ("input.rate", 1_000_001, 1_000_000),
    ("input.count", 1_000_000_001, 1_000_000_000),
    ("input.duration", 604_801, 604_800),
    ("faults.flood.rate", 1_000_001, 1_000_000),
    ("faults.flood.count", 10_000_001, 10_000_000),
    ("faults.agents.actor.latency_ms", 3_600_001, 3_600_000),
    ("faults.agents.actor.from.messages", 1_000_000_001, 1_000_000_000),
    ("provider.max_connections", 1025, 1024),
    ("provider.max_retries", 101, 100),
    ("provider.timeout", ".inf", 3600),
    ("transport.heartbeat", 61, 60),
    ("transport.liveness", 101, 100),
    ("seed", 2**63, 2**63 - 1),
    ("agents.learner.settings.window", 10_001, 10_000),
    ("agents.memory.settings.history", 100_001, 100_000),
    ("agents.monitor.settings.interval", ".inf", 3600),
]


def with_value(dotted: str, value: object) -> str:
    data = yaml.safe_load(GOOD)
    if dotted.startswith("provider."):
        data["provider"] = {"kind": "openai", "model": "m"}
    if dotted.startswith("transport."):
        data["transport"] = {"kind": "zmq"}
    if dotted.startswith("faults.flood."):
        data["faults"] = {"flood": {"topic": "t.in", "rate": 1, "count": 1}}
    if dotted.startswith("agents.actor.breaker."):
        data["agents"]["actor"]["breaker"] = {"window": 10_000, "min_calls": 1}
    node = data
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    text = yaml.safe_dump(data, sort_keys=False)
    return text.replace("'.inf'", ".inf")


@pytest.mark.parametrize(("dotted", "over", "bound"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_every_numeric_knob_has_an_upper_bound(dotted: str, over: object, bound: int) -> None:
    parse_scenario(with_value(dotted, bound), check_files=False)
    _, _, field, message = only_problem(with_value(dotted, over))
    assert field == dotted
    assert "less than" in message


def field_docstrings() -> dict[str, str]:
    """``Model.field`` -> the docstring under it in the schema's source."""
    tree = ast.parse(inspect.getsource(schema_module))
    out = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for field, doc in itertools.pairwise(cls.body):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(doc, ast.Expr)
                and isinstance(doc.value, ast.Constant)
            ):
                out[f"{cls.name}.{field.target.id}"] = str(doc.value.value)
    return out


def test_each_upper_bound_is_in_its_fields_docstring() -> None:
    docs = field_docstrings()
    undocumented = []
    for model in vars(schema_module).values():
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for name, field in model.model_fields.items():
            if any(hasattr(m, "le") or hasattr(m, "lt") for m in _metadata(field.annotation)):
                owner = next(
                    c.__name__ for c in model.__mro__ if name in getattr(c, "__annotations__", {})
                )
                fraction = name in ("failure_rate", "min_confidence", "sampling", "min_accuracy")
                if not fraction and f"{owner}.{name}" not in docs:
                    undocumented.append(f"{owner}.{name}")
    assert not undocumented
    assert "1024" in docs["AgentConfig.concurrency"]
    assert "10,000,000" in docs["AgentConfig.max_queue"]


def _metadata(annotation: object) -> list[object]:
    """Constraint objects anywhere in ``annotation`` (through ``Annotated`` and ``| None``)."""
    out: list[object] = []
    for arg in typing.get_args(annotation):
        out.extend(_metadata(arg))
    if typing.get_origin(annotation) is typing.Annotated:
        out.extend(annotation.__metadata__)  # type: ignore[attr-defined]
        for meta in annotation.__metadata__:  # type: ignore[attr-defined]
            out.extend(getattr(meta, "metadata", []))
    return out


def test_cli_prints_one_located_line_for_each_case(tmp_path: Path) -> None:
    cases = {
        "nul.yaml": (b"version: 1\nname: t\x00\n", ":2:8: control character U+0000"),
        "deep.yaml": (b"version: 1\nx: " + b"[" * 1000 + b"]" * 1000 + b"\n", "nested deeper"),
        "int.yaml": (b"version: 1\nseed: " + b"7" * 100_000 + b"\n", ":2:7: an integer of"),
        "knob.yaml": (
            b"version: 1\nname: t\ninput: {kind: stdin, topic: a}\n"
            b"agents: {actor: {concurrency: 100000000}}\n",
            ":4:18: agents.actor.concurrency: Input should be less than or equal to 1024",
        ),
    }
    for name, (content, _) in cases.items():
        (tmp_path / name).write_bytes(content)
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(3 * MAX_SCENARIO_BYTES)
    cases["big.yaml"] = (b"", f"{big}:1:1: larger than 1 MiB; a scenario is a small YAML file")
    # One interpreter for all of them: each `pantheon` start costs a second of CPU.
    script = (
        "import sys\nfrom typer.testing import CliRunner\nfrom pantheon.cli import app\n"
        "for f in sys.argv[1:]:\n"
        "    r = CliRunner().invoke(app, ['validate', f])\n"
        "    print(repr((f, r.exit_code, r.output, repr(r.exception))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, *(str(tmp_path / n) for n in cases)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    results = [ast.literal_eval(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(cases)
    for (file, code, output, exception), expected in zip(
        results, (e for _, e in cases.values()), strict=True
    ):
        assert code == 2, (file, output, exception)
        lines = output.strip().splitlines()
        assert lines[0] == "invalid scenario"
        assert len(lines) == 2 and expected in lines[1], (file, lines)


def test_cli_subprocess_on_a_control_character_and_a_deep_file(tmp_path: Path) -> None:
    bad = tmp_path / "bel.yaml"
    bad.write_bytes(b"version: 1\nname: \x07\n")
    deep = tmp_path / "deep.yaml"
    deep.write_bytes(b"version: 1\nx: " + b"{a: " * 2000 + b"1" + b"}" * 2000 + b"\n")
    for path in (bad, deep):
        proc = validate(path)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.splitlines()[1].startswith(f"{path}:")


# -- the fuzzer --------------------------------------------------------------------------------

CONTROL = [chr(c) for c in (*range(0, 9), 11, 12, *range(14, 32), 127)] + ["\ufffe", "\x85"]


def mutate(text: str, rng: random.Random) -> str:
    """One of the ways the original fuzzer broke files: byte flips, control characters, deep
    nesting, huge numbers, truncation, spliced lines, YAML punctuation."""
    n = len(text)
    at = rng.randrange(n + 1)
    kind = rng.randrange(9)
    if kind == 0:  # flip characters
        chars = list(text)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(n)
            chars[i] = chr(rng.randrange(0x20, 0x7F) if rng.random() < 0.8 else rng.randrange(256))
        return "".join(chars)
    if kind == 1:
        return text[:at] + rng.choice(CONTROL) + text[at:]
    if kind == 2:
        depth = rng.choice([50, 99, 100, 101, 500, 1000, 3000])
        open_, close = rng.choice([("[", "]"), ("{k: ", "}"), ("[{k: ", "}]")])
        return text[:at] + open_ * depth + "1" + close * depth + text[at:]
    if kind == 3:  # a huge or odd number in place of a number
        numbers = [i for i, c in enumerate(text) if c.isdigit()]
        i = rng.choice(numbers) if numbers else at
        value = rng.choice(
            [
                "9" * rng.choice([20, 4300, 4301, 100_000]),
                "-1",
                "0",
                "1e999",
                ".nan",
                "-.inf",
                "0x" + "f" * 5000,
                "0o777777777777",
                "1_000_000_000_000",
                "2020-13-45",
                "!!int x",
            ]
        )
        return text[:i] + value + text[i + 1 :]
    if kind == 4:
        return text[:at]
    if kind == 5:  # splice a line elsewhere, indentation and all
        lines = text.splitlines(keepends=True)
        line = rng.choice(lines)
        lines.insert(rng.randrange(len(lines) + 1), line)
        return "".join(lines)
    if kind == 6:
        punct = rng.choice(
            ["&a ", "*a", "<<: *a\n", "? ", ": ", "- ", "!!python/object ", "%", "'"]
        )
        return text[:at] + punct + text[at:]
    if kind == 7:  # change an indentation
        lines = text.splitlines(keepends=True)
        i = rng.randrange(len(lines))
        lines[i] = " " * rng.randint(0, 9) + lines[i].lstrip(" ")
        return "".join(lines)
    # several at once
    for _ in range(3):
        text = mutate(text, rng) or text
    return text


def loads_or_reports(text: str) -> None:
    try:
        parse_scenario(text, source="fuzz.yaml", base_dir=SCENARIOS)
    except ScenarioError as exc:
        assert exc.problems, "a ScenarioError must say what is wrong"
        for problem in exc.problems:
            assert problem.line >= 1 and problem.column >= 1


@pytest.mark.parametrize("original", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_seeded_mutations_of_shipped_scenarios(original: Path) -> None:
    text = original.read_text()
    rng = random.Random(f"pantheon-fuzz-{original.stem}")
    for _ in range(120):
        loads_or_reports(mutate(text, rng))


def _yaml_values() -> st.SearchStrategy[object]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=20)
        | st.sampled_from(["inprocess", "zmq", "jsonl", "generator", "stdin", "actor"])
    )
    keys = st.sampled_from(
        [
            "version",
            "name",
            "input",
            "agents",
            "kind",
            "topic",
            "count",
            "actor",
            "retry",
            "breaker",
            "concurrency",
            "max_queue",
            "faults",
            "expect",
            "transport",
            "nodes",
            "settings",
            "rate",
            "path",
            "provider",
            "from",
            "until",
        ]
    ) | st.text(max_size=8)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
        max_leaves=30,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "version",
                "name",
                "input",
                "agents",
                "faults",
                "expect",
                "transport",
                "provider",
                "seed",
                "x",
            ]
        ),
        _yaml_values(),
        max_size=8,
    )
)
def test_random_yaml_documents(data: dict[str, object]) -> None:
    loads_or_reports(yaml.safe_dump({"version": 1, "name": "t", **data}))


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    loads_or_reports(text)


def test_cli_on_a_few_mutated_files(tmp_path: Path) -> None:
    rng = random.Random("pantheon-fuzz-cli")
    text = (SCENARIOS / "flaky_actor.yaml").read_text()
    for i in range(3):
        path = tmp_path / f"m{i}.yaml"
        path.write_text(mutate(text, rng))
        proc = validate(path)
        assert proc.returncode in (0, 2), proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
