# shellcheck shell=bash
# Scenario raid_loss, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh raid_loss).
#
# bdev_raid1 over two rtrs bdevs on two targets, under bdevperf verify; one target is
# killed (SIGKILL): the raid goes degraded and IO goes on with zero errors, and once the
# session has had no path for loss_timeout_sec its rtrs bdev is unregistered.

scenario_raid_loss() {
	local a=$((PB + 46)) b=$((PB + 47))
	DEVS=1 start_target tgta $a || return 1
	DEVS=1 start_target tgtb $b || return 1
	python3 "$REPO/ci/spdk/raid_config.py" "$a" "$b" >"$APP_DIR/raid.json"
	app_start bpraid "$BDEVPERF" -m "$CLT_MASK" "${MEM[@]}" --json "$APP_DIR/raid.json" -z \
		-q 16 -o 4096 -w verify -t 14 || return 1
	bdevperf_perform bpraid 14 >"$APP_DIR/raid-r.json" &
	local perf=$!
	sleep 3
	kill -KILL "$(app_pid tgtb)" || return 1
	wait "$(app_pid tgtb)" 2>/dev/null
	rm -f "$APP_DIR/pids/tgtb"
	local i gone=0
	for ((i = 0; i < 300; i++)); do
		if ! rpc bpraid bdev_get_bdevs -b rb >/dev/null 2>&1; then
			gone=1
			break
		fi
		sleep 0.1
	done
	[[ $gone -eq 1 ]] || { echo "rb still registered 30 s after its target died"; tail -n 20 "$APP_DIR/bpraid.log"; return 1; }
	rpc bpraid bdev_raid_get_bdevs all >"$APP_DIR/raid-state.json" || return 1
	wait "$perf" || { tail -n 20 "$APP_DIR/bpraid.log"; return 1; }
	results_clean "$APP_DIR/raid-r.json" || return 1
	grep -q 'loss_timeout_sec' "$APP_DIR/bpraid.log" || { echo "no loss logged"; return 1; }
	python3 "$REPO/ci/spdk/raid_degraded.py" "$APP_DIR/raid-state.json"
}
