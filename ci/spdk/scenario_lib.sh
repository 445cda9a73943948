# shellcheck shell=bash
# The building blocks of ci/spdk-test.sh's scenarios (ci/spdk/scenarios/*.sh) that more than
# one of them uses: targets and bdevperf clients as the scenarios run them, the check of a
# bdevperf result, refused RPCs, the state of a client's path. Sourced by ci/spdk-test.sh
# after ci/spdk/lib.sh; uses the runner's settings (TGT_MASK, CLT_MASK, MEM, TGT_MEM, DEVS).

# The target's malloc bdevs malloc0..malloc{DEVS-1} (64 MiB each), exported read-write
# (extra export arguments follow the app's name).
make_exports() {
	local name=$1 i
	shift
	for ((i = 0; i < DEVS; i++)); do
		rpc "$name" bdev_malloc_create -b "malloc$i" 64 4096 >/dev/null || return 1
	done
	for ((i = 0; i < DEVS; i++)); do
		rpc "$name" rtrs_target_export "malloc$i" -a rw "$@" || return 1
	done
}

# A target spdk_tgt exporting malloc0..malloc{DEVS-1} over tcp on the given ports.
start_target() {
	local name=$1 ports=$2 p
	app_start "$name" "$SPDK_TGT" -m "$TGT_MASK" "${TGT_MEM[@]}" || return 1
	for p in ${ports//,/ }; do
		rpc "$name" rtrs_target_listen -t tcp -a 127.0.0.1 -s "$p" || return 1
	done
	make_exports "$name"
}

# A bdevperf client on two cores whose --json creates rtrs bdevs "rtrs0".. (DEVS of them,
# over one session), waiting for
# perform_tests (-z). Extra bdevperf arguments follow the ports; after them, `-- KEYS`
# (NAME=FILE,...) adds keyring keys and authenticates the paths with the first.
start_bdevperf() {
	local name=$1 ports=$2 extra=$3 keys="" args=()
	shift 3
	while [[ $# -gt 0 ]]; do
		if [[ "$1" == -- ]]; then
			keys=$2
			shift 2
			continue
		fi
		args+=("$1")
		shift
	done
	rtrs_bdev_json rtrs0 malloc0 "$ports" "$extra" "$keys" >"$APP_DIR/$name.json"
	app_start "$name" "$BDEVPERF" -m "$CLT_MASK" "${MEM[@]}" --json "$APP_DIR/$name.json" -z "${args[@]}"
}

# Checks a perform_tests result: every job finished and no IO failed.
results_clean() {
	python3 "$REPO/ci/spdk/results_clean.py" "$1"
}

# Rows on stdin: app|method|params|field the message must name[|text it must also
# contain]; each request must be refused so (all from one Python process:
# ci/spdk/rpc_errors.py). Returns 1 if any was not.
expect_errors() {
	python3 "$REPO/ci/spdk/rpc_errors.py" "$APP_DIR"
}

# The state of the client's path to port $3 in bdev $2's session of app $1 ("" if none).
path_state() {
	rpc "$1" bdev_rtrs_get_sessions -b "$2" 2>/dev/null | python3 "$REPO/ci/spdk/session_path.py" state "$3"
}

# Waits (at most $4 s) until the path of app $1, bdev $2, to port $3 is in state $5.
path_wait() {
	local i
	for ((i = 0; i < $4 * 10; i++)); do
		[[ "$(path_state "$1" "$2" "$3")" == "$5" ]] && return 0
		sleep 0.1
	done
	echo "path to port $3 not $5 within $4 s (it is '$(path_state "$1" "$2" "$3")')"
	return 1
}
