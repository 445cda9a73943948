#!/usr/bin/env bash
# rtrs-bench figures: RNBD over RTRS measured with the release
# binaries, over the in-process loopback fabric (--inline-target: the engine's cost
# without a network) and over TCP on 127.0.0.1 (rtrs-target's reactor pinned to core 0,
# rtrs-bench's to core 1): 4 KiB randread and randwrite at QD 1 and 32, 128 KiB read at
# QD 8. Writes the "## rtrs-bench" section of docs/BENCHMARKS.md (other sections are
# kept) with the machine description and the exact commands, and prints it.
#
#   bench/rtrs.sh                      # 10 s per run
#   RTRS_BENCH_TIME=3s bench/rtrs.sh   # shorter
#   RTRS_BENCH_OUT=/tmp/x.md bench/rtrs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

time_=${RTRS_BENCH_TIME:-10s}
out=${RTRS_BENCH_OUT:-docs/BENCHMARKS.md}
size=256M

cargo build --release --bins
bin=${CARGO_TARGET_DIR:-target}/release
work=$(mktemp -d)
target_pid=
cleanup() {
    if [ -n "$target_pid" ] && kill -0 "$target_pid" 2>/dev/null; then
        kill -TERM "$target_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$target_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$target_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# The runs: pattern, block size, queue depth.
runs=("randread 4K 1" "randread 4K 32" "randwrite 4K 1" "randwrite 4K 32" "read 128K 8")

rows=()
cmds=()
# run TRANSPORT ARGS...: one measured run; appends a table row.
run() {
    local transport=$1; shift
    local line
    cmds+=("rtrs-bench $* --time $time_ --json")
    line=$("$bin/rtrs-bench" "$@" --time "$time_" --json)
    echo "$line" >&2
    rows+=("| $transport | $(field "$line" rw) | $(($(field "$line" bs) / 1024)) KiB | $(field "$line" qd) \
| $(printf '%.0f' "$(field "$line" iops)") | $(printf '%.1f' "$(field "$line" mib_s)") \
| $(printf '%.1f' "$(field "$line" lat_avg_us)") | $(printf '%.1f' "$(field "$line" lat_p50_us)") \
| $(printf '%.1f' "$(field "$line" lat_p99_us)") | $(printf '%.1f' "$(field "$line" lat_p999_us)") \
| $(field "$line" errors) |")
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# Loopback: target and bench in one process on both cores (the same two cores the tcp
# runs use, one per side there). Each run warms the RAM disk with a sequential write.
for r in "${runs[@]}"; do
    read -r rw bs qd <<<"$r"
    run "loopback (inline)" --inline-target "ram:$size" --rw "$rw" --bs "$bs" --qd "$qd" -m 0x3 \
        --warmup-write
done

# TCP: rtrs-target on core 0, rtrs-bench on core 1.
target_cmd=("$bin/rtrs-target" --listen tcp://127.0.0.1:0 --export "vol=ram:$size" --chunk-size 256K -m 0x1)
"${target_cmd[@]}" >"$work/ready" 2>"$work/target.log" &
target_pid=$!
for _ in $(seq 300); do
    [ -s "$work/ready" ] && break
    kill -0 "$target_pid" 2>/dev/null || { cat "$work/target.log" >&2; exit 1; }
    sleep 0.1
done
port=$(sed -E 's/.*tcp:\/\/127\.0\.0\.1:([0-9]+).*/\1/' "$work/ready")
url=tcp://127.0.0.1:$port
# The target's RAM disk lives across the runs: write it once, in 128 KiB blocks.
warmup=(--path "$url" --device vol --rw write --bs 128K --qd 8 -m 0x2 --warmup-write --time 1s)
"$bin/rtrs-bench" "${warmup[@]}" >/dev/null
for r in "${runs[@]}"; do
    read -r rw bs qd <<<"$r"
    run "tcp 127.0.0.1" --path "$url" --device vol --rw "$rw" --bs "$bs" --qd "$qd" -m 0x2
done
kill -TERM "$target_pid"
wait "$target_pid"
target_pid=

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(lscpu | sed -nE 's/^Model name:[[:space:]]+//p' | head -1)
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)

section=$(mktemp)
{
    echo "## rtrs-bench"
    echo
    echo "RNBD block IO over RTRS, measured by \`bench/rtrs.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "(commit \`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\`, release build)."
    echo
    echo "- Machine: $cpu, $(nproc) CPUs, $mem RAM, Linux $(uname -r)."
    echo "- Load average before / after the runs: $load_before / $load_after (the machine was"
    echo "  shared with other jobs; figures are indicative, not a tuned result)."
    echo "- $time_ per run; RAM export of $size, written once before it is measured (loopback:"
    echo "  \`--warmup-write\` in every run; tcp: \`rtrs-bench ${warmup[*]}\` before the runs)."
    echo "  Reactors busy-poll. Reads are zero-copy (each core's buffer is announced to the client)."
    echo "- loopback: \`--inline-target\`, target and client in one process on cores 0-1 (\`-m 0x3\`;"
    echo "  the target's chunk size is 256 KiB). tcp: \`${target_cmd[*]#"$bin/"}\` on core 0,"
    echo "  the bench on core 1 (\`-m 0x2\`). QD is the total queue depth."
    echo "- Latency in microseconds, from a log-linear histogram (within 6.25 %)."
    echo "- Reproduce: \`bench/rtrs.sh\` (\`RTRS_BENCH_TIME=10s\` by default); a single verified run"
    echo "  over tcp: \`ci/bench.sh\`."
    echo
    echo "| transport | pattern | bs | QD | IOPS | MiB/s | avg us | p50 us | p99 us | p99.9 us | errors |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "Commands (the tcp runs with \`--path $url --device vol\` against the target above):"
    echo
    echo '```sh'
    printf '%s\n' "${cmds[@]}"
    echo '```'
} >"$section"

# Replace our section, keep the rest.
if [ -f "$out" ]; then
    awk -v sect="$section" '
        /^## rtrs-bench[[:space:]]*$/ { skip = 1; while ((getline l < sect) > 0) print l; done = 1; next }
        skip && /^## / { skip = 0; print ""; }
        !skip { print }
        END { if (!done) { print ""; while ((getline l < sect) > 0) print l } }
    ' "$out" >"$work/new.md"
    mv "$work/new.md" "$out"
else
    { echo "# Benchmarks"; echo; cat "$section"; } >"$out"
fi
rm -f "$section"
cat "$out"
