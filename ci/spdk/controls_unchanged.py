#!/usr/bin/env python3
"""After refused day-two controls: the session's settings (bdev_rtrs_get_sessions JSON
file) are the defaults (-1, 30, -1) with its path connected, and malloc0's openers
(rtrs_target_get_exports JSON file) are bad-sess alone.

Usage: controls_unchanged.py SESSIONS.json EXPORTS.json
"""
import json
import sys

import check


def main():
    s = json.load(open(sys.argv[1]))[0]
    got = (s["max_reconnect_attempts"], s["reconnect_delay_sec"], s["loss_timeout_sec"])
    assert got == (-1, 30, -1), "settings changed by refused calls: %s" % (got,)
    assert s["paths"][0]["state"] == "connected", s["paths"]
    o = json.load(open(sys.argv[2]))[0]["openers"]
    assert [x["sessname"] for x in o] == ["bad-sess"], o
    print("refused controls changed nothing")


if __name__ == "__main__":
    check.run(main)
