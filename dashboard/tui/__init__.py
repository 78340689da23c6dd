"""The Textual monitor: ``pantheon monitor [SESSION]`` and ``pantheon run FILE --tui``.

Importing this package imports Textual (the ``tui`` extra); the CLI imports it only inside
the commands that start it.
"""

from dashboard.tui._app import DeadLetterScreen, MonitorApp, TimelineScreen
from dashboard.tui._sources import LiveSource, Source, StoreSource

__all__ = [
    "DeadLetterScreen",
    "LiveSource",
    "MonitorApp",
    "Source",
    "StoreSource",
    "TimelineScreen",
]
