#!/usr/bin/env python3
"""One subsystem's part of a saved SPDK config: prints the "config" list of SUBSYSTEM from
save_config's JSON (FILE, or stdin) as one line of JSON.

Usage: subsystem_config.py SUBSYSTEM [CONFIG.json]; exits 1 naming the subsystem when the
config has none.
"""
import json
import sys


def main():
    name = sys.argv[1]
    c = json.load(open(sys.argv[2]) if len(sys.argv) > 2 else sys.stdin)
    found = [s["config"] for s in c["subsystems"] if s["subsystem"] == name]
    if not found:
        sys.exit("subsystem_config: no subsystem %s in the config" % name)
    print(json.dumps(found[0]))


if __name__ == "__main__":
    main()
