"""The ``traced`` fixture: a Telemetry exporting to memory, shut down after the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from telemetry_helpers import Traced


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    yield t
    t.telemetry.shutdown()
