# shellcheck shell=bash
# Scenario admission, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh admission).
#
# Admission: rtrs_target_set_options with rpc.py's plugin options (-T handshake timeout,
# -P/-S caps) before the listener; 1500 TCP connections from 127.0.0.2-4 that never write
# are opened while bdevperf connects and verifies: zero IO errors, every idle socket
# closed by the target (evicted, or at the 1.5 s deadline), a few log lines about them
# per second, the options kept by save_config.

scenario_admission() {
	local port=$((PB + 9))
	app_start tgt "$SPDK_TGT" -m "$TGT_MASK" "${TGT_MEM[@]}" || return 1
	rpc tgt rtrs_target_set_options -T 1500 -P 64 -S 8 || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	make_exports tgt || return 1
	local started=$SECONDS
	python3 "$REPO/ci/spdk/idle_flood.py" $port >"$APP_DIR/flood.out" 2>&1 &
	local flood=$!
	echo "$flood" >"$APP_DIR/pids/flood"
	local i
	for ((i = 0; i < 300; i++)); do
		grep -q flooding "$APP_DIR/flood.out" 2>/dev/null && break
		sleep 0.1
	done
	start_bdevperf bpadm $port '' -q 16 -o 4096 -w verify -t 4 || return 1
	bdevperf_perform bpadm 4 >"$APP_DIR/adm.json" || { tail -n 20 "$APP_DIR/bpadm.log"; return 1; }
	results_clean "$APP_DIR/adm.json" || return 1
	wait "$flood" || { cat "$APP_DIR/flood.out"; return 1; }
	rm -f "$APP_DIR/pids/flood"
	tail -n 1 "$APP_DIR/flood.out"
	# The last window's count is logged within a second of its end.
	sleep 1.5
	local secs=$((SECONDS - started + 1)) lines
	lines=$(grep -c 'tcp fabric listener' "$APP_DIR/tgt.log")
	echo "log: $lines lines about the listener in ${secs} s"
	grep -q 'similar messages suppressed' "$APP_DIR/tgt.log" || { echo "no suppressed count logged"; return 1; }
	[[ $lines -le $((6 * secs)) ]] || { echo "too many log lines"; return 1; }
	rpc tgt save_config >"$APP_DIR/adm-saved.json" || return 1
	python3 "$REPO/ci/spdk/admission_saved.py" "$APP_DIR/adm-saved.json"
}
