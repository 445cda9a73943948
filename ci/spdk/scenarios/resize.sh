# shellcheck shell=bash
# Scenario resize, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh resize).
#
# bdev_null_resize on the target reaches the client's rtrs bdev: at once through
# bdev_rtrs_remap, and at the re-open after a reconnect (the target disconnects the
# session); bdev_get_bdevs shows each new size.

scenario_resize() {
	local port=$((PB + 48))
	app_start tgt "$SPDK_TGT" -m "$TGT_MASK" "${TGT_MEM[@]}" || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	rpc tgt bdev_null_create null0 64 4096 >/dev/null || return 1
	rpc tgt rtrs_target_export null0 || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n rs-sess -d null0 -p tcp:127.0.0.1:$port -D 1 -i 1000 -M 5 >/dev/null || return 1
	size_mib() { rpc clt bdev_get_bdevs -b rtrs0 | python3 -c 'import json,sys; b=json.load(sys.stdin)[0]; print(b["num_blocks"]*b["block_size"]>>20)'; }
	[[ $(size_mib) -eq 64 ]] || { echo "rtrs0 is $(size_mib) MiB, expected 64"; return 1; }
	rpc tgt bdev_null_resize null0 128 >/dev/null || return 1
	[[ $(size_mib) -eq 64 ]] || { echo "the size changed before any OPEN"; return 1; }
	local out
	out=$(rpc clt bdev_rtrs_remap rtrs0) || return 1
	[[ $(size_mib) -eq 128 ]] || { echo "after bdev_rtrs_remap rtrs0 is $(size_mib) MiB, expected 128 ($out)"; return 1; }
	echo "   remap: 64 -> 128 MiB"
	rpc tgt bdev_null_resize null0 192 >/dev/null || return 1
	rpc tgt rtrs_target_disconnect rs-sess >/dev/null || return 1
	local i
	for ((i = 0; i < 300; i++)); do
		[[ $(size_mib) -eq 192 ]] && break
		sleep 0.1
	done
	[[ $(size_mib) -eq 192 ]] || { echo "after a reconnect rtrs0 is $(size_mib) MiB, expected 192"; return 1; }
	grep -q 're-opened after a reconnect' "$APP_DIR/clt.log" || { echo "no reconnect happened"; return 1; }
	echo "   reconnect: 128 -> 192 MiB"
}
