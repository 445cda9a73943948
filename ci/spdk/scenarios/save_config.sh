# shellcheck shell=bash
# Scenario save_config, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh save_config).
#
# save_config on both sides, then restart each from its saved JSON.

scenario_save_config() {
	start_target tgt $((PB + 3)) || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n cfg-sess -d malloc0 -p tcp:127.0.0.1:$((PB + 3)) \
		-m round-robin -D 1 -i 1000 -z native >/dev/null || return 1
	# A second device of the session, with its own write_zeroes mode.
	rpc clt bdev_rtrs_create -b rtrs1 -n cfg-sess -d malloc1 -p tcp:127.0.0.1:$((PB + 3)) \
		-m round-robin -D 1 -i 1000 -z emulate >/dev/null || return 1
	rpc tgt save_config >"$APP_DIR/tgt-saved.json" || return 1
	rpc clt save_config >"$APP_DIR/clt-saved.json" || return 1
	grep -q '"rtrs_target_listen"' "$APP_DIR/tgt-saved.json" || { echo "target config lacks rtrs_target_listen"; return 1; }
	grep -q '"rtrs_target_export"' "$APP_DIR/tgt-saved.json" || { echo "target config lacks rtrs_target_export"; return 1; }
	grep -q '"bdev_rtrs_create"' "$APP_DIR/clt-saved.json" || { echo "client config lacks bdev_rtrs_create"; return 1; }
	grep -q 'round-robin' "$APP_DIR/clt-saved.json" || { echo "client config lost mp_policy"; return 1; }
	grep -Eq '"write_zeroes": ?"native"' "$APP_DIR/clt-saved.json" || { echo "client config lost write_zeroes"; return 1; }
	app_stop clt
	app_stop tgt
	app_start tgt "$SPDK_TGT" -m "$TGT_MASK" "${TGT_MEM[@]}" --json "$APP_DIR/tgt-saved.json" || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" --json "$APP_DIR/clt-saved.json" || return 1
	rpc clt bdev_get_bdevs -b rtrs0 >/dev/null || { echo "rtrs0 not rebuilt from saved config"; return 1; }
	# To a file first: `grep -q` stops reading at the first match, and under pipefail the
	# writer's broken pipe would fail the check.
	rpc clt bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/sess-restored.json" || return 1
	python3 "$REPO/ci/spdk/config_restored.py" "$APP_DIR/sess-restored.json" || return 1
	rpc tgt save_config >"$APP_DIR/tgt-saved2.json" || return 1
	grep -q '"rtrs_target_export"' "$APP_DIR/tgt-saved2.json"
}
