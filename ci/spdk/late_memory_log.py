#!/usr/bin/env python3
"""The bdevperf log of late_memory: SPDK memory was registered with the session after
the rtrs bdevs were created (otherwise the test did not exercise late memory).

Usage: late_memory_log.py BDEVPERF.log
"""
import re
import sys

import check


def main():
    log = open(sys.argv[1], errors="replace").read().splitlines()
    made = [i for i, l in enumerate(log) if re.search(r"rtrs bdev rtrs\d: .* blocks of", l)]
    regs = [i for i, l in enumerate(log) if "SPDK memory" in l and l.rstrip().endswith(" registered")]
    assert made, "no bdev was registered"
    late = [i for i in regs if i > made[-1]]
    print("%d SPDK memory region(s) registered with the session, %d after the bdevs were created" % (len(regs), len(late)))
    assert late, "no memory was registered after the bdevs: the test did not exercise late memory"


if __name__ == "__main__":
    check.run(main)
