# shellcheck shell=bash
# Scenario unexport, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh unexport).
#
# Unexport while the client has the device open under load: the client's IO fails
# cleanly (bdevperf reports failed IO and stops by itself) and neither app crashes.

scenario_unexport() {
	start_target tgt $((PB + 6)) || return 1
	start_bdevperf bp $((PB + 6)) '{"io_timeout_sec": 2, "max_reconnect_attempts": 0}' \
		-q 16 -o 4096 -w write -t 30 || return 1
	bdevperf_perform bp 30 >"$APP_DIR/unexp.json" 2>"$APP_DIR/unexp.err" &
	local perf=$!
	sleep 3
	rpc tgt rtrs_target_unexport malloc0 || return 1
	wait "$perf"
	local st
	app_wait bp 60 || { echo "bdevperf did not stop after its IO failed"; return 1; }
	st=$APP_STATUS
	# bdevperf exits with 255 (-1) after failed IO; 129..192 is death by a signal.
	if [[ "$st" -gt 128 && "$st" -le 192 ]]; then
		echo "bdevperf died by signal $((st - 128))"
		return 1
	fi
	[[ "$st" -ne 0 ]] || { echo "bdevperf reported success although the export was withdrawn"; return 1; }
	grep -Eiq 'fail|error' "$APP_DIR/bp.log" "$APP_DIR/unexp.err" "$APP_DIR/unexp.json" 2>/dev/null ||
		{ echo "no IO failure reported"; return 1; }
	app_alive tgt || { echo "target died"; return 1; }
	rpc tgt spdk_get_version >/dev/null && rpc tgt rtrs_target_get_sessions >/dev/null
}
