#!/usr/bin/env bash
# The SPDK tests: the plugin loaded into real SPDK applications on this
# machine. Target and client apps run on two cores each (-m 0x3; the cores are shared),
# so every disk and the target have threads on more than one core.
#
# Finds SPDK through $SPDK_DIR, else /opt/spdk (the README's default); without SPDK it
# prints one SKIPPED line and succeeds. Each scenario has a time limit; a trap stops
# every SPDK application this script started. A scenario whose tool is missing (fio:
# $FIO, SPDK's CONFIG_FIO_SOURCE_DIR, /opt/fio-3.*/fio or the PATH) prints "SKIP NAME:
# why". Ends with "SPDK tests: N passed, M failed" plus ", K skipped (NAMES)" when some
# were skipped.
#
# Each scenario is a function scenario_NAME in ci/spdk/scenarios/NAME.sh, over the
# helpers of ci/spdk/lib.sh and ci/spdk/scenario_lib.sh; the checks of JSON answers are
# the Python scripts in ci/spdk/.
#
#   ci/spdk-test.sh                 all scenarios
#   ci/spdk-test.sh basic verify    only these
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"

# shellcheck source=ci/spdk/lib.sh
. ci/spdk/lib.sh
if [[ -n "${SPDK_DIR:-}" ]]; then
	SPDK_DIR_REASON="SPDK_DIR=$SPDK_DIR is not a directory"
else
	SPDK_DIR_REASON="SPDK_DIR not set and /opt/spdk not found"
fi
SPDK_DIR=$(spdk_find)
if [[ -z "$SPDK_DIR" ]]; then
	echo "SKIPPED: SPDK tests — ${SPDK_DIR_REASON}; see README"
	exit 0
fi
export SPDK_DIR
apps_init
trap apps_cleanup EXIT
trap 'exit 130' INT TERM

spdk_setup_paths || exit 1
echo "== SPDK at $SPDK_DIR; building the plugin (${PLUGIN_PROFILE:-release})"
plugin_build || {
	echo "plugin build failed"
	exit 1
}
# The code that needs SPDK (the root crate's `spdk` feature, the plugin) under the lints
# ci/test.sh gives the rest, which it cannot build without SPDK.
echo "== clippy with SPDK: --features spdk and -p rtrs-spdk-plugin, every target, -D warnings"
(cd "$REPO" && cargo clippy -q --features spdk --all-targets -- -D warnings &&
	cargo clippy -q -p rtrs-spdk-plugin --all-targets -- -D warnings) || {
	echo "clippy with SPDK failed"
	exit 1
}
echo "== cargo doc with SPDK: --features spdk, and the plugin's private items, -D warnings"
(cd "$REPO" && RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q --features spdk &&
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q -p rtrs-spdk-plugin --document-private-items) || {
	echo "cargo doc with SPDK failed"
	exit 1
}

SCENARIO_TIMEOUT=${SCENARIO_TIMEOUT:-240}
# Other SPDK applications may run on this machine: no core locks.
MEM=(--no-huge -s 1024 --disable-cpumask-locks)
# Targets: every RTRS session's chunk pool is SPDK DMA memory (queue_depth x chunk_size,
# 64 MiB by default) and a bare spdk_tgt -s 1024 has ~140 MiB free, so give them room for
# a few sessions.
TGT_MEM=(--no-huge -s 2048 --disable-cpumask-locks)
# Base of the TCP ports the scenarios listen on (set it to run two copies side by side).
# shellcheck disable=SC2034 # read by the scenarios
PB=${RTRS_TEST_PORT_BASE:-14420}
TGT_MASK=0x3
CLT_MASK=0x3
PASSED=0
FAILED=0
FAILED_NAMES=()
SKIPPED=0
SKIPPED_NAMES=()

# Every scenario runs with this many devices over each client session (rtrs0 over
# malloc0, rtrs1 over malloc1, ... sharing rtrs0's sessname): bdevperf and fio drive them
# all, and every path fault and outage hits all of them at once.
export DEVS=${DEVS:-2}

# The scenarios' building blocks, then one file per scenario defining scenario_NAME.
# shellcheck source=ci/spdk/scenario_lib.sh
. ci/spdk/scenario_lib.sh
for f in ci/spdk/scenarios/*.sh; do
	# shellcheck source=/dev/null
	. "$f"
done

# ---- runner -----------------------------------------------------------------------------

run_scenario() {
	local name=$1 rc t0=$SECONDS took
	echo "== $name"
	(scenario_"$name") &
	local sub=$!
	# The watchdog's sleep goes with it: a sleep left behind would hold the output open
	# (a reader of a pipe would wait for it) until the timeout.
	(
		sleep "$SCENARIO_TIMEOUT" &
		nap=$!
		trap 'kill "$nap" 2>/dev/null; exit 0' TERM
		wait "$nap" || exit 0
		echo "   $name: timed out after ${SCENARIO_TIMEOUT}s"
		kill -TERM "$sub" 2>/dev/null
	) &
	local dog=$!
	wait "$sub"
	rc=$?
	kill "$dog" 2>/dev/null
	wait "$dog" 2>/dev/null
	for app in "$APP_DIR"/pids/*; do
		[[ -e "$app" ]] || continue
		local n
		n=$(basename "$app")
		if ! app_alive "$n"; then
			echo "   $n is not running any more (crash?); last lines of its log:"
			tail -n 15 "$APP_DIR/$n.log" | sed 's/^/     /'
		fi
	done
	apps_stop_all
	# Each scenario's time, for the suite's budget (ci/test.sh).
	took="($((SECONDS - t0)) s)"
	case $rc in
	0)
		echo "PASS $name $took"
		PASSED=$((PASSED + 1))
		;;
	2)
		echo "SKIP $name $took"
		SKIPPED=$((SKIPPED + 1))
		SKIPPED_NAMES+=("$name")
		;;
	*)
		echo "FAIL $name (rc $rc) $took; logs in $APP_DIR"
		KEEP_APP_DIR=1
		FAILED=$((FAILED + 1))
		FAILED_NAMES+=("$name")
		;;
	esac
}

ALL=(basic verify fio save_config path_flap unexport outage outage_timeout reset admission psk write_zeroes bad_params refused pace late_memory exit
	openers force_close path_rpc reconnect_attempts raid_loss resize geometry bad_controls interrupt)
SELECTED=("$@")
[[ ${#SELECTED[@]} -gt 0 ]] || SELECTED=("${ALL[@]}")
for s in "${SELECTED[@]}"; do
	run_scenario "$s"
done
echo "SPDK tests: $PASSED passed, $FAILED failed${FAILED_NAMES:+ (${FAILED_NAMES[*]})}${SKIPPED_NAMES:+, $SKIPPED skipped (${SKIPPED_NAMES[*]})}"
[[ $FAILED -eq 0 ]]
