# shellcheck shell=bash
# Scenario late_memory, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh late_memory).
#
# Memory as SPDK maps it, on a fabric that resolves local memory as verbs does
# (RTRS_TCP_LKEYS_ONLY=1: no fallback to the fabric's own table, so a READ lands only in
# memory registered with the session's cores). bdevperf runs on hugepages in SPDK's
# dynamic memory mode (no -s): its buffers (64 x 1 MiB per job) are allocated after the
# bdevs were created, in memory DPDK maps then; verify reads into them. The client's log
# must show SPDK memory registered with the session after the bdevs were, and no IO may
# fail.

scenario_late_memory() {
	if ! hugepages_ensure; then
		echo "SKIP late_memory: needs hugepages and none could be reserved"
		return 2
	fi
	local port=$((PB + 30)) rc=0
	start_target tgt $port || { hugepages_restore; return 1; }
	rtrs_bdev_json rtrs0 malloc0 $port '' '' >"$APP_DIR/bplate.json"
	export RTRS_TCP_LKEYS_ONLY=1
	app_start bplate "$BDEVPERF" -m "$CLT_MASK" --disable-cpumask-locks --json "$APP_DIR/bplate.json" -z || rc=1
	unset RTRS_TCP_LKEYS_ONLY
	if [[ $rc -eq 0 ]]; then
		python3 "$BDEVPERF_PY" -s "$APP_DIR/bplate.sock" -t 120 perform_tests -q 64 -o 1048576 -w verify -t 4 \
			>"$APP_DIR/late.json" || { tail -n 20 "$APP_DIR/bplate.log"; rc=1; }
	fi
	[[ $rc -eq 0 ]] && { results_clean "$APP_DIR/late.json" || rc=1; }
	app_stop bplate
	hugepages_restore
	[[ $rc -eq 0 ]] || return 1
	python3 "$REPO/ci/spdk/late_memory_log.py" "$APP_DIR/bplate.log"
}
