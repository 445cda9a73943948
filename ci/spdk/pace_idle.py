#!/usr/bin/env python3
"""Whether every rtrs poller of the client (thread_get_pollers JSON file) is on its idle
period (62.5 ms for a 1000 ms heartbeat). Exit status 1 (with the periods seen) when
not yet, so the caller samples again.

Usage: pace_idle.py THREAD_GET_POLLERS.json
"""
import json
import sys

import check


def main():
    d = json.load(open(sys.argv[1]))
    hz = d["tick_rate"]
    ours = [p for t in d["threads"] for kind in ("active_pollers", "timed_pollers", "paused_pollers")
            for p in t.get(kind, []) if p["name"] == "rtrs"]
    assert ours, "no rtrs poller on any thread: %s" % d
    idle = 62_500 * hz // 1_000_000
    periods = sorted({p["period_ticks"] for p in ours})
    if periods != [idle]:
        print("   rtrs pollers' periods %s ticks, waiting for all %d (62.5 ms)" % (periods, idle))
        sys.exit(1)
    print("%d rtrs pollers, all on the 62.5 ms idle period" % len(ours))


if __name__ == "__main__":
    check.run(main)
