"""The live feed: watch a running session from another process, or the same one.

A running session's :class:`LiveFeed` publishes a :class:`Snapshot` several times a second
(counters, throughput over time, per-hop latency, breakers, recent dead letters, recent
traces) to in-process subscribers and to clients of a Unix socket beside the session store
(``.pantheon/live/<session>.sock``). :func:`connect` attaches to one; a client can ask the
running process to redrive a dead letter. :func:`snapshot_from_store` builds the same value
for a finished session from :mod:`pantheon.readmodel`. Needs nothing beyond the core
dependencies (the socket speaks length-prefixed msgpack).

Errors::

    LiveError
    ├── FeedNotFound
    ├── FeedClosed
    └── ProtocolError
"""

from pantheon.live._client import LiveClient, connect, connect_url, live_sessions
from pantheon.live._errors import FeedClosed, FeedNotFound, LiveError, ProtocolError
from pantheon.live._feed import (
    DEFAULT_HISTORY,
    DEFAULT_INTERVAL,
    DEFAULT_MAX_CLIENTS,
    DEFAULT_MAX_DEAD_LETTERS,
    DEFAULT_MAX_TRACES,
    DEFAULT_TRACE_RING,
    LiveFeed,
    SnapshotStream,
)
from pantheon.live._node import NodeParts
from pantheon.live._parts import PartsBoard
from pantheon.live._run import LiveRun, live_run, outcome_tally
from pantheon.live._snapshot import (
    PROTOCOL_VERSION,
    BreakerEvent,
    BreakerState,
    Check,
    DeadLetterView,
    HopBar,
    HopLatency,
    OutcomeTally,
    RedriveResult,
    Series,
    Snapshot,
    Totals,
    Trace,
)
from pantheon.live._store import snapshot_from_store, trace_from_store
from pantheon.live._wire import socket_path

__all__ = [
    "DEFAULT_HISTORY",
    "DEFAULT_INTERVAL",
    "DEFAULT_MAX_CLIENTS",
    "DEFAULT_MAX_DEAD_LETTERS",
    "DEFAULT_MAX_TRACES",
    "DEFAULT_TRACE_RING",
    "PROTOCOL_VERSION",
    "BreakerEvent",
    "BreakerState",
    "Check",
    "DeadLetterView",
    "FeedClosed",
    "FeedNotFound",
    "HopBar",
    "HopLatency",
    "LiveClient",
    "LiveError",
    "LiveFeed",
    "LiveRun",
    "NodeParts",
    "OutcomeTally",
    "PartsBoard",
    "ProtocolError",
    "RedriveResult",
    "Series",
    "Snapshot",
    "SnapshotStream",
    "Totals",
    "Trace",
    "connect",
    "connect_url",
    "live_run",
    "live_sessions",
    "outcome_tally",
    "snapshot_from_store",
    "socket_path",
    "trace_from_store",
]
