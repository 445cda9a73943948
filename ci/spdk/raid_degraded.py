#!/usr/bin/env python3
"""bdev_raid_get_bdevs (JSON file) after one leg's target died: raid1 online with 1 of
its 2 base bdevs.

Usage: raid_degraded.py RAID_BDEVS.json
"""
import json
import sys

import check


def main():
    r = [x for x in json.load(open(sys.argv[1])) if x["name"] == "raid1"][0]
    print("raid1: %s, %d of %d base bdevs" % (r["state"], r["num_base_bdevs_discovered"], r["num_base_bdevs"]))
    assert r["state"] == "online" and r["num_base_bdevs_discovered"] == 1 and r["num_base_bdevs"] == 2, r


if __name__ == "__main__":
    check.run(main)
