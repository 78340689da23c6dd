"""Exporting a session's envelopes, one JSON object per line."""

from __future__ import annotations

from typing import IO, Any

import msgspec

from pantheon.sessions._codec import safe_repr
from pantheon.sessions._store import SessionStore

__all__ = ["export_jsonl"]


def _fallback(obj: Any) -> Any:
    return safe_repr(obj)


_json = msgspec.json.Encoder(enc_hook=_fallback)


def export_jsonl(store: SessionStore, session_id: str, out: IO[str]) -> int:
    """Write every envelope of a session to ``out`` as JSON lines, in publish order; returns
    how many. Each object has the envelope's stored fields plus ``session``; ``payload`` is
    the stored payload (bytes as base64; a payload stored as its repr, with
    ``payload_repr: true``, is that string). ``node`` is the process that published it in a
    multi-process session (``driver`` for the one that ran the scenario, as ``sessions
    show`` names it), ``null`` in a single-process one."""
    sid = store.resolve(session_id)
    node = store.node_names(sid)
    n = 0
    for env in store.envelopes(sid):
        record = {"session": sid, **env.to_dict(), "node": node(env.node)}
        try:
            line = _json.encode(record)
        except (TypeError, msgspec.EncodeError):
            # Maps with non-string keys (msgpack allows them, JSON does not).
            record["payload"] = safe_repr(record["payload"])
            line = _json.encode(record)
        out.write(line.decode())
        out.write("\n")
        n += 1
    return n
