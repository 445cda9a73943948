# shellcheck shell=bash
# Scenario basic, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh basic).
#
# Two spdk_tgt apps: the client creates an rtrs bdev with rpc.py; its size and block size
# come from the remote malloc bdev; get_sessions shows the path; delete removes it.

scenario_basic() {
	start_target tgt $((PB + 0)) || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	local out
	out=$(rpc clt bdev_rtrs_create -b rtrs0 -n basic-sess -d malloc0 -p tcp:127.0.0.1:$((PB + 0)) \
		-i 1000 -M 5 -D 1 -t 10) || return 1
	[[ "$out" == rtrs0 ]] || { echo "bdev_rtrs_create answered '$out', expected rtrs0"; return 1; }
	rpc clt bdev_get_bdevs -b rtrs0 >"$APP_DIR/bdev.json" || return 1
	python3 "$REPO/ci/spdk/basic_bdev.py" "$APP_DIR/bdev.json" || return 1
	# A second device over the same session; the same sessname with another path or
	# setting is refused, naming what differs.
	out=$(rpc clt bdev_rtrs_create -b rtrs1 -n basic-sess -d malloc1 -p tcp:127.0.0.1:$((PB + 0)) \
		-i 1000 -M 5 -D 1 -t 10) || return 1
	[[ "$out" == rtrs1 ]] || { echo "bdev_rtrs_create answered '$out', expected rtrs1"; return 1; }
	if out=$(rpc clt bdev_rtrs_create -b rtrs2 -n basic-sess -d malloc1 -p tcp:127.0.0.1:$((PB + 29)) 2>&1); then
		echo "a device over basic-sess with another path was created: $out"
		return 1
	fi
	[[ "$out" == *"'paths': session "*"basic-sess"*" is connected to [127.0.0.1:$((PB + 0))]"* ]] ||
		{ echo "other path: $out"; return 1; }
	if out=$(rpc clt bdev_rtrs_create -b rtrs2 -n basic-sess -d malloc1 -p tcp:127.0.0.1:$((PB + 0)) \
		-i 500 -M 5 -D 1 -t 10 2>&1); then
		echo "a device over basic-sess with another heartbeat was created: $out"
		return 1
	fi
	[[ "$out" == *"'hb_interval_ms' = 500"* ]] || { echo "other setting: $out"; return 1; }
	rpc clt bdev_rtrs_get_sessions >"$APP_DIR/sess-all.json" || return 1
	python3 "$REPO/ci/spdk/basic_sessions.py" "$APP_DIR/sess-all.json" || return 1
	rpc tgt rtrs_target_get_sessions >"$APP_DIR/tsess.json" || return 1
	python3 "$REPO/ci/spdk/basic_target_sessions.py" "$APP_DIR/tsess.json" || return 1
	rpc clt bdev_rtrs_delete rtrs1 || return 1
	rpc clt bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/sess.json" || return 1
	grep -q "$((PB + 0))" "$APP_DIR/sess.json" || { cat "$APP_DIR/sess.json"; return 1; }
	rpc tgt rtrs_target_get_sessions >"$APP_DIR/tsess.json" || return 1
	grep -q 'basic-sess' "$APP_DIR/tsess.json" || { cat "$APP_DIR/tsess.json"; return 1; }
	# Every statistics key and its JSON type, on both sides.
	python3 "$REPO/ci/spdk/stats_shape.py" bdev "$APP_DIR/sess.json" || return 1
	python3 "$REPO/ci/spdk/stats_shape.py" target "$APP_DIR/tsess.json" || return 1
	# The examine of the new bdevs read them; bdev_rtrs_reset_stats zeroes the counters.
	rpc clt bdev_rtrs_reset_stats rtrs0 || return 1
	rpc clt bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/sess-reset.json" || return 1
	python3 "$REPO/ci/spdk/stats_reset.py" "$APP_DIR/sess.json" "$APP_DIR/sess-reset.json" || return 1
	rpc clt bdev_rtrs_set_mp_policy rtrs0 round-robin || return 1
	rpc clt bdev_rtrs_delete rtrs0 || return 1
	if rpc clt bdev_get_bdevs -b rtrs0 >/dev/null 2>&1; then
		echo "rtrs0 still exists after bdev_rtrs_delete"
		return 1
	fi
	app_alive tgt && app_alive clt
}
