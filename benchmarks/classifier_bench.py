"""The rule classifier: every pattern searched one by one (the old algorithm) vs one scan.

    python benchmarks/classifier_bench.py [--repeats 15]

Builds the Reasoner's ``RuleProvider`` from ``scenarios/support_email.yaml`` and classifies
every email of ``scenarios/data/support_emails.jsonl`` that has a subject and a body (the
malformed lines never reach the Reasoner) with ``_classify_reference`` (each pattern searched
separately in the subject and in the body: 2 searches per pattern, 30 patterns) and with
``_classify`` (one folded scan per text, only the patterns whose needles occur searched).
Both are checked to give the same verdict for every email first. Each repeat times one pass
over the dataset in CPU time of this process (``time.process_time_ns``, so other work on
the machine slows it less than wall time would); reported are the medians of ns per email
and their ratio, the target being >= 5x. JSON with every repeat goes to
``benchmarks/results/classifier_bench.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents import RuleProvider
from pantheon.scenario import RulesProviderConfig, load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "support_email.yaml"
DATASET = ROOT / "scenarios" / "data" / "support_emails.jsonl"
TARGET = 5.0


def emails() -> list[tuple[str, str]]:
    out = []
    for line in DATASET.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        subject, body = record.get("subject"), record.get("body")
        if isinstance(subject, str) and isinstance(body, str):
            out.append((subject, body))
    return out


def ns_per_email(classify: Callable[[str, str], Any], data: list[tuple[str, str]]) -> float:
    started = time.process_time_ns()
    for subject, body in data:
        classify(subject, body)
    return (time.process_time_ns() - started) / len(data)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--json", type=Path, default=ROOT / "benchmarks/results/classifier_bench.json"
    )
    args = parser.parse_args()

    config = load_scenario(SCENARIO).provider
    assert isinstance(config, RulesProviderConfig)
    provider = RuleProvider(config.rules, config.default_intent, intents=config.intents)
    data = emails()
    for subject, body in data:
        want = provider._classify_reference(subject, body)
        if provider._classify(subject, body) != want:
            sys.exit(f"different verdicts for {subject!r}: not measuring")
    variants = {"per-pattern": provider._classify_reference, "one scan": provider._classify}
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for classify in variants.values():
        ns_per_email(classify, data)  # warm-up
    for _ in range(args.repeats):
        for name, classify in variants.items():
            runs[name].append(ns_per_email(classify, data))
    medians = {name: statistics.median(rs) for name, rs in runs.items()}
    speedup = medians["per-pattern"] / medians["one scan"]

    print(f"rule classifier, {len(data)} support emails, median of {args.repeats} (CPU time)")
    for name, median in medians.items():
        print(f"  {name:<12}{median:>12,.0f} ns/email")
    verdict = "PASS" if speedup >= TARGET else "FAIL"
    print(f"  speed-up    {speedup:>12.2f}x   {verdict} (target >= {TARGET:g}x)")
    print(f"  loadavg     {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    results = {
        "benchmark": "classifier_bench",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "loadavg_end": os.getloadavg(),
        "emails": len(data),
        "repeats": args.repeats,
        "median_ns_per_email": medians,
        "speedup": speedup,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
