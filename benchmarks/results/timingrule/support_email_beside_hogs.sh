#!/bin/bash
# support_email beside two busy loops; prints the timing checks' states
cd "$(dirname "$0")"
hogs=""
for i in $(seq 1 ${HOGS:-2}); do python3 -c "while True: pass" & hogs="$hogs $!"; done
sleep 0.3
for r in $(seq 1 ${RUNS:-3}); do
  uptime | sed 's/.*load/load/'
  pantheon run ../../../scenarios/support_email.yaml --json ${REC:---store /tmp/se.db} > /tmp/se_$r.json; echo "exit $?"
  python - <<'PY' $r
import json,sys
d=json.load(open(f"/tmp/se_{sys.argv[1]}.json"))
print("share", d["scheduling"].get("share"), "passed", d["passed"])
from collections import Counter
print(Counter(e["state"] for e in d["expectations"]))
for e in d["expectations"]:
    if e["state"]!="passed": print("  ", e["state"], e["name"], e["actual"], "|", e.get("why"))
own=max(h.get("own_p99_ms",0) for h in d["hops"].values()); cpu=max(h["cpu_p99_ms"] for h in d["hops"].values())
hand=max(h["handle_p99_ms"] for h in d["hops"].values()); wait=max(h["wait_p99_ms"] for h in d["hops"].values())
print(f"  max handle_p99 {hand:.2f} own_p99 {own:.2f} cpu_p99 {cpu:.2f} wait_p99 {wait:.2f}")
PY
done
kill $hogs
