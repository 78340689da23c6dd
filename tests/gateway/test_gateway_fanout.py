"""Many subscribers of one pattern cost one bus subscription and one encode per message:
what an idle client costs the bus's stats, and a fan-out its CPU, no longer grows with the
number of clients."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from bus import Bus
from pantheon.gateway import Gateway
from pantheon.scenario import GatewayConfig
from pantheon.sessions import WATCHER_PREFIX

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets")

CLIENTS = 40


async def test_clients_of_one_pattern_share_a_subscription_and_an_encode() -> None:
    async with Bus() as bus, Gateway(bus, GatewayConfig(port=0)) as gw:
        url = f"ws://127.0.0.1:{gw.port}/v1/subscribe?pattern=fan.*"
        sockets = [await websockets.connect(url) for _ in range(CLIENTS)]
        other = await websockets.connect(f"ws://127.0.0.1:{gw.port}/v1/subscribe?pattern=fan.>")
        watchers = [n for n in bus.subscriptions() if n.startswith(WATCHER_PREFIX)]
        assert len(watchers) == 2  # one per pattern, not one per client
        for i in range(5):
            bus.emit_nowait("fan.out", {"i": i})
        for ws in [*sockets, other]:
            got: list[int] = []
            while len(got) < 5:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
                assert frame["dropped"] == 0
                got += [m["payload"]["i"] for m in frame["messages"]]
            assert got == [0, 1, 2, 3, 4]
        assert gw.state.encoder.encoded == 5  # once per message, for 41 clients, 2 patterns
        for ws in [*sockets, other]:
            await ws.close()
        for _ in range(100):
            if not any(n.startswith(WATCHER_PREFIX) for n in bus.subscriptions()):
                break
            await asyncio.sleep(0.02)
        assert not [n for n in bus.subscriptions() if n.startswith(WATCHER_PREFIX)]
        assert not gw.state.clients
