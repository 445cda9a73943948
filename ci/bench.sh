#!/usr/bin/env bash
# The main job on an embedded default, no SPDK needed: builds the release binaries,
# starts rtrs-target on 127.0.0.1 (reactor on core 0) with a RAM export, runs rtrs-bench
# against it over TCP (reactor on core 1) with --verify, prints the result and stops the
# target (also when something fails).
#
#   ci/bench.sh                      # 4 KiB randrw, QD 16, 5 s, verified
#   BENCH_TIME=10s BENCH_RW=randread BENCH_QD=32 ci/bench.sh
#   ci/bench.sh --fabric [ARGS...]   # the fabric benchmark instead (cargo bench --bench fabric)
#   ci/bench.sh --all                # both
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh

mode=rtrs
case "${1:-}" in
    --fabric) mode=fabric; shift ;;
    --all) mode=all; shift ;;
esac
if [ "$mode" = fabric ]; then
    exec cargo bench --bench fabric -- "$@"
fi

time_=${BENCH_TIME:-5s}
rw=${BENCH_RW:-randrw}
bs=${BENCH_BS:-4K}
qd=${BENCH_QD:-16}

cargo build --release --bins
bin=${CARGO_TARGET_DIR:-target}/release

work=$(mktemp -d)
target_pid=
cleanup() {
    { set +x; } 2>/dev/null
    if [ -n "$target_pid" ] && kill -0 "$target_pid" 2>/dev/null; then
        kill -TERM "$target_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$target_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$target_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# Port 0: the target picks a free port and prints it in its ready line.
"$bin/rtrs-target" --listen tcp://127.0.0.1:0 --export vol=ram:256M --chunk-size 256K -m 0x1 \
    >"$work/ready" 2>"$work/target.log" &
target_pid=$!
for _ in $(seq 300); do
    [ -s "$work/ready" ] && break
    kill -0 "$target_pid" 2>/dev/null || { cat "$work/target.log" >&2; exit 1; }
    sleep 0.1
done
[ -s "$work/ready" ] || { echo "ci/bench.sh: rtrs-target did not get ready" >&2; exit 1; }
cat "$work/ready"
port=$(sed -E 's/.*tcp:\/\/127\.0\.0\.1:([0-9]+).*/\1/' "$work/ready")

set -x
"$bin/rtrs-bench" --path "tcp://127.0.0.1:$port" --device vol --rw "$rw" --bs "$bs" --qd "$qd" \
    --time "$time_" --verify -m 0x2
{ set +x; } 2>/dev/null

kill -TERM "$target_pid"
wait "$target_pid"
target_pid=
echo "ci/bench.sh: rtrs-target stopped cleanly"

if [ "$mode" = all ]; then
    cargo bench --bench fabric -- "$@"
fi
