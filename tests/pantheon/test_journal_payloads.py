"""Materializing an envelope chunk stores each payload's msgpack bytes as the writer encoded
them (``msgspec.Raw``), not decoded and encoded again: the rows must be exactly what the
decode-and-encode path gave, or readers of old and new stores would disagree."""

from __future__ import annotations

import msgspec

from bus import Envelope
from pantheon.sessions._codec import safe_repr
from pantheon.sessions._journal import CHUNK_ROWS, EnvelopeRows, decode_envelopes


def envelope_chunk(wall: float, mono: int, envelopes: list[Envelope]) -> bytes:
    rows = EnvelopeRows(wall, mono)
    for env in envelopes:
        rows.add_envelope(env)
    ((kind, count, blob),) = rows.take()
    assert (kind, count) == ("envelopes", len(envelopes))
    return blob


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
    rows = decode_envelopes(envelope_chunk(200.0, 10**9, envelopes), 7)

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


def test_a_chunk_written_row_by_row_is_the_bytes_of_encoding_it_whole() -> None:
    """Chunks are written one envelope at a time on the loop thread; stores written when
    the writer encoded a whole batch at once hold chunks in that form, and both must read
    back alike: the bytes are the same, at every array-header size and with flags."""
    enc = msgspec.msgpack.Encoder()
    for n in (1, 15, 16, 300, CHUNK_ROWS):
        envelopes = [
            Envelope(topic="t", payload={"i": i, "s": "x" * (i % 7)}, id=i, created=10**9 + i)
            for i in range(n)
        ]
        assert envelope_chunk(1.5, 10**9, envelopes) == enc.encode((1.5, 10**9, [], envelopes))
    odd = [Envelope(topic="t", payload=p, id=i) for i, p in enumerate([1, _Unencodable(), 3])]
    fixed = [
        msgspec.structs.replace(e, payload=safe_repr(e.payload)) if i == 1 else e
        for i, e in enumerate(odd)
    ]
    assert envelope_chunk(0.0, 0, odd) == enc.encode((0.0, 0, [1], fixed))


def test_rows_are_cut_into_chunks_of_at_most_chunk_rows() -> None:
    rows = EnvelopeRows(0.0, 0)
    for i in range(2 * CHUNK_ROWS + 5):
        rows.add_envelope(Envelope(topic="t", payload=i, id=i))
    assert rows.rows() == 2 * CHUNK_ROWS + 5
    chunks = rows.take()
    assert [count for _, count, _ in chunks] == [CHUNK_ROWS, CHUNK_ROWS, 5]
    assert rows.rows() == 0 and rows.take() == []
    firsts = [decode_envelopes(blob, 0)[0][1] for _, _, blob in chunks]
    assert firsts == [0, CHUNK_ROWS, 2 * CHUNK_ROWS]  # in order, none lost
