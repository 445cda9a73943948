#!/usr/bin/env python3
"""rtrs_target_get_exports and rtrs_target_get_sessions (JSON files) of the openers
scenario: malloc0's openers op-rw (rw) and op-ro (ro) over tcp with one connected path
to PORT each, opened between T0 and T1, malloc1 without openers, and each session's
devices matching its opener.

Usage: openers.py EXPORTS.json TARGET_SESSIONS.json T0 T1 PORT
"""
import json
import sys

import check


def main():
    exports = {e["export_name"]: e for e in json.load(open(sys.argv[1]))}
    sessions = json.load(open(sys.argv[2]))
    t0, t1, port = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    op = {o["sessname"]: o for o in exports["malloc0"]["openers"]}
    assert sorted(op) == ["op-ro", "op-rw"], exports["malloc0"]
    assert op["op-rw"]["access_mode"] == "rw" and op["op-ro"]["access_mode"] == "ro", op
    for o in op.values():
        assert o["transport"] == "tcp" and o["export"] == "malloc0", o
        assert t0 - 5 <= o["opened_at"] <= t1 + 5, "opened_at %d not within [%d, %d]" % (o["opened_at"], t0, t1)
        assert len(o["paths"]) == 1, o
        p = o["paths"][0]
        assert p["addr"].startswith("127.0.0.1:") and p["addr"].endswith("@127.0.0.1:" + port), p
        assert p["state"] == "connected" and "hca_name" in p and "hca_port" in p, p
    assert exports["malloc1"]["openers"] == [], exports["malloc1"]
    for s in sessions:
        devs = s["devices"]
        want = op[s["sessname"]]
        assert [(d["export_name"], d["access_mode"], d["device_id"]) for d in devs] == \
            [("malloc0", want["access_mode"], want["device_id"])], s
    print("openers: %s" % ", ".join("%s (%s, device %d, %s)" % (n, o["access_mode"], o["device_id"],
                                     o["paths"][0]["addr"]) for n, o in sorted(op.items())))


if __name__ == "__main__":
    check.run(main)
