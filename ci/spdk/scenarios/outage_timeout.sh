# shellcheck shell=bash
# Scenario outage_timeout, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh outage_timeout).
#
# The same outage, longer than io_timeout_sec: the waiting IO fails cleanly (bdevperf
# reports failed IO and stops by itself), nothing crashes, the target serves on.

scenario_outage_timeout() {
	start_target tgt $((PB + 11)) || return 1
	start_bdevperf bpto $((PB + 11)) \
		'{"io_timeout_sec": 2, "hb_interval_ms": 500, "hb_missed_max": 2}' \
		-q 16 -o 4096 -w verify -t 30 || return 1
	bdevperf_perform bpto 30 >"$APP_DIR/to.json" 2>"$APP_DIR/to.err" &
	local perf=$! tgt st
	tgt=$(app_pid tgt)
	sleep 2
	kill -STOP "$tgt" || return 1
	# The target stays stopped until bdevperf has given up (the outage outlasts the timeout).
	wait "$perf"
	kill -CONT "$tgt" || return 1
	app_wait bpto 60 || { echo "bdevperf did not stop after its IO failed"; return 1; }
	st=$APP_STATUS
	# bdevperf exits with 255 (-1) after failed IO; 129..192 is death by a signal.
	if [[ "$st" -gt 128 && "$st" -le 192 ]]; then
		echo "bdevperf died by signal $((st - 128))"
		return 1
	fi
	[[ "$st" -ne 0 ]] || { echo "bdevperf reported success although IO could not be served"; return 1; }
	grep -Eiq 'fail|error' "$APP_DIR/bpto.log" "$APP_DIR/to.err" "$APP_DIR/to.json" 2>/dev/null ||
		{ echo "no IO failure reported"; return 1; }
	app_alive tgt || { echo "target died"; return 1; }
	rpc tgt rtrs_target_get_sessions >/dev/null
}
