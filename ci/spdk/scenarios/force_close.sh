# shellcheck shell=bash
# Scenario force_close, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh force_close).
#
# The target closes one client's mapping (the kernel's force_close) while the client
# writes: the IO to that device fails, its bdev shows the device closed by the target,
# and the session's other device goes on; with the host list now leaving the client out
# its re-open (bdev_rtrs_remap) is refused with -EACCES; allowed again, it maps again and
# IO is clean.

scenario_force_close() {
	local port=$((PB + 41))
	app_start tgt "$SPDK_TGT" -m "$TGT_MASK" "${TGT_MEM[@]}" || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	make_exports tgt -H 127.0.0.1 || return 1
	start_bdevperf bpfc $port '{"io_timeout_sec": 5}' -q 8 -o 4096 -w write -t 3 -f || return 1
	bdevperf_perform bpfc 3 >"$APP_DIR/fc1.json" || return 1
	results_clean "$APP_DIR/fc1.json" || return 1
	rpc tgt rtrs_target_force_close malloc0 sess-rtrs0 >"$APP_DIR/fc-closed.json" || return 1
	rpc tgt rtrs_target_export_remove_host malloc0 127.0.0.1 || return 1
	rpc tgt rtrs_target_get_exports -e malloc0 >"$APP_DIR/fc-exp.json" || return 1
	bdevperf_perform bpfc 3 >"$APP_DIR/fc2.json" || return 1
	rpc bpfc bdev_rtrs_get_sessions >"$APP_DIR/fc-sess.json" || return 1
	python3 "$REPO/ci/spdk/force_close.py" "$APP_DIR/fc-closed.json" "$APP_DIR/fc-exp.json" "$APP_DIR/fc2.json" "$APP_DIR/fc-sess.json" || return 1
	local out
	if out=$(rpc bpfc bdev_rtrs_remap rtrs0 2>&1); then
		echo "the remap was allowed although the host list leaves the client out: $out"
		return 1
	fi
	[[ "$out" == *EACCES* ]] || { echo "remap refused without -EACCES: $out"; return 1; }
	echo "   remap refused: $(grep -o 'server refused open[^"]*' <<<"$out" | head -n 1)"
	rpc bpfc bdev_rtrs_get_sessions >"$APP_DIR/fc-sess2.json" || return 1
	grep -q '"closed by the server"' "$APP_DIR/fc-sess2.json" || { echo "no longer closed after a refused remap"; return 1; }
	rpc tgt rtrs_target_export_add_host malloc0 127.0.0.1 || return 1
	rpc bpfc bdev_rtrs_remap rtrs0 >"$APP_DIR/fc-remap.json" || return 1
	rpc tgt rtrs_target_get_exports -e malloc0 >"$APP_DIR/fc-exp2.json" || return 1
	grep -q '"sess-rtrs0"' "$APP_DIR/fc-exp2.json" || { echo "not mapped again"; cat "$APP_DIR/fc-exp2.json"; return 1; }
	bdevperf_perform bpfc 3 >"$APP_DIR/fc3.json" || return 1
	results_clean "$APP_DIR/fc3.json"
}
