"""The one root of every error Pantheon raises on purpose, so a caller can catch them all.

::

    PantheonError
    ├── ScenarioError            a scenario file is wrong (every problem, located)
    ├── ImportProblem            an import path in a scenario leads nowhere usable
    ├── AgentSetupError          an agent's class raised while the team was built
    ├── ClusterError             a multi-process run's processes (ZeroMQ or NATS)
    │   └── TransportUnreachable its NATS server cannot be reached: nothing ran
    ├── RunStuck                 a run's team finished nothing for its drain timeout
    ├── SessionError             the session store, recording and replay (pantheon.sessions)
    │   ├── StoreError → SchemaVersionError, StoreReadOnly, SessionNotFound
    │   ├── ItemNotFound         no item by that key in a session (pantheon.itemtrace)
    │   ├── RecordingError
    │   ├── ReplayDivergence
    │   └── ApprovalError → ApprovalNotFound, AlreadyDecided
    ├── LiveError                the live feed → FeedNotFound, FeedClosed, ProtocolError
    ├── GatewayError             the HTTP gateway cannot start → TokenError
    ├── InboxFull                the gateway's inbox is full (the gateway answers 429)
    ├── InboxClosed              the gateway's inbox has ended (the gateway answers 503)
    ├── TelemetryConfigError     OTEL_* settings that cannot be honoured
    ├── TeamNameError            ``pantheon new`` was given a name a team cannot have
    ├── DriverGone               a node's approval or budget admission after its driver died
    │                            → ApprovalDriverGone, BudgetDriverGone (agents' errors too)
    └── AgentFailed              pantheon.testing: the agent under test dead-lettered a message

Each keeps the builtin base it had (``ValueError``, ``RuntimeError``, ``KeyError``,
``AssertionError``) so code that caught those goes on working. Users catch them where they
call: ``pantheon`` exports the run's (``ScenarioError``, ``AgentSetupError``,
``ClusterError``), each sub-package its own.

:class:`DriverGone`'s two errors are also ``agents``' own (``ApprovalUnavailable``,
``BudgetUnavailable``), which is what an agent's code catches around ``approve()``.

One exception is left out on purpose: :class:`pantheon.sessions.RecordedError` stands in,
during a replay, for an exception the *team's* code raised in the original run. A handler
that caught ``PantheonError`` around an effect would catch the stand-in on replay but not
the original live, and the replay would leave the recorded path.
"""

from __future__ import annotations

__all__ = ["DriverGone", "PantheonError"]


class PantheonError(Exception):
    """Something Pantheon refused or could not do, with a message meant for the user."""


class DriverGone(PantheonError, RuntimeError):
    """Mixed into an error a node raised only because its run's driver had died: an
    artifact of the death, not an answer. A node records it as its effect's outcome and
    ships it, so ``pantheon resume`` finds it in the record; the resume asks again (the
    approval still pending in the store, the budget's ledgers now its own) rather than
    serving the failure."""
