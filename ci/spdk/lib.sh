#!/usr/bin/env bash
# Helpers for ci/spdk-test.sh, ci/spdk-target-test.sh and the benches: find SPDK, build the
# plugin, start SPDK applications with the plugin preloaded, talk JSON-RPC to them, and make
# sure every application a script started is gone when it ends (trap). Sourced, not run.

# Where SPDK is: $SPDK_DIR, else the README's default. Empty when neither exists.
spdk_find() {
	if [[ -n "${SPDK_DIR:-}" ]]; then
		[[ -d "$SPDK_DIR" ]] && echo "$SPDK_DIR"
		return 0
	fi
	[[ -d /opt/spdk ]] && echo /opt/spdk
	return 0
}

# The first existing file among "$SPDK_DIR/<candidates>" (source tree or installed layout).
spdk_path() {
	local c
	for c in "$@"; do
		if [[ -e "$SPDK_DIR/$c" ]]; then
			echo "$SPDK_DIR/$c"
			return 0
		fi
	done
	return 1
}

# Sets SPDK_TGT, NVMF_TGT, BDEVPERF, BDEVPERF_PY, RPC_PY, FIO_PLUGIN (may be empty) and
# PYTHONPATH (SPDK's python package and plugin/python).
spdk_setup_paths() {
	SPDK_TGT=$(spdk_path build/bin/spdk_tgt bin/spdk_tgt) || { echo "spdk_tgt not found under $SPDK_DIR" >&2; return 1; }
	NVMF_TGT=$(spdk_path build/bin/nvmf_tgt bin/nvmf_tgt) || NVMF_TGT=
	BDEVPERF=$(spdk_path build/examples/bdevperf bin/bdevperf build/bin/bdevperf) || { echo "bdevperf not found under $SPDK_DIR" >&2; return 1; }
	BDEVPERF_PY=$(spdk_path examples/bdev/bdevperf/bdevperf.py scripts/bdevperf.py bin/bdevperf.py) || BDEVPERF_PY=
	FIO_PLUGIN=$(spdk_path build/fio/spdk_bdev lib/spdk_bdev build/fio/spdk_bdev.so) || FIO_PLUGIN=
	spdk_setup_rpc
}

# python_direct: Python started cheaply from now on. `python3` by the interpreter's own
# path (a directory holding only a link named python3 to it, first on PATH): where
# `python3` is a version manager's shim (pyenv's: a bash script that finds the version,
# then runs it), every start pays for the shim, about 0.2 s of CPU on cores the
# busy-polling applications hold, and the scripts start Python for every rpc (rpc.py too,
# through its `env python3` line); where python3 is the interpreter itself, that part
# changes nothing. And bytecode kept between starts in the build directory, outside
# every source tree, where the environment turned writing it off
# (PYTHONDONTWRITEBYTECODE): SPDK's python package is then compiled once, not at every
# rpc.py (a fifth of its start).
python_direct() {
	local exe dir=$REPO/target/python-direct
	export PYTHONPYCACHEPREFIX=$REPO/target/pycache
	unset PYTHONDONTWRITEBYTECODE
	exe=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) || return 0
	[[ -x "$exe" && "$exe" != "$(command -v python3)" ]] || return 0
	mkdir -p "$dir" && ln -sfn "$exe" "$dir/python3" || return 0
	[[ ":$PATH:" == *":$dir:"* ]] || export PATH="$dir:$PATH"
}

# What app_start and rpc need, and no more (ci/spdk-target-test.sh runs only spdk_tgt):
# RPC_PY, PYTHONPATH (SPDK's python package and plugin/python) and LD_LIBRARY_PATH.
spdk_setup_rpc() {
	RPC_PY=$(spdk_path scripts/rpc.py bin/spdk_rpc.py bin/rpc.py) || { echo "rpc.py not found under $SPDK_DIR" >&2; return 1; }
	python_direct
	local pyd
	pyd=$(spdk_path python) || pyd=
	PYTHONPATH="$REPO/plugin/python${pyd:+:$pyd}${PYTHONPATH:+:$PYTHONPATH}"
	export PYTHONPATH
	# Installed layouts keep SPDK's libraries in lib/; source trees in build/lib and dpdk.
	local libs="$SPDK_DIR/build/lib:$SPDK_DIR/dpdk/build/lib:$SPDK_DIR/lib"
	export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	rpc_resident_start
}

# fio for SPDK's fio plugin: sets FIO_BIN and returns 0, or sets FIO_WHY and returns 1.
# SPDK's plugin works only with the fio version it was built against, so the order is:
# $FIO (must be an executable file), the fio in SPDK's CONFIG_FIO_SOURCE_DIR (mk/config.mk),
# the newest /opt/fio-3.*/fio (where a Debian source build is left), then fio on the PATH.
fio_find() {
	FIO_BIN= FIO_WHY=
	if [[ -n "${FIO:-}" ]]; then
		[[ -f "$FIO" && -x "$FIO" ]] && FIO_BIN=$FIO && return 0
		FIO_WHY="FIO=$FIO is not an executable file"
		return 1
	fi
	local src c
	src=$(sed -n 's/^CONFIG_FIO_SOURCE_DIR?*=//p' "$SPDK_DIR/mk/config.mk" 2>/dev/null | tail -n 1)
	for c in ${src:+"$src/fio"} $(ls -d /opt/fio-3.*/fio 2>/dev/null | sort -rV) "$(command -v fio)"; do
		[[ -n "$c" && -f "$c" && -x "$c" ]] && FIO_BIN=$c && return 0
	done
	FIO_WHY="no fio found (set FIO, or build fio in SPDK's CONFIG_FIO_SOURCE_DIR${src:+ $src}, /opt/fio-3.*/ or on the PATH)"
	return 1
}

# Builds the plugin (release; PLUGIN_PROFILE=debug for a quicker build); sets PLUGIN_SO.
plugin_build() {
	local tdir=${CARGO_TARGET_DIR:-$REPO/target} profile=${PLUGIN_PROFILE:-release} flag=--release
	[[ "$profile" == release ]] || flag=
	(cd "$REPO" && SPDK_DIR="$SPDK_DIR" cargo build $flag -q -p rtrs-spdk-plugin) || return 1
	PLUGIN_SO="$tdir/$profile/librtrs_spdk.so"
	[[ -f "$PLUGIN_SO" ]] || { echo "plugin build produced no $PLUGIN_SO" >&2; return 1; }
}

# ---- applications -------------------------------------------------------------------------

# Creates the directory holding sockets, logs and pid files of the applications.
apps_init() {
	APP_DIR=${APP_DIR:-$(mktemp -d /tmp/rtrs-spdk.XXXXXX)}
	mkdir -p "$APP_DIR/pids"
	rpc_resident_start
}

# rpc_resident_start: once RPC_PY and APP_DIR are known (spdk_setup_rpc and apps_init,
# whichever comes last), starts ci/spdk/rpc_resident.py, rpc.py kept resident: `rpc`,
# `rpc_raw` and `rpc_result` then cost no Python start (see rpc_call). Call it from the
# script's own shell, not a subshell: the resident ends when its parent does. Without it
# (it failed to start) the commands run their scripts as before.
rpc_resident_start() {
	[[ -n ${RPC_PY:-} && -n ${APP_DIR:-} && -d ${APP_DIR:-} && -z ${RPC_RESIDENT_PID:-} ]] || return 0
	rm -f "$APP_DIR/rpc.port" "$APP_DIR/rpc.token"
	python3 "$REPO/ci/spdk/rpc_resident.py" "$RPC_PY" "$APP_DIR" >>"$APP_DIR/rpc_resident.log" 2>&1 &
	RPC_RESIDENT_PID=$!
	local i
	for ((i = 0; i < 200; i++)); do
		if [[ -s "$APP_DIR/rpc.port" ]]; then
			RPC_RESIDENT_PORT=$(<"$APP_DIR/rpc.port")
			RPC_RESIDENT_TOKEN=$(<"$APP_DIR/rpc.token")
			return 0
		fi
		kill -0 "$RPC_RESIDENT_PID" 2>/dev/null || break
		sleep 0.05
	done
	echo "rpc_resident.py did not start (each rpc starts rpc.py); its log:" >&2
	tail -n 5 "$APP_DIR/rpc_resident.log" >&2
	kill "$RPC_RESIDENT_PID" 2>/dev/null
}

# rpc_call KIND ARGS... : one command of the resident rpc.py (KIND rpc: rpc.py's command
# line; raw: rpc_raw.py's), over 127.0.0.1 with bash's /dev/tcp: its output, its error
# output and its exit status. 255 when no command was run (no resident, or it did not
# take the command): the caller runs the script itself.
rpc_call() {
	local kind=$1 fd st out err
	shift
	[[ -n ${RPC_RESIDENT_PORT:-} ]] || return 255
	# (The group keeps bash's own "connection refused" lines out of the caller's output.)
	{ exec {fd}<>"/dev/tcp/127.0.0.1/$RPC_RESIDENT_PORT"; } 2>/dev/null || return 255
	{
		printf '%s\0' "$RPC_RESIDENT_TOKEN" "$kind" "$#"
		(($# == 0)) || printf '%s\0' "$@"
	} >&"$fd"
	if ! { IFS= read -r -d '' st && IFS= read -r -d '' out && IFS= read -r -d '' err; } <&"$fd"; then
		exec {fd}>&-
		echo "rpc: the resident rpc.py answered nothing to: $kind $*" >&2
		return 1
	fi
	exec {fd}>&-
	printf '%s' "$out"
	[[ -z $err ]] || printf '%s' "$err" >&2
	return "$st"
}

# app_start NAME BINARY ARGS... : start an SPDK application with the plugin preloaded, its
# RPC socket at $APP_DIR/NAME.sock, output in $APP_DIR/NAME.log; waits for its RPC server
# (APP_START_WAIT tenths of a second, 30 s by default).
app_start() {
	local name=$1 bin=$2
	shift 2
	local sock="$APP_DIR/$name.sock"
	rm -f "$sock"
	# APP_LOG_APPEND=1: the log goes on after the previous run's of the same NAME.
	[[ "${APP_LOG_APPEND:-0}" == 1 ]] || : >"$APP_DIR/$name.log"
	local intr=()
	# RTRS_SPDK_INTERRUPT=1: every application in SPDK's interrupt mode (docs/ARCHITECTURE.md,
	# "Interrupt mode"); the SPDK scenarios run so once more in ci/test.sh.
	[[ "${RTRS_SPDK_INTERRUPT:-0}" == 1 ]] && intr=(--interrupt-mode)
	LD_PRELOAD="$PLUGIN_SO${APP_PRELOAD:+ $APP_PRELOAD}" "$bin" -r "$sock" "${intr[@]}" "$@" \
		>>"$APP_DIR/$name.log" 2>&1 &
	local pid=$!
	echo "$pid" >"$APP_DIR/pids/$name"
	local i
	for ((i = 0; i < 2 * ${APP_START_WAIT:-300}; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "app $name exited during start-up; log:" >&2
			tail -n 30 "$APP_DIR/$name.log" >&2
			return 1
		fi
		if [[ -S "$sock" ]] && rpc "$name" -t 5 spdk_get_version >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.05
	done
	echo "app $name: RPC socket $sock did not come up within $((${APP_START_WAIT:-300} / 10)) s" >&2
	return 1
}

app_pid() { cat "$APP_DIR/pids/$1" 2>/dev/null; }

app_alive() {
	local pid
	pid=$(app_pid "$1") || return 1
	kill -0 "$pid" 2>/dev/null
}

# app_wait NAME [SECONDS] : waits (30 s by default) for an application to exit by itself
# and sets APP_STATUS to its exit status; returns 1 if it is still running. Call it in the
# shell that started the application, not in $(...): a subshell cannot reap it and
# reads -1 for a status that arrives while it waits.
app_wait() {
	local name=$1 limit=${2:-30} pid i
	APP_STATUS=
	pid=$(app_pid "$name") || return 1
	for ((i = 0; i < limit * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$pid" 2>/dev/null && return 1
	wait "$pid" 2>/dev/null
	APP_STATUS=$?
	rm -f "$APP_DIR/pids/$name"
}

# app_stop NAME... : SIGINT (SPDK's clean shutdown) to each, then SIGKILL to any still
# running 10 s later, saying so; returns 1 when one had to be killed.
app_stop() {
	local name pid i live names=() pids=() rc=0
	for name; do
		pid=$(app_pid "$name") || continue
		kill -INT "$pid" 2>/dev/null
		names+=("$name") pids+=("$pid")
	done
	# Together: each SPDK application takes about half a second to stop, most of it SPDK's
	# own, and the applications of a test stop as well side by side.
	for ((i = 0; i < 500; i++)); do
		live=0
		for pid in "${pids[@]}"; do
			kill -0 "$pid" 2>/dev/null && live=1 && break
		done
		((live)) || break
		sleep 0.02
	done
	for i in "${!pids[@]}"; do
		if kill -KILL "${pids[i]}" 2>/dev/null; then
			echo "app ${names[i]}: still running 10 s after SIGINT; killed" >&2
			rc=1
		fi
		wait "${pids[i]}" 2>/dev/null
		rm -f "$APP_DIR/pids/${names[i]}"
	done
	return $rc
}

# apps_stop_all: app_stop of every application still recorded, all at once.
apps_stop_all() {
	local f names=()
	for f in "$APP_DIR"/pids/*; do
		[[ -e "$f" ]] && names+=("$(basename "$f")")
	done
	((${#names[@]} == 0)) || app_stop "${names[@]}"
}

# The trap of every script using these helpers: no SPDK application survives it.
apps_cleanup() {
	apps_stop_all
	if [[ -n ${RPC_RESIDENT_PID:-} ]]; then
		kill "$RPC_RESIDENT_PID" 2>/dev/null
		wait "$RPC_RESIDENT_PID" 2>/dev/null
		RPC_RESIDENT_PID= RPC_RESIDENT_PORT=
	fi
	hugepages_restore
	[[ "${KEEP_APP_DIR:-0}" == 1 ]] || rm -rf "$APP_DIR"
}

# rpc NAME ARGS... : scripts/rpc.py with the rtrs plugin against application NAME.
rpc() {
	local name=$1 st
	shift
	rpc_call rpc -s "$APP_DIR/$name.sock" --plugin rtrs_rpc "$@"
	st=$?
	((st == 255)) || return $st
	python3 "$RPC_PY" -s "$APP_DIR/$name.sock" --plugin rtrs_rpc "$@"
}

# rpc_raw NAME METHOD JSON-PARAMS : one raw request; prints the response object.
rpc_raw() {
	rpc_call raw "$APP_DIR/$1.sock" "$2" "$3"
	local st=$?
	((st == 255)) || return $st
	python3 "$REPO/ci/spdk/rpc_raw.py" "$APP_DIR/$1.sock" "$2" "$3"
}

# rpc_result NAME METHOD [JSON-PARAMS] : one raw request (no params when JSON-PARAMS is
# empty); prints the result as one line of JSON, or the error's message and returns 1.
rpc_result() {
	rpc_call raw --result "$APP_DIR/$1.sock" "$2" "${3:--}"
	local st=$?
	((st == 255)) || return $st
	python3 "$REPO/ci/spdk/rpc_raw.py" --result "$APP_DIR/$1.sock" "$2" "${3:--}"
}

# bdevperf_perform NAME SECONDS : bdevperf.py perform_tests; prints the JSON result.
bdevperf_perform() {
	python3 "$BDEVPERF_PY" -s "$APP_DIR/$1.sock" -t "$(($2 + 60))" perform_tests
}

# hugepages_ensure [PAGES]: at least PAGES (256 by default) free 2 MiB hugepages, for the fio
# plugin and the benches that run SPDK on hugepages; reserves more if too few are free
# (hugepages_restore gives back what the first call found). Returns 1 when impossible.
hugepages_ensure() {
	local want=${1:-256} free now
	[[ -n "${HP_PREV:-}" ]] || HP_PREV=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
	free=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
	if [[ "${free:-0}" -lt $want ]]; then
		now=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
		echo $((now + want - ${free:-0} + 256)) >/proc/sys/vm/nr_hugepages 2>/dev/null || return 1
		free=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
	fi
	[[ "${free:-0}" -ge $want ]] || return 1
	if ! grep -q hugetlbfs /proc/mounts; then
		mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages 2>/dev/null || return 1
	fi
	return 0
}

hugepages_restore() {
	[[ -n "${HP_PREV:-}" ]] && echo "$HP_PREV" >/proc/sys/vm/nr_hugepages 2>/dev/null
	HP_PREV=
	return 0
}

# JSON config of a client creating rtrs bdev NAME over PORTS (comma-separated) to DEVICE;
# EXTRA (JSON) overrides parameters; KEYS (NAME=FILE,...) adds keyring_file keys, and
# every path then uses the first one. With DEVS=N (default 1), N bdevs share the session:
# NAME over DEVICE, then NAME with 1..N-1 in place of its last digit over DEVICE likewise
# (rtrs0 over malloc0, rtrs1 over malloc1, ...), all with NAME's sessname.
# spdk_bench_init: for the benches: finds SPDK (exported SPDK_DIR), sets up the
# applications' directory with its cleanup on exit, and the paths spdk_setup_paths sets;
# exits with a message when any is missing.
spdk_bench_init() {
	SPDK_DIR=$(spdk_find)
	[[ -n "$SPDK_DIR" ]] || { echo "SPDK not found: set SPDK_DIR (see README)" >&2; exit 1; }
	export SPDK_DIR
	apps_init
	trap apps_cleanup EXIT
	trap 'exit 130' INT TERM
	spdk_setup_paths || exit 1
}

# nvmf_export APP BDEV NQN SERIAL PORT: exports bdev BDEV of application APP over
# NVMe-oF/TCP as subsystem NQN on 127.0.0.1:PORT (the transport made here).
nvmf_export() {
	local app=$1 bdev=$2 nqn=$3 serial=$4 port=$5
	rpc "$app" nvmf_create_transport -t TCP >/dev/null &&
		rpc "$app" nvmf_create_subsystem "$nqn" -a -s "$serial" >/dev/null &&
		rpc "$app" nvmf_subsystem_add_ns "$nqn" "$bdev" >/dev/null &&
		rpc "$app" nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$port" >/dev/null
}

# nvme_bdev_json NAME NQN PORT: a --json config attaching NVMe-oF/TCP controller NAME to
# subsystem NQN at 127.0.0.1:PORT (its namespace is bdev NAMEn1).
nvme_bdev_json() {
	cat <<JSON
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_nvme_attach_controller", "params": {"name": "$1", "trtype": "tcp",
   "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "$3", "subnqn": "$2"}},
  {"method": "bdev_wait_for_examine"}]}]}
JSON
}

rtrs_bdev_json() {
	local name=$1 device=$2 ports=$3 extra=${4:-} keys=${5:-}
	python3 - "$name" "$device" "$ports" "$extra" "$keys" "${DEVS:-1}" <<'PY'
import json, sys
name, device, ports, extra, keys, devs = sys.argv[1:7]
keys = [k.split("=", 1) for k in keys.split(",") if k]
params = {"name": name, "sessname": "sess-" + name,
          "paths": [{"transport": "tcp", "dst_addr": "127.0.0.1", "port": int(p)}
                    for p in ports.split(",")],
          "device": device, "access_mode": "rw", "reconnect_delay_sec": 1,
          "hb_interval_ms": 1000, "hb_missed_max": 5, "io_timeout_sec": 10}
if keys:
    for p in params["paths"]:
        p["psk"] = keys[0][0]
if extra:
    params.update(json.loads(extra))
creates = []
for i in range(int(devs)):
    p = dict(params)
    if i:
        p["name"] = params["name"][:-1] + str(i)
        p["device"] = params["device"][:-1] + str(i)
    creates.append({"method": "bdev_rtrs_create", "params": p})
subsystems = []
if keys:
    subsystems.append({"subsystem": "keyring", "config": [
        {"method": "keyring_file_add_key", "params": {"name": n, "path": f}} for n, f in keys]})
subsystems.append({"subsystem": "bdev", "config": creates + [
    {"method": "bdev_wait_for_examine"}]})
print(json.dumps({"subsystems": subsystems}, indent=2))
PY
}
