#!/usr/bin/env python3
"""The saved configs of a PSK target and client (JSON files) name key0 on the listener and
on both devices' paths, keep their keyring_file_add_key calls, and hold none of the
keys themselves (KEY0, KEY1: the key files).

Usage: psk_saved.py TGT_CONFIG.json CLT_CONFIG.json KEY0 KEY1
"""
import json
import sys


def main():
    tgt, clt = (json.load(open(f)) for f in sys.argv[1:3])
    secrets = [open(f).read().strip() for f in sys.argv[3:5]]
    def calls(cfg, method):
        return [c["params"] for s in cfg["subsystems"] for c in (s["config"] or []) if c["method"] == method]
    assert [l.get("psk") for l in calls(tgt, "rtrs_target_listen")] == ["key0"], calls(tgt, "rtrs_target_listen")
    assert [p.get("psk") for b in calls(clt, "bdev_rtrs_create") for p in b["paths"]] == ["key0", "key0"], calls(clt, "bdev_rtrs_create")
    assert calls(tgt, "keyring_file_add_key") and calls(clt, "keyring_file_add_key")
    for s in secrets:
        for c in (tgt, clt):
            assert s[:16] not in json.dumps(c), "a key is in a saved config"
    print("saved configs name key0 and hold no key")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        sys.exit("psk_saved: %s" % e)
