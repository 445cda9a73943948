#!/usr/bin/env bash
# Idle CPU of an SPDK target and client pair, rtrs against SPDK's own NVMe-oF/TCP
# (docs/BENCHMARKS.md, "Interrupt mode"): nvmf_tgt on core 0 serving an AIO bdev over both
# transports, a second nvmf_tgt on core 1 as the client with one bdev over each; after the
# connections are up, both apps' user+system CPU over --idle S seconds (/proc/PID/stat),
# with the apps started in SPDK's interrupt mode (--interrupt-mode) and polling.
# nvmf_tgt, not spdk_tgt: spdk_tgt's iSCSI poll group busy-polls in interrupt mode (a
# whole core with no plugin loaded). The disk is an AIO bdev on a file: of SPDK's bdevs
# only AIO and NVMe/PCIe sleep in interrupt mode (null's and malloc's channel pollers
# spin, on whichever thread opens a channel). SPDK's NVMe-oF/TCP client (bdev_nvme over tcp)
# refuses interrupt mode ("only supported with PCIe transport"): its client app polls.
#
# Then QD1 4 KiB random reads with each target in interrupt mode (the same AIO disk),
# bdevperf polling on core 1 (--rounds pairs, rtrs then NVMe-oF/TCP in each; the round of
# the median latency ratio is the result).
#
#   bench/idle_cpu.sh [--idle S] [--mode intr|poll|both] [--rounds N] [--time S]
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 1
# shellcheck source=ci/spdk/lib.sh
. ci/spdk/lib.sh
IDLE=10
ROUNDS=3
TIME=5
MODES="intr poll"
while [[ $# -gt 0 ]]; do
	case $1 in
	--idle) IDLE=${2:?}; shift 2 ;;
	--mode) case ${2:?} in intr) MODES=intr ;; poll) MODES=poll ;; both) MODES="intr poll" ;; *) echo "--mode: intr, poll or both" >&2; exit 2 ;; esac; shift 2 ;;
	--rounds) ROUNDS=${2:?}; shift 2 ;;
	--time) TIME=${2:?}; shift 2 ;;
	*) echo "usage: $0 [--idle S] [--mode intr|poll|both] [--rounds N] [--time S]" >&2; exit 2 ;;
	esac
done
[[ "$IDLE" =~ ^[0-9]+$ && "$IDLE" -gt 0 ]] || { echo "--idle: '$IDLE' is not a number of seconds" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[0-9]+$ ]] || { echo "--rounds: '$ROUNDS' is not a number" >&2; exit 2; }
[[ "$TIME" =~ ^[0-9]+$ && "$TIME" -gt 0 ]] || { echo "--time: '$TIME' is not a number of seconds" >&2; exit 2; }
spdk_bench_init
plugin_build || exit 1
MEM=(--no-huge -s 1024 --disable-cpumask-locks)
if [[ -n "${RTRS_TEST_PORT_BASE:-}" ]]; then
	RTRS_PORT=$((RTRS_TEST_PORT_BASE + 92)) NVMF_PORT=$((RTRS_TEST_PORT_BASE + 93))
	REEXPORT_PORT=$((RTRS_TEST_PORT_BASE + 94))
else
	RTRS_PORT=14510 NVMF_PORT=4430 REEXPORT_PORT=4431
fi
IO_TIME=3
NQN=nqn.2016-06.io.spdk:rtrsidle
TCK=$(getconf CLK_TCK)

# aio_disk: bdev disk0 of the target, 64 MiB of a file by AIO (a bdev that sleeps in
# interrupt mode).
aio_disk() {
	truncate -s 64M "$APP_DIR/disk0" &&
		rpc tgt bdev_aio_create "$APP_DIR/disk0" disk0 4096 >/dev/null
}

# cpu_ticks NAME: user+system clock ticks of application NAME so far.
cpu_ticks() {
	awk '{ print $14 + $15 }' "/proc/$(app_pid "$1")/stat"
}

# idle_pct NAME...: each app's CPU (% of one core) over $IDLE seconds, in order.
idle_pct() {
	local n a0=() a1=() i=0
	for n in "$@"; do a0+=("$(cpu_ticks "$n")"); done
	sleep "$IDLE"
	for n in "$@"; do a1+=("$(cpu_ticks "$n")"); done
	for n in "$@"; do
		awk -v a="${a0[$i]}" -v b="${a1[$i]}" -v t="$TCK" -v s="$IDLE" 'BEGIN { printf "%.1f ", 100 * (b - a) / t / s }'
		i=$((i + 1))
	done
	echo
}

for mode in $MODES; do
	flag=()
	[[ $mode == intr ]] && flag=(--interrupt-mode)
	for kind in rtrs nvmf; do
		# A target of its own per transport, so that each one's CPU is its own.
		app_start tgt "$NVMF_TGT" -m 0x1 "${MEM[@]}" "${flag[@]}" || exit 1
		aio_disk || exit 1
		if [[ $kind == rtrs ]]; then
			rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $RTRS_PORT || exit 1
			rpc tgt rtrs_target_export disk0 -a rw || exit 1
		else
			nvmf_export tgt disk0 $NQN RTRSIDLE0001 $NVMF_PORT || exit 1
		fi
		sleep 1
		t0=$(idle_pct tgt)
		cflag=("${flag[@]}")
		[[ $kind == nvmf ]] && cflag=()
		app_start clt "$NVMF_TGT" -m 0x2 "${MEM[@]}" "${cflag[@]}" || exit 1
		if [[ $kind == rtrs ]]; then
			rpc clt bdev_rtrs_create -b r0 -n idle-sess -d disk0 -p "tcp:127.0.0.1:$RTRS_PORT" >/dev/null || exit 1
		else
			rpc clt bdev_nvme_attach_controller -b n0 -t tcp -a 127.0.0.1 -s $NVMF_PORT -f ipv4 -n $NQN >/dev/null ||
				{ echo "bdev_nvme_attach_controller failed; client log:" >&2; tail -n 20 "$APP_DIR/clt.log" >&2; exit 1; }
		fi
		sleep 1
		read -r t c < <(idle_pct tgt clt)
		note=
		[[ $mode == intr && $kind == nvmf ]] && note=" (the client polls)"
		echo "   $mode $kind: target alone ${t0% }%; connected, $IDLE s idle: target ${t}% client ${c}% of a core$note"
		if [[ $kind == rtrs ]]; then
			# The rtrs bdev re-exported over NVMe-oF/TCP by the client app: its poll group
			# holds a channel of the bdev (a poll group of the rtrs module on that
			# thread); bdevperf (polling, core 1) reads through it for $IO_TIME s, goes,
			# and both apps are measured idle again.
			nvmf_export clt r0 $NQN RTRSIDLE0002 $REEXPORT_PORT || exit 1
			nvme_bdev_json re0 $NQN $REEXPORT_PORT >"$APP_DIR/re.json"
			app_start bp "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/re.json" -z || exit 1
			python3 "$BDEVPERF_PY" -s "$APP_DIR/bp.sock" -t $((IO_TIME + 60)) perform_tests \
				-q 4 -o 4096 -w randrw -M 50 -t "$IO_TIME" >"$APP_DIR/bp.out" ||
				{ echo "bdevperf through the re-export failed; log:" >&2; tail -n 20 "$APP_DIR/bp.log" >&2; exit 1; }
			app_stop bp || exit 1
			io=$(python3 bench/perf_report.py bdevperf "$APP_DIR/bp.out") || exit 1
			echo "   $mode rtrs: $IO_TIME s of 4 KiB randrw QD4 through the re-export: ${io%% *} IOPS"
			sleep 1
			read -r t c < <(idle_pct tgt clt)
			echo "   $mode rtrs: after ${IO_TIME} s of IO through a channel still open, $IDLE s idle: target ${t}% client ${c}% of a core"
		fi
		app_stop clt || { echo "the $kind client did not stop" >&2; exit 1; }
		app_stop tgt || { echo "the $kind target did not stop" >&2; exit 1; }
	done
done

# ---- QD1 latency, targets in interrupt mode ----
[[ "$ROUNDS" -gt 0 ]] || exit 0
app_start tgt "$NVMF_TGT" -m 0x1 "${MEM[@]}" --interrupt-mode || exit 1
aio_disk || exit 1
rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $RTRS_PORT || exit 1
rpc tgt rtrs_target_export disk0 -a rw || exit 1
nvmf_export tgt disk0 $NQN RTRSIDLE0001 $NVMF_PORT || exit 1
rtrs_bdev_json lat0 disk0 $RTRS_PORT >"$APP_DIR/rtrs.json"
nvme_bdev_json nvme0 $NQN $NVMF_PORT >"$APP_DIR/nvmf.json"
declare -A LAT
ratios=()
for r in $(seq "$ROUNDS"); do
	for kind in rtrs nvmf; do
		app_start "lat-$kind" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/$kind.json" -z || exit 1
		python3 "$BDEVPERF_PY" -s "$APP_DIR/lat-$kind.sock" -t $((TIME + 60)) perform_tests \
			-q 1 -o 4096 -w randread -t "$TIME" >"$APP_DIR/lat-$kind.out" ||
			{ echo "bdevperf over $kind failed; log:" >&2; tail -n 20 "$APP_DIR/lat-$kind.log" >&2; exit 1; }
		app_stop "lat-$kind" || exit 1
		LAT[$kind]=$(python3 bench/perf_report.py bdevperf "$APP_DIR/lat-$kind.out") || exit 1
	done
	set -- ${LAT[rtrs]}
	ra=$3
	set -- ${LAT[nvmf]}
	na=$3
	q=$(python3 bench/perf_report.py ratio "$ra" "$na")
	ratios+=("$q")
	echo "   round $r QD1 4 KiB randread, targets in interrupt mode: rtrs ${LAT[rtrs]}; nvmf ${LAT[nvmf]}; avg latency ratio $q"
done
echo "== QD1 average latency rtrs / NVMe-oF/TCP, targets in interrupt mode: median $(python3 bench/perf_report.py median "${ratios[@]}") (rounds: ${ratios[*]}; lower is better)"
app_stop tgt || exit 1
