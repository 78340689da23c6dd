"""The shared corpus of undecodable bytes against pantheon's readers: the live feed's
frames and the store's payloads and effect results. Each fails as that reader's one
documented error, never as RecursionError, UnicodeDecodeError or OverflowError."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from untrusted_corpus import CORPUS

from bus import Bus, DecodeError
from pantheon.live import ProtocolError
from pantheon.live._wire import decode_client, decode_server
from pantheon.sessions import Recorder, SessionStore, StoreError
from pantheon.sessions._codec import decode


@pytest.mark.parametrize("item", CORPUS)
def test_live_frames_from_the_corpus_are_protocol_errors(item: str) -> None:
    data = CORPUS[item]
    for reader, what in ((decode_server, "feed frame"), (decode_client, "client frame")):
        with pytest.raises(ProtocolError) as caught:
            reader(data)
        assert f"{what} of {len(data)} bytes is " in str(caught.value)


@pytest.mark.parametrize("item", CORPUS)
def test_stored_values_from_the_corpus_are_decode_errors(item: str) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(CORPUS[item])
    assert caught.value.what == "stored value"


async def test_a_stored_payload_nested_100000_deep_is_a_one_line_store_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sessions.db"
    with SessionStore(path) as store:
        recorder = Recorder(store, session_id="s", scenario="x", scenario_text="x", seed=1)
        async with Bus() as bus:
            recorder.attach(bus)
            bus.on("a.b", lambda env: None, name="sink")
            await bus.emit("a.b", {"n": 1})
            await bus.drain()
        await recorder.finish("completed", {})
        store.materialize("s")
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "UPDATE envelopes SET payload = ? WHERE session = 's'",
            (CORPUS["msgpack nested 100,000 deep"],),
        )
    conn.close()
    with SessionStore(path) as store, pytest.raises(StoreError) as caught:
        store.envelopes("s")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: session 's': the payload of message ")
    assert message.endswith(
        "cannot be decoded (stored value of 100001 bytes is too deep: nested too deep to decode)"
    )


def test_a_stored_value_over_64_mib_reads_back() -> None:
    """The store has no size bound of its own: what was recorded must read back."""
    from pantheon.sessions._codec import encode

    blob, as_repr = encode("x" * (65 * 1024 * 1024))
    assert not as_repr
    assert decode(blob) == "x" * (65 * 1024 * 1024)
