#!/usr/bin/env bash
# The performance goals (issues 4 §7 and 5), measured in one invocation: the rtrs bdev
# over the tcp fabric against SPDK's own NVMe-oF/TCP, both served by one spdk_tgt from the
# same null bdev, both driven by bdevperf (and fio's spdk_bdev plugin) on the other core.
#
# Target: spdk_tgt on core 0 (-m 0x1) with the plugin preloaded: null bdevs exported over
# RTRS (tcp, 127.0.0.1) and over NVMe-oF/TCP (127.0.0.1:4420).
# Initiator: bdevperf on core 1 (-m 0x2), once with an rtrs bdev, once with bdev_nvme.
#
# Parts (all by default; --only picks some):
#   floor   the plain-TCP floor of every pair (bench/tcp_floor.rs: two pinned threads on
#           cores 0 and 1, fixed-size requests and responses pipelined QD deep, nothing
#           else), run before the target starts so that no reactor spins on its cores
#   pairs   4 KiB randread and randwrite at QD1 and QD32, 128 KiB read at QD8 (bdevperf;
#           average and p99 latency). Each pair runs --rounds times (3 by default), rtrs
#           and NVMe-oF/TCP one after the other in every round, each in a bdevperf of its
#           own; the round whose IOPS ratio is the median of the rounds' is the pair's
#           result (this machine changes speed from one minute to the next, and a run of
#           one transport after all of the other's would measure the two in different
#           spells). Every round's ratio is printed and kept in the report.
#   syscalls  every pair once more with `perf stat` syscall tracepoints attached to spdk_tgt
#           and to bdevperf, counting only in the middle of the run: syscalls per IO of the
#           target and of the initiator, for rtrs and for NVMe-oF/TCP, and over the same
#           window each process's user and system CPU time per IO (/proc/PID/stat)
#   layers  every pair once more with `perf record` (cpu-clock samples) attached to spdk_tgt
#           and to bdevperf over the same middle window (each workload over rtrs and then
#           over NVMe-oF/TCP, seconds apart): each side's CPU per IO in the
#           kernel and in user space, the latter by layer (this project's modules, SPDK's
#           libraries), in nanoseconds (each layer's share of the samples times the
#           process's CPU time in the window, over the IOs the bdev moved in it)
#   timeline  each QD1 workload, --rounds rounds of rtrs then NVMe-oF/TCP: the system calls
#           of spdk_tgt and bdevperf traced together for 0.3 s (perf record of
#           raw_syscalls), and each IO cut into four phases by them, the median of each:
#           the request's way (the initiator's send to the target's receive returning),
#           the target's work (to its answer's send), the answer's way (to the initiator's
#           receive returning) and the initiator's work (to its next send, bdevperf's
#           included). At QD1 both sides spin between IOs, so CPU time cannot say what an IO
#           costs each side; the two "work" phases do (user space between two system calls,
#           plus what the application's loop does in between)
#   sweep   4 KiB randread IOPS at QD 1..128, both sides → docs/perf-iops-qd.svg
#   fio     4 KiB randread QD1 through fio's spdk_bdev plugin: avg, p50, p99, p99.9 for both
#           sides → docs/perf-qd1-latency.svg (needs hugepages, which root can reserve)
#   split   where the gap lies: 4 KiB randread QD32 with each side of rtrs in or out of
#           SPDK — rtrs-bench and bdevperf over the rtrs bdev, each against the standalone
#           rtrs-target (a RAM export, core 0, run before spdk_tgt) and against spdk_tgt
#           (--rounds rounds of the two back to back, the order alternating; the goal:
#           bdevperf ≥ 0.97 × rtrs-bench, the round of the median ratio)
#   inline  rtrs-bench --inline-target (loopback fabric, one reactor, 4 KiB randread QD32,
#           the RAM export written first, on transparent huge pages) vs bdevperf on a 256 MiB
#           malloc bdev on one core (on hugepages where root can reserve them)
#           (--rounds rounds of the two back to back, the order alternating; the round of
#           the median ratio is reported)
#   memory  resident memory of the target per connected session and of the client per bdev
#   soak    a --soak-minute bdevperf run over the rtrs bdev, sampling both sides' memory
#
#   bench/spdk_vs_nvmf.sh [--time S] [--sweep-time S] [--rounds N] [--soak MINUTES] [--only a,b]
#                          [--workloads NAME,...] [--chunk-size BYTES] [--target-qd N] [--no-append]
#
# --workloads keeps only the named workloads (4k-randread-qd1, 4k-randread-qd32,
# 4k-randwrite-qd1, 4k-randwrite-qd32, 128k-read-qd8; and, only when named here,
# 128k-write-qd8, 1m-read-qd4, 1m-write-qd4) in every part; the goals of the others read
# n/a. --chunk-size and --target-qd set the RTRS target's chunk size and queue depth
# (rtrs_target_set_options; 128 KiB and 512 by default, as the kernel's): a chunk larger
# than an IO plus its header carries it whole, where the bdev layer splits it otherwise
# (docs/BENCHMARKS.md, "Large IO, whole or split").
#
# Needs SPDK ($SPDK_DIR or /opt/spdk), and perf for the syscalls and layers parts. Prints every pair,
# the ratios to the floor, syscalls per IO, every goal's ratio with PASS or MISS, writes
# the plots, and writes the run into docs/BENCHMARKS.md under "## SPDK: rtrs vs NVMe-oF/TCP",
# in place of the previous run.
# Ports: 14500 (RTRS), 4420 (NVMe-oF/TCP), 14501 (split) and an ephemeral one (floor), or
# RTRS_TEST_PORT_BASE + 95, 96, 98 and 97 when that is set.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 1
# shellcheck source=ci/spdk/lib.sh
. ci/spdk/lib.sh
# shellcheck source=bench/lib.sh
. bench/lib.sh
REPORT=(python3 "$REPO/bench/perf_report.py")

TIME=10
SWEEP_TIME=5
SOAK_MIN=10
ROUNDS=3
PARTS=floor,pairs,syscalls,layers,timeline,split,sweep,fio,inline,memory,soak
ONLY=$PARTS
APPEND=1
usage() {
	echo "usage: $0 [--time S] [--sweep-time S] [--rounds N] [--soak MINUTES] [--only $PARTS] [--no-append]" >&2
	exit 2
}
while [[ $# -gt 0 ]]; do
	case $1 in
	--time) TIME=${2:?}; shift 2 ;;
	--sweep-time) SWEEP_TIME=${2:?}; shift 2 ;;
	--rounds) ROUNDS=${2:?}; shift 2 ;;
	--soak) SOAK_MIN=${2:?}; shift 2 ;;
	--only) ONLY=${2:?}; shift 2 ;;
	--workloads) ONLY_WORKLOADS=${2:?}; shift 2 ;;
	--chunk-size) CHUNK=${2:?}; shift 2 ;;
	--target-qd) TARGET_QD=${2:?}; shift 2 ;;
	--no-append) APPEND=0; shift ;;
	*) usage ;;
	esac
done
for p in ${ONLY//,/ }; do
	[[ ",$PARTS," == *",$p,"* ]] || { echo "--only: unknown part '$p'" >&2; usage; }
done
LOAD0=$(cut -d" " -f1-3 /proc/loadavg)
want() { [[ ",$ONLY," == *",$1,"* ]]; }
[[ "$SOAK_MIN" =~ ^[0-9]+$ ]] || { echo "--soak: '$SOAK_MIN' is not a number of minutes" >&2; exit 2; }
[[ "$SOAK_MIN" -gt 0 ]] || ONLY=${ONLY//soak/}
[[ "$TIME" =~ ^[0-9]+$ && "$TIME" -gt 0 ]] || { echo "--time: '$TIME' is not a number of seconds" >&2; exit 2; }
if want syscalls; then
	command -v perf >/dev/null || { echo "the syscalls part needs perf (linux-perf); leave it out with --only" >&2; exit 1; }
	perf stat -e raw_syscalls:sys_enter -x, -o /dev/null true 2>/dev/null ||
		{ echo "perf cannot read syscall tracepoints here (root, or kernel.perf_event_paranoid <= -1, and tracefs)" >&2; exit 1; }
fi

if want timeline; then
	command -v perf >/dev/null || { echo "the timeline part needs perf (linux-perf); leave it out with --only" >&2; exit 1; }
	perf record -q -e raw_syscalls:sys_enter -o /dev/null true >/dev/null 2>&1 ||
		{ echo "perf cannot record syscall tracepoints here (root, or kernel.perf_event_paranoid <= -1, and tracefs)" >&2; exit 1; }
fi

if want layers; then
	command -v perf >/dev/null || { echo "the layers part needs perf (linux-perf); leave it out with --only" >&2; exit 1; }
	perf record -e cpu-clock -o /dev/null true >/dev/null 2>&1 ||
		{ echo "perf cannot record here (root, or kernel.perf_event_paranoid <= 1)" >&2; exit 1; }
fi

spdk_bench_init
[[ -n "$BDEVPERF_PY" ]] || { echo "bdevperf.py not found under $SPDK_DIR" >&2; exit 1; }
echo "== building the plugin and the binaries (release)"
plugin_build || exit 1
(cargo build --release -q --bins --example tcp_floor) || exit 1
BIN=${CARGO_TARGET_DIR:-$REPO/target}/release

MEM=(--no-huge -s 2048 --disable-cpumask-locks)
if [[ -n "${RTRS_TEST_PORT_BASE:-}" ]]; then
	RTRS_PORT=$((RTRS_TEST_PORT_BASE + 95)) NVMF_PORT=$((RTRS_TEST_PORT_BASE + 96)) FLOOR_PORT=$((RTRS_TEST_PORT_BASE + 97))
	SPLIT_PORT=$((RTRS_TEST_PORT_BASE + 98))
else
	RTRS_PORT=14500 NVMF_PORT=4420 FLOOR_PORT=0 SPLIT_PORT=14501
fi
NQN=nqn.2016-06.io.spdk:rtrsbench
NMEM=4 # sessions (bdevs) of the memory part
OUT="$APP_DIR/out.md"
: >"$OUT"

# name|queue depth|io size|workload
WORKLOADS=(
	"4k-randread-qd1|1|4096|randread"
	"4k-randread-qd32|32|4096|randread"
	"4k-randwrite-qd1|1|4096|randwrite"
	"4k-randwrite-qd32|32|4096|randwrite"
	"128k-read-qd8|8|131072|read"
)
# Run only when --workloads names them.
EXTRA_WORKLOADS=(
	"128k-write-qd8|8|131072|write"
	"1m-read-qd4|4|1048576|read"
	"1m-write-qd4|4|1048576|write"
)
if [[ -n "${ONLY_WORKLOADS:-}" ]]; then
	keep=()
	for n in ${ONLY_WORKLOADS//,/ }; do
		found=""
		for w in "${WORKLOADS[@]}" "${EXTRA_WORKLOADS[@]}"; do [[ ${w%%|*} == "$n" ]] && found=$w; done
		[[ -n $found ]] || { echo "--workloads: unknown workload '$n' (known: $(printf '%s ' "${WORKLOADS[@]%%|*}" "${EXTRA_WORKLOADS[@]%%|*}"))" >&2; exit 2; }
		keep+=("$found")
	done
	WORKLOADS=("${keep[@]}")
fi
SWEEP_QDS=(1 2 4 8 16 32 64 128)
# The shape of a pair on the wire, for the floor: a read is a 64-byte request answered by
# the data and a 64-byte header, a write the data and a header answered by 64 bytes.
HDR=64

declare -A RES

# ---- the plain-TCP floor, while no reactor spins on cores 0 and 1 ---------------------------
if want floor; then
	echo "== plain-TCP floor (bench/tcp_floor.rs): server thread on core 0, client on core 1"
	for w in "${WORKLOADS[@]}"; do
		IFS='|' read -r name qd size rw <<<"$w"
		if [[ $rw == *write ]]; then req=$((size + HDR)) resp=$HDR; else req=$HDR resp=$((size + HDR)); fi
		line=$("$BIN/examples/tcp_floor" --qd "$qd" --req "$req" --resp "$resp" --time "$TIME" \
			--server-core 0 --client-core 1 --port "$FLOOR_PORT") || exit 1
		RES[floor-$name]=$("${REPORT[@]}" floor "$line")
		echo "   floor $name ($req B -> $resp B, QD$qd): ${RES[floor-$name]} (IOPS avg-µs p99-µs syscalls/IO client server)"
	done
fi

# perform NAME QD SIZE RW SECONDS OUT: one bdevperf perform_tests; prints
# "IOPS MiB/s avg-µs failed p99-µs" (p99 from the summary bdevperf -l prints to its log).
perform() {
	local name=$1 qd=$2 size=$3 rw=$4 t=$5 out=$6 at
	at=$(stat -c %s "$APP_DIR/$name.log")
	python3 "$BDEVPERF_PY" -s "$APP_DIR/$name.sock" -t $((t + 60)) perform_tests \
		-q "$qd" -o "$size" -w "$rw" -t "$t" >"$out" || {
		echo "$name: perform_tests -q $qd -o $size -w $rw failed; log:" >&2
		tail -n 20 "$APP_DIR/$name.log" >&2
		return 1
	}
	"${REPORT[@]}" bdevperf "$out" "$APP_DIR/$name.log" "$at"
}

# split_bench PORT: rtrs-bench (core 1) against device null0 at 127.0.0.1:PORT; prints IOPS.
split_bench() {
	local line
	line=$("$BIN/rtrs-bench" --path "tcp://127.0.0.1:$1" --device null0 --rw randread --bs 4K \
		--qd 32 --time "${TIME}s" -m 0x2 --json) || return 1
	"${REPORT[@]}" rtrs-bench "$line"
}

# split_bdevperf NAME PORT: bdevperf (core 1) over an rtrs bdev of null0 at PORT, 4 KiB
# randread QD32; prints IOPS.
split_bdevperf() {
	local name=$1 r
	rtrs_bdev_json "${name}0" null0 "$2" '{"hb_interval_ms": 5000}' >"$APP_DIR/$name.json"
	app_start "$name" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/$name.json" -z -l \
		-q 1 -o 4096 -w randread -t "$TIME" || return 1
	r=$(perform "$name" 32 4096 randread "$TIME" "$APP_DIR/$name.out.json") || { app_stop "$name"; return 1; }
	app_stop "$name"
	echo "${r%% *}"
}

# ---- split, first half: the standalone rtrs-target on core 0, before spdk_tgt spins there ----
if want split; then
	echo "== split: standalone rtrs-target on core 0 (:$SPLIT_PORT), 4 KiB randread QD32 from core 1"
	"$BIN/rtrs-target" --listen "tcp://127.0.0.1:$SPLIT_PORT" --export null0=ram:1G -m 0x1 \
		>"$APP_DIR/split-ready" 2>"$APP_DIR/split-target.log" &
	echo $! >"$APP_DIR/pids/split-target"
	for _ in $(seq 300); do
		[[ -s "$APP_DIR/split-ready" ]] && break
		sleep 0.1
	done
	[[ -s "$APP_DIR/split-ready" ]] || { echo "rtrs-target did not get ready:" >&2; cat "$APP_DIR/split-target.log" >&2; exit 1; }
	RES[split-bench-rt]=$(split_bench "$SPLIT_PORT") || { echo "split: rtrs-bench failed" >&2; exit 1; }
	echo "   rtrs-bench -> rtrs-target: ${RES[split-bench-rt]} IOPS"
	RES[split-bdev-rt]=$(split_bdevperf bp-split "$SPLIT_PORT") || { echo "split: bdevperf failed" >&2; exit 1; }
	echo "   bdevperf (rtrs bdev) -> rtrs-target: ${RES[split-bdev-rt]} IOPS"
	app_stop split-target
fi

echo "== target on core 0: null0 over RTRS (tcp :$RTRS_PORT) and NVMe-oF/TCP (:$NVMF_PORT)"
app_start tgt "$SPDK_TGT" -m 0x1 "${MEM[@]}" || exit 1
rpc tgt bdev_null_create null0 1024 4096 >/dev/null || exit 1
if [[ -n "${CHUNK:-}${TARGET_QD:-}" ]]; then
	rpc tgt rtrs_target_set_options ${CHUNK:+--chunk-size "$CHUNK"} ${TARGET_QD:+--queue-depth "$TARGET_QD"} || exit 1
fi
rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $RTRS_PORT || exit 1
rpc tgt rtrs_target_export null0 -a rw || exit 1
nvmf_export tgt null0 $NQN RTRSBENCH0001 $NVMF_PORT || exit 1
SPDK_VERSION=$(rpc tgt spdk_get_version | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')

rtrs_bdev_json bench0 null0 $RTRS_PORT '{"hb_interval_ms": 5000}' >"$APP_DIR/rtrs.json"
nvme_bdev_json nvme0 $NQN $NVMF_PORT >"$APP_DIR/nvmf.json"
# shellcheck disable=SC2034 # read as ${!bdev_var} (BDEV_$kind)
BDEV_rtrs=bench0 BDEV_nvmf=nvme0n1

: >"$APP_DIR/sweep.tsv"

# Syscall tracepoints counted per process: every syscall, the socket and polling calls by
# name, and the receives that returned data (exit events filtered on ret > 0).
SC_EVENTS=(-e raw_syscalls:sys_enter
	-e syscalls:sys_enter_recvfrom -e syscalls:sys_exit_recvfrom --filter 'ret > 0'
	-e syscalls:sys_enter_readv -e syscalls:sys_exit_readv --filter 'ret > 0'
	-e syscalls:sys_enter_recvmsg -e syscalls:sys_exit_recvmsg --filter 'ret > 0'
	-e syscalls:sys_enter_sendmsg -e syscalls:sys_enter_sendto -e syscalls:sys_enter_writev
	-e syscalls:sys_enter_epoll_wait -e syscalls:sys_enter_epoll_pwait
	-e syscalls:sys_enter_io_uring_enter)
# Counting window of a syscalls run: from 1 s after perform_tests starts, SC_WIN seconds.
SC_WIN=$((TIME > 3 ? TIME - 2 : 1))

# The perf instances of a counting window, one per side (tgt: spdk_tgt, ini: bdevperf),
# each started disabled (-D -1) with fifo control at $APP_DIR/TAG-SIDE.ctl and .ack and
# its pid in pids/perf-TAG-SIDE, for window_run to switch on and off.
perf_fifos() { # TAG SIDE: the control fifos, made anew; prints perf's --control argument
	local f=$APP_DIR/$1-$2
	rm -f "$f.ctl" "$f.ack"
	mkfifo "$f.ctl" "$f.ack" && echo "fifo:$f.ctl,$f.ack"
}
# sc_perf SIDE PID: perf stat of PID's syscall tracepoints, to $APP_DIR/sc-SIDE.perf.
sc_perf() {
	local ctl
	ctl=$(perf_fifos sc "$1") || return 1
	perf stat -D -1 --control "$ctl" -x, -o "$APP_DIR/sc-$1.perf" "${SC_EVENTS[@]}" -p "$2" \
		2>"$APP_DIR/perf-sc-$1.log" &
	echo $! >"$APP_DIR/pids/perf-sc-$1"
}
# ly_perf SIDE PID OUT: perf record of PID's samples (cpu-clock, 4 kHz, no call chains).
ly_perf() {
	local ctl
	ctl=$(perf_fifos ly "$1") || return 1
	perf record -e cpu-clock -F 4000 -D -1 --control "$ctl" -o "$3" -p "$2" \
		>"$APP_DIR/perf-ly-$1.log" 2>&1 &
	echo $! >"$APP_DIR/pids/perf-ly-$1"
}

# window_run TAG KIND NAME QD SIZE RW: perform_tests once more on bdevperf bp-KIND while
# the perf instances TAG-tgt and TAG-ini (started by the caller) count over the middle
# SC_WIN seconds, then stops them (SIGINT: perf writes its file and exits). The result goes
# to $APP_DIR/TAG-KIND-NAME.json; each side's CPU time and busy share of the window to
# $APP_DIR/TAG-SIDE.cpu and .busy (perf_report.py window). Sets WIN_IOS to the IOs the
# bdev moved in the window (its bytes over the IO size, so that an IO the bdev layer
# splits counts once); fails when the run or the window did. Not in a subshell: the perf
# instances are this shell's children, which app_stop waits for.
window_run() {
	local tag=$1 kind=$2 name=$3 qd=$4 size=$5 rw=$6 bdev_var=BDEV_$2 bp ios
	python3 "$BDEVPERF_PY" -s "$APP_DIR/bp-$kind.sock" -t $((SC_WIN + 62)) perform_tests \
		-q "$qd" -o "$size" -w "$rw" -t $((SC_WIN + 2)) >"$APP_DIR/$tag-$kind-$name.json" &
	bp=$!
	sleep 1
	ios=$("${REPORT[@]}" window "$APP_DIR/bp-$kind.sock" "${!bdev_var}" "$SC_WIN" "$size" \
		"$APP_DIR/$tag-tgt:$(app_pid tgt):$APP_DIR/tgt.sock" \
		"$APP_DIR/$tag-ini:$(app_pid "bp-$kind"):$APP_DIR/bp-$kind.sock") || ios=
	wait $bp || { echo "$kind $name: perform_tests under perf ($tag) failed" >&2; ios=; }
	app_stop "perf-$tag-tgt"
	app_stop "perf-$tag-ini"
	WIN_IOS=$ios
	[[ -n "$ios" ]]
}

# syscalls_run KIND NAME QD SIZE RW: a window_run with perf stat's syscall tracepoints;
# sets RES[sc-KIND-NAME-SIDE] to "ALL BREAKDOWN" (syscalls per IO), RES[cpu-KIND-NAME-SIDE]
# to "USER_US SYS_US" per IO and RES[busy-KIND-NAME-SIDE] for each side, and
# RES[sc-KIND-NAME] to the run's bdevperf line.
syscalls_run() {
	local kind=$1 name=$2 ios side
	sc_perf tgt "$(app_pid tgt)" || return 1
	sc_perf ini "$(app_pid "bp-$kind")" || return 1
	window_run sc "$@" || return 1
	ios=$WIN_IOS
	for side in tgt ini; do
		RES[sc-$kind-$name-$side]=$("${REPORT[@]}" syscalls "$APP_DIR/sc-$side.perf" "$ios")
		RES[cpu-$kind-$name-$side]=$("${REPORT[@]}" cpu "$APP_DIR/sc-$side.cpu" "$ios")
		RES[busy-$kind-$name-$side]=$("${REPORT[@]}" busy "$APP_DIR/sc-$side.busy")
	done
	RES[sc-$kind-$name]=$("${REPORT[@]}" bdevperf "$APP_DIR/sc-$kind-$name.json")
}

# layers_run KIND NAME QD SIZE RW: a window_run with perf record; sets
# RES[ly-KIND-NAME-SIDE] to "KERNEL_NS USER_NS GROUP=NS;..." per IO (perf_report.py
# layers) and RES[ly-KIND-NAME] to the run's bdevperf line.
layers_run() {
	local kind=$1 name=$2 ios side
	ly_perf tgt "$(app_pid tgt)" "$APP_DIR/ly-$kind-$name-tgt.data" || return 1
	ly_perf ini "$(app_pid "bp-$kind")" "$APP_DIR/ly-$kind-$name-ini.data" || return 1
	window_run ly "$@" || return 1
	ios=$WIN_IOS
	for side in tgt ini; do
		RES[ly-$kind-$name-$side]=$("${REPORT[@]}" layers "$APP_DIR/ly-$kind-$name-$side.data" "$APP_DIR/ly-$side.cpu" "$ios")
	done
	RES[ly-$kind-$name]=$("${REPORT[@]}" bdevperf "$APP_DIR/ly-$kind-$name.json")
}

# pair_once KIND NAME QD SIZE RW OUT: one bdevperf of its own on core 1, one run; prints
# its result line.
pair_once() {
	local kind=$1 r
	app_start "pr-$kind" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/$kind.json" -z -l \
		-q 1 -o 4096 -w randread -t "$TIME" || return 1
	r=$(perform "pr-$kind" "$3" "$4" "$5" "$TIME" "$6") || { app_stop "pr-$kind"; return 1; }
	app_stop "pr-$kind"
	echo "$r"
}

# run_pairs: every workload ROUNDS times, rtrs then NVMe-oF/TCP in each round; the round
# with the median IOPS ratio gives the pair's result (RES[rtrs-NAME], RES[nvmf-NAME]).
run_pairs() {
	local w name qd size rw k a b picked
	for w in "${WORKLOADS[@]}"; do
		IFS='|' read -r name qd size rw <<<"$w"
		local -a ra=() rb=() rr=()
		for ((k = 1; k <= ROUNDS; k++)); do
			a=$(pair_once rtrs "$name" "$qd" "$size" "$rw" "$APP_DIR/rtrs-$name-$k.json") || return 1
			b=$(pair_once nvmf "$name" "$qd" "$size" "$rw" "$APP_DIR/nvmf-$name-$k.json") || return 1
			ra+=("$a"); rb+=("$b"); rr+=("$("${REPORT[@]}" ratio "${a%% *}" "${b%% *}")")
			echo "   round $k $name: rtrs $a; nvmf $b; IOPS ratio ${rr[-1]}"
		done
		# The index of the median ratio (the lower middle one for an even count).
		picked=$("${REPORT[@]}" median-index "${rr[@]}")
		RES[rtrs-$name]=${ra[$picked]}
		RES[nvmf-$name]=${rb[$picked]}
		RES[rounds-$name]=${rr[*]}
		echo "   rtrs $name: ${RES[rtrs-$name]} (IOPS MiB/s avg-µs failed p99-µs; round $((picked + 1)), the median ratio)"
		echo "   nvmf $name: ${RES[nvmf-$name]}"
	done
}

# run_side KIND: one bdevperf on core 1 for the syscalls and the sweep of this transport.
run_side() {
	local kind=$1 w name qd size rw
	app_start "bp-$kind" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/$kind.json" -z -l \
		-q 1 -o 4096 -w randread -t "$TIME" || return 1
	if want syscalls; then
		for w in "${WORKLOADS[@]}"; do
			IFS='|' read -r name qd size rw <<<"$w"
			syscalls_run "$kind" "$name" "$qd" "$size" "$rw" || return 1
			echo "   $kind $name under perf: ${RES[sc-$kind-$name]} (IOPS MiB/s avg-µs failed p99-µs)"
			echo "   $kind $name syscalls per IO: target ${RES[sc-$kind-$name-tgt]}"
			echo "   $kind $name syscalls per IO: initiator ${RES[sc-$kind-$name-ini]}"
			echo "   $kind $name CPU µs per IO (user sys): target ${RES[cpu-$kind-$name-tgt]}, initiator ${RES[cpu-$kind-$name-ini]}"
			echo "   $kind $name busy share of the busiest SPDK thread (thread_get_stats): target ${RES[busy-$kind-$name-tgt]}, initiator ${RES[busy-$kind-$name-ini]}"
		done
	fi
	if want sweep; then
		for qd in "${SWEEP_QDS[@]}"; do
			local r
			r=$(perform "bp-$kind" "$qd" 4096 randread "$SWEEP_TIME" "$APP_DIR/$kind-sweep-$qd.json") || return 1
			echo "   $kind 4k-randread qd$qd: $r"
			echo -e "$kind\t$qd\t${r%% *}" >>"$APP_DIR/sweep.tsv"
		done
	fi
	app_stop "bp-$kind"
}

# ---- split, second half: rtrs-bench and bdevperf against spdk_tgt, back to back ----------
# Each round runs both, one right after the other (the order alternating), so that the
# ratio compares two runs of the same minute on a machine whose speed drifts; the round
# whose ratio is the median is reported.
if want split; then
	st_ratios=() st_bench=() st_bdev=()
	for ((k = 1; k <= ROUNDS; k++)); do
		if ((k % 2)); then
			a=$(split_bench "$RTRS_PORT") || { echo "split: rtrs-bench against spdk_tgt failed" >&2; exit 1; }
			b=$(split_bdevperf "bp-splitst-$k" "$RTRS_PORT") || { echo "split: bdevperf against spdk_tgt failed" >&2; exit 1; }
		else
			b=$(split_bdevperf "bp-splitst-$k" "$RTRS_PORT") || { echo "split: bdevperf against spdk_tgt failed" >&2; exit 1; }
			a=$(split_bench "$RTRS_PORT") || { echo "split: rtrs-bench against spdk_tgt failed" >&2; exit 1; }
		fi
		st_bench+=("${a%% *}") st_bdev+=("$b") st_ratios+=("$("${REPORT[@]}" ratio "$b" "${a%% *}")")
		echo "   split round $k: rtrs-bench -> spdk_tgt ${a%% *} IOPS, bdevperf (rtrs bdev) -> spdk_tgt $b IOPS, ratio ${st_ratios[-1]}"
	done
	med=$("${REPORT[@]}" median-index "${st_ratios[@]}")
	RES[split-bench-st]=${st_bench[$med]} RES[split-bdev-st]=${st_bdev[$med]} RES[split-ratios]="${st_ratios[*]}"
fi

if want pairs; then
	echo "== bdevperf on core 1, the pairs: $ROUNDS rounds of rtrs then NVMe-oF/TCP"
	run_pairs || exit 1
fi
if want sweep || want syscalls; then
	echo "== bdevperf on core 1 over the rtrs bdev"
	run_side rtrs || exit 1
	echo "== bdevperf on core 1 over NVMe-oF/TCP"
	run_side nvmf || exit 1
fi
# The layers: each workload over rtrs and then over NVMe-oF/TCP, a bdevperf of its own for
# each, so that the two profiles of a workload are taken within seconds of each other.
if want layers; then
	echo "== perf record of both sides, each workload over rtrs then NVMe-oF/TCP"
	for w in "${WORKLOADS[@]}"; do
		IFS='|' read -r name qd size rw <<<"$w"
		for kind in rtrs nvmf; do
			app_start "bp-$kind" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/$kind.json" -z -l \
				-q 1 -o 4096 -w randread -t "$TIME" || exit 1
			layers_run "$kind" "$name" "$qd" "$size" "$rw" || exit 1
			app_stop "bp-$kind"
			echo "   $kind $name under perf record: ${RES[ly-$kind-$name]} (IOPS MiB/s avg-µs failed p99-µs)"
			echo "   $kind $name ns per IO (kernel user layers...): target ${RES[ly-$kind-$name-tgt]}"
			echo "   $kind $name ns per IO (kernel user layers...): initiator ${RES[ly-$kind-$name-ini]}"
		done
	done
fi

# ---- timeline: each QD1 IO cut into its phases by both sides' system calls -----------------
# timeline_once KIND NAME SIZE RW ROUND: a fresh bdevperf over KIND runs the workload at QD1
# while perf records the system calls of spdk_tgt and of it for TL_WIN seconds; prints
# perf_report.py timeline's line ("REQ TGT RESP INI CYCLE N", µs).
TL_WIN=0.3
timeline_once() {
	local kind=$1 name=$2 size=$3 rw=$4 f=$APP_DIR/tl-$1-$2-$5 bp line
	app_start "bp-$kind" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/$kind.json" -z \
		-q 1 -o 4096 -w randread -t "$TIME" >&2 || return 1
	python3 "$BDEVPERF_PY" -s "$APP_DIR/bp-$kind.sock" -t 65 perform_tests \
		-q 1 -o "$size" -w "$rw" -t 3 >"$f.json" &
	bp=$!
	sleep 1
	perf record -q -e raw_syscalls:sys_enter -e raw_syscalls:sys_exit \
		-p "$(app_pid tgt),$(app_pid "bp-$kind")" -o "$f.perf" -- sleep "$TL_WIN" >"$f.log" 2>&1
	if ! wait $bp; then
		echo "timeline $kind $name: perform_tests failed" >&2
		app_stop "bp-$kind" >&2
		return 1
	fi
	app_stop "bp-$kind" >&2
	perf script -i "$f.perf" -F comm,pid,tid,time,event,trace --ns >"$f.txt" 2>>"$f.log" ||
		{ echo "timeline $kind $name: perf script failed (see $f.log)" >&2; return 1; }
	line=$("${REPORT[@]}" timeline "$f.txt" "$(app_pid tgt)") || return 1
	rm -f "$f.perf" "$f.txt"
	echo "$line"
}
if want timeline; then
	echo "== timeline: each QD1 workload's IO cut into phases by both sides' system calls, $ROUNDS rounds of rtrs then NVMe-oF/TCP"
	for w in "${WORKLOADS[@]}"; do
		IFS='|' read -r name qd size rw <<<"$w"
		[[ $qd == 1 ]] || continue
		for kind in rtrs nvmf; do RES[tl-$kind-$name]=""; done
		for ((k = 1; k <= ROUNDS; k++)); do
			for kind in rtrs nvmf; do
				line=$(timeline_once "$kind" "$name" "$size" "$rw" "$k") || exit 1
				RES[tl-$kind-$name]+="$line;"
				echo "   round $k $name $kind: $line (request's way, target's work, answer's way, initiator's work, cycle µs; cycles)"
			done
		done
	done
fi

# ---- fio through SPDK's spdk_bdev plugin: QD1 latency percentiles ---------------------------
FIO_OK=0
if want fio; then
	if [[ -z "$FIO_PLUGIN" ]]; then
		echo "== fio: SKIPPED (SPDK's build/fio/spdk_bdev not found)"
	elif ! fio_find; then
		echo "== fio: SKIPPED ($FIO_WHY)"
	elif ! hugepages_ensure; then
		echo "== fio: SKIPPED (SPDK's fio plugin needs hugepages and none could be reserved)"
	else
		echo "== fio (spdk_bdev plugin) on core 1: 4 KiB randread QD1, ${TIME}s per side"
		FIO_OK=1
		for kind in rtrs nvmf; do
			bdev_var=BDEV_$kind
			cat >"$APP_DIR/fio-$kind.fio" <<EOF
[global]
ioengine=spdk_bdev
spdk_json_conf=$APP_DIR/$kind.json
thread=1
direct=1
time_based=1
ramp_time=1
runtime=$TIME
bs=4k
iodepth=1
rw=randread
cpus_allowed=1
percentile_list=1:5:10:20:30:40:50:60:70:80:90:95:99:99.5:99.9:99.99
[qd1]
filename=${!bdev_var}
EOF
			LD_PRELOAD="$PLUGIN_SO $FIO_PLUGIN" "$FIO_BIN" --output-format=json \
				--output="$APP_DIR/fio-$kind.json" "$APP_DIR/fio-$kind.fio" >"$APP_DIR/fio-$kind.log" 2>&1 &
			echo $! >"$APP_DIR/pids/fio"
			wait $!
			rc=$?
			rm -f "$APP_DIR/pids/fio"
			if [[ $rc -ne 0 ]] || ! RES[fio-$kind]=$("${REPORT[@]}" fio "$APP_DIR/fio-$kind.json"); then
				echo "   fio $kind failed (rc $rc); log:" >&2
				tail -n 15 "$APP_DIR/fio-$kind.log" >&2
				FIO_OK=0
				break
			fi
			echo "   $kind: ${RES[fio-$kind]} (IOPS avg-µs p50 p99 p99.9)"
		done
		hugepages_restore
	fi
fi

# ---- engine cost without a network -----------------------------------------------------------
if want inline; then
	echo "== inline: rtrs-bench --inline-target on one reactor vs bdevperf on a malloc bdev (core 1), $ROUNDS rounds"
	cat >"$APP_DIR/malloc.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "malloc0", "num_blocks": 65536, "block_size": 4096}},
  {"method": "bdev_wait_for_examine"}]}]}
EOF
	# The RAM disk behind rtrs-bench asks for transparent huge pages; bdevperf's malloc bdev
	# gets SPDK's own hugepages where they can be had, so that neither side pays a TLB miss
	# per IO the other does not (docs/BENCHMARKS.md, "A RAM disk on huge pages").
	if hugepages_ensure 640; then
		IN_MEM=(-s 1024 --disable-cpumask-locks) RES[inline-mem]="bdevperf on 2 MiB hugepages"
	else
		IN_MEM=("${MEM[@]}") RES[inline-mem]="bdevperf without hugepages (none could be reserved)"
	fi
	echo "   ${RES[inline-mem]}; rtrs-bench's RAM disk on transparent huge pages ($(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo "none here"))"
	inline_rtrs() {
		local line
		line=$("$BIN/rtrs-bench" --inline-target ram:256M --rw randread --bs 4K --qd 32 -m 0x2 \
			--warmup-write --time "${TIME}s" --json) || return 1
		"${REPORT[@]}" rtrs-bench "$line"
	}
	inline_malloc() {
		local r
		app_start "bp-malloc-$1" "$BDEVPERF" -m 0x2 "${IN_MEM[@]}" --json "$APP_DIR/malloc.json" -z -l \
			-q 1 -o 4096 -w randread -t "$TIME" >&2 || return 1
		r=$(perform "bp-malloc-$1" 32 4096 randread "$TIME" "$APP_DIR/malloc-$1.json.out") || return 1
		app_stop "bp-malloc-$1" >&2
		echo "${r%% *}"
	}
	# Each round runs both back to back, the order alternating (as the split part does);
	# the round whose ratio is the median is reported.
	in_rtrs=() in_malloc=() in_ratios=()
	for ((k = 1; k <= ROUNDS; k++)); do
		if ((k % 2)); then
			a=$(inline_rtrs) || exit 1
			b=$(inline_malloc "$k") || exit 1
		else
			b=$(inline_malloc "$k") || exit 1
			a=$(inline_rtrs) || exit 1
		fi
		in_rtrs+=("$a") in_malloc+=("$b") in_ratios+=("$("${REPORT[@]}" ratio "$a" "$b")")
		echo "   inline round $k: rtrs-bench inline $a IOPS, bdevperf malloc $b IOPS, ratio ${in_ratios[-1]}"
	done
	med=$("${REPORT[@]}" median-index "${in_ratios[@]}")
	RES[inline-rtrs]=${in_rtrs[$med]} RES[inline-malloc]=${in_malloc[$med]} RES[inline-ratios]="${in_ratios[*]}"
	echo "   rtrs-bench inline: ${RES[inline-rtrs]} IOPS; bdevperf malloc: ${RES[inline-malloc]} IOPS (round of the median ratio)"
	hugepages_restore
fi

# ---- memory ----------------------------------------------------------------------------------
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$(app_pid "$1")/status"; }
# DPDK heap bytes allocated by application NAME (SPDK's DMA memory: spdk_dma_malloc & co).
dpdk_alloc() {
	local f
	f=$(rpc "$1" env_dpdk_get_mem_stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["filename"])') || return 1
	awk -F: '/Alloc_size/ {gsub(/[^0-9]/, "", $2); s += $2} END {print s + 0}' "$f"
}
if want memory; then
	echo "== memory: $NMEM sessions (one bdev each) from a client spdk_tgt on core 1"
	for i in $(seq 1 $NMEM); do
		rpc tgt bdev_null_create "mnull$i" 64 4096 >/dev/null || exit 1
		rpc tgt rtrs_target_export "mnull$i" -a rw || exit 1
	done
	app_start mclt "$SPDK_TGT" -m 0x2 "${MEM[@]}" || exit 1
	sleep 1
	t0=$(rss_kib tgt) c0=$(rss_kib mclt) td0=$(dpdk_alloc tgt) cd0=$(dpdk_alloc mclt)
	for i in $(seq 1 $NMEM); do
		rpc mclt bdev_rtrs_create -b "m$i" -n "mem-sess-$i" -d "mnull$i" -p "tcp:127.0.0.1:$RTRS_PORT" \
			-i 5000 >/dev/null || exit 1
	done
	sleep 2
	t1=$(rss_kib tgt) c1=$(rss_kib mclt) td1=$(dpdk_alloc tgt) cd1=$(dpdk_alloc mclt)
	RES[mem]=$(python3 -c '
import sys
n, t0, t1, c0, c1, td0, td1, cd0, cd1 = map(int, sys.argv[1:])
mib = lambda kib: kib / 1024.0
print("%.1f %.1f %.1f %.1f" % (mib(t1 - t0) / n, (td1 - td0) / n / 1048576.0,
                               mib(c1 - c0) / n, (cd1 - cd0) / n / 1048576.0))' \
		$NMEM "$t0" "$t1" "$c0" "$c1" "$td0" "$td1" "$cd0" "$cd1")
	read -r mts mtd mcb mcd <<<"${RES[mem]}"
	echo "   target per session: RSS +$mts MiB, SPDK DMA heap +$mtd MiB"
	echo "   client per bdev:    RSS +$mcb MiB, SPDK DMA heap +$mcd MiB"
	for i in $(seq 1 $NMEM); do rpc mclt bdev_rtrs_delete "m$i" >/dev/null || exit 1; done
	app_stop mclt
fi

# ---- soak: memory over a long run ------------------------------------------------------------
if want soak; then
	echo "== soak: bdevperf over the rtrs bdev, 4 KiB randrw QD32, $SOAK_MIN min; RSS every 30 s"
	app_start bp-soak "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/rtrs.json" -z \
		-q 1 -o 4096 -w randread -t 1 || exit 1
	secs=$((SOAK_MIN * 60))
	python3 "$BDEVPERF_PY" -s "$APP_DIR/bp-soak.sock" -t $((secs + 120)) perform_tests \
		-q 32 -o 4096 -w randrw -M 50 -t "$secs" >"$APP_DIR/soak.json" 2>&1 &
	soak_pid=$!
	: >"$APP_DIR/soak.tsv"
	for ((s = 0; s <= secs; s += 30)); do
		echo -e "$s\t$(rss_kib tgt)\t$(rss_kib bp-soak)" >>"$APP_DIR/soak.tsv"
		kill -0 $soak_pid 2>/dev/null || break
		sleep 30
	done
	wait $soak_pid || { echo "soak run failed:" >&2; cat "$APP_DIR/soak.json" >&2; exit 1; }
	soak_io=$("${REPORT[@]}" bdevperf "$APP_DIR/soak.json")
	app_stop bp-soak
	# Growth from the first sample after one minute of warm-up to the last one.
	RES[soak]=$(python3 - "$APP_DIR/soak.tsv" <<'PY'
import sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
warm = [r for r in rows if r[0] >= 60] or rows
first, last = warm[0], warm[-1]
print("%d %.1f %.1f %.1f %.1f %.1f %.1f" % (
    last[0], first[1] / 1024, last[1] / 1024, max(r[1] for r in warm) / 1024,
    first[2] / 1024, last[2] / 1024, max(r[2] for r in warm) / 1024))
PY
	)
	read -r ssec st0 st1 stmax sc0 sc1 scmax <<<"${RES[soak]}"
	echo "   $soak_io (IOPS MiB/s avg-µs failed) over ${ssec}s"
	echo "   target RSS ${st0} → ${st1} MiB (max ${stmax}); client RSS ${sc0} → ${sc1} MiB (max ${scmax})"
fi

# ---- tables, goals, plots ------------------------------------------------------------------
ratio() { "${REPORT[@]}" ratio "$1" "$2"; }
GOALS=() # goal TEXT VALUE OP TARGET [AIM] (bench/lib.sh): a done-when ratio, PASS/MISS
reported() { # reported TEXT VALUE [AIM]: a figure shown beside the goals, without a verdict
	GOALS+=("| $1 | $2 | ${3:-—} | — |")
}
# The first word of RES[KEY] (or the Nth: res_word KEY N); empty when the part did not run.
res_word() { local f; read -r -a f <<<"${RES[$1]:-}"; echo "${f[${2:-1} - 1]:-}"; }

if want pairs; then
	{
		echo "| workload | rtrs IOPS | rtrs MiB/s | rtrs avg µs | rtrs p99 µs | NVMe-oF/TCP IOPS | NVMe-oF/TCP MiB/s | NVMe-oF/TCP avg µs | NVMe-oF/TCP p99 µs | IOPS ratio rtrs/nvmf | every round's ratio |"
		echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
		for w in "${WORKLOADS[@]}"; do
			IFS='|' read -r name _ _ _ <<<"$w"
			read -r ri rm rl _ r99 <<<"${RES[rtrs-$name]}"
			read -r ni nm nl _ n99 <<<"${RES[nvmf-$name]}"
			echo "| $name | $ri | $rm | $rl | $r99 | $ni | $nm | $nl | $n99 | $(ratio "$ri" "$ni") | ${RES[rounds-$name]// / · } |"
		done
	} >"$APP_DIR/pairs.md"
	goal "4 KiB randread QD32: IOPS rtrs / NVMe-oF/TCP" \
		"$(ratio "$(res_word rtrs-4k-randread-qd32)" "$(res_word nvmf-4k-randread-qd32)")" ">=" 1.00 1.25
	goal "4 KiB randwrite QD32: IOPS rtrs / NVMe-oF/TCP" \
		"$(ratio "$(res_word rtrs-4k-randwrite-qd32)" "$(res_word nvmf-4k-randwrite-qd32)")" ">=" 1.00 1.25
	goal "4 KiB randread QD1: avg latency rtrs / NVMe-oF/TCP (bdevperf; p99 $(res_word rtrs-4k-randread-qd1 5) / $(res_word nvmf-4k-randread-qd1 5) µs)" \
		"$(ratio "$(res_word rtrs-4k-randread-qd1 3)" "$(res_word nvmf-4k-randread-qd1 3)")" "<=" 1.00 0.80
	reported "4 KiB randread QD1: p99 latency rtrs / NVMe-oF/TCP (bdevperf)" \
		"$(ratio "$(res_word rtrs-4k-randread-qd1 5)" "$(res_word nvmf-4k-randread-qd1 5)")"
	goal "128 KiB read QD8: MiB/s rtrs / NVMe-oF/TCP" \
		"$(ratio "$(res_word rtrs-128k-read-qd8 2)" "$(res_word nvmf-128k-read-qd8 2)")" ">=" 1.00 1.25
fi
if want floor; then
	# Ratios to the floor: IOPS (≤ 1: the share of the floor reached) and average latency
	# (≥ 1: how many times the floor's), each side against the floor of the same shape.
	{
		echo "| workload | floor IOPS | floor avg µs | floor p99 µs | floor syscalls/IO client, server | rtrs IOPS / floor | NVMe-oF/TCP IOPS / floor | rtrs avg µs / floor | NVMe-oF/TCP avg µs / floor |"
		echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
		for w in "${WORKLOADS[@]}"; do
			IFS='|' read -r name _ _ _ <<<"$w"
			read -r fio fl f99 fc fs <<<"${RES[floor-$name]}"
			echo "| $name | $fio | $fl | $f99 | $fc, $fs | $(ratio "$(res_word "rtrs-$name")" "$fio") | $(ratio "$(res_word "nvmf-$name")" "$fio") | $(ratio "$(res_word "rtrs-$name" 3)" "$fl") | $(ratio "$(res_word "nvmf-$name" 3)" "$fl") |"
		done
	} >"$APP_DIR/floor.md"
	if want pairs; then
		for name in 4k-randread-qd32 4k-randwrite-qd32 128k-read-qd8; do
			reported "$name: IOPS / plain-TCP floor ($(res_word "floor-$name") IOPS), rtrs; NVMe-oF/TCP" \
				"$(ratio "$(res_word "rtrs-$name")" "$(res_word "floor-$name")"); $(ratio "$(res_word "nvmf-$name")" "$(res_word "floor-$name")")" "aim rtrs >= 0.90"
		done
		reported "4k-randread-qd1: avg latency / plain-TCP floor ($(res_word floor-4k-randread-qd1 2) µs, p99 $(res_word floor-4k-randread-qd1 3) µs), rtrs; NVMe-oF/TCP" \
			"$(ratio "$(res_word rtrs-4k-randread-qd1 3)" "$(res_word floor-4k-randread-qd1 2)"); $(ratio "$(res_word nvmf-4k-randread-qd1 3)" "$(res_word floor-4k-randread-qd1 2)")"
	fi
fi
if want syscalls; then
	{
		echo "| workload | side | rtrs syscalls/IO | NVMe-oF/TCP syscalls/IO | rtrs / nvmf | rtrs calls per IO | NVMe-oF/TCP calls per IO | IOPS while counted, rtrs; NVMe-oF/TCP |"
		echo "|---|---|---:|---:|---:|---|---|---:|"
		for w in "${WORKLOADS[@]}"; do
			IFS='|' read -r name _ _ _ <<<"$w"
			for side in tgt ini; do
				rs=${RES[sc-rtrs-$name-$side]} ns=${RES[sc-nvmf-$name-$side]}
				echo "| $name | $([[ $side == tgt ]] && echo target || echo initiator) | ${rs%% *} | ${ns%% *} | $(ratio "${rs%% *}" "${ns%% *}") | ${rs#* } | ${ns#* } | $(res_word "sc-rtrs-$name"); $(res_word "sc-nvmf-$name") |"
			done
		done
		echo
		echo "| workload | side | rtrs user µs/IO | NVMe-oF/TCP user µs/IO | rtrs / nvmf, user | rtrs system µs/IO | NVMe-oF/TCP system µs/IO | rtrs / nvmf, system | busy share of the IO thread, rtrs; NVMe-oF/TCP |"
		echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
		for w in "${WORKLOADS[@]}"; do
			IFS='|' read -r name _ _ _ <<<"$w"
			for side in tgt ini; do
				read -r ru rs <<<"${RES[cpu-rtrs-$name-$side]}"
				read -r nu ns <<<"${RES[cpu-nvmf-$name-$side]}"
				rb=${RES[busy-rtrs-$name-$side]:-n/a} nb=${RES[busy-nvmf-$name-$side]:-n/a}
				echo "| $name | $([[ $side == tgt ]] && echo target || echo initiator) | $ru | $nu | $(ratio "$ru" "$nu") | $rs | $ns | $(ratio "$rs" "$ns") | ${rb%% *}; ${nb%% *} |"
			done
		done
		echo
		echo "The busy share is SPDK's own count (\`thread_get_stats\`) of the ticks its busiest thread spent in"
		echo "polls that found work over the window: the side near 1.00 is the one that bounds the rate."
		echo "At QD1 both spin between IOs, rtrs in user space and NVMe-oF/TCP in \`epoll_wait\`, so the"
		echo "user and system split says where each idles rather than what an IO costs."
	} >"$APP_DIR/syscalls.md"
	for w in "${WORKLOADS[@]}"; do
		IFS='|' read -r name _ _ _ <<<"$w"
		rt=$(res_word "sc-rtrs-$name-tgt") nt=$(res_word "sc-nvmf-$name-tgt")
		ri=$(res_word "sc-rtrs-$name-ini") ni=$(res_word "sc-nvmf-$name-ini")
		# Both sides must hold: the measure is the larger of the two sides' ratios.
		worst=$(python3 -c '
import sys
try:
    print("%.2f" % max(float(sys.argv[1]) / float(sys.argv[2]), float(sys.argv[3]) / float(sys.argv[4])))
except (ValueError, ZeroDivisionError):
    print("n/a")' "$rt" "$nt" "$ri" "$ni")
		goal "$name: syscalls per IO rtrs / NVMe-oF/TCP, larger of target ($rt / $nt) and initiator ($ri / $ni)" "$worst" "<=" 1.00
	done
fi
# The first six "GROUP=NS" of a layers line, as text.
top_layers() { tr ';' '\n' <<<"$1" | head -n 6 | tr '\n' ' ' | sed 's/ $//; s/ /, /g; s/_/ /g'; }
if want layers; then
	{
		echo "| workload | side | rtrs kernel ns/IO | NVMe-oF/TCP kernel ns/IO | rtrs user ns/IO | NVMe-oF/TCP user ns/IO | rtrs / nvmf, user | rtrs user, largest layers (ns/IO) | NVMe-oF/TCP user, largest layers (ns/IO) |"
		echo "|---|---|---:|---:|---:|---:|---:|---|---|"
		for w in "${WORKLOADS[@]}"; do
			IFS='|' read -r name _ _ _ <<<"$w"
			for side in tgt ini; do
				read -r rk ru rg <<<"${RES[ly-rtrs-$name-$side]:-n/a n/a -}"
				read -r nk nu ng <<<"${RES[ly-nvmf-$name-$side]:-n/a n/a -}"
				echo "| $name | $([[ $side == tgt ]] && echo target || echo initiator) | $rk | $nk | $ru | $nu | $(ratio "$ru" "$nu") | $(top_layers "$rg") | $(top_layers "$ng") |"
			done
		done
		echo
		echo "CPU per IO from \`perf record\` (cpu-clock samples) of each process over the counting window:"
		echo "a layer's share of the samples times the process's CPU time in the window, over the IOs."
		echo "A side that idles (busy share below 1.00) counts its idle polling in its user or kernel time."
	} >"$APP_DIR/layers.md"
fi
# tl_median KIND NAME FIELD: the median over the rounds of field FIELD (1-6) of the timeline.
tl_median() {
	local v=() r line fs
	IFS=';' read -r -a r <<<"${RES[tl-$1-$2]:-}"
	for line in "${r[@]}"; do
		read -r -a fs <<<"$line"
		v+=("${fs[$3 - 1]:-n/a}")
	done
	((${#v[@]})) && "${REPORT[@]}" median "${v[@]}" 2>/dev/null || echo n/a
}
if want timeline; then
	{
		echo "| QD1 workload | transport | request's way µs | target's work µs | answer's way µs | initiator's work µs | cycle µs | every round (target's; initiator's work) |"
		echo "|---|---|---:|---:|---:|---:|---:|---|"
		for w in "${WORKLOADS[@]}"; do
			IFS='|' read -r name qd _ _ <<<"$w"
			[[ $qd == 1 ]] || continue
			for kind in rtrs nvmf; do
				rounds=$(tr ';' '\n' <<<"${RES[tl-$kind-$name]}" | awk 'NF {printf "%s%s; %s", sep, $2, $4; sep=" · "}')
				echo "| $name | $kind | $(tl_median $kind "$name" 1) | $(tl_median $kind "$name" 2) | $(tl_median $kind "$name" 3) | $(tl_median $kind "$name" 4) | $(tl_median $kind "$name" 5) | $rounds |"
			done
		done
		echo
		echo "Medians over the rounds of each round's median phase, from the system calls of both"
		echo "sides traced together for ${TL_WIN} s at QD1 (the tracing lengthens the system calls, not"
		echo "the work between them). The target's work runs from its last receive of the request to"
		echo "the send of its answer, the initiator's from its last receive of the answer to the send"
		echo "of the next request (the bdev layer and bdevperf included, as for both transports)."
	} >"$APP_DIR/timeline.md"
	for w in "${WORKLOADS[@]}"; do
		IFS='|' read -r name qd _ _ <<<"$w"
		[[ $qd == 1 ]] || continue
		for f in 2:target 4:initiator; do
			r=$(tl_median rtrs "$name" "${f%%:*}") n=$(tl_median nvmf "$name" "${f%%:*}")
			goal "$name: the ${f#*:}'s work per IO (timeline) rtrs / NVMe-oF/TCP ($r / $n µs)" "$(ratio "$r" "$n")" "<=" 1.00
		done
	done
fi
if [[ $FIO_OK -eq 1 ]]; then
	{
		echo "| fio spdk_bdev, 4 KiB randread QD1 | IOPS | avg µs | p50 µs | p99 µs | p99.9 µs |"
		echo "|---|---:|---:|---:|---:|---:|"
		for kind in rtrs nvmf; do
			read -r fio fa f50 f99 f999 <<<"${RES[fio-$kind]}"
			echo "| $kind | $fio | $fa | $f50 | $f99 | $f999 |"
		done
	} >"$APP_DIR/fio.md"
	read -r _ ra _ r99 _ <<<"${RES[fio-rtrs]}"; read -r _ na _ n99 _ <<<"${RES[fio-nvmf]}"
	goal "4 KiB randread QD1: avg latency rtrs / NVMe-oF/TCP (fio)" "$(ratio "$ra" "$na")" "<=" 1.00 0.80
	GOALS+=("| 4 KiB randread QD1: p99 latency rtrs / NVMe-oF/TCP (fio; reported) | $(ratio "$r99" "$n99") ($r99 / $n99 µs) | — | — |")
	"${REPORT[@]}" svg-lat "$APP_DIR/fio-rtrs.json" "$APP_DIR/fio-nvmf.json" docs/perf-qd1-latency.svg
	echo "wrote docs/perf-qd1-latency.svg"
fi
if want sweep; then
	{
		echo "| 4 KiB randread QD | $(printf '%s | ' "${SWEEP_QDS[@]}")"
		echo "|---|$(printf -- '---:|%.0s' "${SWEEP_QDS[@]}")"
		for kind in rtrs nvmf; do
			echo "| $kind IOPS | $(awk -v k=$kind '$1 == k {printf "%s | ", $3}' "$APP_DIR/sweep.tsv")"
		done
	} >"$APP_DIR/sweep.md"
	"${REPORT[@]}" svg-qd "$APP_DIR/sweep.tsv" docs/perf-iops-qd.svg
	echo "wrote docs/perf-iops-qd.svg"
fi
if want split; then
	nv=$(res_word nvmf-4k-randread-qd32)
	{
		echo "| 4 KiB randread QD32, IOPS (ratio to NVMe-oF/TCP${nv:+, $nv}) | standalone rtrs-target | spdk_tgt (rtrs target backend) |"
		echo "|---|---:|---:|"
		echo "| rtrs-bench | ${RES[split-bench-rt]} ($(ratio "${RES[split-bench-rt]}" "$nv")) | ${RES[split-bench-st]} ($(ratio "${RES[split-bench-st]}" "$nv")) |"
		echo "| bdevperf over the rtrs bdev | ${RES[split-bdev-rt]} ($(ratio "${RES[split-bdev-rt]}" "$nv")) | ${RES[split-bdev-st]} ($(ratio "${RES[split-bdev-st]}" "$nv")) |"
	} >"$APP_DIR/split.md"
	goal "bdevperf over the rtrs bdev / rtrs-bench, both against spdk_tgt, 4 KiB randread QD32 (round of the median ratio; every round: ${RES[split-ratios]})" \
		"$(ratio "${RES[split-bdev-st]}" "${RES[split-bench-st]}")" ">=" 0.97
fi
if want inline; then
	goal "inline engine (rtrs-bench, loopback, 1 reactor) / bdevperf malloc (1 core), 4 KiB randread QD32 IOPS ($(printf '%s / %s' "${RES[inline-rtrs]}" "${RES[inline-malloc]}"); round of the median ratio, every round: ${RES[inline-ratios]}; ${RES[inline-mem]})" \
		"$(ratio "${RES[inline-rtrs]}" "${RES[inline-malloc]}")" ">=" 0.60 0.80
fi
if want soak; then
	# "No growth": the last sample within 2 MiB (allocator noise) of the first after warm-up.
	g=$(python3 -c 'import sys; print("%.1f" % max(float(sys.argv[2]) - float(sys.argv[1]), float(sys.argv[4]) - float(sys.argv[3])))' "$st0" "$st1" "$sc0" "$sc1")
	goal "RSS growth over the ${SOAK_MIN}-minute run, larger of target and client (MiB)" "$g" "<=" 2
fi

# The report: printed whole; docs/BENCHMARKS.md keeps it without the per-side tables of
# the syscalls part (their ratios are among the goals), so the doc stays a summary.
report() { # report PART...: the run's report with those parts' tables
	echo "### $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), ${TIME} s per workload, $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $SPDK_VERSION"
	echo
	# The command as it ran: options of parts that did not run are left out.
	cmd="bench/spdk_vs_nvmf.sh --time $TIME"
	{ want pairs || want split || want inline; } && cmd+=" --rounds $ROUNDS"
	want sweep && cmd+=" --sweep-time $SWEEP_TIME"
	want soak && cmd+=" --soak $SOAK_MIN"
	cmd+=" --only $ONLY"
	echo "Command: \`$cmd\`; load average before the run: $LOAD0, after: $(cut -d" " -f1-3 /proc/loadavg)."
	if [[ ${#GOALS[@]} -gt 0 ]]; then
		echo
		echo "| goal | measured | target | result |"
		echo "|---|---:|---:|---|"
		printf '%s\n' "${GOALS[@]}"
	fi
	for part in "$@"; do
		[[ -s "$APP_DIR/$part.md" ]] && { echo; cat "$APP_DIR/$part.md"; }
	done
	if [[ -s "$APP_DIR/syscalls.md" && " $* " != *" syscalls "* ]]; then
		echo
		echo "System calls and CPU time per IO of each side: in the bench's printed report."
	fi
	if [[ -s "$APP_DIR/layers.md" && " $* " != *" layers "* ]]; then
		echo
		echo "CPU per IO of each side by layer: in the bench's printed report."
	fi
	if want memory; then
		echo
		echo "Memory ($NMEM sessions, one bdev each): target +$mts MiB RSS and +$mtd MiB SPDK DMA heap per connected session; client +$mcb MiB RSS and +$mcd MiB SPDK DMA heap per bdev."
	fi
	if want soak; then
		echo
		echo "Soak ($SOAK_MIN min, 4 KiB randrw QD32 over the rtrs bdev: $soak_io IOPS MiB/s avg-µs failed): target RSS $st0 → $st1 MiB (max $stmax), client RSS $sc0 → $sc1 MiB (max $scmax), sampled every 30 s after 1 min of warm-up."
	fi
	if [[ -s "$APP_DIR/sweep.md" || $FIO_OK -eq 1 ]]; then
		echo
		echo "Plots of this run: [IOPS vs queue depth](perf-iops-qd.svg), [QD1 latency distribution](perf-qd1-latency.svg)."
	fi
}
report pairs floor syscalls layers timeline split fio sweep >"$OUT"
report pairs floor timeline split fio sweep >"$OUT.doc"
echo
cat "$OUT"

if [[ $APPEND -eq 1 ]]; then
	cat >"$APP_DIR/intro.md" <<'EOF'
`bench/spdk_vs_nvmf.sh`: one spdk_tgt on core 0 serves the same null bdev over RTRS
(tcp fabric, 127.0.0.1) and over SPDK's NVMe-oF/TCP; bdevperf (and fio's spdk_bdev plugin)
on core 1 runs each workload against the rtrs bdev, then against bdev_nvme. SPDK runs
without hugepages (`--no-huge`), except fio's plugin, which needs them, and the inline
part's bdevperf on a malloc bdev, against a RAM disk on transparent huge pages. Ratios are rtrs
over NVMe-oF/TCP, measured in the same invocation.
EOF
	"${REPORT[@]}" append docs/BENCHMARKS.md "## SPDK: rtrs vs NVMe-oF/TCP" "$APP_DIR/intro.md" "$OUT.doc"
	echo "appended to docs/BENCHMARKS.md"
fi
