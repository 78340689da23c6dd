"""CURVE: a broker with keys admits only the node keys on its allow-list."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bus import Bus
from bus.backends.zeromq import (
    AuthenticationFailed,
    Broker,
    ConnectError,
    CurveKeys,
    ZmqTransport,
    run_broker,
)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, CurveKeys]:
    made = {name: CurveKeys.generate() for name in ("server", "good", "other", "stranger")}
    made["server"].save(tmp_path / "server")
    made["good"].save(tmp_path / "allowed" / "good")
    made["other"].save(tmp_path / "allowed" / "other")
    return made


async def test_only_allowed_keys_join_and_traffic_flows_between_them(
    tmp_path: Path, keys: dict[str, CurveKeys]
) -> None:
    server = keys["server"].public
    async with run_broker(
        curve_secret=tmp_path / "server.key_secret", allow=tmp_path / "allowed"
    ) as endpoint:
        async with (
            Bus(transport=ZmqTransport(endpoint, curve=keys["good"], server_key=server)) as a,
            Bus(transport=ZmqTransport(endpoint, curve=keys["other"], server_key=server)) as b,
        ):
            got: list[object] = []
            b.on("secret.*", lambda env: got.append(env.payload), name="b")
            await b.transport.sync()
            await a.emit("secret.plan", {"x": 1})
            await a.drain()
            assert got == [{"x": 1}]

        stranger = ZmqTransport(
            endpoint, curve=keys["stranger"], server_key=server, connect_timeout=3
        )
        with pytest.raises(AuthenticationFailed, match=r"refused .*CURVE.*allow-list") as info:
            await Bus(transport=stranger).start()
        assert endpoint in str(info.value)

        plain = ZmqTransport(endpoint, connect_timeout=3)
        with pytest.raises(AuthenticationFailed, match="requires CURVE"):
            await Bus(transport=plain).start()

    # And with nobody listening at all, the error says that instead.
    with pytest.raises(ConnectError, match=r"no answer from the broker at .* within 0\.3s"):
        await Bus(transport=ZmqTransport(endpoint, connect_timeout=0.3)).start()


async def test_a_data_link_refused_before_the_directory_listed_it_links_again(
    tmp_path: Path, keys: dict[str, CurveKeys], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race CI hit: node a dials b's data socket before b's directory lists a's key, so
    b refuses the handshake, and ZeroMQ never retries a refused one. Here every first
    handshake is refused; without linking again, nothing a sends would ever arrive."""
    refused: set[bytes] = set()
    admit = ZmqTransport._admit

    def refuse_first(self: ZmqTransport, key: bytes) -> bool:
        if key not in refused:
            refused.add(key)
            return False
        return admit(self, key)

    monkeypatch.setattr(ZmqTransport, "_admit", refuse_first)
    server = keys["server"].public
    async with (
        run_broker(
            curve_secret=tmp_path / "server.key_secret", allow=tmp_path / "allowed"
        ) as endpoint,
        Bus(transport=ZmqTransport(endpoint, curve=keys["good"], server_key=server)) as a,
        Bus(transport=ZmqTransport(endpoint, curve=keys["other"], server_key=server)) as b,
    ):
        got: list[object] = []
        b.on("secret.*", lambda env: got.append(env.payload["i"]), name="b")
        await b.transport.sync()
        async with asyncio.timeout(20):
            for i in range(200):
                await a.emit("secret.plan", {"i": i})
            await a.drain()
        assert sorted(got) == list(range(200))
        assert keys["good"].public in refused
        assert a.transport.stats()["relinked"] >= 1


def test_keys_round_trip_through_zeromq_certificate_files(tmp_path: Path) -> None:
    pair = CurveKeys.generate()
    public_file, secret_file = pair.save(tmp_path / "node")
    assert CurveKeys.load(secret_file) == pair
    assert CurveKeys.load(tmp_path / "node") == pair
    assert secret_file.stat().st_mode & 0o777 == 0o600
    assert pair.secret.decode() not in public_file.read_text()
    with pytest.raises(ValueError, match="no secret key"):
        CurveKeys.load(public_file)
    with pytest.raises(ValueError, match="40 bytes"):
        CurveKeys(b"short", pair.secret)


def test_a_curve_broker_with_an_empty_allow_list_is_refused_at_construction() -> None:
    # It would refuse every node: a configuration error to name now, not a log line.
    with pytest.raises(ValueError, match="every node would be refused"):
        Broker("tcp://127.0.0.1:0", curve=CurveKeys.generate(), allow=())
