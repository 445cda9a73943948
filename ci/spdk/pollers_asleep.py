"""Whether every rtrs poller of the target's SPDK threads sleeps (docs/ARCHITECTURE.md,
"Interrupt mode"): none is run on each wake-up of its thread, and each sleeps the period
of a poller that a descriptor wakes (20 ms), none the 1 ms of one without a descriptor.

Usage: pollers_asleep.py THREAD_GET_POLLERS.json LABEL; exit status 0 when asleep, 1 (with
what runs) when not yet.
"""
import json
import sys

WOKEN_MS = 20  # WOKEN_IDLE_US
UNWOKEN_MS = 1  # INTR_PACE.idle_us

d = json.load(open(sys.argv[1]))
label = sys.argv[2]
hz = d["tick_rate"]
threads = [t for t in d["threads"] if t["name"].startswith("rtrs_target")]
assert threads, "no rtrs_target thread: %s" % [t["name"] for t in d["threads"]]
active = [p["name"] for t in threads for p in t.get("active_pollers", [])
          if p["name"].startswith("rtrs")]
timed = sorted({p["period_ticks"] * 1000 // hz for t in threads
                for p in t.get("timed_pollers", []) if p["name"] == "rtrs"})
if active or WOKEN_MS not in timed or UNWOKEN_MS in timed:
    print("   %s: rtrs pollers run on every wake-up: %s; timed (ms): %s" % (label, active, timed))
    sys.exit(1)
print("%s: every rtrs poller of %d target thread(s) sleeps, woken by its descriptors; periods %s ms"
      % (label, len(threads), timed))
