#!/usr/bin/env python3
"""Whether a bdev has completed writes: reads bdev_get_iostat -b BDEV (JSON) on stdin; exit
status 0 when its write operations are more than 0, 1 otherwise. Writes, not reads: the
bdev layer's own examine reads a bdev when it appears, so reads are no sign that a
workload that writes (bdevperf's verify, say) runs.

Usage: rpc.py ... bdev_get_iostat -b BDEV | bdev_io_done.py
"""
import json
import sys


def main():
    b = json.load(sys.stdin)["bdevs"][0]
    sys.exit(0 if b["num_write_ops"] > 0 else 1)


if __name__ == "__main__":
    main()
