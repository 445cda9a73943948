#!/usr/bin/env python3
"""The saved configs of a PSK target and client (JSON files) name key0 on the listener and
on both devices' paths, keep their keyring_file_add_key calls, and hold none of the
keys themselves (KEY0, KEY1: the key files).

Usage: psk_saved.py TGT_CONFIG.json CLT_CONFIG.json KEY0 KEY1
"""
import json
import sys

import check


def main():
    tgt, clt = (json.load(open(f)) for f in sys.argv[1:3])
    secrets = [open(f).read().strip() for f in sys.argv[3:5]]
    assert [l.get("psk") for l in check.calls(tgt, "rtrs_target_listen")] == ["key0"], check.calls(tgt, "rtrs_target_listen")
    assert [p.get("psk") for b in check.calls(clt, "bdev_rtrs_create") for p in b["paths"]] == ["key0", "key0"], check.calls(clt, "bdev_rtrs_create")
    assert check.calls(tgt, "keyring_file_add_key") and check.calls(clt, "keyring_file_add_key")
    for s in secrets:
        for c in (tgt, clt):
            assert s[:16] not in json.dumps(c), "a key is in a saved config"
    print("saved configs name key0 and hold no key")


if __name__ == "__main__":
    check.run(main)
