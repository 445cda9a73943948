#!/usr/bin/env bash
# bdevperf over an rtrs bdev vs bdevperf over SPDK's own NVMe-oF/TCP, in one invocation,
# both against the same null bdev of one target application (issue 4, §7).
#
# Target: spdk_tgt on core 0 (-m 0x1) with the plugin preloaded: a null bdev "null0"
# exported over RTRS (tcp, 127.0.0.1) and over NVMe-oF/TCP (127.0.0.1:4420).
# Initiator: bdevperf on core 1 (-m 0x2), once with an rtrs bdev, once with bdev_nvme.
# Workloads: 4 KiB randread and randwrite at QD1 and QD32, 128 KiB read at QD8.
#
#   bench/spdk_vs_nvmf.sh [--time SECONDS] [--no-append]
#
# Needs SPDK ($SPDK_DIR or /opt/spdk). Prints each pair and the ratio rtrs/nvmf, and
# appends them to docs/BENCHMARKS.md under "## SPDK: rtrs vs NVMe-oF/TCP".
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
. ci/spdk/lib.sh

TIME=10
APPEND=1
while [[ $# -gt 0 ]]; do
	case $1 in
	--time) TIME=$2; shift 2 ;;
	--no-append) APPEND=0; shift ;;
	*) echo "usage: $0 [--time SECONDS] [--no-append]" >&2; exit 2 ;;
	esac
done

SPDK_DIR=$(spdk_find)
[[ -n "$SPDK_DIR" ]] || { echo "SPDK not found: set SPDK_DIR (see README)" >&2; exit 1; }
export SPDK_DIR
apps_init
trap apps_cleanup EXIT
trap 'exit 130' INT TERM
spdk_setup_paths || exit 1
[[ -n "$BDEVPERF_PY" ]] || { echo "bdevperf.py not found under $SPDK_DIR" >&2; exit 1; }
echo "== building the plugin (release)"
plugin_build || exit 1

MEM=(--no-huge -s 2048 --disable-cpumask-locks)
RTRS_PORT=14500
NVMF_PORT=4420
NQN=nqn.2016-06.io.spdk:rtrsbench

# name|queue depth|io size|workload
WORKLOADS=(
	"4k-randread-qd1|1|4096|randread"
	"4k-randread-qd32|32|4096|randread"
	"4k-randwrite-qd1|1|4096|randwrite"
	"4k-randwrite-qd32|32|4096|randwrite"
	"128k-read-qd8|8|131072|read"
)

echo "== target on core 0: null0 over RTRS (tcp :$RTRS_PORT) and NVMe-oF/TCP (:$NVMF_PORT)"
app_start tgt "$SPDK_TGT" -m 0x1 "${MEM[@]}" || exit 1
rpc tgt bdev_null_create null0 1024 4096 >/dev/null || exit 1
rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $RTRS_PORT || exit 1
rpc tgt rtrs_target_export null0 -a rw || exit 1
rpc tgt nvmf_create_transport -t TCP >/dev/null || exit 1
rpc tgt nvmf_create_subsystem $NQN -a -s RTRSBENCH0001 >/dev/null || exit 1
rpc tgt nvmf_subsystem_add_ns $NQN null0 >/dev/null || exit 1
rpc tgt nvmf_subsystem_add_listener $NQN -t tcp -a 127.0.0.1 -s $NVMF_PORT >/dev/null || exit 1

rtrs_bdev_json bench0 null0 $RTRS_PORT '{"hb_interval_ms": 5000}' >"$APP_DIR/rtrs.json"
cat >"$APP_DIR/nvmf.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_nvme_attach_controller", "params": {"name": "nvme0", "trtype": "tcp",
   "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "$NVMF_PORT", "subnqn": "$NQN"}},
  {"method": "bdev_wait_for_examine"}]}]}
EOF

declare -A RES
# run_side KIND: one bdevperf on core 1 for every workload of this transport.
run_side() {
	local kind=$1 w name qd size rw
	app_start "bp-$kind" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/$kind.json" -z \
		-q 1 -o 4096 -w randread -t "$TIME" || return 1
	for w in "${WORKLOADS[@]}"; do
		IFS='|' read -r name qd size rw <<<"$w"
		python3 "$BDEVPERF_PY" -s "$APP_DIR/bp-$kind.sock" -t $((TIME + 60)) perform_tests \
			-q "$qd" -o "$size" -w "$rw" -t "$TIME" >"$APP_DIR/$kind-$name.json" || {
			echo "$kind $name failed; log:" >&2
			tail -n 20 "$APP_DIR/bp-$kind.log" >&2
			return 1
		}
		RES[$kind-$name]=$(python3 - "$APP_DIR/$kind-$name.json" <<'PY'
import json, sys
jobs = json.load(open(sys.argv[1]))["results"]
iops = sum(j["iops"] for j in jobs)
mibps = sum(j["mibps"] for j in jobs)
lat = sum(j["avg_latency_us"] for j in jobs) / len(jobs)
failed = sum(j.get("io_failed", 0) for j in jobs)
print("%.0f %.1f %.1f %d" % (iops, mibps, lat, failed))
PY
		)
		echo "   $kind $name: ${RES[$kind-$name]} (IOPS MiB/s avg-µs failed)"
	done
	app_stop "bp-$kind"
}

echo "== bdevperf on core 1 over the rtrs bdev (${TIME}s per workload)"
run_side rtrs || exit 1
echo "== bdevperf on core 1 over NVMe-oF/TCP (${TIME}s per workload)"
run_side nvmf || exit 1

TABLE=$(
	echo "| workload | rtrs IOPS | rtrs MiB/s | rtrs avg µs | NVMe-oF/TCP IOPS | NVMe-oF/TCP MiB/s | NVMe-oF/TCP avg µs | ratio rtrs/nvmf |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|"
	for w in "${WORKLOADS[@]}"; do
		IFS='|' read -r name _ _ _ <<<"$w"
		read -r ri rm rl _ <<<"${RES[rtrs-$name]}"
		read -r ni nm nl _ <<<"${RES[nvmf-$name]}"
		ratio=$(python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print('%.2f' % (a/b if b else 0))" "$ri" "$ni")
		echo "| $name | $ri | $rm | $rl | $ni | $nm | $nl | $ratio |"
	done
)
echo
echo "$TABLE"

if [[ $APPEND -eq 1 ]]; then
	{
		echo "### $(date -u '+%Y-%m-%d %H:%M UTC'), ${TIME} s per workload, $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(rpc tgt spdk_get_version | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')"
		echo
		echo "$TABLE"
	} >"$APP_DIR/run.md"
	# The run goes at the end of this section (created once), not after later sections.
	python3 - docs/BENCHMARKS.md "$APP_DIR/run.md" <<'PY'
import os, sys
doc, run = sys.argv[1], open(sys.argv[2]).read().rstrip("\n") + "\n"
section = "## SPDK: rtrs vs NVMe-oF/TCP"
intro = (section + "\n\n"
         "`bench/spdk_vs_nvmf.sh`: one spdk_tgt on core 0 serves the same null bdev over RTRS\n"
         "(tcp fabric, 127.0.0.1) and over SPDK's NVMe-oF/TCP; bdevperf on core 1 runs each\n"
         "workload against the rtrs bdev, then against bdev_nvme. SPDK runs without hugepages\n"
         "(`--no-huge`). Ratio = rtrs IOPS / NVMe-oF/TCP IOPS.\n")
text = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
lines = text.split("\n")
try:
    at = lines.index(section)
except ValueError:
    text = text.rstrip("\n") + "\n\n" + intro + "\n" + run
else:
    end = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    head = "\n".join(lines[:end]).rstrip("\n")
    tail = "\n".join(lines[end:])
    text = head + "\n\n" + run + ("\n" + tail if tail.strip() else "")
open(doc, "w").write(text)
PY
	echo "appended to docs/BENCHMARKS.md"
fi
