#!/usr/bin/env python3
"""Whether a JSON-RPC response (as rpc_raw.py prints it) is an error whose message contains
every WORD (an empty WORD is in every message).

Usage: rpc_error.py RESPONSE_JSON WORD...; exit status 0 when it is, 1 (saying what the
message lacks) when not. `missing_words` is also used by rpc_errors.py.
"""
import json
import sys


def missing_words(r, words):
    """None when response object `r` is an error whose message contains every word, else
    what is wrong."""
    e = r.get("error") or {}
    if not e:
        return "not an error response"
    m = e.get("message", "")
    missing = [w for w in words if w not in m]
    if missing:
        return "the message does not contain %s" % ", ".join(repr(w) for w in missing)
    return None


def main():
    why = missing_words(json.loads(sys.argv[1]), sys.argv[2:])
    if why:
        sys.exit("rpc_error: " + why)


if __name__ == "__main__":
    main()
