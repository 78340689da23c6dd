"""Bytes no decoder of ours may choke on: every reader of untrusted input (transport frames,
gateway bodies, feed frames, stored payloads) is fed this same corpus, and each item must come
back as that reader's one "malformed" outcome, never as another exception."""

from __future__ import annotations

#: name -> bytes. Each is undecodable as msgpack *and* as JSON.
CORPUS: dict[str, bytes] = {
    "empty": b"",
    "json string not UTF-8": b'"\xff"',
    "msgpack string not UTF-8": b"\xa1\xff",
    "msgpack nested 100,000 deep": b"\x91" * 100_000 + b"\xc0",
    "JSON nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "JSON int of 5,000 digits": b"1" + b"0" * 5_000,
    "msgpack truncated array": b"\x92\x01",
    "JSON truncated object": b'{"a": [1,',
    "msgpack array claiming 4 billion items": b"\xdd\xff\xff\xff\xff\x01",
    "msgpack map with a list key": b"\x81\x91\x01\x01\xc1",
    "msgpack reserved byte": b"\xc1",
}
