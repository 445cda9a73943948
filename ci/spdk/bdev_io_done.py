#!/usr/bin/env python3
"""Whether a bdev has completed IO: reads bdev_get_iostat -b BDEV (JSON) on stdin; exit
status 0 when its read and write operations are more than 0, 1 otherwise. With
--writes only its writes count: the reads of the bdev layer's own examine, done when the
bdev appears, are then no sign that a workload that writes (bdevperf's verify, say) runs.

Usage: rpc.py ... bdev_get_iostat -b BDEV | bdev_io_done.py [--writes]
"""
import json
import sys


def main():
    b = json.load(sys.stdin)["bdevs"][0]
    ops = b["num_write_ops"] if sys.argv[1:] == ["--writes"] else b["num_read_ops"] + b["num_write_ops"]
    sys.exit(0 if ops > 0 else 1)


if __name__ == "__main__":
    main()
