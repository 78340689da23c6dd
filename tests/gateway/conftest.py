"""The module-wide gateway of tests/gateway (helpers in tests/_support/gateway_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gateway_server import TOKENS_ENV, Server, start_server, write_scenario


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("gateway")
    srv = start_server(write_scenario(tmp), tmp, env={"GW_TEST_TOKENS": TOKENS_ENV})
    try:
        yield srv
    finally:
        srv.stop()
