#!/usr/bin/env bash
# Per-IO profile of the tcp fabric under rtrs-bench: syscalls per IO on each
# side, counted by the kernel's syscall tracepoints (`perf stat`, which costs the traced
# process almost nothing, unlike strace), and optionally user-space instructions per IO of
# the initiator (`valgrind --tool=callgrind`). rtrs-target runs on core 0, rtrs-bench on
# core 1, as in bench/rtrs.sh. These counts are stable on a shared machine, unlike
# wall-clock figures.
#
#   bench/tcp_profile.sh                       # syscalls, 4K randread QD1/QD32, 128K read QD8
#   RTRS_PROFILE_CALLGRIND=1 bench/tcp_profile.sh
#   RTRS_PROFILE_BIN=/some/dir bench/tcp_profile.sh   # other rtrs-target/rtrs-bench binaries
#
# Columns: sendmsg, recvfrom (all) and recvfrom_ok (the ones that returned data), readv,
# accept4, and every syscall (all), each divided by the IOs the bench completed. A
# busy-polled reactor's idle recvfrom calls (EAGAIN) grow with the time it waits, so only
# the *_ok and sendmsg columns are comparable between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

time_=${RTRS_PROFILE_TIME:-3s}
if [ -z "${RTRS_PROFILE_BIN:-}" ]; then
    CARGO_PROFILE_RELEASE_DEBUG=true cargo build --release --bins
    bin=${CARGO_TARGET_DIR:-target}/release
else
    bin=$RTRS_PROFILE_BIN
fi
work=$(mktemp -d)
target_pid=
cleanup() {
    if [ -n "$target_pid" ] && kill -0 "$target_pid" 2>/dev/null; then
        pkill -TERM -P "$target_pid" 2>/dev/null || true
        kill -TERM "$target_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

events=(-e syscalls:sys_enter_sendmsg -e syscalls:sys_enter_recvfrom
    -e syscalls:sys_exit_recvfrom --filter 'ret > 0' -e syscalls:sys_enter_readv
    -e syscalls:sys_enter_accept4 -e raw_syscalls:sys_enter)

# start_target WRAPPER...: rtrs-target on core 0 under the given wrapper; sets $url.
start_target() {
    "$@" "$bin/rtrs-target" --listen tcp://127.0.0.1:0 --export vol=ram:64M \
        --chunk-size 256K -m 0x1 >"$work/ready" 2>"$work/target.log" &
    target_pid=$!
    for _ in $(seq 1200); do
        [ -s "$work/ready" ] && break
        kill -0 "$target_pid" 2>/dev/null || { cat "$work/target.log" >&2; exit 1; }
        sleep 0.1
    done
    [ -s "$work/ready" ] || { echo "rtrs-target did not start within 120 s" >&2; exit 1; }
    url=tcp://127.0.0.1:$(sed -E 's/.*tcp:\/\/127\.0\.0\.1:([0-9]+).*/\1/' "$work/ready")
}

# stop_target: SIGTERM to the target itself (the child of its wrapper), then wait.
stop_target() {
    pkill -TERM -P "$target_pid" 2>/dev/null || kill -TERM "$target_pid"
    wait "$target_pid" || true
    target_pid=
}

# per_io FILE IOS: the perf stat counts of FILE divided by IOS.
per_io() {
    awk -F, -v ios="$2" '$1 ~ /^[0-9]+$/ {
        n = $3; sub(/raw_syscalls:sys_enter/, "all", n); sub(/syscalls:sys_exit_recvfrom/, "recvfrom_ok", n)
        sub(/syscalls:sys_enter_/, "", n); printf " %s=%.2f", n, $1 / ios }' "$1"
}

runs=("randread 4K 1" "randwrite 4K 1" "randread 4K 32" "read 128K 8")
for r in "${runs[@]}"; do
    read -r rw bs qd <<<"$r"
    args=(--device vol --rw "$rw" --bs "$bs" --qd "$qd" -m 0x2 --time "$time_" --json)
    start_target perf stat "${events[@]}" -x, -o "$work/target.perf"
    line=$(perf stat "${events[@]}" -x, -o "$work/bench.perf" "$bin/rtrs-bench" --path "$url" "${args[@]}")
    stop_target
    ios=$(field "$line" ios)
    echo "$rw $bs QD$qd: $ios IOs, $(field "$line" iops) IOPS, avg $(field "$line" lat_avg_us) us"
    echo "  target:   $(per_io "$work/target.perf" "$ios")"
    echo "  initiator:$(per_io "$work/bench.perf" "$ios")"
    if [ -n "${RTRS_PROFILE_CALLGRIND:-}" ] && [ "$bs" = 4K ] && [ "$rw" = randread ]; then
        start_target env
        out=$work/callgrind.out
        line=$(valgrind --tool=callgrind --callgrind-out-file="$out" "$bin/rtrs-bench" \
            --path "$url" "${args[@]}" 2>/dev/null)
        stop_target
        ios=$(field "$line" ios)
        # Instructions per IO of the initiator's fabric entry points (inclusive) and of
        # its whole reactor loop less the one-off zeroed allocations made at start.
        callgrind_annotate --inclusive=yes "$out" 2>/dev/null | awk -v ios="$ios" '
            { v = $1; gsub(",", "", v) }
            /Reactor::run_once \[/ { run = v }
            /__rust_alloc_zeroed \[/ { zero = v }
            /TcpConn as rtrs_spdk::fabric::Conn>::poll_cq \[/ { poll = v }
            /TcpConn as rtrs_spdk::fabric::Conn>::post_send \[/ { post = v }
            END { printf "  initiator instructions per IO (callgrind, %d IOs): reactor %.0f, tcp poll_cq %.0f, tcp post_send %.0f\n",
                  ios, (run - zero) / ios, poll / ios, post / ios }'
    fi
done
