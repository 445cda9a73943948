#!/usr/bin/env python3
"""The target's rtrs_target_get_sessions (JSON file) holds exactly one session named
basic-sess (both devices of the client share it).

Usage: basic_target_sessions.py TARGET_SESSIONS.json
"""
import json
import sys

import check


def main():
    s = [x for x in json.load(open(sys.argv[1])) if x["sessname"] == "basic-sess"]
    assert len(s) == 1, "the target holds %d sessions named basic-sess" % len(s)
    print("the target holds one session for both devices")


if __name__ == "__main__":
    check.run(main)
