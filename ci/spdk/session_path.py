#!/usr/bin/env python3
"""One field of the client's path to a port: reads bdev_rtrs_get_sessions (JSON) on stdin
and prints FIELD (e.g. state, failure) of the first session's path whose address ends in
":PORT", when that path has it set; prints nothing otherwise.

Usage: rpc.py ... bdev_rtrs_get_sessions -b BDEV | session_path.py FIELD PORT
"""
import json
import sys


def main():
    field, port = sys.argv[1:3]
    for p in json.load(sys.stdin)[0]["paths"]:
        if p["path"].endswith(":" + port) and p.get(field):
            print(p[field])


if __name__ == "__main__":
    main()
