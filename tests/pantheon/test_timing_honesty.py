"""Timing checks that know when they cannot judge: slow code fails at any load; a bound
exceeded while the machine kept the process from a CPU is inconclusive, unless strict, and
only as far as the handlers' waits for a CPU explain it (a handler that awaits or blocks past
the bound is slow code). Real starvation: test_timing_starved.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import bus._worker
import pantheon.runner._report
from bus import Bus
from bus._sched import LoopScheduling, read_schedstat
from pantheon.cli import app
from pantheon.runner._build import Team
from pantheon.runner._report import RunSummary, expectation_state, judge, local_report, summarize
from pantheon.scenario import Scenario, ScenarioError, load_scenario
from pantheon.sessions import SessionStore
from pantheon.testing import run_scenario

LINUX_SCHEDSTAT = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists()
#: What a check says of the handlers' own time: less their waits for a CPU where Linux
#: measures those, their CPU time elsewhere.
OWN = (
    "the handlers' own time p99 (less their waits for a CPU)"
    if LINUX_SCHEDSTAT
    else "the handlers' own CPU time p99"
)

AGENTS = '''
import asyncio
import time


async def burn(env):
    """80 ms of this thread's CPU per item: slow code, whatever the machine does."""
    start = time.thread_time()
    while time.thread_time() - start < 0.08:
        pass


async def nap(env):
    """30 ms of waiting and no CPU: late only if something else makes it late."""
    await asyncio.sleep(0.03)
'''


def _team(tmp_path: Path, handler: str, expect: str, count: int = 6) -> Path:
    (tmp_path / "timing_agents.py").write_text(AGENTS)
    path = tmp_path / "scenario.yaml"
    path.write_text(
        f"""version: 1
name: timing
input: {{kind: generator, topic: item.new, payload: {{n: 1}}, count: {count}}}
agents:
  worker:
    handler: "timing_agents:{handler}"
    subscribe: ["item.new"]
expect:
  zero_lost: true
{expect}
"""
    )
    return path


@pytest.fixture
def hogs() -> Iterator[None]:
    """Two processes burning a CPU each beside the test: on two cores, a loaded machine."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(2)
    ]
    try:
        time.sleep(0.2)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _check(summary: RunSummary, prefix: str) -> dict[str, Any]:
    (found,) = [e for e in summary.expectations if e["name"].startswith(prefix)]
    return found


# -- (1) slow code fails, loaded or not ---------------------------------------------------


def _assert_burn_fails(summary: RunSummary) -> None:
    check = _check(summary, "timing: p99 handling worker <= 50")
    assert check["state"] == "failed" and check["passed"] is False
    # Quantiles are histogram buckets: within 12.5% of the 80 ms each handling burns.
    assert summary.hops["worker"]["cpu_p99_ms"] >= 70.0
    assert check["actual"] >= 70.0
    assert check["why"].startswith(f"{OWN} is ")
    assert check["why"].endswith(" ms, over the bound: slow at any load")
    assert summary.passed is False


def test_a_handler_burning_80ms_of_cpu_fails_a_50ms_bound(tmp_path: Path) -> None:
    path = _team(tmp_path, "burn", "  p99_handling_ms: 50")
    _assert_burn_fails(run_scenario(path, record=False))


def test_it_fails_on_a_loaded_machine_too(tmp_path: Path, hogs: None) -> None:
    path = _team(tmp_path, "burn", "  p99_handling_ms: 50")
    summary = run_scenario(path, record=False)
    _assert_burn_fails(summary)
    # Even had the bound been excused by load, CPU over it is never inconclusive.
    starved = dataclasses.replace(summary, scheduling=_starved(0.9))
    (again,) = [e for e in judge(_load(path), starved) if e["name"].startswith("timing: p99")]
    assert again["state"] == "failed"


# -- (2) a waiting handler on a starved machine is inconclusive ------------------------------


def _starved(share: float, source: str = "schedstat") -> dict[str, Any]:
    return {"source": source, "wall_s": 2.0, "cpu_s": 0.2, "wait_s": 1.5, "share": share}


def _load(path: Path, strict: bool = False) -> Scenario:
    scenario = load_scenario(path)
    if not strict:
        return scenario
    expect = scenario.expect.model_copy(update={"strict_timing": True})
    return scenario.model_copy(update={"expect": expect})


@pytest.fixture
def napped(tmp_path: Path) -> tuple[Path, RunSummary]:
    """A real run of a handler that waits 30 ms per item against a 10 ms bound."""
    path = _team(tmp_path, "nap", "  p99_handling_ms: 10\n  p99_queue_wait_ms: 1000")
    summary = run_scenario(path, record=False)
    assert summary.hops["worker"]["handle_p99_ms"] >= 30.0
    assert summary.hops["worker"]["cpu_p99_ms"] < 10.0
    if LINUX_SCHEDSTAT:
        assert summary.hops["worker"]["own_p99_ms"] >= 30.0
    return path, summary


def _excused(summary: RunSummary, share: float, **scheduling: Any) -> RunSummary:
    """``summary`` as if the handlers' 30 ms had been waits for a CPU: their own time 1 ms,
    the loop waiting ``share`` of its busy time."""
    hops = {n: h | {"own_p99_ms": 1.0} for n, h in summary.hops.items()}
    return dataclasses.replace(summary, hops=hops, scheduling=_starved(share) | scheduling)


@pytest.mark.skipif(not LINUX_SCHEDSTAT, reason="waits per handling are measured on Linux")
def test_a_handler_awaiting_past_the_bound_fails_on_a_starved_machine_too(
    napped: tuple[Path, RunSummary],
) -> None:
    path, summary = napped
    starved = dataclasses.replace(summary, scheduling=_starved(0.41))
    checks = judge(_load(path), starved)
    (check,) = [e for e in checks if e["name"] == "timing: p99 handling worker <= 10.0 ms"]
    own = summary.hops["worker"]["own_p99_ms"]
    assert check["state"] == "failed" and check["passed"] is False
    assert check["why"] == f"{OWN} is {own:.3f} ms, over the bound: slow at any load"


def test_a_miss_the_waits_for_a_cpu_explain_is_inconclusive(
    napped: tuple[Path, RunSummary],
) -> None:
    path, summary = napped
    checks = judge(_load(path), _excused(summary, 0.41))
    (check,) = [e for e in checks if e["name"] == "timing: p99 handling worker <= 10.0 ms"]
    assert check["state"] == "inconclusive" and check["passed"] is True
    assert check["why"] == (
        "the process waited 41% of its busy time for a CPU; the handlers' own time p99 "
        "(less their waits for a CPU) is 1.000 ms, within the bound"
    )
    assert [expectation_state(e) for e in checks] == ["inconclusive", "passed", "passed"]


def test_strict_timing_fails_what_would_be_inconclusive(napped: tuple[Path, RunSummary]) -> None:
    path, summary = napped
    starved = _excused(summary, 0.41)
    check = _check(
        dataclasses.replace(starved, expectations=judge(_load(path, strict=True), starved)),
        "timing: p99 handling",
    )
    assert check["state"] == "failed" and check["passed"] is False
    assert check["why"].startswith("inconclusive (the process waited 41% of its busy time")
    assert check["why"].endswith("), and timing is strict")


def test_a_waiting_handler_on_a_quiet_machine_fails(napped: tuple[Path, RunSummary]) -> None:
    path, summary = napped
    quiet = _excused(summary, 0.03)
    check = _check(
        dataclasses.replace(quiet, expectations=judge(_load(path), quiet)), "timing: p99 handling"
    )
    assert check["state"] == "failed"
    assert check["why"] == (
        "the process waited 3% of its busy time for a CPU: too little to excuse it"
    )


def test_unmeasured_waits_or_cpu_never_excuse_a_check(napped: tuple[Path, RunSummary]) -> None:
    path, summary = napped
    scenario = _load(path)
    unknown = dataclasses.replace(_excused(summary, 0.5), scheduling={})
    assert _check(
        dataclasses.replace(unknown, expectations=judge(scenario, unknown)), "timing: p99 handling"
    )["why"] == ("no measure of how long the process waited for a CPU")
    # A report from before handlers' CPU time was kept (an older node) has neither figure.
    hops = {
        n: {k: v for k, v in h.items() if k not in ("cpu_p99_ms", "own_p99_ms")}
        for n, h in summary.hops.items()
    }
    old = dataclasses.replace(summary, hops=hops, scheduling=_starved(0.5))
    check = _check(
        dataclasses.replace(old, expectations=judge(scenario, old)), "timing: p99 handling"
    )
    assert check["state"] == "failed"
    assert check["why"].endswith("but the team's own time was not measured")
    # Without waits per handling (not Linux, or a node from before them) the CPU time
    # stands in: it cannot see the 30 ms awaited, so the miss reads as the machine's.
    cpu_only = {n: {k: v for k, v in h.items() if k != "own_p99_ms"} for n, h in hops.items()}
    for n, h in cpu_only.items():
        h["cpu_p99_ms"] = summary.hops[n]["cpu_p99_ms"]
    guess = dataclasses.replace(summary, hops=cpu_only, scheduling=_starved(0.5))
    check = _check(
        dataclasses.replace(guess, expectations=judge(scenario, guess)), "timing: p99 handling"
    )
    assert check["state"] == "inconclusive"
    assert "the handlers' own CPU time p99 is " in check["why"]


def test_estimated_waits_say_so(napped: tuple[Path, RunSummary]) -> None:
    path, summary = napped
    guess = _excused(summary, 0.5, source="loadavg")
    check = _check(
        dataclasses.replace(guess, expectations=judge(_load(path), guess)), "timing: p99 handling"
    )
    assert check["state"] == "inconclusive"
    assert check["why"].startswith(
        "the process waited 50% of its busy time for a CPU (estimated from the load average); "
    )


def test_throughput_is_excused_only_if_the_waits_explain_it(tmp_path: Path) -> None:
    path = _team(tmp_path, "nap", "  min_throughput: 100")
    scenario = _load(path)
    base = dataclasses.replace(run_scenario(path, record=False), messages=100, elapsed_s=2.0)
    # 50 msg/s over 2 s; had the loop not waited 1.5 s for a CPU: 200 msg/s, above 100.
    slow = dataclasses.replace(base, throughput=50.0, scheduling=_starved(0.6))
    (check,) = [e for e in judge(scenario, slow) if e["name"].startswith("throughput")]
    assert check["state"] == "inconclusive"
    assert check["why"] == (
        "the process waited 60% of its busy time for a CPU; "
        "without its waits it would reach 200.0 msg/s, within the bound"
    )
    # Waiting 0.5 s of 2 s explains 66.7 msg/s at best: short of 100 at any load.
    short = dataclasses.replace(slow, scheduling=_starved(0.6) | {"wait_s": 0.5})
    (check,) = [e for e in judge(scenario, short) if e["name"].startswith("throughput")]
    assert check["state"] == "failed"
    assert check["why"] == (
        "without its waits it would reach 66.7 msg/s, short of the bound: slow at any load"
    )
    # Nothing measured the waits: no estimate, and nothing to excuse the check with.
    (check,) = [
        e
        for e in judge(scenario, dataclasses.replace(slow, scheduling={}))
        if e["name"].startswith("throughput")
    ]
    assert (check["state"], check["why"]) == (
        "failed",
        "no measure of how long the process waited for a CPU",
    )


# -- (3) the measurement ----------------------------------------------------------------------


@pytest.mark.skipif(not LINUX_SCHEDSTAT, reason="no /proc/<pid>/task/<tid>/schedstat here")
def test_schedstat_of_this_thread_counts_its_cpu() -> None:
    path = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
    first = read_schedstat(path)
    assert first is not None and first[0] > 0 and first[1] >= 0
    clock = LoopScheduling()
    start = time.thread_time()
    while time.thread_time() - start < 0.1:
        pass
    got = clock.read()
    assert got.source == "schedstat"
    # schedstat's on-CPU time of a running thread is brought up to date at least every tick.
    assert 0.08 <= got.cpu_s <= got.wall_s + 0.02
    assert got.share == pytest.approx(got.wait_s / (got.wait_s + got.cpu_s))


def test_schedstat_readings_make_the_share(tmp_path: Path) -> None:
    task = tmp_path / "self" / "task" / str(threading.get_native_id())
    task.mkdir(parents=True)
    (task / "schedstat").write_text("1000000000 500000000 10\n")
    clock = LoopScheduling(proc=tmp_path)
    (task / "schedstat").write_text("1500000000 1000000000 20\n")
    got = clock.read()
    assert (got.source, got.cpu_s, got.wait_s, got.share) == ("schedstat", 0.5, 0.5, 0.5)
    (task / "schedstat").write_text("1000000000 500000000 10\n")
    assert clock.read().share is None  # nothing accounted since the start: no figure
    (task / "schedstat").write_text("garbage\n")
    assert read_schedstat(task / "schedstat") is None
    assert clock.read().share is None  # unreadable later: no figure, not a wrong one


def test_without_schedstat_the_load_average_estimates_it(tmp_path: Path) -> None:
    clock = LoopScheduling(proc=tmp_path / "none", loadavg=lambda: 8.0, cpus=2)
    got = clock.read()
    assert got.source == "loadavg" and got.share == 0.75
    assert got.wait_s == pytest.approx(got.cpu_s * 3)
    idle = LoopScheduling(proc=tmp_path / "none", loadavg=lambda: 1.5, cpus=2).read()
    assert (idle.source, idle.share, idle.wait_s) == ("loadavg", 0.0, 0.0)
    none = LoopScheduling(proc=tmp_path / "none", loadavg=lambda: None, cpus=2).read()
    assert (none.source, none.share) == ("none", None)


async def test_the_bus_reports_it_and_a_multi_process_run_keeps_the_worst(
    tmp_path: Path,
) -> None:
    reports = []
    for _ in range(2):
        async with Bus() as bus:
            bus.on("x", _noop, name="worker")
            await bus.emit("x", {})
            await bus.drain()
            reports.append(local_report(bus, Team({}, _outbox())))
    assert reports[0]["scheduling"]["source"] in ("schedstat", "loadavg", "none")
    assert reports[0]["subscribers"]["worker"]["cpu_p99_ms"] > 0.0
    reports[0]["scheduling"] = _starved(0.2)
    reports[1]["scheduling"] = _starved(0.7)
    scenario = _load(_team(tmp_path, "nap", ""))
    summary = summarize(scenario, reports, seed=0, elapsed=1.0, session_id=None)
    assert summary.scheduling == _starved(0.7)


async def _noop(env: Any) -> None:
    return None


def _outbox() -> Any:
    from agents import Outbox

    return Outbox(None)


# -- (4) the three states where people read them ------------------------------------------


@pytest.fixture
def any_wait_excuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run counts as starved, and each handling's time as its wait for a CPU (a run
    queue that grows a second between two readings), so a real run's late check is
    inconclusive on any machine (the rule itself is tested above)."""
    if sys.platform == "win32":
        pytest.skip("no measure of CPU waits on Windows: nothing is ever inconclusive")
    monkeypatch.setattr(pantheon.runner._report, "STARVED_SHARE", 0.0)
    monkeypatch.setattr(bus._worker, "_run_delay_ns", itertools.count(0, 10**9).__next__)


def test_run_prints_inconclusive_and_json_carries_the_states(
    tmp_path: Path, any_wait_excuses: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _team(tmp_path, "nap", "  p99_handling_ms: 10")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(path), "--no-record"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    (mark,) = [ln for ln in lines if "timing: p99 handling" in ln]
    assert mark.startswith("INCONCLUSIVE timing: p99 handling worker <= 10.0 ms (actual ")
    why = lines[lines.index(mark) + 1]
    assert why.lstrip().startswith("the process waited ") and "within the bound" in why
    assert "PASS zero lost (actual True)" in lines
    assert (
        "all expectations passed (1 timing check inconclusive: the process waited for a CPU)"
        in lines
    )

    result = runner.invoke(app, ["run", str(path), "--no-record", "--json"])
    out = json.loads(result.output)
    assert [(e["name"], e["state"], e["passed"]) for e in out["expectations"]] == [
        ("timing: p99 handling worker <= 10.0 ms", "inconclusive", True),
        ("zero lost", "passed", True),
    ]
    assert out["passed"] is True and out["scheduling"]["source"] in ("schedstat", "loadavg")

    result = runner.invoke(app, ["run", str(path), "--no-record", "--strict-timing"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    (mark,) = [ln for ln in lines if "timing: p99 handling" in ln]
    assert mark.startswith("FAIL timing: p99 handling worker <= 10.0 ms (actual ")
    assert lines[lines.index(mark) + 1].rstrip().endswith("), and timing is strict")
    assert "expectations failed" in lines


def test_strict_timing_in_the_scenario_fails_it_too(tmp_path: Path, any_wait_excuses: None) -> None:
    path = _team(tmp_path, "nap", "  p99_handling_ms: 10\n  strict_timing: true")
    summary = run_scenario(path, record=False)
    check = _check(summary, "timing: p99 handling")
    assert (check["state"], check["passed"], summary.passed) == ("failed", False, False)


def test_sessions_show_lists_inconclusive_checks_and_reads_old_sessions(
    tmp_path: Path, any_wait_excuses: None
) -> None:
    path = _team(tmp_path, "nap", "  p99_handling_ms: 10")
    store = tmp_path / "s.db"
    summary = run_scenario(path, store=store)
    runner = CliRunner()
    result = runner.invoke(
        app, ["sessions", "show", summary.session_id or "", "--store", str(store)],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "summary   expectations: 1 passed, 0 failed, 1 inconclusive" in lines
    (mark,) = [ln for ln in lines if ln.startswith("  INCONCLUSIVE ")]
    assert mark.startswith("  INCONCLUSIVE timing: p99 handling worker <= 10.0 ms: expected 10.0")
    assert lines[lines.index(mark) + 1].startswith("    the process waited ")

    # A session recorded before checks had a state reads as passed/failed from ``passed``.
    old = {"expectations": [{"name": "zero lost", "passed": False, "expected": True,
                             "actual": False}]}  # fmt: skip
    with SessionStore(store) as s:
        sid = s.begin_session(scenario="old", seed=1)
        s.end_session(sid, "failed", old)
    result = runner.invoke(app, ["sessions", "show", sid, "--store", str(store)])
    assert "summary   expectations: 0 passed, 1 failed" in result.output.splitlines()
    assert expectation_state(old["expectations"][0]) == "failed"
    assert expectation_state({"passed": True}) == "passed"


def test_strict_timing_must_be_a_boolean(tmp_path: Path) -> None:
    path = _team(tmp_path, "nap", "  strict_timing: sometimes")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert "expect.strict_timing" in str(err.value)
    assert f"{path}:" in str(err.value)
