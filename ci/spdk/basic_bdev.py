#!/usr/bin/env python3
"""The rtrs bdev of the basic scenario (bdev_get_bdevs JSON): an rtrs product, 4 KiB
blocks, 64 MiB (the remote malloc bdev's geometry) and every IO type the module serves.

Usage: basic_bdev.py BDEV_GET_BDEVS.json
"""
import json
import sys

import check


def main():
    b = json.load(open(sys.argv[1]))[0]
    assert b["product_name"].lower().startswith("rtrs"), b["product_name"]
    assert b["block_size"] == 4096, b["block_size"]
    assert b["num_blocks"] * b["block_size"] == 64 << 20, b["num_blocks"]
    for t in ("read", "write", "flush", "unmap", "write_zeroes", "reset"):
        assert b["supported_io_types"][t], t
    print("bdev ok: %d x %d" % (b["num_blocks"], b["block_size"]))


if __name__ == "__main__":
    check.run(main)
