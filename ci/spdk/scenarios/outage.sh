# shellcheck shell=bash
# Scenario outage, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh outage).
#
# Both paths lose the target for a while (the target process is stopped: heartbeats go
# unanswered, the paths die, reconnects fail) during bdevperf verify; io_timeout_sec is
# longer than the outage, so the IO waits for the paths to come back: zero IO errors.

scenario_outage() {
	start_target tgt $((PB + 9)),$((PB + 10)) || return 1
	start_bdevperf bpout $((PB + 9)),$((PB + 10)) \
		'{"io_timeout_sec": 30, "hb_interval_ms": 500, "hb_missed_max": 2}' \
		-q 32 -o 4096 -w verify -t 8 || return 1
	bdevperf_perform bpout 8 >"$APP_DIR/out.json" &
	local perf=$! tgt
	tgt=$(app_pid tgt)
	sleep 2
	kill -STOP "$tgt" || return 1
	sleep 4
	kill -CONT "$tgt" || return 1
	wait "$perf" || { tail -n 20 "$APP_DIR/bpout.log"; return 1; }
	results_clean "$APP_DIR/out.json" || return 1
	grep -q 're-opened after a reconnect' "$APP_DIR/bpout.log" ||
		{ echo "the device was never re-opened: no full outage happened"; tail -n 20 "$APP_DIR/bpout.log"; return 1; }
}
