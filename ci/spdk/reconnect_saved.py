#!/usr/bin/env python3
"""The client's save_config (JSON file) keeps max_reconnect_attempts 2 and
loss_timeout_sec -1 on its bdev_rtrs_create calls.

Usage: reconnect_saved.py SAVED_CONFIG.json
"""
import json
import sys


def main():
    for sub in json.load(open(sys.argv[1]))["subsystems"]:
        for c in sub.get("config") or []:
            if c["method"] == "bdev_rtrs_create":
                p = c["params"]
                assert (p["max_reconnect_attempts"], p["loss_timeout_sec"]) == (2, -1), p
    print("save_config: max_reconnect_attempts 2, loss_timeout_sec -1")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        sys.exit("reconnect_saved: %s" % e)
