#!/usr/bin/env python3
"""Whether a bdev has completed IO: reads bdev_get_iostat -b BDEV (JSON) on stdin; exit
status 0 when its read and write operations are more than 0, 1 otherwise.

Usage: rpc.py ... bdev_get_iostat -b BDEV | bdev_io_done.py
"""
import json
import sys


def main():
    b = json.load(sys.stdin)["bdevs"][0]
    sys.exit(0 if b["num_read_ops"] + b["num_write_ops"] > 0 else 1)


if __name__ == "__main__":
    main()
