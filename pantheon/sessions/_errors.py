"""Every error the session layer raises, rooted at one class so a caller can catch the family.

::

    SessionError
    ├── StoreError                    the session store cannot be opened or used
    │   ├── SchemaVersionError        the file was written by another schema version
    │   ├── StoreReadOnly             the store cannot be written, and this needs to write it
    │   └── SessionNotFound           no session (or no unique one) matches an id prefix
    ├── RecordingError                the recorder's writer failed; the record is incomplete
    ├── ReplayDivergence              a replay (or a diff) left the recorded path
    └── ApprovalError                 an approval cannot be read or decided (_approvals.py)
        ├── ApprovalNotFound          no approval with that number in that session
        └── AlreadyDecided            someone (or the timeout) decided it first

:class:`RecordedError` is not in this tree on purpose: it stands in, during a replay, for an
exception an effect raised in the original run, and agents catch it as they caught the
original (it is an ``Exception`` named like the original type).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pantheon._errors import PantheonError

__all__ = [
    "RecordedError",
    "RecordingError",
    "ReplayDivergence",
    "SchemaVersionError",
    "SessionError",
    "SessionNotFound",
    "StoreError",
    "StoreReadOnly",
]


class SessionError(PantheonError):
    """Root of every error the session layer raises."""


class StoreError(SessionError):
    """The session store cannot be opened, read or written."""


class SchemaVersionError(StoreError):
    """The store file has a schema version this code does not know.

    ``path`` is the file, ``found`` the version written in it, ``expected`` ours.
    """

    def __init__(self, path: Path | str, found: int | str, expected: int) -> None:
        self.path = Path(path)
        self.found = found
        self.expected = expected
        hint = (
            "it was written by a newer Pantheon: upgrade pantheon to read it"
            if isinstance(found, int) and found > expected
            else "move the file aside (or point PANTHEON_STORE elsewhere) to start a new store"
        )
        super().__init__(
            f"session store {self.path} has schema version {found}, but this Pantheon "
            f"reads schema version {expected}; {hint}"
        )


class StoreReadOnly(StoreError):
    """The store cannot be written (a read-only file, directory or file system) and what was
    asked needs to write it: record a session, decide an approval, mark a dead letter
    redriven, or migrate an older store. Reading such a store works
    (``SessionStore(..., access="read")``)."""


class SessionNotFound(StoreError, KeyError):
    """No session matches an id (or prefix), or the prefix matches more than one.

    ``candidates`` lists the matching ids when the prefix was ambiguous.
    """

    def __init__(self, ref: str, candidates: list[str] | None = None, path: Path | None = None):
        self.ref = ref
        self.candidates = candidates or []
        where = f" in {path}" if path is not None else ""
        if self.candidates:
            shown = ", ".join(self.candidates[:5]) + (" ..." if len(self.candidates) > 5 else "")
            msg = f"session prefix {ref!r} is ambiguous{where}: matches {shown}"
        else:
            msg = f"no session {ref!r}{where}"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class RecordingError(SessionError):
    """The recorder's background writer failed (disk full, store locked for too long, ...).

    Recording stops at that point and the run goes on unaffected; ``Recorder.finish`` raises
    this so the failure is never silent. The store holds everything committed before it.
    """


class ReplayDivergence(SessionError):
    """A replay (or the second session of a diff) left the path the original took.

    ``field`` says what differed: ``topic`` or ``payload`` of a message, ``missing`` (the
    original had a message the replay did not produce), ``extra`` (the reverse), ``effect``
    (a different effect name or order) or ``outcome`` (a delivery failed in one run and not
    in the other, or failed with another error type). ``original_id`` and ``replay_id`` are
    the envelope ids on each side (``None`` where there is none), ``agent`` the subscriber
    that emitted the message (or ran the effect / handled the delivery), ``expected`` the
    original's value and ``actual`` the replay's. ``diff`` holds a readable payload diff.
    ``hint`` names the likely cause when the replay can tell (a handler that drew
    randomness or read the clock outside an effect). ``item`` is the key of the input
    whose tree it is in (``A-5``), where the reader knows the team's input key: a person
    finds an item by its key, not by a 19-digit message id.
    """

    def __init__(
        self,
        field: str,
        *,
        original_id: int | None,
        replay_id: int | None,
        agent: str | None,
        expected: Any,
        actual: Any,
        topic: str | None = None,
        diff: list[str] | None = None,
        detail: str | None = None,
        hint: str | None = None,
        item: str | None = None,
    ) -> None:
        self.field = field
        self.item = item
        self.original_id = original_id
        self.replay_id = replay_id
        self.agent = agent
        self.expected = expected
        self.actual = actual
        self.topic = topic
        self.diff = diff or []
        self.detail = detail
        self.hint = hint
        super().__init__(self.describe())

    def describe(self, a: str | None = None, b: str | None = None) -> str:
        """The message, for a replay (the default) or for two runs named ``a`` and ``b``
        (``pantheon diff``: neither is a replay, so neither is "expected")."""
        on = f" on {self.topic!r}" if self.topic else ""
        of = f" for item {self.item!r}" if self.item is not None else ""
        at = f"({self.field}) at {self.where(a or 'original', b or 'replay')}{on}{of}"
        # A side with no message, or no call there, says so, not "None" (read as a value).
        none = {"missing": "nothing", "extra": "nothing", "effect": "no call"}.get(self.field)
        expected = none if self.expected is None and none else _short(self.expected)
        actual = none if self.actual is None and none else _short(self.actual)
        if a is None or b is None:
            msg = (
                f"replay diverged {at} from agent {self.agent!r}: expected {expected}, got {actual}"
            )
        else:
            msg = (
                f"runs differ {at} from agent {self.agent!r}: {a} has {expected}, {b} has {actual}"
            )
        if self.detail:
            msg += f" ({self.detail})"
        if self.hint:
            msg += f"; {self.hint}"
        if self.diff:
            msg += "\n" + "\n".join("  " + line for line in self.diff)
        return msg

    def name_item(self, item: str | None) -> None:
        """Say which item it is in (found once the divergence is known)."""
        self.item = item
        self.args = (self.describe(),)

    def where(self, a: str = "original", b: str = "replay") -> str:
        """Both sides' message ids, or the one side that has the message."""
        if self.original_id is None and self.replay_id is None:
            return "no message"
        if self.original_id is None:
            return f"{b} message {self.replay_id} (none in the {a})"
        if self.replay_id is None:
            return f"{a} message {self.original_id} (none in the {b})"
        return f"{a} message {self.original_id} / {b} message {self.replay_id}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "original_id": self.original_id,
            "replay_id": self.replay_id,
            "agent": self.agent,
            "topic": self.topic,
            "expected": self.expected,
            "actual": self.actual,
            "diff": self.diff,
            "detail": self.detail,
            "hint": self.hint,
            "item": self.item,
            "message": str(self).split("\n", 1)[0],
        }

    def __reduce__(self) -> Any:
        return (_rebuild_divergence, (self.to_dict(),))


def _rebuild_divergence(d: dict[str, Any]) -> ReplayDivergence:
    d = dict(d)
    d.pop("message", None)
    field = d.pop("field")
    return ReplayDivergence(field, **d)


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RecordedError(Exception):
    """Raised on replay in place of an exception an effect raised in the original run, when
    that exception type cannot be rebuilt (its module is not loaded, or its constructor does
    not take a single message).

    The replay raises a subclass *named like the original type*, so the bus records the same
    error type name for the failed delivery; ``type_name`` is the original's qualified name.
    """

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        self.message = message
        super().__init__(message)
