# shellcheck shell=bash
# Scenario reset, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh reset).
#
# bdevperf's reset workload (verify with a reset every 10 s) under load: each reset waits
# for the bdev's outstanding IO and succeeds; no data mismatch. (IO the bdev layer itself
# refuses while a reset freezes the channels counts as failed in bdevperf's results.)

scenario_reset() {
	start_target tgt $((PB + 12)) || return 1
	start_bdevperf bprst $((PB + 12)) '' -q 32 -o 4096 -w reset -t 11 || return 1
	bdevperf_perform bprst 11 >"$APP_DIR/rst.json" || { tail -n 20 "$APP_DIR/bprst.log"; return 1; }
	if grep -Eq 'Reset blockdev=.* failed|Reset failed|Buffer mismatch' "$APP_DIR/bprst.log"; then
		tail -n 20 "$APP_DIR/bprst.log"
		return 1
	fi
	python3 "$REPO/ci/spdk/reset_result.py" "$APP_DIR/rst.json"
}
