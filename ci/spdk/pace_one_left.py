#!/usr/bin/env python3
"""Whether exactly one rtrs poller (home's) is left in thread_get_pollers (JSON file)
after bdev_rtrs_delete. Exit status 1 when not yet.

Usage: pace_one_left.py THREAD_GET_POLLERS.json
"""
import json
import sys

import check


def main():
    d = json.load(open(sys.argv[1]))
    left = [p for t in d["threads"] for kind in ("active_pollers", "timed_pollers", "paused_pollers")
            for p in t.get(kind, []) if p["name"] == "rtrs"]
    if len(left) != 1:
        sys.exit(1)
    print("one rtrs poller left (home's), period %d ticks" % left[0]["period_ticks"])


if __name__ == "__main__":
    check.run(main)
