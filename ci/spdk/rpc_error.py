#!/usr/bin/env python3
"""Whether a JSON-RPC response (as rpc_raw.py prints it) is an error whose message contains
every WORD (an empty WORD is in every message).

Usage: rpc_error.py RESPONSE_JSON WORD...; exit status 0 when it is, 1 (saying what the
message lacks) when not.
"""
import json
import sys


def main():
    r = json.loads(sys.argv[1])
    words = sys.argv[2:]
    e = r.get("error") or {}
    m = e.get("message", "")
    if not r.get("error"):
        sys.exit("rpc_error: not an error response")
    missing = [w for w in words if w not in m]
    if missing:
        sys.exit("rpc_error: the message does not contain %s" % ", ".join(repr(w) for w in missing))


if __name__ == "__main__":
    main()
