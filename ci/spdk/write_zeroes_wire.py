#!/usr/bin/env python3
"""What write_zeroes put on the wire, from the target's rtrs_target_get_sessions (JSON
file): in MODE emulate zero-filled 64 KiB WRITEs (data arrives), in native RNBD op 5
without data (only headers, under 4 KiB per write on average).

Usage: write_zeroes_wire.py TARGET_SESSIONS.json MODE
"""
import json
import sys

import check


def main():
    sessions, mode = json.load(open(sys.argv[1])), sys.argv[2]
    paths = [p for s in sessions if s["sessname"] == "sess-rtrs0" for p in s["paths"]]
    cnt = sum(p["write_cnt"] for p in paths)
    avg = sum(p["write_bytes"] for p in paths) / max(cnt, 1)
    print("%s: %d writes at the target, %.0f bytes each on average" % (mode, cnt, avg))
    assert cnt > 0, "no writes reached the target"
    if mode == "emulate":
        assert avg >= 65536, "write-zeroes did not arrive as 64 KiB writes of zeros"
    else:
        assert avg < 4096, "native write-zeroes carried data"


if __name__ == "__main__":
    check.run(main)
