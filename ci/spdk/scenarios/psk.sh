# shellcheck shell=bash
# Scenario psk, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh psk).
#
# PSK authentication with keys from SPDK's keyring (keyring_file_add_key): the target's
# listener requires key0. bdev_rtrs_create with another key or none fails at once with
# "authentication failed" (not after io_timeout_sec), an unknown key name is an error
# naming 'psk'; with key0 the bdev maps. save_config keeps the keys' names, never the
# keys, and both sides come back from their saved JSON, still authenticated; bdevperf
# (its keyring from its --json) verifies IO through an authenticated bdev.

scenario_psk() {
	local p=$((PB + 20)) out args
	(
		umask 077
		python3 -c 'import os; print(os.urandom(32).hex())' >"$APP_DIR/key0"
		python3 -c 'import base64, os; print(base64.b64encode(os.urandom(48)).decode())' >"$APP_DIR/key1"
	)
	app_start tgt "$SPDK_TGT" -m "$TGT_MASK" "${TGT_MEM[@]}" || return 1
	rpc tgt keyring_file_add_key key0 "$APP_DIR/key0" || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $p -k key0 || return 1
	make_exports tgt || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
	rpc clt keyring_file_add_key key0 "$APP_DIR/key0" || return 1
	rpc clt keyring_file_add_key key1 "$APP_DIR/key1" || return 1
	for args in "tcp:127.0.0.1:$p,psk=key1" "tcp:127.0.0.1:$p"; do
		if out=$(rpc clt bdev_rtrs_create -b bad -n psk-bad -d malloc0 -p "$args" -t 60 2>&1); then
			echo "bdev_rtrs_create -p $args succeeded: $out"
			return 1
		fi
		[[ "$out" == *"authentication failed"* ]] ||
			{ echo "bdev_rtrs_create -p $args: no 'authentication failed' in: $out"; return 1; }
		echo "refused: -p $args: $(grep -o 'tcp fabric: [^"]*authentication failed' <<<"$out" | head -n 1)"
	done
	if out=$(rpc clt bdev_rtrs_create -b bad -n psk-bad -d malloc0 -p tcp:127.0.0.1:$p -k nokey 2>&1); then
		echo "an unknown key name was accepted"
		return 1
	fi
	[[ "$out" == *"'paths[0].psk'"*"nokey"* ]] || { echo "unknown key: $out"; return 1; }
	out=$(rpc clt bdev_rtrs_create -b rtrs0 -n psk-sess -d malloc0 -p tcp:127.0.0.1:$p -k key0) || return 1
	[[ "$out" == rtrs0 ]] || { echo "bdev_rtrs_create answered '$out', expected rtrs0"; return 1; }
	out=$(rpc clt bdev_rtrs_create -b rtrs1 -n psk-sess -d malloc1 -p tcp:127.0.0.1:$p -k key0) || return 1
	[[ "$out" == rtrs1 ]] || { echo "bdev_rtrs_create answered '$out', expected rtrs1"; return 1; }
	rpc tgt save_config >"$APP_DIR/tgt-psk.json" || return 1
	rpc clt save_config >"$APP_DIR/clt-psk.json" || return 1
	python3 "$REPO/ci/spdk/psk_saved.py" "$APP_DIR/tgt-psk.json" "$APP_DIR/clt-psk.json" "$APP_DIR/key0" "$APP_DIR/key1" || return 1
	app_stop clt
	app_stop tgt
	app_start tgt "$SPDK_TGT" -m "$TGT_MASK" "${TGT_MEM[@]}" --json "$APP_DIR/tgt-psk.json" || return 1
	app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" --json "$APP_DIR/clt-psk.json" || return 1
	rpc clt bdev_get_bdevs -b rtrs0 >/dev/null || { echo "rtrs0 not rebuilt from the saved config"; return 1; }
	rpc clt bdev_get_bdevs -b rtrs1 >/dev/null || { echo "rtrs1 not rebuilt from the saved config"; return 1; }
	app_stop clt
	start_bdevperf bppsk $p '' -q 16 -o 4096 -w verify -t 5 -- "key0=$APP_DIR/key0" || return 1
	bdevperf_perform bppsk 5 >"$APP_DIR/psk.json" || { tail -n 20 "$APP_DIR/bppsk.log"; return 1; }
	results_clean "$APP_DIR/psk.json"
}
