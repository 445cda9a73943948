# shellcheck shell=bash
# Scenario bad_params, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh bad_params).
#
# Bad parameters for every RPC: a JSON-RPC error whose message names the field; the apps
# keep running.

scenario_bad_params() {
	start_target tgt $((PB + 7)) || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n bad-sess -d malloc0 -p tcp:127.0.0.1:$((PB + 7)) >/dev/null || return 1
	# An export only 10.0.0.0/8 and session "nobody" may open (rpc.py's -H and the
	# add_host/get_exports sub-commands): this client's OPEN is refused as an RPC error.
	rpc tgt rtrs_target_export malloc0 -e locked -H 10.0.0.0/8 || return 1
	rpc tgt rtrs_target_export_add_host locked sess:nobody || return 1
	rpc tgt rtrs_target_get_exports -e locked >"$APP_DIR/locked.json" || return 1
	grep -q 'sess:nobody' "$APP_DIR/locked.json" || { cat "$APP_DIR/locked.json"; return 1; }
	rpc tgt rtrs_target_export_remove_host locked sess:nobody || return 1
	# Options are fixed once a listener runs: check their validation on a fresh target.
	app_start tgt2 "$SPDK_TGT" -m "$TGT_MASK" "${MEM[@]}" || return 1
	local bad=0
	local good="\"paths\":[{\"transport\":\"tcp\",\"dst_addr\":\"127.0.0.1\",\"port\":$((PB + 7))}]"
	expect_errors <<EOF || bad=1
clt|bdev_rtrs_create|{"sessname":"s","device":"malloc0",$good}|name
clt|bdev_rtrs_create|{"name":"x","device":"malloc0",$good}|sessname
clt|bdev_rtrs_create|{"name":"x","sessname":"s",$good}|device
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0"}|paths
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[]}|paths
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":"127.0.0.1"}|paths
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"udp","dst_addr":"127.0.0.1"}]}|transport
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"not-an-ip"}]}|dst_addr
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1","port":70000}]}|port
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","src_addr":"nowhere","dst_addr":"127.0.0.1"}]}|src_addr
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"rdma","dst_addr":"127.0.0.1"}]}|'paths[0].transport'|no RDMA device found
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1"},{"transport":"rdma","dst_addr":"127.0.0.2"}]}|'paths[1].transport'|one session uses one transport
clt|bdev_rtrs_create|{"name":"x","sessname":"s/x","device":"malloc0",$good}|sessname
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"access_mode":"rwx"}|access_mode
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"mp_policy":"fastest"}|mp_policy
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"max_reconnect_attempts":"many"}|max_reconnect_attempts
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"reconnect_delay_sec":-1}|reconnect_delay_sec
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"hb_interval_ms":0}|hb_interval_ms
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"hb_missed_max":0}|hb_missed_max
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"io_timeout_sec":-3}|io_timeout_sec
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"write_zeroes":"same"}|write_zeroes|native, emulate
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"colour":"red"}|colour
clt|bdev_rtrs_create|{"name":"rtrs0","sessname":"s","device":"malloc0",$good}|name
clt|bdev_rtrs_create|{"name":"x","sessname":"s2","device":"no-such-export",$good}|device|no such export
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1","psk":5}]}|'paths[0].psk'
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1","psk":""}]}|'paths[0].psk'
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"rdma","dst_addr":"127.0.0.1","psk":"k"}]}|'paths[0].psk'|tcp transport only
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1","psk":"nokey"}]}|'paths[0].psk'|keyring
clt|bdev_rtrs_create|{"name":"y","sessname":"s3","device":"locked",$good}|'locked'|EACCES (access denied
clt|bdev_rtrs_delete|{}|name
clt|bdev_rtrs_delete|{"name":"nope"}|name
clt|bdev_rtrs_get_sessions|{"name":"nope"}|name
clt|bdev_rtrs_get_sessions|{"name":5}|name
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"tcp"}|dst_addr
clt|bdev_rtrs_add_path|{"name":"nope","transport":"tcp","dst_addr":"127.0.0.1"}|name
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"ib","dst_addr":"127.0.0.1"}|transport
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"rdma","dst_addr":"127.0.0.2"}|'transport'|no RDMA device found
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.1","port":-1}|port
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.1","port":1,"psk":"nokey"}|'psk'|keyring
clt|bdev_rtrs_remove_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.1","psk":"k"}|psk
clt|bdev_rtrs_remove_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.9","port":1}|dst_addr
clt|bdev_rtrs_remove_path|{"transport":"tcp","dst_addr":"127.0.0.1"}|name
clt|bdev_rtrs_set_mp_policy|{"name":"rtrs0","mp_policy":"fastest"}|mp_policy
clt|bdev_rtrs_set_mp_policy|{"name":"nope","mp_policy":"round-robin"}|name
clt|bdev_rtrs_set_mp_policy|{"name":"rtrs0"}|mp_policy
clt|bdev_rtrs_reset_stats|{}|name
clt|bdev_rtrs_reset_stats|{"name":"nope"}|name
clt|bdev_rtrs_reset_stats|{"name":"rtrs0","all":true}|all
tgt2|rtrs_target_set_options|{"queue_depth":0}|queue_depth
tgt2|rtrs_target_set_options|{"chunk_size":1000}|chunk_size
tgt2|rtrs_target_set_options|{"always_invalidate":"yes"}|always_invalidate
tgt2|rtrs_target_set_options|{"handshake_timeout_ms":0}|handshake_timeout_ms
tgt2|rtrs_target_set_options|{"handshake_timeout_ms":3600001}|handshake_timeout_ms|1 hour
tgt2|rtrs_target_set_options|{"max_pending":0}|max_pending
tgt2|rtrs_target_set_options|{"max_pending":"many"}|max_pending
tgt2|rtrs_target_set_options|{"max_pending":8,"max_pending_per_source":9}|max_pending_per_source
tgt|rtrs_target_listen|{"transport":"udp","addr":"127.0.0.1","port":$((PB + 8))}|transport
tgt|rtrs_target_listen|{"transport":"rdma","addr":"127.0.0.1","port":$((PB + 8))}|'transport'|no RDMA device found
tgt|rtrs_target_listen|{"transport":"tcp","addr":"localhost-ish","port":$((PB + 8))}|addr
tgt|rtrs_target_listen|{"transport":"tcp","addr":"127.0.0.1","port":"x"}|port
tgt|rtrs_target_listen|{"transport":"tcp","addr":"127.0.0.1","port":$((PB + 8)),"psk":"nokey"}|'psk'|keyring
tgt|rtrs_target_listen|{"transport":"tcp","addr":"127.0.0.1","port":$((PB + 8)),"psk":7}|psk
tgt|rtrs_target_stop_listener|{"transport":"tcp","addr":"127.0.0.1","port":$((PB + 79))}|port
tgt|rtrs_target_stop_listener|{"transport":"tcp","port":$((PB + 7))}|addr
tgt|rtrs_target_export|{"access":"rw"}|bdev_name
tgt|rtrs_target_export|{"bdev_name":"no-such-bdev"}|bdev_name
tgt|rtrs_target_export|{"bdev_name":"malloc0","export_name":"e2","access":"wo"}|access
tgt|rtrs_target_unexport|{"export_name":"nope"}|export_name
tgt|rtrs_target_unexport|{}|export_name
tgt|rtrs_target_get_sessions|{"colour":"red"}|colour
EOF
	app_alive tgt || { echo "target died"; return 1; }
	app_alive clt || { echo "client died"; return 1; }
	app_alive tgt2 || { echo "second target died"; return 1; }
	rpc clt bdev_get_bdevs -b rtrs0 >/dev/null || { echo "rtrs0 gone after bad parameters"; return 1; }
	rpc tgt spdk_get_version >/dev/null || return 1
	return $bad
}
