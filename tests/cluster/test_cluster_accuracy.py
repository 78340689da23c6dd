"""A multi-process run is scored from its whole record, on ZeroMQ and NATS.

The access desk (not the support desk: no Learner, a declared outcome) placed on two nodes,
``screen: [intake]`` and ``review: [reviewer]``: its outcome, ``access.decided``, is
published on node ``review`` and no agent on the driver subscribes to it, so no process sees
an item's input and its decision together. Each process alone scored nothing (accuracy
``{}``, ``min_accuracy`` failed, exit 1); the summary now reads the session the nodes'
journals filled, as ``pantheon diff`` and a what-if do, and gives the in-process figures;
an unrecorded one adds what each process decided itself.

Every process is real: ``pantheon run`` (the driver) in a subprocess, which starts the nodes
(and the ZeroMQ broker); the NATS server is started here on a free port."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_run import pantheon
from transports import transport_section

from pantheon.rerun import session_outcomes
from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "access_requests.yaml"
PLACEMENT = "  nodes:\n    screen: [intake]\n    review: [reviewer]\n"
#: The desk's documented accuracy in one process (scenarios/access_requests.yaml): 168 of
#: 200 requests decided as labelled.
IN_PROCESS = {"scored": 200, "unlabelled": 0, "accuracy": 0.84, "decision_accuracy": 0.84}


@pytest.fixture(params=["zmq", "nats"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """The scenario's ``transport:`` section: a ZeroMQ broker the run starts, or this
    test's own ``nats-server -js``."""
    with transport_section(request.param, PLACEMENT) as section:
        yield section


def placed(work: Path, transport: str) -> Path:
    """The shipped access desk with ``transport``, in ``work`` with its package and data
    (the scenario imports ``access.*`` from beside itself)."""
    shutil.copytree(ROOT / "scenarios" / "access", work / "access")
    (work / "data").mkdir()
    for data in (ROOT / "scenarios" / "data").glob("access_*.json*"):
        shutil.copy(data, work / "data" / data.name)
    text = SCENARIO.read_text(encoding="utf-8")
    assert "\nseed: 5\n" in text
    path = work / "access_placed.yaml"
    path.write_text(text.replace("\nseed: 5\n", f"\nseed: 5\n\n{transport}\n"), encoding="utf-8")
    return path


def test_an_outcome_published_on_a_node_is_scored_as_in_one_process(
    tmp_path: Path, transport: str
) -> None:
    scenario = placed(tmp_path, transport)
    proc = pantheon("run", str(scenario), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    # The decisions were made on node `review`, the labels read on the driver.
    assert summary["nodes"]["review"]["agents"] == ["reviewer"]
    assert summary["nodes"]["driver"]["agents"] == ["observer"]
    assert summary["accuracy"] == IN_PROCESS
    check = next(e for e in summary["expectations"] if e["name"] == "accuracy >= 0.8")
    assert check == {
        "name": "accuracy >= 0.8",
        "passed": True,
        "expected": 0.8,
        "actual": 0.84,
        "state": "passed",
    }
    # The summary reads the record as diff and what-if read it, and the session keeps it.
    with SessionStore(tmp_path / ".pantheon" / "sessions.db") as store:
        read = session_outcomes(store, summary["session_id"])
        stored = store.session(summary["session_id"])
    assert read.score.as_report() == IN_PROCESS
    assert len(read.decisions) == 200
    assert stored.status == "completed"
    assert stored.summary["accuracy"] == IN_PROCESS


def test_an_unrecorded_run_is_scored_from_what_each_process_decided(tmp_path: Path) -> None:
    """Without a record, each process tallies the outcomes it published itself; a message
    is one process's, so the tallies add up to the team's."""
    section = f"transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n{PLACEMENT}"
    proc = pantheon("run", str(placed(tmp_path, section)), "--json", "--no-record", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["session_id"] is None
    assert summary["accuracy"] == IN_PROCESS


def test_an_unrecorded_run_without_a_declared_outcome_says_why_it_has_no_accuracy(
    tmp_path: Path,
) -> None:
    section = f"transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n{PLACEMENT}"
    scenario = placed(tmp_path, section)
    text = scenario.read_text(encoding="utf-8")
    declared = text[text.index("outcome:") : text.index("expect:")]
    scenario.write_text(text.replace(declared, ""), encoding="utf-8")
    proc = pantheon("run", str(scenario), "--json", "--no-record", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["accuracy"] == {}
    check = next(e for e in summary["expectations"] if e["name"] == "accuracy >= 0.8")
    assert check["state"] == "failed"
    assert check["actual"] is None
    assert "outcome:" in check["why"] and "--no-record" in check["why"]
