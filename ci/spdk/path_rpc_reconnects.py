#!/usr/bin/env python3
"""After path_rpc (bdev_rtrs_get_sessions JSON file): the path to port B reconnected
once, the one to A never, and both are connected.

Usage: path_rpc_reconnects.py SESSIONS.json A B
"""
import json
import sys

import check


def main():
    paths = {p["path"].rsplit(":", 1)[1]: p for p in json.load(open(sys.argv[1]))[0]["stats"]["paths"]}
    a, b = paths[sys.argv[2]], paths[sys.argv[3]]
    print("path :%s reconnected %d time(s), path :%s %d" % (sys.argv[3], b["reconnects"]["successful"],
          sys.argv[2], a["reconnects"]["successful"]))
    assert b["reconnects"]["successful"] == 1 and a["reconnects"]["successful"] == 0, paths
    assert a["state"] == b["state"] == "connected", paths


if __name__ == "__main__":
    check.run(main)
