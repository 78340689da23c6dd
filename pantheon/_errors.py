"""The one root of every error Pantheon raises on purpose, so a caller can catch them all.

::

    PantheonError
    ├── ScenarioError            a scenario file is wrong (every problem, located)
    ├── ImportProblem            an import path in a scenario leads nowhere usable
    ├── AgentSetupError          an agent's class raised while the team was built
    ├── SessionError             the session store, recording and replay
    │   ├── StoreError → SchemaVersionError, SessionNotFound
    │   ├── RecordingError
    │   └── ReplayDivergence
    ├── LiveError                the live feed → FeedNotFound, FeedClosed, ProtocolError
    ├── ClusterError             a ZeroMQ run's processes
    └── TelemetryConfigError     OTEL_* settings that cannot be honoured

Each keeps the builtin base it had (``ValueError``, ``RuntimeError``, ``KeyError``) so code
that caught those goes on working.
"""

from __future__ import annotations

__all__ = ["PantheonError"]


class PantheonError(Exception):
    """Something Pantheon refused or could not do, with a message meant for the user."""
