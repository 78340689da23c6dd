"""Materializing an envelope chunk stores each payload's msgpack bytes as the writer encoded
them (``msgspec.Raw``), not decoded and encoded again: the rows must be exactly what the
decode-and-encode path gave, or readers of old and new stores would disagree."""

from __future__ import annotations

import msgspec

from bus import Envelope
from pantheon.sessions._codec import safe_repr
from pantheon.sessions._journal import ChunkEncoder, decode_envelopes


class _Unencodable:
    """A payload msgspec cannot encode: stored as its repr, its position flagged."""


def test_materialized_payloads_are_the_bytes_a_decode_and_encode_would_give() -> None:
    payloads = [
        None,
        {"id": "e1", "body": "héllo", "features": {"len": 5, "score": 0.25, "tags": ["a"]}},
        (1, 2, 3),  # a tuple reads back as a list: the bytes are an array either way
        b"\x00\xff",
        2**64 - 1,
        -(2**63),
        1.5e300,
        "",
        {"deep": [{"k": None, "v": [True, False]}]},
        _Unencodable(),
    ]
    envelopes = [
        Envelope(topic=f"t.{i}", payload=p, id=2**64 - 1 - i, created=10**9 + i, hops=i)
        for i, p in enumerate(payloads)
    ]
    rows = decode_envelopes(ChunkEncoder(200.0, 10**9).envelopes(envelopes), 7)

    assert [r[0] for r in rows] == list(range(7, 7 + len(envelopes)))
    for env, row in zip(envelopes, rows, strict=True):
        blob, flagged = row[10], row[11]
        if isinstance(env.payload, _Unencodable):
            assert flagged == 1
            assert msgspec.msgpack.decode(blob) == safe_repr(env.payload)
        else:
            assert flagged == 0
            again = msgspec.msgpack.encode(
                msgspec.msgpack.decode(msgspec.msgpack.encode(env.payload))
            )
            assert blob == again
        assert row[2] == env.topic and row[7] == env.hops and row[8] == env.created
        assert row[1] == env.id - 2**64  # ids above 2**63 - 1 as SQLite stores them
        assert row[9] == 200.0 + (env.created - 10**9) * 1e-9
