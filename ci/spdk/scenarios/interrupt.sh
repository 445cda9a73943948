# shellcheck shell=bash
# Scenario interrupt, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh interrupt).
#
# Interrupt mode (docs/ARCHITECTURE.md, "Interrupt mode"), whatever RTRS_SPDK_INTERRUPT
# says: with a connected client and no IO, every poller of the target's threads sleeps on
# a timer (none is run on each wake-up); a verify run is served from there (the readiness
# set wakes them), and afterwards they sleep again.

scenario_interrupt() {
	# shellcheck disable=SC2034 # read by app_start (ci/spdk/lib.sh)
	local RTRS_SPDK_INTERRUPT=1 round
	start_target tgt $((PB + 26)) || return 1
	start_bdevperf bp $((PB + 26)) '' -q 8 -o 4096 -w verify -t 3 || return 1
	for round in before after; do
		if [[ $round == after ]]; then
			bdevperf_perform bp 3 >"$APP_DIR/r1.json" || { tail -n 20 "$APP_DIR/bp.log"; return 1; }
			results_clean "$APP_DIR/r1.json" || return 1
		fi
		local i ok=0
		# shellcheck disable=SC2034 # a count of tries
		for i in $(seq 40); do
			rpc tgt thread_get_pollers >"$APP_DIR/pollers.json" || return 1
			if python3 "$REPO/ci/spdk/pollers_asleep.py" "$APP_DIR/pollers.json" "$round IO"; then
				ok=1
				break
			fi
			sleep 0.25
		done
		[[ $ok -eq 1 ]] || { echo "the target's pollers did not go to sleep ($round IO)"; return 1; }
	done
	app_alive tgt && app_alive bp
}
