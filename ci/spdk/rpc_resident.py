#!/usr/bin/env python3
"""SPDK's scripts/rpc.py (and rpc_raw.py) kept resident for the test scripts.

Usage: rpc_resident.py RPC_PY DIR

Every `rpc` of ci/spdk/lib.sh used to start Python, import SPDK's package and build
rpc.py's parser of several hundred methods: about 0.2 s of CPU, on cores the busy-polling
SPDK applications hold, for a request the application answers in microseconds. This
process does that once. It listens on 127.0.0.1 (a port the kernel picks) and writes,
in DIR, `rpc.token` (a random secret, mode 0600) and then `rpc.port`; lib.sh's bash
client connects with /dev/tcp, so a command costs no process at all.

One command per connection, each field ending in a NUL byte:
    request:  TOKEN, KIND ("rpc" or "raw"), N, then N arguments
    reply:    EXIT-STATUS, STDOUT, STDERR
`rpc` runs rpc.py's command line (`-s SOCKET --plugin rtrs_rpc METHOD ...`) as rpc.py
itself would, with the same output and exit status (1 for an error the application
answered, 2 for a bad command line); `raw` runs rpc_raw.py's; status 255 says the
command was not run (see `NOT_HERE`). A request without the token is dropped unanswered. Connections are served in threads of their own, so a call
that waits (a create that connects, a reset) does not hold back the others; each
thread's output is its own. No command reads standard input (it is empty here).

The process ends when its parent (the script that started it) is gone.
"""
import argparse
import contextlib
import importlib.util
import io
import os
import secrets
import socket
import sys
import threading
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
# The exit status meaning "not run: run rpc.py itself" (a command this process does not
# take: no method, --dry-run, --go-client); rpc.py never exits with it.
NOT_HERE = 255


class PerThread(io.TextIOBase):
    """A stream writing into the calling thread's buffer (the real one outside a call)."""

    def __init__(self, real):
        self.real = real
        self.local = threading.local()

    def write(self, s):
        buf = getattr(self.local, "buf", None)
        return (buf if buf is not None else self.real).write(s)

    def flush(self):
        if getattr(self.local, "buf", None) is None:
            self.real.flush()

    @contextlib.contextmanager
    def capture(self):
        self.local.buf = io.StringIO()
        try:
            yield self.local.buf
        finally:
            self.local.buf = None


OUT = PerThread(sys.stdout)
ERR = PerThread(sys.stderr)


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Rpc:
    """rpc.py's single-command path, its parser built once."""

    def __init__(self, rpc_py):
        self.mod = load(rpc_py, "spdk_rpc_py")
        self.parser, self.subparsers = self.mod.create_parser()
        self.plugins = []
        self.lock = threading.Lock()

    def run(self, argv):
        m = self.mod
        m.replace_arg_underscores(argv)
        with self.lock:
            # A plugin named on the command line adds its methods to the parser once.
            m.load_plugin(argv, self.subparsers, self.plugins)
        args = self.parser.parse_args(argv)
        if not hasattr(args, "func") or args.dry_run or args.go_client:
            return NOT_HERE
        level = getattr(m.logging, args.verbose.upper())
        try:
            args.client = m.JSONRPCClient(
                args.server_addr,
                args.port,
                args.timeout,
                log_level=level,
                conn_retries=args.conn_retries,
            )
        except m.JSONRPCException as ex:
            print(ex.message)
            return 1
        try:
            m.call_rpc_func(args)
            return 0
        except m.JSONRPCException as ex:
            print(ex.message)
            return 1
        finally:
            args.client.close()
            # rpc.py's client adds a log handler per client, to a logger per socket.
            args.client.get_logger().handlers.clear()


def serve_one(conn, token, kinds):
    with conn:
        conn.settimeout(None)
        f = conn.makefile("rb")

        def field():
            b = bytearray()
            while True:
                c = f.read(1)
                if not c:
                    raise EOFError
                if c == b"\0":
                    return b.decode()
                b += c

        try:
            if not secrets.compare_digest(field(), token):
                return
            kind = field()
            fields = [field() for _ in range(int(field()))]
        except (EOFError, ValueError, UnicodeDecodeError):
            return
        run = kinds.get(kind)
        with OUT.capture() as out, ERR.capture() as err:
            try:
                if run is None:
                    print(f"rpc_resident: no command kind {kind!r}", file=sys.stderr)
                    status = 2
                else:
                    status = run(fields)
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # rpc.py would die with a traceback and status 1
                traceback.print_exc()
                status = 1
        reply = b"".join(s.encode() + b"\0" for s in (str(status), out.getvalue(), err.getvalue()))
        try:
            conn.sendall(reply)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rpc_py")
    ap.add_argument("dir")
    a = ap.parse_args()
    # Usage and error lines name rpc.py, as the script itself would.
    sys.argv[0] = "rpc.py"
    sys.stdin = io.StringIO()
    sys.stdout, sys.stderr = OUT, ERR
    rpc = Rpc(a.rpc_py)
    raw = load(os.path.join(HERE, "rpc_raw.py"), "rpc_raw")

    kinds = {"rpc": rpc.run, "raw": raw.main}
    token = secrets.token_hex(16)
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    lsock.settimeout(1.0)
    tok_path, port_path = os.path.join(a.dir, "rpc.token"), os.path.join(a.dir, "rpc.port")
    fd = os.open(tok_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as t:
        t.write(token)
    with open(port_path + ".new", "w") as p:
        p.write(str(lsock.getsockname()[1]))
    os.rename(port_path + ".new", port_path)
    parent = os.getppid()
    while os.getppid() == parent:
        try:
            conn, _ = lsock.accept()
        except socket.timeout:
            continue
        threading.Thread(target=serve_one, args=(conn, token, kinds), daemon=True).start()


if __name__ == "__main__":
    main()
