#!/usr/bin/env python3
"""Send one raw JSON-RPC request to an SPDK application and print the response object.

Usage: rpc_raw.py [--result] SOCKET METHOD PARAMS_JSON   (PARAMS_JSON "-" sends no params)

With --result it prints the result as one line of JSON (exit status 0), or the error's
message (exit status 1).

rpc.py validates arguments before sending; the bad-parameter tests need to send what a
careless client would, so this talks to the socket directly. `request` is also used by
rpc_errors.py, which sends many requests from one process.
"""
import json
import socket
import sys


CLOSED = {"error": {"code": 0, "message": "connection closed without a response"}}


def request(sock_path, method, params):
    """The response object to one request (`params` a JSON text, "-" for none), or
    `CLOSED` when the application closed the connection without one."""
    req = {"jsonrpc": "2.0", "id": 1, "method": method}
    if params != "-":
        req["params"] = json.loads(params)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(sock_path)
        s.sendall(json.dumps(req).encode())
        buf = b""
        dec = json.JSONDecoder()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            try:
                obj, _ = dec.raw_decode(buf.decode())
            except ValueError:
                continue
            return obj
    finally:
        s.close()
    return CLOSED


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    result = args[:1] == ["--result"]
    if result:
        args = args[1:]
    sock_path, method, params = args[:3]
    obj = request(sock_path, method, params)
    if not result:
        print(json.dumps(obj))
        return 1 if obj is CLOSED else 0
    if "error" in obj:
        print(obj["error"]["message"])
        return 1
    print(json.dumps(obj["result"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
