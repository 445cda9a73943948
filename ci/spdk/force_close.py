#!/usr/bin/env python3
"""After rtrs_target_force_close of malloc0 for sess-rtrs0 (JSON files: the call's
answer, get_exports, the next bdevperf result, the client's sessions): the mapping is
gone, IO to rtrs0 failed and rtrs0 is "closed by the server", rtrs1 open with no
failed IO.

Usage: force_close.py CLOSED.json EXPORTS.json RESULT.json SESSIONS.json
"""
import json
import sys

import check


def main():
    closed = json.load(open(sys.argv[1]))
    assert [(c["export"], c["sessname"], c["access_mode"]) for c in closed] == [("malloc0", "sess-rtrs0", "rw")], closed
    assert json.load(open(sys.argv[2]))[0]["openers"] == [], "the mapping is still listed"
    jobs = {j["job"]: j for j in json.load(open(sys.argv[3]))["results"]}
    assert jobs["rtrs0"]["io_failed"] > 0, "IO to the closed device did not fail: %s" % jobs["rtrs0"]
    assert jobs["rtrs1"]["io_failed"] == 0, "the session's other device failed IO: %s" % jobs["rtrs1"]
    devs = {d["name"]: d for d in json.load(open(sys.argv[4]))[0]["devices"]}
    assert devs["rtrs0"]["device_state"] == "closed by the server", devs["rtrs0"]
    assert devs["rtrs1"]["device_state"] == "open", devs["rtrs1"]
    print("rtrs0: %d writes failed, closed by the server; rtrs1: %d IOs, none failed"
          % (jobs["rtrs0"]["io_failed"], jobs["rtrs1"]["iops"] * jobs["rtrs1"]["runtime"]))


if __name__ == "__main__":
    check.run(main)
