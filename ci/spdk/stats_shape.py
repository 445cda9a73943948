#!/usr/bin/env python3
"""Checks the shape of the rtrs statistics RPC answers: every key and its JSON type.

Usage: stats_shape.py bdev FILE     (bdev_rtrs_get_sessions' answer)
       stats_shape.py target FILE   (rtrs_target_get_sessions' answer)

The shapes below are the contract scripts and rpc.py users rely on; a key added,
renamed or retyped fails here with the JSON path of the difference. Exits 0 and prints
one line when the answer matches, else prints the differences and exits 1.
"""
import json
import sys

INT = "int"
STR = "str"
INTS = [INT]
# The RDMA device and port of a path: null on the software fabrics.
OPT_STR = "str or null"
OPT_INT = "int or null"

RDMA = {k: INT for k in ("read_cnt", "read_bytes", "write_cnt", "write_bytes", "inflight",
                         "failover_cnt")}
CLIENT_PATH = {
    "path": STR, "state": STR, "hca_name": OPT_STR, "hca_port": OPT_INT,
    "failure": OPT_STR, "last_error": OPT_STR,
    "cur_latency_ns": INT, "rdma": RDMA,
    "reconnects": {"successful": INT, "failed": INT},
    "cpu_migration_from": INTS, "cpu_migration_to": INTS, "sg_entries": INTS,
    "wc_completion": {"polls": INT, "completions": INT, "max_per_poll": INT},
    "latency_hist_log2_ns": INTS, "direct_reads": INT,
}
CLIENT_STATS = {"sessname": STR, "mp_policy": STR, "paths": [CLIENT_PATH]}

TARGET_PATH = {
    "pathname": STR, "addr": STR, "state": STR, "hca_name": OPT_STR, "hca_port": OPT_INT,
    "cid_num": INT, "recon_cnt": INT,
    "read_cnt": INT, "read_bytes": INT, "write_cnt": INT, "write_bytes": INT,
    "inflight": INT, "failover_waits": INT, "failover_dups": INT, "rsp_queued": INT, "dropped": INT,
    "handler_lat_sum_ns": INT, "handler_lat_us_log2": INTS,
}
TARGET_DEVICE = {"device_id": INT, "export_name": STR, "access_mode": STR, "opened_at": INT}
TARGET_SESSION = {
    "transport": STR, "id": INT, "sessname": STR, "queue_depth": INT, "chunk_size": INT,
    "chunk_memory": STR, "paths": [TARGET_PATH], "devices": [TARGET_DEVICE],
}


def check(value, shape, where, errors):
    """Appends to `errors` every place where `value` differs from `shape`."""
    if shape in (OPT_STR, OPT_INT):
        if value is not None:
            check(value, STR if shape == OPT_STR else INT, where, errors)
    elif shape == INT:
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append("%s: expected an integer, got %r" % (where, value))
    elif shape == STR:
        if not isinstance(value, str):
            errors.append("%s: expected a string, got %r" % (where, value))
    elif isinstance(shape, list):
        if not isinstance(value, list):
            errors.append("%s: expected an array, got %r" % (where, value))
            return
        for i, v in enumerate(value):
            check(v, shape[0], "%s[%d]" % (where, i), errors)
    else:
        if not isinstance(value, dict):
            errors.append("%s: expected an object, got %r" % (where, value))
            return
        for k in sorted(set(value) - set(shape)):
            errors.append("%s: unexpected key %r" % (where, k))
        for k in sorted(set(shape) - set(value)):
            errors.append("%s: missing key %r" % (where, k))
        for k in sorted(set(shape) & set(value)):
            check(value[k], shape[k], "%s.%s" % (where, k), errors)


def main():
    kind, path = sys.argv[1], sys.argv[2]
    answer = json.load(open(path))
    errors = []
    if not isinstance(answer, list) or not answer:
        errors.append("answer: expected a non-empty array, got %r" % (answer,))
    elif kind == "bdev":
        for i, bdev in enumerate(answer):
            stats = bdev.get("stats") if isinstance(bdev, dict) else None
            if stats is None or not stats.get("paths"):
                errors.append("[%d].stats: expected a session with paths, got %r" % (i, stats))
            else:
                check(stats, CLIENT_STATS, "[%d].stats" % i, errors)
    elif kind == "target":
        for i, sess in enumerate(answer):
            if isinstance(sess, dict) and not sess.get("paths"):
                errors.append("[%d].paths: expected at least one path" % i)
            check(sess, TARGET_SESSION, "[%d]" % i, errors)
    else:
        sys.exit("stats_shape.py: unknown kind %r (bdev or target)" % kind)
    if errors:
        print("%s statistics shape differs:\n  %s" % (kind, "\n  ".join(errors)))
        sys.exit(1)
    print("%s statistics shape ok: %d session(s)" % (kind, len(answer)))


if __name__ == "__main__":
    main()
