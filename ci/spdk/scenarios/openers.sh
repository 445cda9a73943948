# shellcheck shell=bash
# Scenario openers, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh openers).
#
# The target lists each export's openers (session, access mode, device id, paths with
# their addresses and devices, since when) in rtrs_target_get_exports, and each session's
# devices in rtrs_target_get_sessions.

scenario_openers() {
	start_target tgt $((PB + 40)) || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	local before
	before=$(date +%s)
	rpc clt bdev_rtrs_create -b rtrs0 -n op-rw -d malloc0 -p tcp:127.0.0.1:$((PB + 40)) -D 1 >/dev/null || return 1
	rpc clt bdev_rtrs_create -b rtrs1 -n op-ro -d malloc0 -a ro -p tcp:127.0.0.1:$((PB + 40)) -D 1 >/dev/null || return 1
	rpc tgt rtrs_target_get_exports >"$APP_DIR/exports.json" || return 1
	rpc tgt rtrs_target_get_sessions >"$APP_DIR/tsess.json" || return 1
	python3 "$REPO/ci/spdk/openers.py" "$APP_DIR/exports.json" "$APP_DIR/tsess.json" "$before" "$(date +%s)" "$((PB + 40))" || return 1
	python3 "$REPO/ci/spdk/stats_shape.py" target "$APP_DIR/tsess.json"
}
