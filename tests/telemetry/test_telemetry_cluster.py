"""One trace across processes: ``pantheon run`` of a 3-node scenario (ZeroMQ and NATS) exports
the same span tree as the same scenario in one process.

Every process exports with the SDK's own OTLP/HTTP exporter, chosen by the ``OTEL_*``
variables the nodes inherit from ``pantheon run``, to a real OTLP receiver started here
(tests/_support/otlp_collector.py). A node that set up no tracing, or a trace context lost on
the wire, shows as missing spans, orphans (a parent id nobody exported) or split traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from decisions import outcomes
from otlp_collector import CollectedSpan, OtlpCollector
from untimed import copy_untimed

from pantheon.sessions import DEFAULT_STORE_PATH

ROOT = Path(__file__).resolve().parents[2]
EMAILS = 600  # scenarios/data/support_emails.jsonl: 591 valid, 9 malformed


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Scenarios without their timing bounds: the traces are under test, not the speed."""
    path = tmp_path_factory.mktemp("trace")
    copy_untimed(path)
    return path


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpCollector]:
    with OtlpCollector() as c:
        yield c


def clean_env() -> dict[str, str]:
    """The test's environment without the machine's own OTEL_/PANTHEON_ settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PANTHEON_"))}


def traced_run(
    workdir: Path, collector: OtlpCollector, scenario: str, **env: str
) -> tuple[dict[str, Any], list[CollectedSpan]]:
    """``pantheon run`` exporting to ``collector``; its summary and every span it exported
    (each process flushes before it exits, and the run waits for its nodes to exit)."""
    collector.clear()
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", scenario, "--json"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env()
        | {
            "COLUMNS": "250",
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_METRICS_EXPORTER": "none",
        }
        | env,
    )
    assert proc.returncode == 0, proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout)
    assert summary["accounting_ok"] and summary["dlq"] == {}, summary
    return summary, collector.taken()


def shapes(spans: list[CollectedSpan]) -> Counter[str]:
    """Each trace as one canonical string: span names nested by parent, children sorted.

    Also checks the links: every parent id is a span of the same trace that was exported,
    and every trace has one root. Traces the Monitor starts (a ``monitor.alert.*`` when a
    loaded machine lets a mailbox fill) depend on timing, not on the emails: left out."""
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == len(spans), "duplicate span ids"
    children: dict[str, list[CollectedSpan]] = defaultdict(list)
    roots: dict[str, list[CollectedSpan]] = defaultdict(list)
    for s in spans:
        if not s.parent_id:
            roots[s.trace_id].append(s)
            continue
        parent = by_id.get(s.parent_id)
        assert parent is not None, f"orphan: {s} (its parent was not exported)"
        assert parent.trace_id == s.trace_id, f"{s} parents to another trace"
        children[s.parent_id].append(s)
    traces = {s.trace_id for s in spans}
    assert all(len(roots[t]) == 1 for t in traces), "a trace without exactly one root"

    def shape(s: CollectedSpan) -> str:
        inner = sorted(shape(c) for c in children[s.span_id])
        return f"{s.name}({','.join(inner)})" if inner else s.name

    return Counter(
        shape(r[0]) for r in roots.values() if not r[0].name.startswith("publish monitor.")
    )


def of_emails(spans: list[CollectedSpan]) -> list[CollectedSpan]:
    """The spans of the emails' traces (see :func:`shapes` for what else there may be)."""
    monitor = {s.trace_id for s in spans if s.name.startswith("publish monitor.")}
    monitor -= {s.trace_id for s in spans if s.name == "publish observation.email.received"}
    return [s for s in spans if s.trace_id not in monitor]


@pytest.fixture(scope="module")
def in_process(
    workdir: Path, collector: OtlpCollector
) -> tuple[dict[str, Any], list[CollectedSpan]]:
    summary, spans = traced_run(workdir, collector, "scenarios/support_email.yaml")
    assert {s.node for s in spans} == {""}  # one process: no node named
    return summary, spans


def moved(workdir: Path, a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    """The emails two runs' summaries decided differently (verdict or action). Across
    processes that can only be timing: a threshold the Learner moved, read by the Reasoner
    before or after the move reached its process (tests/cluster/test_cluster_run.py holds
    the diff to that). Each such email's trace differs by what the Learner made of it."""

    store = workdir / DEFAULT_STORE_PATH
    first, second = outcomes(store, a["session_id"]), outcomes(store, b["session_id"])
    assert set(first) == set(second)
    return {item for item in first if first[item] != second[item]}


NODES = {"driver", "perception", "cognition", "action"}


@pytest.mark.parametrize(
    "scenario",
    ["scenarios/support_email_3node.yaml", "scenarios/support_email_nats.yaml"],
    ids=["zmq", "nats"],
)
def test_three_nodes_export_the_in_process_span_tree(
    workdir: Path,
    collector: OtlpCollector,
    in_process: tuple[dict[str, Any], list[CollectedSpan]],
    scenario: str,
) -> None:
    summary, spans = traced_run(workdir, collector, scenario)
    reference_summary, reference_spans = in_process
    differ = moved(workdir, reference_summary, summary)
    assert len(differ) <= 3, differ

    # Every process exported, and each email's trace crosses them: the Sensor's process
    # span (perception) parents to the Observer's publish span (driver), and so on.
    assert {s.node for s in spans} == NODES
    by_id = {s.span_id: s for s in spans}
    crossing = Counter(
        (by_id[s.parent_id].node, s.node)
        for s in of_emails(spans)
        if s.parent_id and by_id[s.parent_id].node != s.node
    )
    valid = EMAILS - 9
    assert crossing == {
        ("driver", "perception"): valid,  # observation.email.received -> Sensor
        ("perception", "cognition"): valid,  # sensor.email.enriched -> Reasoner, Memory
        ("cognition", "action"): valid,  # plan.proposed -> Guardian
        ("action", "cognition"): valid,  # action.executed -> Memory
        ("action", "driver"): valid,  # action.executed -> Learner
    }
    # The same trees, trace for trace: names, nesting and counts (links checked inside),
    # but for the traces of emails decided differently (timing, see ``moved``).
    alone, ours_shapes = shapes(reference_spans), shapes(spans)
    assert sum(alone.values()) == EMAILS  # one trace per input email
    assert sum(ours_shapes.values()) == EMAILS
    assert sum((ours_shapes - alone).values()) <= len(differ)
    if differ:
        return
    assert ours_shapes == alone
    # And so the same spans: 16,922 of them at sampling 1.0.
    ours, reference = of_emails(spans), of_emails(reference_spans)
    assert len(ours) == len(reference) > 15 * EMAILS
    assert Counter(s.name for s in ours) == Counter(s.name for s in reference)


def test_a_sampled_trace_is_whole_on_every_node(
    workdir: Path,
    collector: OtlpCollector,
    in_process: tuple[dict[str, Any], list[CollectedSpan]],
) -> None:
    """At 20% sampling the decision is made once, at the root on the driver, and travels in
    the envelope: each sampled email's trace is complete across the nodes, and no node
    starts traces of its own for the others' messages."""
    summary, spans = traced_run(
        workdir,
        collector,
        "scenarios/support_email_3node.yaml",
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0.2",
    )
    sampled = shapes(spans)
    # ~120 of 600 emails; 0.2 ± 6 standard deviations (sd ~ 9.8) never fails by chance.
    assert 60 <= sum(sampled.values()) <= 180, sampled
    whole = set(shapes(in_process[1]))
    # Every sampled trace is one of the complete trees, but for an email decided otherwise.
    assert len(set(sampled) - whole) <= len(moved(workdir, in_process[0], summary))
    assert {s.node for s in spans} == NODES


def test_a_node_refuses_otel_settings_it_cannot_honour(workdir: Path) -> None:
    """``pantheon node`` reads the same variables as ``pantheon run`` and fails the same way:
    one line naming the variable, exit 2, before it connects anywhere."""
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "node", "--connect", "tcp://127.0.0.1:9",
         "--scenario", "scenarios/support_email_3node.yaml", "--node", "perception"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env() | {"COLUMNS": "250", "OTEL_TRACES_EXPORTER": "jaeger"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert (
        "observability: OTEL_TRACES_EXPORTER='jaeger': unknown exporter 'jaeger' "
        "(want otlp, console or none)" in proc.stderr
    ), proc.stderr
