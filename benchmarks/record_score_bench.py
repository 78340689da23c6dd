"""What scoring a multi-process run from its record costs at the end of the run.

    python benchmarks/record_score_bench.py [--scenario scenarios/support_email_3node.yaml]
        [--reads 3]

Runs the scenario with ``pantheon run`` (its nodes, recorded into a fresh store), then times
``session_outcomes`` and ``SessionStore.topic_counts`` on the session ``--reads`` times
each: the reads ``pantheon run`` does once, after the run's elapsed time, to score and
count a multi-process run from its record (pantheon/_api.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pantheon.rerun import session_outcomes
from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenario", type=Path, default=ROOT / "scenarios/support_email_3node.yaml"
    )
    parser.add_argument("--reads", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "s.db"
        proc = subprocess.run(
            [sys.executable, "-m", "pantheon.cli", "run", str(args.scenario.resolve()), "--json",
             "--store", str(store)],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        summary = json.loads(proc.stdout)
        with SessionStore(store) as st:
            times = []
            counting = []
            for _ in range(args.reads):
                t = time.perf_counter()
                read = session_outcomes(st, summary["session_id"])
                times.append(time.perf_counter() - t)
                t = time.perf_counter()
                st.topic_counts(summary["session_id"])
                counting.append(time.perf_counter() - t)
    print(
        f"{summary['messages']:,} messages, {len(read.decisions):,} items decided; scored from "
        f"the record in {', '.join(f'{t:.3f}' for t in times)} s, counted per topic in "
        f"{', '.join(f'{t:.4f}' for t in counting)} s "
        f"(the run itself: {summary['elapsed_s']:.2f} s)"
    )


if __name__ == "__main__":
    main()
