# shellcheck shell=bash
# Scenario bad_controls, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh bad_controls).
#
# The day-two controls refuse bad input naming the field (unknown bdev, session, path or
# export, values out of range, unknown fields), and a refused call changes nothing: the
# session's settings and the target's mapping stand.

scenario_bad_controls() {
	local port=$((PB + 50)) bad=0
	start_target tgt $port || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n bad-sess -d malloc0 -p tcp:127.0.0.1:$port >/dev/null || return 1
	local good="\"paths\":[{\"transport\":\"tcp\",\"dst_addr\":\"127.0.0.1\",\"port\":$port}]"
	expect_errors <<EOF || bad=1
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"loss_timeout_sec":-2}|loss_timeout_sec
clt|bdev_rtrs_disconnect_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.9","port":1}|dst_addr|no such path
clt|bdev_rtrs_disconnect_path|{"name":"nope","transport":"tcp","dst_addr":"127.0.0.1"}|name
clt|bdev_rtrs_reconnect_path|{"name":"rtrs0","transport":"tcp"}|dst_addr
clt|bdev_rtrs_set_session_options|{"name":"rtrs0","max_reconnect_attempts":3,"loss_timeout_sec":"soon"}|loss_timeout_sec
clt|bdev_rtrs_set_session_options|{"name":"rtrs0","loss_timeout_sec":9,"max_reconnect_attempts":-5}|max_reconnect_attempts
clt|bdev_rtrs_set_session_options|{"name":"rtrs0","reconnect_delay_sec":-1}|reconnect_delay_sec
clt|bdev_rtrs_set_session_options|{"name":"nope"}|name
clt|bdev_rtrs_set_session_options|{"name":"rtrs0","colour":1}|colour
clt|bdev_rtrs_remap|{"name":"nope"}|name
clt|bdev_rtrs_remap|{}|name
tgt|rtrs_target_force_close|{"export_name":"malloc0","sessname":"nope"}|sessname|no such session
tgt|rtrs_target_force_close|{"export_name":"nope","sessname":"bad-sess"}|export_name|no such export
tgt|rtrs_target_force_close|{"export_name":"malloc1","sessname":"bad-sess"}|export_name|no mapping
tgt|rtrs_target_force_close|{"sessname":"bad-sess"}|export_name
tgt|rtrs_target_disconnect|{"sessname":"nope"}|sessname|no such session
tgt|rtrs_target_disconnect|{"sessname":"bad-sess","path":"1.2.3.4:5"}|path|no such path
tgt|rtrs_target_disconnect|{}|sessname
EOF
	rpc clt bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/bad-sess.json" || return 1
	rpc tgt rtrs_target_get_exports -e malloc0 >"$APP_DIR/bad-exp.json" || return 1
	python3 "$REPO/ci/spdk/controls_unchanged.py" "$APP_DIR/bad-sess.json" "$APP_DIR/bad-exp.json" || return 1
	app_alive tgt && app_alive clt || { echo "an application died"; return 1; }
	return $bad
}
