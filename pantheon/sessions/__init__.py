"""Sessions: every run recorded, listable, diffable and replayable exactly.

A :class:`Recorder` attached to a bus writes the run into a :class:`SessionStore` (one
SQLite file, WAL). ``pantheon.rerun.replay_session`` re-runs a recorded session on a
fresh bus with every effect served from the record and reports the first hop where it
diverges; :func:`diff_sessions` aligns two recorded sessions the same way; :func:`redrive`
re-delivers a finished session's dead letters to a (fixed) team.

Errors::

    SessionError
    ├── StoreError
    │   ├── SchemaVersionError
    │   ├── StoreReadOnly
    │   └── SessionNotFound
    ├── RecordingError
    ├── ReplayDivergence
    └── ApprovalError
        ├── ApprovalNotFound
        └── AlreadyDecided
"""

from pantheon.sessions._align import WATCHER_PREFIX, FailureMatch
from pantheon.sessions._approvals import (
    AlreadyDecided,
    Approval,
    ApprovalBook,
    ApprovalError,
    ApprovalNotFound,
)
from pantheon.sessions._diff import LatencyDelta, LatencyStats, SessionDiff, diff_sessions
from pantheon.sessions._effects import EffectsContext, RecordingEffects
from pantheon.sessions._errors import (
    RecordedError,
    RecordingError,
    ReplayDivergence,
    SchemaVersionError,
    SessionError,
    SessionNotFound,
    StoreError,
    StoreReadOnly,
)
from pantheon.sessions._export import export_jsonl
from pantheon.sessions._recorder import (
    DEFAULT_COMMIT_INTERVAL,
    DEFAULT_COMMIT_ROWS,
    DEFAULT_MAX_PENDING,
    DEFAULT_METRICS_INTERVAL,
    Recorder,
    ShippingRecorder,
    import_envelopes,
    import_shipments,
)
from pantheon.sessions._redrive import (
    DEFAULT_REPLAY_TIMEOUT,
    DeskFactory,
    RedriveDeadLetter,
    RedriveReport,
    Setup,
    redrive,
)
from pantheon.sessions._store import (
    DEFAULT_STORE_PATH,
    DRIVER_NODE,
    SCHEMA_VERSION,
    STORE_ENV,
    BreakerTransition,
    MetricSnapshot,
    NodeJournal,
    SessionInfo,
    SessionStore,
    StoredDeadLetter,
    StoredDelivery,
    StoredEffect,
    StoredEnvelope,
    new_session_id,
    resolve_store_path,
)

__all__ = [
    "DEFAULT_COMMIT_INTERVAL",
    "DEFAULT_COMMIT_ROWS",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_METRICS_INTERVAL",
    "DEFAULT_REPLAY_TIMEOUT",
    "DEFAULT_STORE_PATH",
    "DRIVER_NODE",
    "SCHEMA_VERSION",
    "STORE_ENV",
    "WATCHER_PREFIX",
    "AlreadyDecided",
    "Approval",
    "ApprovalBook",
    "ApprovalError",
    "ApprovalNotFound",
    "BreakerTransition",
    "DeskFactory",
    "EffectsContext",
    "FailureMatch",
    "LatencyDelta",
    "LatencyStats",
    "MetricSnapshot",
    "NodeJournal",
    "RecordedError",
    "Recorder",
    "RecordingEffects",
    "RecordingError",
    "RedriveDeadLetter",
    "RedriveReport",
    "ReplayDivergence",
    "SchemaVersionError",
    "SessionDiff",
    "SessionError",
    "SessionInfo",
    "SessionNotFound",
    "SessionStore",
    "Setup",
    "ShippingRecorder",
    "StoreError",
    "StoreReadOnly",
    "StoredDeadLetter",
    "StoredDelivery",
    "StoredEffect",
    "StoredEnvelope",
    "diff_sessions",
    "export_jsonl",
    "import_envelopes",
    "import_shipments",
    "new_session_id",
    "redrive",
    "resolve_store_path",
]
