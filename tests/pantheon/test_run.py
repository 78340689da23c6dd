"""``pantheon run`` and ``pantheon validate`` end to end, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from untimed import copy_untimed

from agents import ModelProvider, ProviderError
from bus import Bus
from pantheon.runner._build import _provider, build_team
from pantheon.runner._runtime import run_scenario
from pantheon.scenario import OpenAIProviderConfig, Scenario, load_scenario
from pantheon.sessions import SessionStore
from pantheon.testing import ModelServer, classify_reply

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"


def pantheon(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in a child; 250 columns unless ``env`` says otherwise, so that a summary line
    read whole here is not one the terminal's width wrapped (test_summary_width.py)."""
    return subprocess.run(
        [sys.executable, "-m", "pantheon.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"COLUMNS": "250"} if env is None else env,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the scenarios in a scratch directory, so runs write their store there.

    Without their timing bounds: these tests check what a run does, and a shared or loaded
    machine can stall a run past them; latency is benchmarks/' business
    (benchmarks/busy_machine.py) and the timing checks' own tests (test_expect.py)."""
    copy_untimed(tmp_path)
    return tmp_path


def test_support_scenario_runs_passes_and_is_recorded(workdir: Path) -> None:
    proc = pantheon("run", "scenarios/support_email.yaml", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["passed"] is True
    assert summary["inputs"] + summary["malformed"] == 600
    assert summary["malformed"] >= 7
    assert summary["accounting_ok"] is True
    acc = summary["accuracy"]
    assert acc["scored"] == 598 and 0.7 <= acc["action_accuracy"] <= 1.0
    assert {"sensor", "reasoner", "planner", "guardian", "actor", "learner"} <= set(summary["hops"])
    assert summary["decisions"]["escalated"] > 0 and summary["decisions"]["modified"] > 0
    # The Actor's outbox is a real file next to the store, one line per tool call.
    outbox = workdir / ".pantheon" / "outbox" / f"{summary['session_id']}.jsonl"
    lines = outbox.read_text().splitlines()
    assert len(lines) == sum(summary["outbox"].values())
    assert all("4111" not in line for line in lines)
    assert (workdir / ".pantheon" / "sessions.db").exists()


def test_human_summary_prints_accuracy_and_hops(workdir: Path) -> None:
    proc = pantheon("run", "scenarios/support_email.yaml", "--no-record", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "accuracy vs ground truth: action" in proc.stdout
    assert "per-hop latency" in proc.stdout
    assert "all expectations passed" in proc.stdout
    # The Reasoner asks the rule provider: model calls that use no tokens and cost nothing.
    (usage,) = [line for line in proc.stdout.splitlines() if line.startswith("models ")]
    assert usage.endswith(" calls, tokens 0 in / 0 out, cost $0"), usage
    assert not (workdir / ".pantheon" / "sessions.db").exists()


def test_version(workdir: Path) -> None:
    from importlib.metadata import version

    proc = pantheon("--version", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"pantheon {version('pantheon')}\n"


def test_summary_inputs_tell_one_story(workdir: Path) -> None:
    """Published plus malformed is the input; malformed are not dead letters; the accuracy
    line says why fewer were scored than came in."""
    proc = pantheon("run", "scenarios/support_email.yaml", "--no-record", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        "inputs 600: 591 published, 9 malformed "
        "(on observation.email.malformed, not dead letters)" in lines
    ), proc.stdout
    (acc,) = [line for line in lines if line.startswith("accuracy vs ground truth")]
    assert acc.endswith(" over 598 labelled (2 outcomes had no label)"), acc
    assert any(line.startswith("dead letters 0  breaker trips 0") for line in lines)


def test_piped_summary_is_not_squeezed_to_80_columns(workdir: Path) -> None:
    """Piped with no terminal anywhere (as here), the table keeps every cell whole; with
    ``COLUMNS`` set, that is the width."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = pantheon("run", "scenarios/flood.yaml", "--no-record", cwd=workdir, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    assert "learner:observation.email.malformed" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) > 80
    proc = pantheon(
        "run", "scenarios/flood.yaml", "--no-record", cwd=workdir, env=env | {"COLUMNS": "60"}
    )
    table = [line for line in proc.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 60


def test_flood_dead_letters_are_counted_past_the_in_memory_cap(workdir: Path) -> None:
    """The flood sheds more than the DLQ keeps in memory: the summary, its JSON and the
    session store give one total, the cap is stated, and ``max_dlq`` says what it counts."""
    proc = pantheon("run", "scenarios/flood.yaml", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("dead letters ")]
    total = int(line.split()[2].replace(",", ""))
    assert total > 10_000
    assert f"({total:,} shed; the last 10,000 kept in memory, all in the session store)" in line
    assert "PASS dead letters other than shed <= 20 (actual 0)" in proc.stdout
    with SessionStore(workdir / ".pantheon" / "sessions.db", create=False) as store:
        (info,) = store.sessions()
        assert len(store.dead_letters(info.id)) == total
        assert info.summary["dlq"] == {"shed": total}
        assert info.summary["dlq_evicted"] == total - 10_000


def test_failed_expectation_exits_non_zero(workdir: Path) -> None:
    path = workdir / "scenarios" / "support_email.yaml"
    path.write_text(path.read_text().replace("min_accuracy: 0.7", "min_accuracy: 0.99"))
    proc = pantheon("run", "scenarios/support_email.yaml", "--json", "--no-record", cwd=workdir)
    assert proc.returncode == 1
    summary = json.loads(proc.stdout)
    [failed] = [e for e in summary["expectations"] if not e["passed"]]
    assert failed["name"] == "accuracy >= 0.99" and failed["actual"] < 0.99


def test_bad_scenario_fails_before_anything_runs(workdir: Path) -> None:
    path = workdir / "scenarios" / "support_email.yaml"
    text = path.read_text().replace("    concurrency: 8", "    concurrency: -1", 1)
    path.write_text(text)
    line = next(n for n, ln in enumerate(text.splitlines(), 1) if "concurrency: -1" in ln)
    for command in ("validate", "run"):
        proc = pantheon(command, "scenarios/support_email.yaml", cwd=workdir)
        assert proc.returncode == 2
        assert f"support_email.yaml:{line}:" in proc.stderr
        assert "agents.reasoner.concurrency" in proc.stderr
    assert not (workdir / ".pantheon").exists()


async def test_progress_reaches_the_total_before_the_run_drains(workdir: Path) -> None:
    """The last input is counted as soon as it is out, not after the bus drained: the bar
    does not sit at 599/600 while the team finishes."""
    scenario = load_scenario(workdir / "scenarios" / "support_email.yaml")
    bus = Bus()
    events: list[object] = []
    drain = bus.drain

    async def drain_and_note(*args: Any, **kwargs: Any) -> Any:
        events.append("drain")
        return await drain(*args, **kwargs)

    bus.drain = drain_and_note  # type: ignore[method-assign]
    await run_scenario(scenario, bus=bus, on_progress=lambda done, total: events.append(done))
    assert 600 in events[: events.index("drain")], events[-5:]


def test_flood_is_shed_and_every_message_accounted(workdir: Path) -> None:
    proc = pantheon("run", "scenarios/flood.yaml", "--json", "--no-record", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["dlq"].get("shed", 0) > 1000
    assert summary["accounting_ok"] is True


def test_flaky_actor_dead_letters_exhausted_retries(workdir: Path) -> None:
    proc = pantheon("run", "scenarios/flaky_actor.yaml", "--json", "--no-record", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    # 30% failure, 3 attempts: about 2.7% of actions exhaust their retries.
    assert 0 < summary["dlq"]["failed"] <= 60
    assert summary["hops"]["actor"]["handled"] > 500


def test_seed_changes_the_injected_faults(workdir: Path) -> None:
    runs = [
        json.loads(
            pantheon(
                "run", "scenarios/flaky_actor.yaml", "--json", "--no-record", "--seed", seed,
                cwd=workdir,
            ).stdout
        )
        for seed in ("1", "1", "2")
    ]  # fmt: skip
    assert runs[0]["seed"] == 1 and runs[2]["seed"] == 2
    failed = [{d["error"] for d in run["dead_letters"]} for run in runs]
    assert failed[0] and failed[0] == failed[1]
    assert failed[0] != failed[2]


def test_zmq_transport_without_nodes_runs_everything_in_the_driver(workdir: Path) -> None:
    path = workdir / "scenarios" / "support_email.yaml"
    text = path.read_text()
    assert "transport:" in text
    lines = [
        'transport: {kind: zmq, broker: "tcp://127.0.0.1:0"}' if ln.startswith("transport:") else ln
        for ln in text.splitlines()
        if not ln.startswith("  kind: inprocess")
    ]
    path.write_text("\n".join(lines) + "\n")
    proc = pantheon("run", "scenarios/support_email.yaml", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["accounting_ok"] is True and summary["inputs"] == 591
    assert list(summary["nodes"]) == ["driver"]  # a broker, but no node process


async def test_a_run_on_a_model_server_shares_counts_and_closes_one_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[ModelProvider] = []

    def capture(scenario: Scenario) -> ModelProvider:
        made.append(_provider(scenario))
        return made[-1]

    monkeypatch.setattr("pantheon.runner._build._provider", capture)
    support = load_scenario(SCENARIOS / "support_email.yaml")
    with ModelServer(classify_reply) as server:
        scenario = support.model_copy(
            update={
                "provider": OpenAIProviderConfig(
                    kind="openai", base_url=server.base_url, model="local", api_key_env=""
                ),
                "input": support.input.model_copy(update={"count": 20}),
            }
        )
        team = build_team(scenario)
        assert all(agent.provider is team.provider for agent in team.agents.values())
        await team.aclose()
        summary = await run_scenario(scenario)
        requests = server.requests
    provider = made[-1]
    assert summary.inputs == 20 and summary.accounting_ok
    assert len(requests) == 20 and len({r.client_port for r in requests}) <= 8
    words = sum(len(m["content"].split()) for r in requests for m in r.body["messages"])
    assert summary.usage["calls"] == 20 and summary.usage["input_tokens"] == words
    assert summary.usage["output_tokens"] > 0 and summary.usage["priced"] is False
    with pytest.raises(ProviderError, match="closed"):  # the run closed its provider
        await provider.chat([{"role": "user", "content": "still there?"}])
