# shellcheck shell=bash
# Scenario fio, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh fio).
#
# fio (Debian's) through SPDK's spdk_bdev plugin with the checked-in job and JSON config.

scenario_fio() {
	if [[ -z "$FIO_PLUGIN" ]]; then
		echo "SKIP fio: SPDK's fio plugin (build/fio/spdk_bdev) not found under $SPDK_DIR"
		return 2
	fi
	if ! fio_find; then
		echo "SKIP fio: $FIO_WHY"
		return 2
	fi
	local fio=$FIO_BIN
	echo "   fio: $fio"
	if ! hugepages_ensure; then
		echo "SKIP fio: SPDK's fio plugin needs hugepages and none could be reserved"
		return 2
	fi
	start_target tgt 1234 || return 1
	# In the background with a pid file, so the runner's clean-up stops it on a time-out.
	LD_PRELOAD="$PLUGIN_SO $FIO_PLUGIN" "$fio" plugin/fio/rtrs_verify.fio \
		--output="$APP_DIR/fio.out" >"$APP_DIR/fio.log" 2>&1 &
	local pid=$!
	echo "$pid" >"$APP_DIR/pids/fio"
	wait "$pid"
	local rc=$?
	rm -f "$APP_DIR/pids/fio"
	hugepages_restore
	tail -n 25 "$APP_DIR/fio.out" "$APP_DIR/fio.log" 2>/dev/null | grep -E 'err=|verify|error|IOPS' | head -n 8
	[[ $rc -eq 0 ]] || return 1
	grep -q 'err= 0' "$APP_DIR/fio.out"
}
