# shellcheck shell=bash
# Scenario write_zeroes, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh write_zeroes).
#
# bdevperf's write_zeroes workload in both write_zeroes modes; the target's counters
# show what went on the wire: emulate sends zero-filled WRITEs (data bytes arrive),
# native sends RNBD op 5 without data (only the 32-byte headers arrive).

scenario_write_zeroes() {
	local mode port=$((PB + 13))
	for mode in emulate native; do
		start_target tgt "$port" || return 1
		start_bdevperf bpz "$port" "{\"write_zeroes\": \"$mode\"}" -q 8 -o 65536 -w write_zeroes -t 3 || return 1
		bdevperf_perform bpz 3 >"$APP_DIR/wz-$mode.json" || { tail -n 20 "$APP_DIR/bpz.log"; return 1; }
		results_clean "$APP_DIR/wz-$mode.json" || return 1
		rpc tgt rtrs_target_get_sessions >"$APP_DIR/wz-$mode-tgt.json" || return 1
		python3 "$REPO/ci/spdk/write_zeroes_wire.py" "$APP_DIR/wz-$mode-tgt.json" "$mode" || return 1
		app_stop bpz
		app_stop tgt
		port=$((PB + 14))
	done
}
