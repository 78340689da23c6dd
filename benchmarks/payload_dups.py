"""How much of a recorded pipeline's payload bytes repeat: what storing each distinct payload
once per session (content-addressed) would save.

    python benchmarks/payload_dups.py [--emails 3000]

Records one run of the nine-agent pipeline (``pipeline_bench.py``'s, 1 ms model latency)
into a fresh store, then hashes every stored payload (BLAKE2b, 16 bytes) and prints, overall
and per topic, the messages, distinct payloads and the bytes a store of distinct payloads
would keep.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sqlite3
import tempfile
from collections import defaultdict
from pathlib import Path

from pipeline_bench import make_inbox, one_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emails", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        asyncio.run(one_run(make_inbox(args.emails, directory), 1.0, 64, "recording"))
        [path] = directory.glob("pipeline-*.db")
        conn = sqlite3.connect(path)
        try:
            rows = conn.execute("SELECT topic, payload FROM envelopes ORDER BY seq").fetchall()
        finally:
            conn.close()
    distinct: dict[bytes, int] = {}
    per_topic: dict[str, dict[bytes, int]] = defaultdict(dict)
    counts: dict[str, int] = defaultdict(int)
    for topic, payload in rows:
        digest = hashlib.blake2b(payload, digest_size=16).digest()
        distinct[digest] = len(payload)
        per_topic[topic][digest] = len(payload)
        counts[topic] += 1
    total = sum(len(p) for _, p in rows)
    kept = sum(distinct.values())
    print(
        f"{len(rows):,} envelopes, {total:,} payload bytes; {len(distinct):,} distinct payloads "
        f"holding {kept:,} bytes: {1 - kept / total:.1%} of payload bytes repeat"
    )
    for topic, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {topic:<32}{n:>8,} messages{len(per_topic[topic]):>8,} distinct")


if __name__ == "__main__":
    main()
