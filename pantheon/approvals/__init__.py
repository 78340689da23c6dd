"""Approvals: the desk a running team asks, the relay that carries a node's request to it,
and the decision API every decider uses (``pantheon approve``, the terminal monitor, the
web dashboard).

A request is a row of the session store's ``approvals`` table (its access,
:class:`ApprovalBook`, lives with the store in :mod:`pantheon.sessions` and is re-exported
here), so a decision made by any process that opens the store outlives the process that
asked. :class:`StoreDesk` is the running team's side: it writes the request and waits for
the row's decision; :class:`NodeDesk` and :class:`DeskRelay` carry a request from another
process of a multi-process run to the driver's desk.
"""

from pantheon.approvals._desk import (
    NOTICE_AFTER,
    OnWaiting,
    StoreDesk,
    approval_desk,
    redrive_desk,
    request_key,
    who,
)
from pantheon.approvals._relay import (
    APPROVAL_EVENT,
    DECIDED_COMMAND,
    ApprovalDriverGone,
    DeskRelay,
    NodeDesk,
)
from pantheon.sessions import (
    AlreadyDecided,
    Approval,
    ApprovalBook,
    ApprovalError,
    ApprovalNotFound,
)

__all__ = [
    "APPROVAL_EVENT",
    "DECIDED_COMMAND",
    "NOTICE_AFTER",
    "AlreadyDecided",
    "Approval",
    "ApprovalBook",
    "ApprovalDriverGone",
    "ApprovalError",
    "ApprovalNotFound",
    "DeskRelay",
    "NodeDesk",
    "OnWaiting",
    "StoreDesk",
    "approval_desk",
    "redrive_desk",
    "request_key",
    "who",
]
