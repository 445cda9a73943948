#!/usr/bin/env python3
"""The rtrs bdev over geo0 (bdev_get_bdevs JSON file) has its geometry: 512-byte blocks,
32 MiB, 4 KiB physical blocks, 8 KiB max IO and IO boundary, a write cache with FUA.

Usage: geometry.py BDEV_GET_BDEVS.json
"""
import json
import sys

import check


def main():
    b = json.load(open(sys.argv[1]))[0]
    i = b["driver_specific"]["rtrs"]["device_info"]
    print("block %d, physical %d, max IO %d, io boundary %d, write cache %s" % (
        b["block_size"], i["physical_block_size"], i["max_io_size"], i["io_boundary"], i["write_cache"]))
    assert b["block_size"] == 512 and b["num_blocks"] * 512 == 32 << 20, b
    assert i["physical_block_size"] == 4096, i
    assert i["max_io_size"] == 8192 and i["io_boundary"] == 8192, i
    # A malloc bdev has a volatile write cache: the target says so, and honours FUA (as a
    # write and a flush).
    assert i["write_cache"] is True and i["fua"] is True, i


if __name__ == "__main__":
    check.run(main)
