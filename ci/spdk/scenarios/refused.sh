# shellcheck shell=bash
# Scenario refused, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh refused).
#
# A target whose chunk pool cannot be allocated refuses the session with -ENOMEM (a real
# spdk_zmalloc failure: 2048 x 128 KiB = 256 MiB of DMA memory where the target has about
# 140 MiB free). bdev_rtrs_create and rtrs-bench report the reason at once: both are
# bounded at 20 s while their own waits are 60 s, so an answer means the refusal got
# through. Nothing crashes; the target keeps no session.

scenario_refused() {
	local port=$((PB + 13)) resp line rc
	app_start tgt "$SPDK_TGT" -m "$TGT_MASK" "${MEM[@]}" || return 1
	rpc tgt rtrs_target_set_options --queue-depth 2048 --chunk-size 131072 || return 1
	rpc tgt bdev_malloc_create -b malloc0 8 4096 >/dev/null || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	rpc tgt rtrs_target_export malloc0 -a rw || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	resp=$(timeout 20 python3 "$REPO/ci/spdk/rpc_raw.py" "$APP_DIR/clt.sock" bdev_rtrs_create \
		"{\"name\":\"rtrs0\",\"sessname\":\"refused\",\"device\":\"malloc0\",\"io_timeout_sec\":60,\"paths\":[{\"transport\":\"tcp\",\"dst_addr\":\"127.0.0.1\",\"port\":$port}]}")
	rc=$?
	[[ $rc -ne 124 ]] || { echo "bdev_rtrs_create did not answer within 20 s"; return 1; }
	echo "   bdev_rtrs_create: $resp"
	python3 "$REPO/ci/spdk/rpc_error.py" "$resp" malloc0 "target refused the session" "out of memory" ENOMEM ||
		{ echo "expected an error naming malloc0 and the refusal (ENOMEM)"; return 1; }
	grep -q 'spdk_zmalloc(268435456 bytes, SPDK_MALLOC_DMA) failed' "$APP_DIR/tgt.log" ||
		{ echo "no spdk_zmalloc failure in the target's log"; tail -n 20 "$APP_DIR/tgt.log"; return 1; }
	(cd "$REPO" && cargo build -q --bin rtrs-bench) || return 1
	line=$(timeout 20 "${CARGO_TARGET_DIR:-$REPO/target}/debug/rtrs-bench" --path tcp://127.0.0.1:$port \
		--device malloc0 --rw read --connect-timeout 60s --idle adaptive -m "$CLT_MASK" 2>&1)
	rc=$?
	echo "   rtrs-bench (exit $rc): $line"
	[[ $rc -eq 1 && $(wc -l <<<"$line") -eq 1 && "$line" == *"'malloc0'"* && "$line" == *"ENOMEM"* ]] ||
		{ echo "expected exit 1 and one line naming malloc0 and ENOMEM"; return 1; }
	app_alive tgt || { echo "target died"; return 1; }
	app_alive clt || { echo "client died"; return 1; }
	resp=$(rpc tgt rtrs_target_get_sessions) || return 1
	[[ "$resp" == "[]" ]] || { echo "the target kept a session: $resp"; return 1; }
}
