"""Shipped scenarios judged on everything but the machine's speed.

A shipped scenario's latency and throughput bounds hold on a quiet machine; on a loaded one
(a CI runner, two workers of this suite, a laptop compiling something) a mailbox wait of
105 ms against 100 says nothing about the team. A test about what a run *does* (accuracy,
accounting, dead letters, recording, replay, the printed summary) must not pass or fail on
them, so it either runs the scenario with those bounds taken out of its ``expect`` section
(:func:`untimed_text`, :func:`copy_untimed`, :func:`load_untimed`) or judges a run of the
scenario as shipped on every other expectation (:func:`assert_passed_but_timing`). The tests
of the timing checks themselves use a handler that burns CPU or a fake clock instead.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pantheon.scenario import Scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"

#: The ``expect`` keys that bound wall-clock time (pantheon.scenario.ExpectConfig).
TIMING_BOUNDS = ("max_p99_ms", "p99_handling_ms", "p99_queue_wait_ms", "min_throughput")

# The names pantheon.runner._report.judge gives the checks those keys make.
_TIMING_NAME = re.compile(r"timing: .*|p99 \S+ <= \S+ ms|throughput >= \S+ msg/s")
_KEY = re.compile(r"^  (\w+):")


def is_timing(name: str) -> bool:
    """Whether the expectation check called ``name`` bounds wall-clock time."""
    return _TIMING_NAME.fullmatch(name) is not None


def untimed_text(text: str) -> str:
    """Scenario YAML ``text`` without the timing bounds of its ``expect`` section.

    Line by line, so comments, key order and line numbers elsewhere stay as written (a
    recorded scenario's text is what replay and diff show). A bound written over several
    lines (a mapping per agent, block style) goes with all of its lines."""
    out: list[str] = []
    in_expect = dropping = False
    for line in text.splitlines(keepends=True):
        if line[:1] not in " \n#" and line.strip():
            in_expect = line.startswith("expect:")
            dropping = False
        elif in_expect:
            key = _KEY.match(line)
            if key is not None:
                dropping = key.group(1) in TIMING_BOUNDS
            elif dropping and line.startswith("   "):
                continue  # a continuation line of the bound being dropped
            else:
                dropping = False
            if dropping:
                continue
        out.append(line)
    return "".join(out)


def load_untimed(path: Path) -> Scenario:
    """The scenario at ``path`` without its timing bounds, anchored where the file is."""
    scenario = parse_scenario(
        untimed_text(path.read_text(encoding="utf-8")), source=str(path), base_dir=path.parent
    )
    assert all(getattr(scenario.expect, key) is None for key in TIMING_BOUNDS), path
    return scenario


def copy_untimed(dest: Path) -> Path:
    """Copy ``scenarios/`` (data and teams too) to ``dest/scenarios`` with every scenario's
    timing bounds taken out; returns the copy. Relative paths inside keep working."""
    copy = dest / "scenarios"
    shutil.copytree(SCENARIOS, copy)
    for path in copy.glob("*.yaml"):
        path.write_text(untimed_text(path.read_text(encoding="utf-8")), encoding="utf-8")
        load_untimed(path)  # still valid, and really untimed
    return copy


def assert_passed_but_timing(
    expectations: Iterable[Mapping[str, Any]],
) -> list[Mapping[str, Any]]:
    """Assert that every expectation that is not a timing check passed; return the timing
    checks (judged on this machine's speed, so neither asserted passed nor failed)."""
    checks = list(expectations)
    failed = [e for e in checks if not is_timing(e["name"]) and not e["passed"]]
    assert not failed, f"expectations failed: {failed}"
    return [e for e in checks if is_timing(e["name"])]
