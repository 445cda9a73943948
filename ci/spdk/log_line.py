#!/usr/bin/env python3
"""The first line of a log holding every WORD: prints it (stripped, at most 300
characters), or nothing when no line has them all.

Usage: log_line.py LOG WORD...
"""
import sys


def main():
    words = sys.argv[2:]
    for line in open(sys.argv[1], errors="replace"):
        if all(w in line for w in words):
            print(line.strip()[:300])
            break


if __name__ == "__main__":
    main()
