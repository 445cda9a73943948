#!/usr/bin/env bash
# Runs examples/tcp_ready.rs once per readiness mode under `perf stat` (as root) and
# prints ops/s and system calls per operation (the whole process, both threads: every
# syscall of both ends, set-up included, divided by the operations completed).
#
#   bash examples/tcp_ready.sh [tcp_ready options, e.g. --conns 8 --qd 32 --secs 5]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/examples/tcp_ready
CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build -q --release --example tcp_ready
for mode in none epoll uring; do
    out=$(mktemp)
    json=$(perf stat -x, -o "$out" \
        -e raw_syscalls:sys_enter,syscalls:sys_enter_recvfrom,syscalls:sys_enter_readv,syscalls:sys_enter_sendmsg,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_io_uring_enter \
        -- "$bin" --mode "$mode" "$@")
    python3 - "$out" "$json" <<'PY'
import json, sys
counts = {}
for line in open(sys.argv[1]):
    f = line.strip().split(",")
    if len(f) > 2 and f[0].strip().isdigit():
        counts[f[2].split(":")[-1].replace("sys_enter_", "")] = int(f[0])
r = json.loads(sys.argv[2])
ops = r["total_ops"]
per = {k: round(v / ops, 3) for k, v in counts.items()}
print(json.dumps({"mode": r["mode"], "private": r.get("private", False), "conns": r["conns"], "qd": r["qd"],
                  "ops_per_s": r["ops_per_s"], "syscalls_per_op": per}))
PY
    rm -f "$out"
done
