#!/usr/bin/env python3
"""Whether `ss -K` (SOCK_DESTROY) closes sockets on this machine: holds both ends of a
connection on 127.0.0.3, kills it with ss -K and checks the reset. Exit status 0 when it
works.

Usage: sock_destroy_works.py
"""
import socket
import subprocess
import sys

import check


def main():
    l = socket.socket(); l.bind(("127.0.0.3", 0)); l.listen(1)
    port = l.getsockname()[1]
    c = socket.create_connection(("127.0.0.3", port)); s, _ = l.accept()
    subprocess.run(["ss", "-K", "-t", "-4", "dst", "127.0.0.3", "dport", "=", ":%d" % port], capture_output=True)
    c.settimeout(0.5)
    try:
        sys.exit(0 if c.recv(1) == b"" else 1)
    except socket.timeout:
        sys.exit(1)
    except OSError:
        sys.exit(0)


if __name__ == "__main__":
    check.run(main)
