#!/usr/bin/env python3
"""Checks that each of many bad requests is refused with a message naming what was wrong,
all from one process (a Python start per request made the bad-parameter scenarios slow).

Usage: rpc_errors.py APP_DIR < CASES; each line of CASES is
  APP|METHOD|PARAMS_JSON|WORD[|WORD...]
(blank lines and lines starting with # are skipped): the request goes to APP_DIR/APP.sock
and its response must be an error whose message contains every WORD (rpc_error.py's
test). Prints one line per case that is not; exit status 1 when any is not.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rpc_error import missing_words  # noqa: E402
from rpc_raw import request  # noqa: E402


def main():
    app_dir = sys.argv[1]
    bad = 0
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        app, method, params, *words = line.split("|")
        resp = request(os.path.join(app_dir, app + ".sock"), method, params)
        why = missing_words(resp, words)
        if why:
            field, texts = (words[0] if words else ""), [w for w in words[1:] if w]
            said = " and saying " + ", ".join("'%s'" % w for w in texts) if texts else ""
            print("  %s %s: expected an error naming '%s'%s, got %s (%s)"
                  % (method, params, field, said, json.dumps(resp), why))
            bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
