"""What a support-desk session decided, per email, read from its store; and how a
multi-process session may differ from the in-process one of the same scenario and seed."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import pantheon

from pantheon.sessions import SessionStore

__all__ = ["moved_by_timing", "outcomes"]

#: Emails a cross-process run may decide otherwise than one process (seen once in many
#: loaded runs: e0205 escalate on ZeroMQ, ticket alone).
MAX_MOVED = 3


def outcomes(store: Path, session: str) -> dict[str, tuple[str, str]]:
    """(Guardian verdict, action taken) per email id, from the session's action.executed."""
    with SessionStore(store) as s:
        envelopes = s.envelopes(s.resolve(session))
    return {
        e.payload["email_id"]: (e.payload["verdict"], e.payload["action"])
        for e in envelopes
        if e.topic == "action.executed"
    }


def moved_by_timing(workdir: Path, store: str, alone: str, other: str) -> set[str]:
    """The emails session ``other`` (several processes) decided otherwise than ``alone``
    (one process, same scenario and seed), after checking each is timing's doing.

    The team does not promise equal decisions across processes: the Reasoner reads its
    thresholds, moved by the Learner on another process, and Memory's lookups answer by
    which email got there first. So: every email decided, at most :data:`MAX_MOVED` decided
    otherwise, every hop aligned, the diff's changed decisions exactly those whose action
    moved, and every difference explained by ``memory.lookup`` or ``reasoner.thresholds``."""
    expected = outcomes(workdir / store, alone)
    got = outcomes(workdir / store, other)
    assert len(expected) == 591
    assert set(got) == set(expected)
    moved = {item for item in expected if got[item] != expected[item]}
    assert len(moved) <= MAX_MOVED, moved
    proc = pantheon("diff", alone, other, "--store", store, "--json", cwd=workdir)
    diff = json.loads(proc.stdout)
    # Every hop aligned: the merged record walks as one tree, whichever node's shipment
    # came first.
    assert diff["hops_compared"] == diff["compared_a"] == diff["compared_b"]
    acted = {item for item in moved if got[item][1] != expected[item][1]}
    assert {c["item"] for c in diff["decisions"]["changes"]} == acted  # the team's field: action
    assert diff["identical"] or diff["timing_only"], diff["divergence"]
    assert set(diff["timing_effects"]) <= {"memory.lookup", "reasoner.thresholds"}
    return moved
