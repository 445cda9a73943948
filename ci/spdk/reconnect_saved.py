#!/usr/bin/env python3
"""The client's save_config (JSON file) keeps max_reconnect_attempts 2 and
loss_timeout_sec -1 on its bdev_rtrs_create calls.

Usage: reconnect_saved.py SAVED_CONFIG.json
"""
import json
import sys

import check


def main():
    saved = check.calls(json.load(open(sys.argv[1])), "bdev_rtrs_create")
    assert saved, "no bdev_rtrs_create in the saved config"
    for p in saved:
        assert (p["max_reconnect_attempts"], p["loss_timeout_sec"]) == (2, -1), p
    print("save_config: max_reconnect_attempts 2, loss_timeout_sec -1")


if __name__ == "__main__":
    check.run(main)
