# shellcheck shell=bash
# Scenario path_rpc, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh path_rpc).
#
# One path disconnected by RPC under bdevperf verify, and reconnected by RPC later: its IO
# fails over to the other path, it stays closed until the reconnect (no automatic
# reconnect), then connects again; zero IO errors.

scenario_path_rpc() {
	local a=$((PB + 42)) b=$((PB + 43))
	start_target tgt "$a,$b" || return 1
	start_bdevperf bppr "$a,$b" '{"reconnect_delay_sec": 1}' -q 32 -o 4096 -w verify -t 12 || return 1
	bdevperf_perform bppr 12 >"$APP_DIR/pr.json" &
	local perf=$!
	path_wait bppr rtrs0 $b 20 connected || return 1
	sleep 2
	rpc bppr bdev_rtrs_disconnect_path rtrs0 -a 127.0.0.1 -s $b || return 1
	path_wait bppr rtrs0 $b 20 closed || return 1
	# Longer than the reconnect delay: a disconnected path does not come back by itself.
	sleep 3
	[[ "$(path_state bppr rtrs0 $b)" == closed ]] || { echo "the disconnected path reconnected by itself"; return 1; }
	rpc bppr bdev_rtrs_reconnect_path rtrs0 -a 127.0.0.1 -s $b || return 1
	path_wait bppr rtrs0 $b 20 connected || return 1
	rpc bppr bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/pr-sess.json" || return 1
	wait "$perf" || { tail -n 20 "$APP_DIR/bppr.log"; return 1; }
	results_clean "$APP_DIR/pr.json" || return 1
	python3 "$REPO/ci/spdk/path_rpc_reconnects.py" "$APP_DIR/pr-sess.json" "$a" "$b"
}
