# shellcheck shell=bash
# Scenario geometry, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh geometry).
#
# The geometry of the exported bdev reaches the client: a malloc bdev with 512-byte
# blocks, 4 KiB physical blocks, an 8 KiB optimal IO boundary it splits at and a write
# cache gives the rtrs bdev the same block sizes, IO no larger than the boundary, the
# boundary itself and the write cache with FUA (driver_specific shows what OPEN_RSP
# carried).

scenario_geometry() {
	local port=$((PB + 49))
	app_start tgt "$SPDK_TGT" -m "$TGT_MASK" "${TGT_MEM[@]}" || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	rpc tgt bdev_malloc_create -b geo0 -p 4096 -o 16 32 512 >/dev/null || return 1
	rpc tgt rtrs_target_export geo0 || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n geo-sess -d geo0 -p tcp:127.0.0.1:$port >/dev/null || return 1
	rpc clt bdev_get_bdevs -b rtrs0 >"$APP_DIR/geo.json" || return 1
	python3 "$REPO/ci/spdk/geometry.py" "$APP_DIR/geo.json"
}
