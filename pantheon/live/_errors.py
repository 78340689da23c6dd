"""Errors of the live feed.

::

    LiveError
    ├── FeedNotFound       no running session publishes a feed there
    ├── FeedClosed         the feed ended (the run finished, or its process died)
    └── ProtocolError      a frame that is not the feed protocol (or another version)
"""

from __future__ import annotations

from pantheon._errors import PantheonError

__all__ = ["FeedClosed", "FeedNotFound", "LiveError", "ProtocolError"]


class LiveError(PantheonError):
    """Root of every live feed error."""


class FeedNotFound(LiveError):
    """Nothing listens on the socket: the session is not running, or runs without a feed."""


class FeedClosed(LiveError):
    """The connection to the feed ended."""


class ProtocolError(LiveError):
    """The peer sent something that is not a frame of this protocol version."""
