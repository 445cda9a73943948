# shellcheck shell=bash
# Scenario reconnect_attempts, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh reconnect_attempts).
#
# max_reconnect_attempts changed at run time and obeyed: a session created to retry for
# ever is set to 2 attempts (a refused call with a bad field changes nothing); its path to
# a listener that is then stopped (and the path disconnected by the target) gives up
# after 2 failed attempts, closed and saying so, while IO goes on over the other path
# with zero errors; save_config keeps the new value.

scenario_reconnect_attempts() {
	local a=$((PB + 44)) b=$((PB + 45))
	start_target tgt "$a,$b" || return 1
	start_bdevperf bpra "$a,$b" '{"reconnect_delay_sec": 1, "max_reconnect_attempts": -1}' \
		-q 16 -o 4096 -w verify -t 14 || return 1
	bdevperf_perform bpra 14 >"$APP_DIR/ra.json" &
	local perf=$!
	path_wait bpra rtrs0 $b 20 connected || return 1
	rpc bpra bdev_rtrs_set_session_options rtrs0 -r 2 || return 1
	local resp
	resp=$(rpc_raw bpra bdev_rtrs_set_session_options '{"name": "rtrs0", "max_reconnect_attempts": 7, "loss_timeout_sec": -5}')
	[[ "$resp" == *loss_timeout_sec* && "$resp" == *error* ]] || { echo "bad loss_timeout_sec accepted: $resp"; return 1; }
	rpc tgt rtrs_target_stop_listener -t tcp -a 127.0.0.1 -s $b || return 1
	local path
	path=$(rpc tgt rtrs_target_get_sessions | python3 "$REPO/ci/spdk/target_path.py" $b)
	[[ -n "$path" ]] || { echo "the target has no path on port $b"; return 1; }
	rpc tgt rtrs_target_disconnect sess-rtrs0 -p "$path" >/dev/null || return 1
	local i failure=""
	for ((i = 0; i < 300; i++)); do
		failure=$(rpc bpra bdev_rtrs_get_sessions -b rtrs0 | python3 "$REPO/ci/spdk/session_path.py" failure $b)
		[[ -n "$failure" ]] && break
		sleep 0.1
	done
	echo "   path :$b: ${failure:-no failure within 30 s}"
	[[ "$failure" == "gave up after 2 failed attempts (max_reconnect_attempts 2)"* ]] || return 1
	[[ "$(path_state bpra rtrs0 $b)" == closed ]] || { echo "the path is not closed"; return 1; }
	wait "$perf" || { tail -n 20 "$APP_DIR/bpra.log"; return 1; }
	results_clean "$APP_DIR/ra.json" || return 1
	rpc bpra save_config >"$APP_DIR/ra-saved.json" || return 1
	python3 "$REPO/ci/spdk/reconnect_saved.py" "$APP_DIR/ra-saved.json"
}
