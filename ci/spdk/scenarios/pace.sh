# shellcheck shell=bash
# Scenario pace, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh pace).
#
# The module's home pollers (home's group, the session's control) on the application
# thread move from their 1 ms period to an idle one (a sixteenth of the heartbeat
# interval: 62.5 ms for 1000 ms) once they have found no work for 100 runs; the session's
# go with its last disk, home's stays. A heartbeat is work, so a poller may be back on
# 1 ms for a moment when sampled: the pollers are sampled until they are all on the idle
# period (at most 20 times, 0.5 s apart).

scenario_pace() {
	start_target tgt $((PB + 15)) || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n pace-sess -d malloc0 -p tcp:127.0.0.1:$((PB + 15)) \
		-i 1000 -M 5 -D 1 -t 10 >/dev/null || return 1
	local i ok=0
	for i in $(seq 20); do
		sleep 0.5
		rpc clt thread_get_pollers >"$APP_DIR/pollers.json" || return 1
		if python3 "$REPO/ci/spdk/pace_idle.py" "$APP_DIR/pollers.json"; then
			ok=1
			break
		fi
	done
	[[ $ok -eq 1 ]] || { echo "the module's pollers never all reached their idle period"; return 1; }
	rpc clt bdev_rtrs_delete rtrs0 || return 1
	# The session's control poller and the disk's watch go with it (within its CLOSE wait);
	# home's own poller stays, idle, for the next bdev.
	for i in $(seq 40); do
		rpc clt thread_get_pollers >"$APP_DIR/pollers.json" || return 1
		python3 "$REPO/ci/spdk/pace_one_left.py" "$APP_DIR/pollers.json" && break
		[[ $i -lt 40 ]] || { echo "rtrs pollers left after bdev_rtrs_delete: $(cat "$APP_DIR/pollers.json")"; return 1; }
		sleep 0.25
	done
	app_alive tgt && app_alive clt
}
