#!/usr/bin/env python3
"""After path_flap (bdev_rtrs_get_sessions JSON file): each path reconnected exactly as
often as it was broken and is connected; a path closed other than by its breaks fails.

Usage: flap_reconnects.py SESSIONS.json PORT0 BREAKS0 PORT1 BREAKS1
"""
import json
import sys

import check


def main():
    paths = json.load(open(sys.argv[1]))[0]["stats"]["paths"]
    ok = True
    for port, breaks in ((sys.argv[2], int(sys.argv[3])), (sys.argv[4], int(sys.argv[5]))):
        p = [x for x in paths if x["path"].endswith(":" + port)]
        if len(p) != 1:
            print("no statistics of the path to port %s: %s" % (port, paths))
            ok = False
            continue
        p = p[0]
        rec = p["reconnects"]["successful"]
        print("path :%s: broken %d times, reconnected %d times, %s, %d requests failed over onto it"
              % (port, breaks, rec, p["state"], p["rdma"]["failover_cnt"]))
        if rec != breaks or p["state"] != "connected":
            print("   the path was closed other than by its breaks")
            ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    check.run(main)
