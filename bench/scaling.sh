#!/usr/bin/env bash
# Scaling with cores, measured in one invocation (docs/BENCHMARKS.md, "Scaling with cores").
#
# Parts (both by default; --only picks one):
#   inline  rtrs-bench --inline-target ram:1G --warmup-write (target and client in one
#           process over the loopback fabric; the export written once first, so that reads
#           come from memory, not the kernel's zero page), 4 KiB randread QD32, on 1..M
#           reactors (M: every core). Each
#           round runs every reactor count once, in an order that reverses from one round
#           to the next; a count's result is the median of its rounds, and its speed-up
#           the median over rounds of (IOPS at N) / (IOPS at 1 in the same round).
#   spdk    one spdk_tgt on cores 0..N-1 (the plugin preloaded) serving one null bdev over
#           RTRS (tcp fabric) and over NVMe-oF/TCP on 127.0.0.1; bdevperf -C on cores
#           N..2N-1, one job per core at QD32, 4 KiB randread, once with an rtrs bdev and
#           once with bdev_nvme, for N = 1, 2, 4, ... up to half the cores. Each round runs
#           both transports, in an order that alternates between rounds; the round whose
#           IOPS ratio is the median of the rounds' is the result for N (as the pairs of
#           bench/spdk_vs_nvmf.sh).
#
#   bench/scaling.sh [--time S] [--rounds N] [--cores LIST] [--only inline|spdk]
#                    [--out DIR] [--no-append]
#
# --cores limits the core counts (comma-separated) of both parts. Results go to --out
# (default: $TMPDIR/rtrs-scaling): scaling.md (the tables), scaling.tsv
# ("side<TAB>cores<TAB>IOPS") and scaling-cores.svg, and from a checkout the run is
# appended to docs/BENCHMARKS.md with the plot in docs/perf-scaling.svg (not with
# --no-append, nor from a bundle). Nothing here asserts a speed: the figures and ratios
# are printed for a reader to judge.
#
# From a checkout it builds what it needs (cargo, the plugin against $SPDK_DIR or
# /opt/spdk). On a machine without a toolchain or SPDK tree, run it from the relocatable
# bundle bench/pack.sh makes: `./run.sh scaling [ARGS]` inside the unpacked bundle
# (RTRS_PREBUILT=1: nothing is built; SPDK is the bundle's copy). Needs python3 there.
# Ports: 14510 (RTRS), 4421 (NVMe-oF/TCP), or RTRS_TEST_PORT_BASE + 90 and 91.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 1
# shellcheck source=ci/spdk/lib.sh
. ci/spdk/lib.sh
REPORT=(python3 "$REPO/bench/perf_report.py")

TIME=5
ROUNDS=3
ONLY=inline,spdk
CORES=
OUTD=
APPEND=1
usage() {
	echo "usage: $0 [--time S] [--rounds N] [--cores LIST] [--only inline|spdk] [--out DIR] [--no-append]" >&2
	exit 2
}
while [[ $# -gt 0 ]]; do
	case $1 in
	--time) TIME=${2:?}; shift 2 ;;
	--rounds) ROUNDS=${2:?}; shift 2 ;;
	--cores) CORES=${2:?}; shift 2 ;;
	--only) ONLY=${2:?}; shift 2 ;;
	--out) OUTD=${2:?}; shift 2 ;;
	--no-append) APPEND=0; shift ;;
	*) usage ;;
	esac
done
for p in ${ONLY//,/ }; do
	[[ $p == inline || $p == spdk ]] || { echo "--only: unknown part '$p' (inline, spdk)" >&2; usage; }
done
[[ "$TIME" =~ ^[0-9]+$ && "$TIME" -gt 0 ]] || { echo "--time: '$TIME' is not a number of seconds" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[0-9]+$ && "$ROUNDS" -gt 0 ]] || { echo "--rounds: '$ROUNDS' is not a positive number" >&2; exit 2; }
for c in ${CORES//,/ }; do
	[[ "$c" =~ ^[0-9]+$ && "$c" -gt 0 ]] || { echo "--cores: '$c' is not a core count" >&2; exit 2; }
done
want() { [[ ",$ONLY," == *",$1,"* ]]; }
PREBUILT=${RTRS_PREBUILT:-0}
[[ $PREBUILT == 1 ]] && APPEND=0

NCPU=$(nproc)
# The counts to run: 1, 2, 4, ... up to LIMIT and LIMIT itself; or those of --cores within it.
counts() {
	local limit=$1 n=1 c
	if [[ -n "$CORES" ]]; then
		for c in ${CORES//,/ }; do ((c <= limit)) && echo "$c"; done
		return
	fi
	while ((n < limit)); do echo $n; n=$((n * 2)); done
	((limit >= 1)) && echo "$limit"
}
mask() { printf '0x%x' $((((1 << $2) - 1) << $1)); } # mask FIRST COUNT
mapfile -t INLINE_N < <(counts "$NCPU")
mapfile -t SPDK_N < <(counts $((NCPU / 2)))

if [[ $PREBUILT == 1 ]]; then
	BIN=$REPO/target/release
	PLUGIN_SO=$BIN/librtrs_spdk.so
	[[ -x $BIN/rtrs-bench && -f $PLUGIN_SO ]] || { echo "RTRS_PREBUILT=1 but $BIN holds no rtrs-bench or librtrs_spdk.so (run from a bundle of bench/pack.sh)" >&2; exit 1; }
else
	echo "== building the binaries (release)"
	(cargo build --release -q --bin rtrs-bench) || exit 1
	BIN=${CARGO_TARGET_DIR:-$REPO/target}/release
fi

apps_init
OUTD=${OUTD:-${TMPDIR:-/tmp}/rtrs-scaling}
mkdir -p "$OUTD" || exit 1
trap apps_cleanup EXIT
trap 'exit 130' INT TERM
TSV=$OUTD/scaling.tsv MD=$OUTD/scaling.md
: >"$TSV"
: >"$MD"
LOAD0=$(cut -d" " -f1-3 /proc/loadavg)
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)

# ---- inline: the engine alone on 1..M reactors ---------------------------------------------
if want inline; then
	echo "== inline: rtrs-bench --inline-target ram:1G --warmup-write, 4 KiB randread QD32, reactors ${INLINE_N[*]}, $ROUNDS rounds of ${TIME} s"
	declare -A IN
	for ((k = 1; k <= ROUNDS; k++)); do
		order=("${INLINE_N[@]}")
		((k % 2 == 0)) && mapfile -t order < <(printf '%s\n' "${INLINE_N[@]}" | sort -rn)
		for n in "${order[@]}"; do
			line=$("$BIN/rtrs-bench" --inline-target ram:1G --warmup-write --rw randread --bs 4K \
				--qd 32 --time "${TIME}s" -m "$(mask 0 "$n")" --json) || { echo "inline on $n reactors failed" >&2; exit 1; }
			IN[$n-$k]=$("${REPORT[@]}" rtrs-bench "$line")
			echo "   round $k, $n reactors: ${IN[$n-$k]} IOPS"
		done
	done
	{
		echo "rtrs-bench --inline-target ram:1G --warmup-write --rw randread --bs 4K --qd 32 --time ${TIME}s -m MASK, $ROUNDS rounds:"
		echo
		echo "| reactors | IOPS (median) | rounds | × 1 reactor (median of the rounds' ratios) |"
		echo "|---:|---:|---|---:|"
	} >>"$MD"
	for n in "${INLINE_N[@]}"; do
		vals=() ratios=()
		for ((k = 1; k <= ROUNDS; k++)); do
			vals+=("${IN[$n-$k]}")
			[[ -n "${IN[1-$k]:-}" ]] && ratios+=("$("${REPORT[@]}" ratio "${IN[$n-$k]}" "${IN[1-$k]}")")
		done
		med=$("${REPORT[@]}" median "${vals[@]}")
		sp=n/a
		((${#ratios[@]})) && sp=$("${REPORT[@]}" median "${ratios[@]}")
		printf 'inline\t%s\t%.0f\n' "$n" "$med" >>"$TSV"
		printf '| %s | %.0f | %s | %s |\n' "$n" "$med" "${vals[*]}" "$sp" >>"$MD"
		echo "   $n reactors: median $med IOPS, ${sp} × 1 reactor (ratios: ${ratios[*]:-none})"
	done
	echo >>"$MD"
fi

# ---- spdk: rtrs bdev vs NVMe-oF/TCP, N cores per side ---------------------------------------
if want spdk; then
	SPDK_DIR=$(spdk_find)
	if ((${#SPDK_N[@]} == 0)); then
		echo "SKIP spdk: $NCPU core(s) here, two are needed (one per side)"
		echo "spdk: skipped ($NCPU core(s), two needed)." >>"$MD"
	elif [[ -z "$SPDK_DIR" ]]; then
		echo "SKIP spdk: SPDK not found (set SPDK_DIR, or run from a bundle of bench/pack.sh)"
		echo "spdk: skipped (SPDK not found)." >>"$MD"
	else
		export SPDK_DIR
		spdk_setup_paths || exit 1
		[[ -n "$BDEVPERF_PY" ]] || { echo "bdevperf.py not found under $SPDK_DIR" >&2; exit 1; }
		if [[ $PREBUILT != 1 ]]; then
			echo "== building the plugin against $SPDK_DIR (release)"
			plugin_build || exit 1
		fi
		if [[ -n "${RTRS_TEST_PORT_BASE:-}" ]]; then
			RTRS_PORT=$((RTRS_TEST_PORT_BASE + 90)) NVMF_PORT=$((RTRS_TEST_PORT_BASE + 91))
		else
			RTRS_PORT=14510 NVMF_PORT=4421
		fi
		NQN=nqn.2016-06.io.spdk:rtrsscale
		MEM=(--no-huge -s 4096 --disable-cpumask-locks)
		rtrs_bdev_json scale0 null0 $RTRS_PORT '{"hb_interval_ms": 5000}' >"$APP_DIR/rtrs.json"
		nvme_bdev_json nvme0 $NQN $NVMF_PORT >"$APP_DIR/nvmf.json"
		# one KIND N ROUND: bdevperf -C on cores N..2N-1 against the target; prints its line.
		one() {
			local kind=$1 n=$2 k=$3 name="bp-$1-$2-$3" r
			app_start "$name" "$BDEVPERF" -m "$(mask "$n" "$n")" -C "${MEM[@]}" \
				--json "$APP_DIR/$kind.json" -z -q 32 -o 4096 -w randread -t "$TIME" || return 1
			r=$(python3 "$BDEVPERF_PY" -s "$APP_DIR/$name.sock" -t $((TIME + 60)) perform_tests \
				-q 32 -o 4096 -w randread -t "$TIME" >"$APP_DIR/$name.json" &&
				"${REPORT[@]}" bdevperf "$APP_DIR/$name.json") || {
				echo "$kind on $n cores: perform_tests failed; log:" >&2
				tail -n 20 "$APP_DIR/$name.log" >&2
				app_stop "$name"
				return 1
			}
			app_stop "$name"
			echo "$r"
		}
		{
			echo "spdk_tgt on cores 0..N-1 (null bdev over RTRS/tcp and NVMe-oF/TCP, 127.0.0.1), bdevperf -C on cores N..2N-1,"
			echo "one job per core, 4 KiB randread QD32, ${TIME} s, $ROUNDS rounds (the round of the median ratio):"
			echo
			echo "| cores per side | rtrs IOPS | NVMe-oF/TCP IOPS | ratio | rounds' ratios | failed IO (rtrs, nvmf) |"
			echo "|---:|---:|---:|---:|---|---|"
		} >>"$MD"
		for n in "${SPDK_N[@]}"; do
			echo "== spdk: $n core(s) per side: spdk_tgt -m $(mask 0 "$n"), bdevperf -C -m $(mask "$n" "$n")"
			app_start tgt "$SPDK_TGT" -m "$(mask 0 "$n")" "${MEM[@]}" || exit 1
			rpc tgt bdev_null_create null0 1024 4096 >/dev/null || exit 1
			rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $RTRS_PORT || exit 1
			rpc tgt rtrs_target_export null0 -a rw || exit 1
			nvmf_export tgt null0 $NQN RTRSSCALE0001 $NVMF_PORT || exit 1
			ra=() rb=() rr=()
			for ((k = 1; k <= ROUNDS; k++)); do
				if ((k % 2)); then
					a=$(one rtrs "$n" "$k") || exit 1
					b=$(one nvmf "$n" "$k") || exit 1
				else
					b=$(one nvmf "$n" "$k") || exit 1
					a=$(one rtrs "$n" "$k") || exit 1
				fi
				ra+=("$a") rb+=("$b") rr+=("$("${REPORT[@]}" ratio "${a%% *}" "${b%% *}")")
				echo "   round $k: rtrs $a; nvmf $b; IOPS ratio ${rr[-1]} (IOPS MiB/s avg-µs failed p99-µs)"
			done
			picked=$("${REPORT[@]}" median-index "${rr[@]}")
			read -r ai _ _ af _ <<<"${ra[$picked]}"
			read -r bi _ _ bf _ <<<"${rb[$picked]}"
			printf 'rtrs\t%s\t%.0f\nnvmf\t%s\t%.0f\n' "$n" "$ai" "$n" "$bi" >>"$TSV"
			printf '| %s | %.0f | %.0f | %s | %s | %s, %s |\n' "$n" "$ai" "$bi" "${rr[$picked]}" "${rr[*]}" "$af" "$bf" >>"$MD"
			echo "   $n core(s) per side: rtrs $ai, nvmf $bi IOPS: ratio ${rr[$picked]} (rounds: ${rr[*]})"
			app_stop tgt
		done
		echo >>"$MD"
	fi
fi

[[ -s "$TSV" ]] && "${REPORT[@]}" svg-cores "$TSV" "$OUTD/scaling-cores.svg"
{
	echo "Machine: $NCPU cores ($CPU_MODEL), load before the run $LOAD0, $(date -u '+%Y-%m-%d %H:%M UTC')."
	echo
} >"$OUTD/head.md"
cat "$OUTD/head.md" "$MD" >"$OUTD/run.md"
echo "== results (also in $OUTD)"
cat "$OUTD/run.md"
if [[ $APPEND == 1 ]]; then
	[[ -f "$OUTD/scaling-cores.svg" ]] && cp "$OUTD/scaling-cores.svg" "$REPO/docs/perf-scaling.svg"
	cat >"$APP_DIR/intro.md" <<'EOF'
`bench/scaling.sh` (method in its header): the engine alone on 1..M reactors, and the rtrs
bdev against SPDK's NVMe-oF/TCP with N cores per side. Runs in order, the latest last; the
plot (of the latest) is `docs/perf-scaling.svg`.
EOF
	"${REPORT[@]}" append "$REPO/docs/BENCHMARKS.md" "## Scaling with cores" "$APP_DIR/intro.md" "$OUTD/run.md"
	echo "appended to docs/BENCHMARKS.md (## Scaling with cores)"
fi
exit 0
