#!/usr/bin/env python3
"""bdev_rtrs_reset_stats zeroed the counters: the first path's read count was non-zero
in BEFORE and read_cnt, the latency histogram and the SG entries are all 0 in AFTER
(both bdev_rtrs_get_sessions JSON files).

Usage: stats_reset.py BEFORE.json AFTER.json
"""
import json
import sys

import check


def main():
    def counts(f):
        p = json.load(open(f))[0]["stats"]["paths"][0]
        return p["rdma"]["read_cnt"], sum(p["latency_hist_log2_ns"]), sum(p["sg_entries"])
    before, after = counts(sys.argv[1]), counts(sys.argv[2])
    assert before[0] > 0, "no read counted before the reset: %s" % (before,)
    assert after == (0, 0, 0), "after bdev_rtrs_reset_stats: read_cnt, latencies, sg entries = %s" % (after,)
    print("statistics reset: read_cnt %d -> 0" % before[0])


if __name__ == "__main__":
    check.run(main)
