#!/usr/bin/env python3
"""A bdevperf reset-workload result (JSON file): every job finished and IO was done (IO
the bdev layer refuses while a reset freezes the channels counts as failed and is
allowed).

Usage: reset_result.py RESULT.json
"""
import json
import sys

import check


def main():
    r = json.load(open(sys.argv[1]))
    jobs = r.get("results", [])
    done = sum(j.get("iops", 0) * j.get("runtime", 0) for j in jobs)
    print("jobs=%d ios=%.0f io_failed(aborted by the resets' freeze)=%d" % (
        len(jobs), done, sum(j.get("io_failed", 0) for j in jobs)))
    sys.exit(0 if jobs and done > 0 and all(j.get("status") == "finished" for j in jobs) else 1)


if __name__ == "__main__":
    check.run(main)
