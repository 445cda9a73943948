#!/usr/bin/env python3
"""A client rebuilt from its saved config (bdev_rtrs_get_sessions JSON file): one
session, mp_policy round-robin, devices rtrs0 (write_zeroes native) and rtrs1 (emulate).

Usage: config_restored.py SESSIONS.json
"""
import json
import sys

import check


def main():
    s = json.load(open(sys.argv[1]))
    assert len(s) == 1 and s[0]["mp_policy"] == "round-robin", "policy not restored: %s" % s
    modes = {d["name"]: d["write_zeroes"] for d in s[0]["devices"]}
    assert modes == {"rtrs0": "native", "rtrs1": "emulate"}, "devices or write_zeroes not restored: %s" % modes
    print("restored: one session, %s" % modes)


if __name__ == "__main__":
    check.run(main)
