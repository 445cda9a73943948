#!/usr/bin/env python3
"""A bdevperf perform_tests result (JSON file): every job finished, no IO failed, and
some IO was done. Prints the jobs, the IOs and the failed ones.

Usage: results_clean.py RESULT.json
"""
import json
import sys

import check


def main():
    r = json.load(open(sys.argv[1]))
    jobs = r.get("results", [])
    bad = [j for j in jobs if j.get("io_failed", 0) or j.get("status") != "finished"]
    ios = sum(j.get("iops", 0) * j.get("runtime", 0) for j in jobs)
    print("jobs=%d ios=%.0f io_failed=%d" % (len(jobs), ios, sum(j.get("io_failed", 0) for j in jobs)))
    sys.exit(1 if bad or not jobs or ios <= 0 else 0)


if __name__ == "__main__":
    check.run(main)
