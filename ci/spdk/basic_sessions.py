#!/usr/bin/env python3
"""The client's bdev_rtrs_get_sessions (JSON file) holds one session carrying the
devices rtrs0 and rtrs1.

Usage: basic_sessions.py SESSIONS.json
"""
import json
import sys

import check


def main():
    s = json.load(open(sys.argv[1]))
    assert len(s) == 1, "expected one session, got %d" % len(s)
    assert sorted(d["name"] for d in s[0]["devices"]) == ["rtrs0", "rtrs1"], s[0]["devices"]
    print("one session, devices %s" % ", ".join(d["name"] for d in s[0]["devices"]))


if __name__ == "__main__":
    check.run(main)
