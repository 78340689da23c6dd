"""Running a scenario: building the team, its inputs, the run loop, multi-process runs on
either transport (ZeroMQ or NATS JetStream), and the report a run ends with.

:func:`run_scenario` is the loop; :func:`recording` puts a run's bus in the session store;
:func:`build_team` makes the scenario's agents; :func:`cluster_transport` and
:class:`NodeHost` are the driver's and a node's sides of a multi-process run; a run ends
with a :class:`RunSummary`, its expectations judged by :func:`judge`. ``pantheon.run`` (the
user API) and the ``pantheon`` command are built on these.
"""

from pantheon.runner._budget_relay import BudgetDriverGone
from pantheon.runner._build import AgentSetupError, Team, build_team, check_model, team_setup
from pantheon.runner._inputs import (
    HttpSource,
    InboxClosed,
    InboxFull,
    JsonlLine,
    jsonl_labels,
    read_jsonl,
)
from pantheon.runner._multiprocess import (
    ClusterError,
    NodeHost,
    TransportUnreachable,
    cluster_transport,
    discard_consumers,
    import_from_stream,
    install_stop_signals,
    say_control,
    serve_broker,
    serve_node,
)
from pantheon.runner._report import (
    MAX_LISTED_DEAD_LETTERS,
    RunSummary,
    accuracy_bounds,
    count_own_topics,
    expectation_state,
    judge,
    local_report,
    score_from_record,
    summarize,
)
from pantheon.runner._runtime import RunStuck, drain_progressing, run_scenario
from pantheon.runner._session_run import Recording, recording

__all__ = [
    "MAX_LISTED_DEAD_LETTERS",
    "AgentSetupError",
    "BudgetDriverGone",
    "ClusterError",
    "HttpSource",
    "InboxClosed",
    "InboxFull",
    "JsonlLine",
    "NodeHost",
    "Recording",
    "RunStuck",
    "RunSummary",
    "Team",
    "TransportUnreachable",
    "accuracy_bounds",
    "build_team",
    "check_model",
    "cluster_transport",
    "count_own_topics",
    "discard_consumers",
    "drain_progressing",
    "expectation_state",
    "import_from_stream",
    "install_stop_signals",
    "jsonl_labels",
    "judge",
    "local_report",
    "read_jsonl",
    "recording",
    "run_scenario",
    "say_control",
    "score_from_record",
    "serve_broker",
    "serve_node",
    "summarize",
    "team_setup",
]
