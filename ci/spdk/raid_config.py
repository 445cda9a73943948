#!/usr/bin/env python3
"""Prints the bdevperf --json config of raid_loss: rtrs bdevs ra and rb (to ports A and
B, loss_timeout_sec 4) and bdev_raid1 "raid1" over them.

Usage: raid_config.py A B
"""
import json
import sys

import check


def main():
    def rtrs(name, port):
        return {"method": "bdev_rtrs_create", "params": {
            "name": name, "sessname": "sess-" + name, "device": "malloc0", "access_mode": "rw",
            "paths": [{"transport": "tcp", "dst_addr": "127.0.0.1", "port": int(port)}],
            "reconnect_delay_sec": 1, "hb_interval_ms": 500, "hb_missed_max": 2,
            "io_timeout_sec": 2, "loss_timeout_sec": 4}}
    config = [rtrs("ra", sys.argv[1]), rtrs("rb", sys.argv[2]),
              {"method": "bdev_raid_create", "params": {"name": "raid1", "raid_level": "raid1",
                                                        "base_bdevs": ["ra", "rb"]}},
              {"method": "bdev_wait_for_examine"}]
    print(json.dumps({"subsystems": [{"subsystem": "bdev", "config": config}]}, indent=2))


if __name__ == "__main__":
    check.run(main)
