#!/usr/bin/env python3
"""The target's address of a session's path to one of its ports: reads
rtrs_target_get_sessions (JSON) on stdin and prints the "addr" of every path whose
address ends in "@127.0.0.1:PORT".

Usage: rpc.py ... rtrs_target_get_sessions | target_path.py PORT
"""
import json
import sys


def main():
    port = sys.argv[1]
    for s in json.load(sys.stdin):
        for p in s["paths"]:
            if p["addr"].endswith("@127.0.0.1:" + port):
                print(p["addr"])


if __name__ == "__main__":
    main()
