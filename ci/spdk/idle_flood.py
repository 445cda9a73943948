#!/usr/bin/env python3
"""Opens 1500 TCP connections to 127.0.0.1:PORT from 127.0.0.2-4 that never write (prints
"flooding" after 500), then checks that the target closes every one within 60 s
without sending data on any. Exit status 1 with what was wrong otherwise.

Usage: idle_flood.py PORT
"""
import socket
import sys

import check
import time


def main():
    port = int(sys.argv[1])
    socks = []
    for i in range(1500):
        s = socket.socket()
        s.bind(("127.0.0.%d" % (2 + i % 3), 0))
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        socks.append(s)
        if i == 500:
            print("flooding", flush=True)
    start = time.time()
    n = len(socks)
    while socks and time.time() < start + 60:
        left = []
        for s in socks:
            try:
                if s.recv(64):
                    sys.exit("the target sent data to an idle socket")
            except BlockingIOError:
                left.append(s)
                continue
            except OSError:
                pass
        socks = left
        time.sleep(0.1)
    if socks:
        sys.exit("%d of %d idle sockets still open after 60 s" % (len(socks), n))
    print("all %d idle sockets closed by the target (%.1f s after the last was opened)"
          % (n, time.time() - start))


if __name__ == "__main__":
    check.run(main)
