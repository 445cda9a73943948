#!/usr/bin/env python3
"""The target's save_config (JSON file) keeps rtrs_target_set_options with
handshake_timeout_ms 1500, max_pending 64 and max_pending_per_source 8.

Usage: admission_saved.py SAVED_CONFIG.json
"""
import json
import sys

import check


def main():
    c = json.load(open(sys.argv[1]))
    o = check.calls(c, "rtrs_target_set_options")
    assert o and o[0]["handshake_timeout_ms"] == 1500 and o[0]["max_pending"] == 64 \
        and o[0]["max_pending_per_source"] == 8, o
    print("save_config keeps", o[0])


if __name__ == "__main__":
    check.run(main)
