# shellcheck shell=bash
# Scenario verify, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh verify).
#
# bdevperf -w verify over the rtrs bdev (4 KiB and 128 KiB, which the bdev layer splits
# at the device's max IO size when larger).

scenario_verify() {
	start_target tgt $((PB + 1)) || return 1
	start_bdevperf bp $((PB + 1)) '' -q 32 -o 4096 -w verify -t 8 || return 1
	bdevperf_perform bp 8 >"$APP_DIR/r1.json" || { tail -n 20 "$APP_DIR/bp.log"; return 1; }
	results_clean "$APP_DIR/r1.json" || return 1
	python3 "$BDEVPERF_PY" -s "$APP_DIR/bp.sock" -t 120 perform_tests -q 8 -o 262144 -w verify -t 5 \
		>"$APP_DIR/r2.json" || { tail -n 20 "$APP_DIR/bp.log"; return 1; }
	results_clean "$APP_DIR/r2.json"
}
