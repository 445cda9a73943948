#!/usr/bin/env bash
# The SPDK tests: the plugin loaded into real SPDK applications on this
# machine. Target and client apps run on two cores each (-m 0x3; the cores are shared),
# so every disk and the target have threads on more than one core.
#
# Finds SPDK through $SPDK_DIR, else /opt/spdk (the README's default); without SPDK it
# prints one SKIPPED line and succeeds. Each scenario has a time limit; a trap stops
# every SPDK application this script started. A scenario whose tool is missing (fio:
# $FIO, SPDK's CONFIG_FIO_SOURCE_DIR, /opt/fio-3.*/fio or the PATH) prints "SKIP NAME:
# why". Ends with "SPDK tests: N passed, M failed" plus ", K skipped (NAMES)" when some
# were skipped.
#
#   ci/spdk-test.sh                 all scenarios
#   ci/spdk-test.sh basic verify    only these
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"

. ci/spdk/lib.sh
if [[ -n "${SPDK_DIR:-}" ]]; then
	SPDK_DIR_REASON="SPDK_DIR=$SPDK_DIR is not a directory"
else
	SPDK_DIR_REASON="SPDK_DIR not set and /opt/spdk not found"
fi
SPDK_DIR=$(spdk_find)
if [[ -z "$SPDK_DIR" ]]; then
	echo "SKIPPED: SPDK tests — ${SPDK_DIR_REASON}; see README"
	exit 0
fi
export SPDK_DIR
apps_init
trap apps_cleanup EXIT
trap 'exit 130' INT TERM

spdk_setup_paths || exit 1
echo "== SPDK at $SPDK_DIR; building the plugin (${PLUGIN_PROFILE:-release})"
plugin_build || {
	echo "plugin build failed"
	exit 1
}
# The code that needs SPDK (the root crate's `spdk` feature, the plugin) under the lints
# ci/test.sh gives the rest, which it cannot build without SPDK.
echo "== clippy with SPDK: --features spdk and -p rtrs-spdk-plugin, every target, -D warnings"
(cd "$REPO" && cargo clippy -q --features spdk --all-targets -- -D warnings &&
	cargo clippy -q -p rtrs-spdk-plugin --all-targets -- -D warnings) || {
	echo "clippy with SPDK failed"
	exit 1
}
echo "== cargo doc with SPDK: --features spdk, and the plugin's private items, -D warnings"
(cd "$REPO" && RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q --features spdk &&
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q -p rtrs-spdk-plugin --document-private-items) || {
	echo "cargo doc with SPDK failed"
	exit 1
}

SCENARIO_TIMEOUT=${SCENARIO_TIMEOUT:-240}
# Other SPDK applications may run on this machine: no core locks.
MEM=(--no-huge -s 1024 --disable-cpumask-locks)
# Targets: every RTRS session's chunk pool is SPDK DMA memory (queue_depth x chunk_size,
# 64 MiB by default) and a bare spdk_tgt -s 1024 has ~140 MiB free, so give them room for
# a few sessions.
TGT_MEM=(--no-huge -s 2048 --disable-cpumask-locks)
# Base of the TCP ports the scenarios listen on (set it to run two copies side by side).
PB=${RTRS_TEST_PORT_BASE:-14420}
TGT_MASK=0x3
CLT_MASK=0x3
PASSED=0
FAILED=0
FAILED_NAMES=()
SKIPPED=0
SKIPPED_NAMES=()

# Every scenario runs with this many devices over each client session (rtrs0 over
# malloc0, rtrs1 over malloc1, ... sharing rtrs0's sessname): bdevperf and fio drive them
# all, and every path fault and outage hits all of them at once.
export DEVS=${DEVS:-2}

# ---- building blocks ------------------------------------------------------------------

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
	app_start "$name" "$SPDK_TGT" -m $TGT_MASK "${TGT_MEM[@]}" || return 1
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
	app_start "$name" "$BDEVPERF" -m $CLT_MASK "${MEM[@]}" --json "$APP_DIR/$name.json" -z "${args[@]}"
}

# Checks a perform_tests result: every job finished and no IO failed.
results_clean() {
	python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
jobs = r.get("results", [])
bad = [j for j in jobs if j.get("io_failed", 0) or j.get("status") != "finished"]
ios = sum(j.get("iops", 0) * j.get("runtime", 0) for j in jobs)
print("jobs=%d ios=%.0f io_failed=%d" % (len(jobs), ios, sum(j.get("io_failed", 0) for j in jobs)))
sys.exit(1 if bad or not jobs or ios <= 0 else 0)
PY
}

# ---- scenarios --------------------------------------------------------------------------

# Two spdk_tgt apps: the client creates an rtrs bdev with rpc.py; its size and block size
# come from the remote malloc bdev; get_sessions shows the path; delete removes it.
scenario_basic() {
	start_target tgt $((PB + 0)) || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
	local out
	out=$(rpc clt bdev_rtrs_create -b rtrs0 -n basic-sess -d malloc0 -p tcp:127.0.0.1:$((PB + 0)) \
		-i 1000 -M 5 -D 1 -t 10) || return 1
	[[ "$out" == rtrs0 ]] || { echo "bdev_rtrs_create answered '$out', expected rtrs0"; return 1; }
	rpc clt bdev_get_bdevs -b rtrs0 >"$APP_DIR/bdev.json" || return 1
	python3 - "$APP_DIR/bdev.json" <<'PY' || return 1
import json, sys
b = json.load(open(sys.argv[1]))[0]
assert b["product_name"].lower().startswith("rtrs"), b["product_name"]
assert b["block_size"] == 4096, b["block_size"]
assert b["num_blocks"] * b["block_size"] == 64 << 20, b["num_blocks"]
for t in ("read", "write", "flush", "unmap", "write_zeroes", "reset"):
    assert b["supported_io_types"][t], t
print("bdev ok: %d x %d" % (b["num_blocks"], b["block_size"]))
PY
	# A second device over the same session; the same sessname with another path or
	# setting is refused, naming what differs.
	out=$(rpc clt bdev_rtrs_create -b rtrs1 -n basic-sess -d malloc1 -p tcp:127.0.0.1:$((PB + 0)) \
		-i 1000 -M 5 -D 1 -t 10) || return 1
	[[ "$out" == rtrs1 ]] || { echo "bdev_rtrs_create answered '$out', expected rtrs1"; return 1; }
	if out=$(rpc clt bdev_rtrs_create -b rtrs2 -n basic-sess -d malloc1 -p tcp:127.0.0.1:$((PB + 29)) 2>&1); then
		echo "a device over basic-sess with another path was created: $out"
		return 1
	fi
	[[ "$out" == *"'paths': session "*"basic-sess"*" is connected to [127.0.0.1:$((PB + 0))]"* ]] ||
		{ echo "other path: $out"; return 1; }
	if out=$(rpc clt bdev_rtrs_create -b rtrs2 -n basic-sess -d malloc1 -p tcp:127.0.0.1:$((PB + 0)) \
		-i 500 -M 5 -D 1 -t 10 2>&1); then
		echo "a device over basic-sess with another heartbeat was created: $out"
		return 1
	fi
	[[ "$out" == *"'hb_interval_ms' = 500"* ]] || { echo "other setting: $out"; return 1; }
	rpc clt bdev_rtrs_get_sessions >"$APP_DIR/sess-all.json" || return 1
	python3 - "$APP_DIR/sess-all.json" <<'PY' || return 1
import json, sys
s = json.load(open(sys.argv[1]))
assert len(s) == 1, "expected one session, got %d" % len(s)
assert sorted(d["name"] for d in s[0]["devices"]) == ["rtrs0", "rtrs1"], s[0]["devices"]
print("one session, devices %s" % ", ".join(d["name"] for d in s[0]["devices"]))
PY
	rpc tgt rtrs_target_get_sessions >"$APP_DIR/tsess.json" || return 1
	python3 - "$APP_DIR/tsess.json" <<'PY' || return 1
import json, sys
s = [x for x in json.load(open(sys.argv[1])) if x["sessname"] == "basic-sess"]
assert len(s) == 1, "the target holds %d sessions named basic-sess" % len(s)
print("the target holds one session for both devices")
PY
	rpc clt bdev_rtrs_delete rtrs1 || return 1
	rpc clt bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/sess.json" || return 1
	grep -q "$((PB + 0))" "$APP_DIR/sess.json" || { cat "$APP_DIR/sess.json"; return 1; }
	rpc tgt rtrs_target_get_sessions >"$APP_DIR/tsess.json" || return 1
	grep -q 'basic-sess' "$APP_DIR/tsess.json" || { cat "$APP_DIR/tsess.json"; return 1; }
	# Every statistics key and its JSON type, on both sides.
	python3 "$REPO/ci/spdk/stats_shape.py" bdev "$APP_DIR/sess.json" || return 1
	python3 "$REPO/ci/spdk/stats_shape.py" target "$APP_DIR/tsess.json" || return 1
	# The examine of the new bdevs read them; bdev_rtrs_reset_stats zeroes the counters.
	rpc clt bdev_rtrs_reset_stats rtrs0 || return 1
	rpc clt bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/sess-reset.json" || return 1
	python3 - "$APP_DIR/sess.json" "$APP_DIR/sess-reset.json" <<'PY' || return 1
import json, sys
def counts(f):
    p = json.load(open(f))[0]["stats"]["paths"][0]
    return p["rdma"]["read_cnt"], sum(p["latency_hist_log2_ns"]), sum(p["sg_entries"])
before, after = counts(sys.argv[1]), counts(sys.argv[2])
assert before[0] > 0, "no read counted before the reset: %s" % (before,)
assert after == (0, 0, 0), "after bdev_rtrs_reset_stats: read_cnt, latencies, sg entries = %s" % (after,)
print("statistics reset: read_cnt %d -> 0" % before[0])
PY
	rpc clt bdev_rtrs_set_mp_policy rtrs0 round-robin || return 1
	rpc clt bdev_rtrs_delete rtrs0 || return 1
	if rpc clt bdev_get_bdevs -b rtrs0 >/dev/null 2>&1; then
		echo "rtrs0 still exists after bdev_rtrs_delete"
		return 1
	fi
	app_alive tgt && app_alive clt
}

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

# Interrupt mode (docs/ARCHITECTURE.md, "Interrupt mode"), whatever RTRS_SPDK_INTERRUPT
# says: with a connected client and no IO, every poller of the target's threads sleeps on
# a timer (none is run on each wake-up); a verify run is served from there (the readiness
# set wakes them), and afterwards they sleep again.
scenario_interrupt() {
	local RTRS_SPDK_INTERRUPT=1 round
	start_target tgt $((PB + 26)) || return 1
	start_bdevperf bp $((PB + 26)) '' -q 8 -o 4096 -w verify -t 3 || return 1
	for round in before after; do
		if [[ $round == after ]]; then
			bdevperf_perform bp 3 >"$APP_DIR/r1.json" || { tail -n 20 "$APP_DIR/bp.log"; return 1; }
			results_clean "$APP_DIR/r1.json" || return 1
		fi
		local i ok=0
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

# save_config on both sides, then restart each from its saved JSON.
scenario_save_config() {
	start_target tgt $((PB + 3)) || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n cfg-sess -d malloc0 -p tcp:127.0.0.1:$((PB + 3)) \
		-m round-robin -D 1 -i 1000 -z native >/dev/null || return 1
	# A second device of the session, with its own write_zeroes mode.
	rpc clt bdev_rtrs_create -b rtrs1 -n cfg-sess -d malloc1 -p tcp:127.0.0.1:$((PB + 3)) \
		-m round-robin -D 1 -i 1000 -z emulate >/dev/null || return 1
	rpc tgt save_config >"$APP_DIR/tgt-saved.json" || return 1
	rpc clt save_config >"$APP_DIR/clt-saved.json" || return 1
	grep -q '"rtrs_target_listen"' "$APP_DIR/tgt-saved.json" || { echo "target config lacks rtrs_target_listen"; return 1; }
	grep -q '"rtrs_target_export"' "$APP_DIR/tgt-saved.json" || { echo "target config lacks rtrs_target_export"; return 1; }
	grep -q '"bdev_rtrs_create"' "$APP_DIR/clt-saved.json" || { echo "client config lacks bdev_rtrs_create"; return 1; }
	grep -q 'round-robin' "$APP_DIR/clt-saved.json" || { echo "client config lost mp_policy"; return 1; }
	grep -Eq '"write_zeroes": ?"native"' "$APP_DIR/clt-saved.json" || { echo "client config lost write_zeroes"; return 1; }
	app_stop clt
	app_stop tgt
	app_start tgt "$SPDK_TGT" -m $TGT_MASK "${TGT_MEM[@]}" --json "$APP_DIR/tgt-saved.json" || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" --json "$APP_DIR/clt-saved.json" || return 1
	rpc clt bdev_get_bdevs -b rtrs0 >/dev/null || { echo "rtrs0 not rebuilt from saved config"; return 1; }
	# To a file first: `grep -q` stops reading at the first match, and under pipefail the
	# writer's broken pipe would fail the check.
	rpc clt bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/sess-restored.json" || return 1
	python3 - "$APP_DIR/sess-restored.json" <<'PY' || return 1
import json, sys
s = json.load(open(sys.argv[1]))
assert len(s) == 1 and s[0]["mp_policy"] == "round-robin", "policy not restored: %s" % s
modes = {d["name"]: d["write_zeroes"] for d in s[0]["devices"]}
assert modes == {"rtrs0": "native", "rtrs1": "emulate"}, "devices or write_zeroes not restored: %s" % modes
print("restored: one session, %s" % modes)
PY
	rpc tgt save_config >"$APP_DIR/tgt-saved2.json" || return 1
	grep -q '"rtrs_target_export"' "$APP_DIR/tgt-saved2.json"
}

# Whether this machine lets the scenario break paths as the operating system does: ss -K
# (SOCK_DESTROY) and nft, as root. Prints why not.
flap_tools_usable() {
	[[ $(id -u) -eq 0 ]] || { echo "not root"; return 1; }
	command -v ss >/dev/null && command -v nft >/dev/null ||
		{ echo "ss or nft missing (ci/setup.sh installs them)"; return 1; }
	local t="rtrs_flap_probe_$$"
	nft add table inet "$t" 2>/dev/null && nft delete table inet "$t" 2>/dev/null ||
		{ echo "nft cannot create a table"; return 1; }
	# ss -K on a connection of our own: python holds both ends and checks the reset.
	python3 - <<'PY' || { echo "ss -K does not close sockets (no SOCK_DESTROY?)"; return 1; }
import socket, subprocess, sys
l = socket.socket(); l.bind(("127.0.0.3", 0)); l.listen(1)
port = l.getsockname()[1]
c = socket.create_connection(("127.0.0.3", port)); s, _ = l.accept()
subprocess.run(["ss", "-K", "-t", "-4", "dst", "127.0.0.3", "dport", "=", ":%d" % port], capture_output=True)
c.settimeout(0.5)
try:
    sys.exit(0 if c.recv(1) == b"" else 1)
except socket.timeout:
    sys.exit(1)
except OSError:
    sys.exit(0)
PY
}

# The client's established sockets to 127.0.0.1:$1: "COUNT MOST_BYTES_RECEIVED".
flap_sockets() {
	ss -Htni state established dst 127.0.0.1 dport = ":$1" | awk '
		/^[^ \t]/ { n++ }
		{ for (i = 1; i <= NF; i++) if ($i ~ /^bytes_received:/) { split($i, a, ":"); if (a[2] + 0 > m) m = a[2] + 0 } }
		END { print n + 0, m + 0 }'
}

# Waits (at most 30 s) until the path to port $1 has its $2 connections and carries IO
# (one of them received 16 KiB: the IO connection; cid 0 gets about 8 KiB of INFO).
flap_wait_io() {
	local i n m
	for ((i = 0; i < 1500; i++)); do
		read -r n m < <(flap_sockets "$1")
		[[ $n -eq $2 && $m -ge 16384 ]] && return 0
		sleep 0.02
	done
	return 1
}

# Two paths under bdevperf verify; the operating system breaks them alternately, on this
# scenario's ports only: every socket of a path killed with ss -K (the client's side or
# the server's), or the path made silent by an nft drop rule (a table of its own, deleted
# afterwards, also on a time-out) until the client's heartbeat (2 s x 4: longer than the
# few seconds a process on a crowded machine may wait for a CPU) declares it dead. A path is broken only once it carries IO again, so IO always has a path to fail
# over to. Zero IO errors, and each path reconnected exactly as often as it was broken:
# the path not broken was never closed.
scenario_path_flap() {
	local why
	why=$(flap_tools_usable) || { echo "SKIP path_flap: $why"; return 2; }
	local ports=($((PB + 4)) $((PB + 5))) table="rtrs_flap_$BASHPID" t
	# Tables of runs that died before deleting theirs.
	for t in $(nft list tables 2>/dev/null | awk '$3 ~ /^rtrs_flap_[0-9]+$/ { print $3 }'); do
		[[ -d /proc/${t#rtrs_flap_} ]] || nft delete table inet "$t" 2>/dev/null
	done
	trap "nft delete table inet $table 2>/dev/null" EXIT
	trap 'exit 143' TERM
	start_target tgt "${ports[0]},${ports[1]}" || return 1
	start_bdevperf bpflap "${ports[0]},${ports[1]}" \
		'{"hb_interval_ms": 2000, "hb_missed_max": 4, "reconnect_delay_sec": 0}' \
		-q 32 -o 4096 -w verify -t 30 || return 1
	bdevperf_perform bpflap 30 >"$APP_DIR/flap.json" &
	local perf=$! breaks=(0 0) k=$((RANDOM % 2)) i port cons how
	sleep 1
	cons=$(flap_sockets "${ports[0]}" | cut -d' ' -f1)
	[[ $cons -ge 2 ]] || cons=2
	flap_wait_io "${ports[0]}" "$cons" && flap_wait_io "${ports[1]}" "$cons" ||
		{ echo "the paths never carried IO"; return 1; }
	for ((i = 0; i < 8; i++)); do
		port=${ports[k]}
		sleep "0.$((RANDOM % 4))"
		case $((i == 2 ? 2 : i % 2)) in
		0)
			how="ss -K, client side"
			ss -K -t -4 state established dst 127.0.0.1 dport = ":$port" >/dev/null
			;;
		1)
			how="ss -K, server side"
			ss -K -t -4 state established src 127.0.0.1 sport = ":$port" >/dev/null
			;;
		2)
			how="nft drop until the client gives the path up"
			nft -f - <<EOF || return 1
table inet $table {
	chain input {
		type filter hook input priority -10; policy accept;
		ip daddr 127.0.0.1 tcp dport $port drop
		ip saddr 127.0.0.1 tcp sport $port drop
	}
}
EOF
			# Until the client's heartbeat gives the path up (its sockets go), 15 s at most.
			for ((t = 0; t < 300; t++)); do
				[[ $(flap_sockets "$port" | cut -d' ' -f1) -eq 0 ]] && break
				sleep 0.05
			done
			nft delete table inet "$table" || return 1
			;;
		esac
		breaks[k]=$((breaks[k] + 1))
		echo "   break $((i + 1)): port $port ($how)"
		flap_wait_io "$port" "$cons" ||
			{ echo "path $port did not come back"; tail -n 20 "$APP_DIR/bpflap.log"; return 1; }
		k=$((1 - k))
	done
	rpc bpflap bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/flap-sess.json" || return 1
	wait "$perf" || { tail -n 20 "$APP_DIR/bpflap.log"; return 1; }
	results_clean "$APP_DIR/flap.json" || return 1
	python3 - "$APP_DIR/flap-sess.json" "${ports[0]}" "${breaks[0]}" "${ports[1]}" "${breaks[1]}" <<'PY'
import json, sys
paths = json.load(open(sys.argv[1]))[0]["stats"]["paths"]
ok = True
for port, breaks in ((sys.argv[2], int(sys.argv[3])), (sys.argv[4], int(sys.argv[5]))):
    p = [x for x in paths if x["path"].endswith(":" + port)]
    if len(p) != 1:
        print("no statistics of the path to port %s: %s" % (port, paths))
        ok = False
        continue
    p = p[0]
    rec = p["reconnects"]["successful"]
    print("path :%s: broken %d times, reconnected %d times, %s, %d requests failed over onto it"
          % (port, breaks, rec, p["state"], p["rdma"]["failover_cnt"]))
    if rec != breaks or p["state"] != "connected":
        print("   the path was closed other than by its breaks")
        ok = False
sys.exit(0 if ok else 1)
PY
}

# Unexport while the client has the device open under load: the client's IO fails
# cleanly (bdevperf reports failed IO and stops by itself) and neither app crashes.
scenario_unexport() {
	start_target tgt $((PB + 6)) || return 1
	start_bdevperf bp $((PB + 6)) '{"io_timeout_sec": 2, "max_reconnect_attempts": 0}' \
		-q 16 -o 4096 -w write -t 30 || return 1
	bdevperf_perform bp 30 >"$APP_DIR/unexp.json" 2>"$APP_DIR/unexp.err" &
	local perf=$!
	sleep 3
	rpc tgt rtrs_target_unexport malloc0 || return 1
	wait "$perf"
	local st
	app_wait bp 60 || { echo "bdevperf did not stop after its IO failed"; return 1; }
	st=$APP_STATUS
	# bdevperf exits with 255 (-1) after failed IO; 129..192 is death by a signal.
	if [[ "$st" -gt 128 && "$st" -le 192 ]]; then
		echo "bdevperf died by signal $((st - 128))"
		return 1
	fi
	[[ "$st" -ne 0 ]] || { echo "bdevperf reported success although the export was withdrawn"; return 1; }
	grep -Eiq 'fail|error' "$APP_DIR/bp.log" "$APP_DIR/unexp.err" "$APP_DIR/unexp.json" 2>/dev/null ||
		{ echo "no IO failure reported"; return 1; }
	app_alive tgt || { echo "target died"; return 1; }
	rpc tgt spdk_get_version >/dev/null && rpc tgt rtrs_target_get_sessions >/dev/null
}

# Both paths lose the target for a while (the target process is stopped: heartbeats go
# unanswered, the paths die, reconnects fail) during bdevperf verify; io_timeout_sec is
# longer than the outage, so the IO waits for the paths to come back: zero IO errors.
scenario_outage() {
	start_target tgt $((PB + 9)),$((PB + 10)) || return 1
	start_bdevperf bpout $((PB + 9)),$((PB + 10)) \
		'{"io_timeout_sec": 30, "hb_interval_ms": 500, "hb_missed_max": 2}' \
		-q 32 -o 4096 -w verify -t 8 || return 1
	bdevperf_perform bpout 8 >"$APP_DIR/out.json" &
	local perf=$! tgt
	tgt=$(app_pid tgt)
	sleep 2
	kill -STOP "$tgt" || return 1
	sleep 4
	kill -CONT "$tgt" || return 1
	wait "$perf" || { tail -n 20 "$APP_DIR/bpout.log"; return 1; }
	results_clean "$APP_DIR/out.json" || return 1
	grep -q 're-opened after a reconnect' "$APP_DIR/bpout.log" ||
		{ echo "the device was never re-opened: no full outage happened"; tail -n 20 "$APP_DIR/bpout.log"; return 1; }
}

# The same outage, longer than io_timeout_sec: the waiting IO fails cleanly (bdevperf
# reports failed IO and stops by itself), nothing crashes, the target serves on.
scenario_outage_timeout() {
	start_target tgt $((PB + 11)) || return 1
	start_bdevperf bpto $((PB + 11)) \
		'{"io_timeout_sec": 2, "hb_interval_ms": 500, "hb_missed_max": 2}' \
		-q 16 -o 4096 -w verify -t 30 || return 1
	bdevperf_perform bpto 30 >"$APP_DIR/to.json" 2>"$APP_DIR/to.err" &
	local perf=$! tgt st
	tgt=$(app_pid tgt)
	sleep 2
	kill -STOP "$tgt" || return 1
	# The target stays stopped until bdevperf has given up (the outage outlasts the timeout).
	wait "$perf"
	kill -CONT "$tgt" || return 1
	app_wait bpto 60 || { echo "bdevperf did not stop after its IO failed"; return 1; }
	st=$APP_STATUS
	# bdevperf exits with 255 (-1) after failed IO; 129..192 is death by a signal.
	if [[ "$st" -gt 128 && "$st" -le 192 ]]; then
		echo "bdevperf died by signal $((st - 128))"
		return 1
	fi
	[[ "$st" -ne 0 ]] || { echo "bdevperf reported success although IO could not be served"; return 1; }
	grep -Eiq 'fail|error' "$APP_DIR/bpto.log" "$APP_DIR/to.err" "$APP_DIR/to.json" 2>/dev/null ||
		{ echo "no IO failure reported"; return 1; }
	app_alive tgt || { echo "target died"; return 1; }
	rpc tgt rtrs_target_get_sessions >/dev/null
}

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
	python3 - "$APP_DIR/rst.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
jobs = r.get("results", [])
done = sum(j.get("iops", 0) * j.get("runtime", 0) for j in jobs)
print("jobs=%d ios=%.0f io_failed(aborted by the resets' freeze)=%d" % (
    len(jobs), done, sum(j.get("io_failed", 0) for j in jobs)))
sys.exit(0 if jobs and done > 0 and all(j.get("status") == "finished" for j in jobs) else 1)
PY
}

# bdevperf's write_zeroes workload in both write_zeroes modes; the target's counters
# show what went on the wire: emulate sends zero-filled WRITEs (data bytes arrive),
# native sends RNBD op 5 without data (only the 32-byte headers arrive).
scenario_write_zeroes() {
	local mode port=$((PB + 13))
	for mode in emulate native; do
		start_target tgt "$port" || return 1
		start_bdevperf bpz "$port" "{\"write_zeroes\": \"$mode\"}" -q 8 -o 65536 -w write_zeroes -t 3 || return 1
		bdevperf_perform bpz 3 >"$APP_DIR/wz-$mode.json" || { tail -n 20 "$APP_DIR/bpz.log"; return 1; }
		results_clean "$APP_DIR/wz-$mode.json" || return 1
		rpc tgt rtrs_target_get_sessions >"$APP_DIR/wz-$mode-tgt.json" || return 1
		python3 - "$APP_DIR/wz-$mode-tgt.json" "$mode" <<'PY' || return 1
import json, sys
sessions, mode = json.load(open(sys.argv[1])), sys.argv[2]
paths = [p for s in sessions if s["sessname"] == "sess-rtrs0" for p in s["paths"]]
cnt = sum(p["write_cnt"] for p in paths)
avg = sum(p["write_bytes"] for p in paths) / max(cnt, 1)
print("%s: %d writes at the target, %.0f bytes each on average" % (mode, cnt, avg))
assert cnt > 0, "no writes reached the target"
if mode == "emulate":
    assert avg >= 65536, "write-zeroes did not arrive as 64 KiB writes of zeros"
else:
    assert avg < 4096, "native write-zeroes carried data"
PY
		app_stop bpz
		app_stop tgt
		port=$((PB + 14))
	done
}

# Admission: rtrs_target_set_options with rpc.py's plugin options (-T handshake timeout,
# -P/-S caps) before the listener; 1500 TCP connections from 127.0.0.2-4 that never write
# are opened while bdevperf connects and verifies: zero IO errors, every idle socket
# closed by the target (evicted, or at the 1.5 s deadline), a few log lines about them
# per second, the options kept by save_config.
scenario_admission() {
	local port=$((PB + 9))
	app_start tgt "$SPDK_TGT" -m $TGT_MASK "${TGT_MEM[@]}" || return 1
	rpc tgt rtrs_target_set_options -T 1500 -P 64 -S 8 || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	make_exports tgt || return 1
	local started=$SECONDS
	python3 - $port >"$APP_DIR/flood.out" 2>&1 <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
socks = []
for i in range(1500):
    s = socket.socket()
    s.bind(("127.0.0.%d" % (2 + i % 3), 0))
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    socks.append(s)
    if i == 500:
        print("flooding", flush=True)
start = time.time()
n = len(socks)
while socks and time.time() < start + 60:
    left = []
    for s in socks:
        try:
            if s.recv(64):
                sys.exit("the target sent data to an idle socket")
        except BlockingIOError:
            left.append(s)
            continue
        except OSError:
            pass
    socks = left
    time.sleep(0.1)
if socks:
    sys.exit("%d of %d idle sockets still open after 60 s" % (len(socks), n))
print("all %d idle sockets closed by the target (%.1f s after the last was opened)"
      % (n, time.time() - start))
PY
	local flood=$!
	echo "$flood" >"$APP_DIR/pids/flood"
	local i
	for ((i = 0; i < 300; i++)); do
		grep -q flooding "$APP_DIR/flood.out" 2>/dev/null && break
		sleep 0.1
	done
	start_bdevperf bpadm $port '' -q 16 -o 4096 -w verify -t 4 || return 1
	bdevperf_perform bpadm 4 >"$APP_DIR/adm.json" || { tail -n 20 "$APP_DIR/bpadm.log"; return 1; }
	results_clean "$APP_DIR/adm.json" || return 1
	wait "$flood" || { cat "$APP_DIR/flood.out"; return 1; }
	rm -f "$APP_DIR/pids/flood"
	tail -n 1 "$APP_DIR/flood.out"
	# The last window's count is logged within a second of its end.
	sleep 1.5
	local secs=$((SECONDS - started + 1)) lines
	lines=$(grep -c 'tcp fabric listener' "$APP_DIR/tgt.log")
	echo "log: $lines lines about the listener in ${secs} s"
	grep -q 'similar messages suppressed' "$APP_DIR/tgt.log" || { echo "no suppressed count logged"; return 1; }
	[[ $lines -le $((6 * secs)) ]] || { echo "too many log lines"; return 1; }
	rpc tgt save_config >"$APP_DIR/adm-saved.json" || return 1
	python3 - "$APP_DIR/adm-saved.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
calls = [e for s in c["subsystems"] if s["subsystem"] == "rtrs_target" for e in s["config"] or []]
o = [e["params"] for e in calls if e["method"] == "rtrs_target_set_options"]
assert o and o[0]["handshake_timeout_ms"] == 1500 and o[0]["max_pending"] == 64 \
    and o[0]["max_pending_per_source"] == 8, o
print("save_config keeps", o[0])
PY
}

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
	app_start tgt "$SPDK_TGT" -m $TGT_MASK "${TGT_MEM[@]}" || return 1
	rpc tgt keyring_file_add_key key0 "$APP_DIR/key0" || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $p -k key0 || return 1
	make_exports tgt || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
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
	python3 - "$APP_DIR/tgt-psk.json" "$APP_DIR/clt-psk.json" "$APP_DIR/key0" "$APP_DIR/key1" <<'PY' || return 1
import json, sys
tgt, clt = (json.load(open(f)) for f in sys.argv[1:3])
secrets = [open(f).read().strip() for f in sys.argv[3:5]]
def calls(cfg, method):
    return [c["params"] for s in cfg["subsystems"] for c in (s["config"] or []) if c["method"] == method]
assert [l.get("psk") for l in calls(tgt, "rtrs_target_listen")] == ["key0"], calls(tgt, "rtrs_target_listen")
assert [p.get("psk") for b in calls(clt, "bdev_rtrs_create") for p in b["paths"]] == ["key0", "key0"], calls(clt, "bdev_rtrs_create")
assert calls(tgt, "keyring_file_add_key") and calls(clt, "keyring_file_add_key")
for s in secrets:
    for c in (tgt, clt):
        assert s[:16] not in json.dumps(c), "a key is in a saved config"
print("saved configs name key0 and hold no key")
PY
	app_stop clt
	app_stop tgt
	app_start tgt "$SPDK_TGT" -m $TGT_MASK "${TGT_MEM[@]}" --json "$APP_DIR/tgt-psk.json" || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" --json "$APP_DIR/clt-psk.json" || return 1
	rpc clt bdev_get_bdevs -b rtrs0 >/dev/null || { echo "rtrs0 not rebuilt from the saved config"; return 1; }
	rpc clt bdev_get_bdevs -b rtrs1 >/dev/null || { echo "rtrs1 not rebuilt from the saved config"; return 1; }
	app_stop clt
	start_bdevperf bppsk $p '' -q 16 -o 4096 -w verify -t 5 -- "key0=$APP_DIR/key0" || return 1
	bdevperf_perform bppsk 5 >"$APP_DIR/psk.json" || { tail -n 20 "$APP_DIR/bppsk.log"; return 1; }
	results_clean "$APP_DIR/psk.json"
}

# Rows on stdin: app|method|params|field the message must name[|text it must also
# contain]; each request must be refused so. Returns 1 if any was not.
expect_errors() {
	local bad=0 app method params field text resp
	while IFS='|' read -r app method params field text; do
		[[ -n "$app" && "$app" != \#* ]] || continue
		resp=$(rpc_raw "$app" "$method" "$params")
		if ! python3 -c '
import json, sys
r = json.loads(sys.argv[1]); f = sys.argv[2]; t = sys.argv[3]
e = r.get("error")
m = e.get("message", "") if e else ""
sys.exit(0 if e and f in m and t in m else 1)' "$resp" "$field" "$text"; then
			echo "  $method $params: expected an error naming '$field'${text:+ and saying '$text'}, got $resp"
			bad=1
		fi
	done
	return $bad
}

# Bad parameters for every RPC: a JSON-RPC error whose message names the field; the apps
# keep running.
scenario_bad_params() {
	start_target tgt $((PB + 7)) || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n bad-sess -d malloc0 -p tcp:127.0.0.1:$((PB + 7)) >/dev/null || return 1
	# An export only 10.0.0.0/8 and session "nobody" may open (rpc.py's -H and the
	# add_host/get_exports sub-commands): this client's OPEN is refused as an RPC error.
	rpc tgt rtrs_target_export malloc0 -e locked -H 10.0.0.0/8 || return 1
	rpc tgt rtrs_target_export_add_host locked sess:nobody || return 1
	rpc tgt rtrs_target_get_exports -e locked >"$APP_DIR/locked.json" || return 1
	grep -q 'sess:nobody' "$APP_DIR/locked.json" || { cat "$APP_DIR/locked.json"; return 1; }
	rpc tgt rtrs_target_export_remove_host locked sess:nobody || return 1
	# Options are fixed once a listener runs: check their validation on a fresh target.
	app_start tgt2 "$SPDK_TGT" -m $TGT_MASK "${MEM[@]}" || return 1
	local bad=0
	local good="\"paths\":[{\"transport\":\"tcp\",\"dst_addr\":\"127.0.0.1\",\"port\":$((PB + 7))}]"
	expect_errors <<EOF || bad=1
clt|bdev_rtrs_create|{"sessname":"s","device":"malloc0",$good}|name
clt|bdev_rtrs_create|{"name":"x","device":"malloc0",$good}|sessname
clt|bdev_rtrs_create|{"name":"x","sessname":"s",$good}|device
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0"}|paths
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[]}|paths
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":"127.0.0.1"}|paths
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"udp","dst_addr":"127.0.0.1"}]}|transport
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"not-an-ip"}]}|dst_addr
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1","port":70000}]}|port
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","src_addr":"nowhere","dst_addr":"127.0.0.1"}]}|src_addr
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"rdma","dst_addr":"127.0.0.1"}]}|'paths[0].transport'|no RDMA device found
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1"},{"transport":"rdma","dst_addr":"127.0.0.2"}]}|'paths[1].transport'|one session uses one transport
clt|bdev_rtrs_create|{"name":"x","sessname":"s/x","device":"malloc0",$good}|sessname
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"access_mode":"rwx"}|access_mode
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"mp_policy":"fastest"}|mp_policy
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"max_reconnect_attempts":"many"}|max_reconnect_attempts
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"reconnect_delay_sec":-1}|reconnect_delay_sec
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"hb_interval_ms":0}|hb_interval_ms
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"hb_missed_max":0}|hb_missed_max
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"io_timeout_sec":-3}|io_timeout_sec
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"write_zeroes":"same"}|write_zeroes|native, emulate
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"colour":"red"}|colour
clt|bdev_rtrs_create|{"name":"rtrs0","sessname":"s","device":"malloc0",$good}|name
clt|bdev_rtrs_create|{"name":"x","sessname":"s2","device":"no-such-export",$good}|device|no such export
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1","psk":5}]}|'paths[0].psk'
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1","psk":""}]}|'paths[0].psk'
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"rdma","dst_addr":"127.0.0.1","psk":"k"}]}|'paths[0].psk'|tcp transport only
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0","paths":[{"transport":"tcp","dst_addr":"127.0.0.1","psk":"nokey"}]}|'paths[0].psk'|keyring
clt|bdev_rtrs_create|{"name":"y","sessname":"s3","device":"locked",$good}|'locked'|EACCES (access denied
clt|bdev_rtrs_delete|{}|name
clt|bdev_rtrs_delete|{"name":"nope"}|name
clt|bdev_rtrs_get_sessions|{"name":"nope"}|name
clt|bdev_rtrs_get_sessions|{"name":5}|name
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"tcp"}|dst_addr
clt|bdev_rtrs_add_path|{"name":"nope","transport":"tcp","dst_addr":"127.0.0.1"}|name
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"ib","dst_addr":"127.0.0.1"}|transport
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"rdma","dst_addr":"127.0.0.2"}|'transport'|no RDMA device found
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.1","port":-1}|port
clt|bdev_rtrs_add_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.1","port":1,"psk":"nokey"}|'psk'|keyring
clt|bdev_rtrs_remove_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.1","psk":"k"}|psk
clt|bdev_rtrs_remove_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.9","port":1}|dst_addr
clt|bdev_rtrs_remove_path|{"transport":"tcp","dst_addr":"127.0.0.1"}|name
clt|bdev_rtrs_set_mp_policy|{"name":"rtrs0","mp_policy":"fastest"}|mp_policy
clt|bdev_rtrs_set_mp_policy|{"name":"nope","mp_policy":"round-robin"}|name
clt|bdev_rtrs_set_mp_policy|{"name":"rtrs0"}|mp_policy
clt|bdev_rtrs_reset_stats|{}|name
clt|bdev_rtrs_reset_stats|{"name":"nope"}|name
clt|bdev_rtrs_reset_stats|{"name":"rtrs0","all":true}|all
tgt2|rtrs_target_set_options|{"queue_depth":0}|queue_depth
tgt2|rtrs_target_set_options|{"chunk_size":1000}|chunk_size
tgt2|rtrs_target_set_options|{"always_invalidate":"yes"}|always_invalidate
tgt2|rtrs_target_set_options|{"handshake_timeout_ms":0}|handshake_timeout_ms
tgt2|rtrs_target_set_options|{"handshake_timeout_ms":3600001}|handshake_timeout_ms|1 hour
tgt2|rtrs_target_set_options|{"max_pending":0}|max_pending
tgt2|rtrs_target_set_options|{"max_pending":"many"}|max_pending
tgt2|rtrs_target_set_options|{"max_pending":8,"max_pending_per_source":9}|max_pending_per_source
tgt|rtrs_target_listen|{"transport":"udp","addr":"127.0.0.1","port":$((PB + 8))}|transport
tgt|rtrs_target_listen|{"transport":"rdma","addr":"127.0.0.1","port":$((PB + 8))}|'transport'|no RDMA device found
tgt|rtrs_target_listen|{"transport":"tcp","addr":"localhost-ish","port":$((PB + 8))}|addr
tgt|rtrs_target_listen|{"transport":"tcp","addr":"127.0.0.1","port":"x"}|port
tgt|rtrs_target_listen|{"transport":"tcp","addr":"127.0.0.1","port":$((PB + 8)),"psk":"nokey"}|'psk'|keyring
tgt|rtrs_target_listen|{"transport":"tcp","addr":"127.0.0.1","port":$((PB + 8)),"psk":7}|psk
tgt|rtrs_target_stop_listener|{"transport":"tcp","addr":"127.0.0.1","port":$((PB + 79))}|port
tgt|rtrs_target_stop_listener|{"transport":"tcp","port":$((PB + 7))}|addr
tgt|rtrs_target_export|{"access":"rw"}|bdev_name
tgt|rtrs_target_export|{"bdev_name":"no-such-bdev"}|bdev_name
tgt|rtrs_target_export|{"bdev_name":"malloc0","export_name":"e2","access":"wo"}|access
tgt|rtrs_target_unexport|{"export_name":"nope"}|export_name
tgt|rtrs_target_unexport|{}|export_name
tgt|rtrs_target_get_sessions|{"colour":"red"}|colour
EOF
	app_alive tgt || { echo "target died"; return 1; }
	app_alive clt || { echo "client died"; return 1; }
	app_alive tgt2 || { echo "second target died"; return 1; }
	rpc clt bdev_get_bdevs -b rtrs0 >/dev/null || { echo "rtrs0 gone after bad parameters"; return 1; }
	rpc tgt spdk_get_version >/dev/null || return 1
	return $bad
}

# A target whose chunk pool cannot be allocated refuses the session with -ENOMEM (a real
# spdk_zmalloc failure: 2048 x 128 KiB = 256 MiB of DMA memory where the target has about
# 140 MiB free). bdev_rtrs_create and rtrs-bench report the reason at once: both are
# bounded at 20 s while their own waits are 60 s, so an answer means the refusal got
# through. Nothing crashes; the target keeps no session.
scenario_refused() {
	local port=$((PB + 13)) resp line rc
	app_start tgt "$SPDK_TGT" -m $TGT_MASK "${MEM[@]}" || return 1
	rpc tgt rtrs_target_set_options --queue-depth 2048 --chunk-size 131072 || return 1
	rpc tgt bdev_malloc_create -b malloc0 8 4096 >/dev/null || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	rpc tgt rtrs_target_export malloc0 -a rw || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
	resp=$(timeout 20 python3 "$REPO/ci/spdk/rpc_raw.py" "$APP_DIR/clt.sock" bdev_rtrs_create \
		"{\"name\":\"rtrs0\",\"sessname\":\"refused\",\"device\":\"malloc0\",\"io_timeout_sec\":60,\"paths\":[{\"transport\":\"tcp\",\"dst_addr\":\"127.0.0.1\",\"port\":$port}]}")
	rc=$?
	[[ $rc -ne 124 ]] || { echo "bdev_rtrs_create did not answer within 20 s"; return 1; }
	echo "   bdev_rtrs_create: $resp"
	python3 -c '
import json, sys
e = json.loads(sys.argv[1]).get("error") or {}
m = e.get("message", "")
sys.exit(0 if all(w in m for w in ("malloc0", "target refused the session", "out of memory", "ENOMEM")) else 1)' "$resp" ||
		{ echo "expected an error naming malloc0 and the refusal (ENOMEM)"; return 1; }
	grep -q 'spdk_zmalloc(268435456 bytes, SPDK_MALLOC_DMA) failed' "$APP_DIR/tgt.log" ||
		{ echo "no spdk_zmalloc failure in the target's log"; tail -n 20 "$APP_DIR/tgt.log"; return 1; }
	(cd "$REPO" && cargo build -q --bin rtrs-bench) || return 1
	line=$(timeout 20 "${CARGO_TARGET_DIR:-$REPO/target}/debug/rtrs-bench" --path tcp://127.0.0.1:$port \
		--device malloc0 --rw read --connect-timeout 60s --idle adaptive -m $CLT_MASK 2>&1)
	rc=$?
	echo "   rtrs-bench (exit $rc): $line"
	[[ $rc -eq 1 && $(wc -l <<<"$line") -eq 1 && "$line" == *"'malloc0'"* && "$line" == *"ENOMEM"* ]] ||
		{ echo "expected exit 1 and one line naming malloc0 and ENOMEM"; return 1; }
	app_alive tgt || { echo "target died"; return 1; }
	app_alive clt || { echo "client died"; return 1; }
	resp=$(rpc tgt rtrs_target_get_sessions) || return 1
	[[ "$resp" == "[]" ]] || { echo "the target kept a session: $resp"; return 1; }
}

# The module's home pollers (home's group, the session's control) on the application
# thread move from their 1 ms period to an idle one (a sixteenth of the heartbeat
# interval: 62.5 ms for 1000 ms) once they have found no work for 100 runs; the session's
# go with its last disk, home's stays. A heartbeat is work, so a poller may be back on
# 1 ms for a moment when sampled: the pollers are sampled until they are all on the idle
# period (at most 20 times, 0.5 s apart).
scenario_pace() {
	start_target tgt $((PB + 15)) || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n pace-sess -d malloc0 -p tcp:127.0.0.1:$((PB + 15)) \
		-i 1000 -M 5 -D 1 -t 10 >/dev/null || return 1
	local i ok=0
	for i in $(seq 20); do
		sleep 0.5
		rpc clt thread_get_pollers >"$APP_DIR/pollers.json" || return 1
		if python3 - "$APP_DIR/pollers.json" <<'PY'; then
import json, sys
d = json.load(open(sys.argv[1]))
hz = d["tick_rate"]
ours = [p for t in d["threads"] for kind in ("active_pollers", "timed_pollers", "paused_pollers")
        for p in t.get(kind, []) if p["name"] == "rtrs"]
assert ours, "no rtrs poller on any thread: %s" % d
idle = 62_500 * hz // 1_000_000
periods = sorted({p["period_ticks"] for p in ours})
if periods != [idle]:
    print("   rtrs pollers' periods %s ticks, waiting for all %d (62.5 ms)" % (periods, idle))
    sys.exit(1)
print("%d rtrs pollers, all on the 62.5 ms idle period" % len(ours))
PY
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
		python3 - "$APP_DIR/pollers.json" <<'PY' && break
import json, sys
d = json.load(open(sys.argv[1]))
left = [p for t in d["threads"] for kind in ("active_pollers", "timed_pollers", "paused_pollers")
        for p in t.get(kind, []) if p["name"] == "rtrs"]
if len(left) != 1:
    sys.exit(1)
print("one rtrs poller left (home's), period %d ticks" % left[0]["period_ticks"])
PY
		[[ $i -lt 40 ]] || { echo "rtrs pollers left after bdev_rtrs_delete: $(cat "$APP_DIR/pollers.json")"; return 1; }
		sleep 0.25
	done
	app_alive tgt && app_alive clt
}

# Memory as SPDK maps it, on a fabric that resolves local memory as verbs does
# (RTRS_TCP_LKEYS_ONLY=1: no fallback to the fabric's own table, so a READ lands only in
# memory registered with the session's cores). bdevperf runs on hugepages in SPDK's
# dynamic memory mode (no -s): its buffers (64 x 1 MiB per job) are allocated after the
# bdevs were created, in memory DPDK maps then; verify reads into them. The client's log
# must show SPDK memory registered with the session after the bdevs were, and no IO may
# fail.
scenario_late_memory() {
	if ! hugepages_ensure; then
		echo "SKIP late_memory: needs hugepages and none could be reserved"
		return 2
	fi
	local port=$((PB + 30)) rc=0
	start_target tgt $port || { hugepages_restore; return 1; }
	rtrs_bdev_json rtrs0 malloc0 $port '' '' >"$APP_DIR/bplate.json"
	export RTRS_TCP_LKEYS_ONLY=1
	app_start bplate "$BDEVPERF" -m $CLT_MASK --disable-cpumask-locks --json "$APP_DIR/bplate.json" -z || rc=1
	unset RTRS_TCP_LKEYS_ONLY
	if [[ $rc -eq 0 ]]; then
		python3 "$BDEVPERF_PY" -s "$APP_DIR/bplate.sock" -t 120 perform_tests -q 64 -o 1048576 -w verify -t 4 \
			>"$APP_DIR/late.json" || { tail -n 20 "$APP_DIR/bplate.log"; rc=1; }
	fi
	[[ $rc -eq 0 ]] && { results_clean "$APP_DIR/late.json" || rc=1; }
	app_stop bplate
	hugepages_restore
	[[ $rc -eq 0 ]] || return 1
	python3 - "$APP_DIR/bplate.log" <<'PY'
import re, sys
log = open(sys.argv[1], errors="replace").read().splitlines()
made = [i for i, l in enumerate(log) if re.search(r"rtrs bdev rtrs\d: .* blocks of", l)]
regs = [i for i, l in enumerate(log) if "SPDK memory" in l and l.rstrip().endswith(" registered")]
assert made, "no bdev was registered"
late = [i for i in regs if i > made[-1]]
print("%d SPDK memory region(s) registered with the session, %d after the bdevs were created" % (len(regs), len(late)))
assert late, "no memory was registered after the bdevs: the test did not exercise late memory"
PY
}

# Lines saying that a stop went wrong: a message to a thread SPDK had already ended, a
# disk's core out of reach, a thread the application had to end itself.
EXIT_BAD='marked as exited|could not reach core|could not stop core|could not post the|was not called on thread|exited state forcefully'

# exit_within NAME HOW : stops application NAME by HOW (SIGINT, or kill_instance: the
# spdk_kill_instance RPC sending SIGINT) and checks that it exits within 10 s with
# status 0 and no line of EXIT_BAD in its log. Prints how long it took.
exit_within() {
	local name=$1 how=$2 pid t0 st
	pid=$(app_pid "$name") || { echo "$name is not running"; return 1; }
	t0=$(date +%s%N)
	case $how in
	SIGINT) kill -INT "$pid" ;;
	kill_instance) rpc "$name" spdk_kill_instance SIGINT >/dev/null 2>&1 ||
		{ echo "   $name: spdk_kill_instance failed"; return 1; } ;;
	esac
	if ! app_wait "$name" 10; then
		echo "   $name ($how): still running 10 s later; its log ends:"
		tail -n 5 "$APP_DIR/$name.log" | sed 's/^/     /'
		return 1
	fi
	st=$APP_STATUS
	echo "   $name ($how): exit status $st after $((($(date +%s%N) - t0) / 1000000)) ms"
	if grep -Eq "$EXIT_BAD" "$APP_DIR/$name.log"; then
		echo "   $name's log says its stop went wrong:"
		grep -E "$EXIT_BAD" "$APP_DIR/$name.log" | head -n 5 | sed 's/^/     /'
		return 1
	fi
	[[ $st -eq 0 ]]
}

# Waits (at most 30 s) until bdev $2 of application $1 has completed IO.
io_flowing() {
	local i
	for ((i = 0; i < 300; i++)); do
		rpc "$1" bdev_get_iostat -b "$2" 2>/dev/null | python3 -c '
import json, sys
b = json.load(sys.stdin)["bdevs"][0]
sys.exit(0 if b["num_read_ops"] + b["num_write_ops"] > 0 else 1)' && return 0
		sleep 0.1
	done
	return 1
}

# Exit on two cores, each case EXIT_TRIES times (3; the fault this guards against was
# a race): an application with the plugin exits within 10 s with status 0 and no line
# of EXIT_BAD in its log. spdk_tgt with an idle rtrs bdev, by SIGINT and by the
# spdk_kill_instance RPC; bdevperf under IO, and spdk_tgt right after a failed
# bdev_rtrs_create (a port nothing listens on, or a device the target does not export),
# by SIGINT in odd tries and by spdk_kill_instance in even ones; at the end the target
# that served them all, by SIGINT.
scenario_exit() {
	local port=$((PB + 16)) none=$((PB + 17)) i how perf alt
	start_target tgt $port || return 1
	for ((i = 1; i <= ${EXIT_TRIES:-3}; i++)); do
		echo "   try $i"
		if ((i % 2)); then alt=SIGINT; else alt=kill_instance; fi
		for how in SIGINT kill_instance; do
			app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
			rpc clt bdev_rtrs_create -b rtrs0 -n exit-sess -d malloc0 -p tcp:127.0.0.1:$port \
				-D 1 -t 10 >/dev/null || return 1
			sleep 1
			exit_within clt $how || return 1
		done
		start_bdevperf bpexit $port '' -q 32 -o 4096 -w verify -t 60 || return 1
		bdevperf_perform bpexit 60 >/dev/null 2>&1 &
		perf=$!
		io_flowing bpexit rtrs0 || { echo "   no IO completed on rtrs0 within 30 s"; return 1; }
		exit_within bpexit $alt || return 1
		wait "$perf"
		app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
		if ((i % 2)); then
			rpc clt bdev_rtrs_create -b rtrs0 -n exit-sess -d malloc0 -p tcp:127.0.0.1:$none \
				-D 1 -t 1 >/dev/null 2>&1 && { echo "   bdev_rtrs_create to port $none succeeded"; return 1; }
		else
			rpc clt bdev_rtrs_create -b rtrs0 -n exit-sess -d no-such-export -p tcp:127.0.0.1:$port \
				-D 1 -t 1 >/dev/null 2>&1 && { echo "   bdev_rtrs_create of no-such-export succeeded"; return 1; }
		fi
		exit_within clt $alt || return 1
	done
	exit_within tgt SIGINT
}

# ---- day-two operations: openers, forced close, path and session controls, loss, size ----

# The target lists each export's openers (session, access mode, device id, paths with
# their addresses and devices, since when) in rtrs_target_get_exports, and each session's
# devices in rtrs_target_get_sessions.
scenario_openers() {
	start_target tgt $((PB + 40)) || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
	local before
	before=$(date +%s)
	rpc clt bdev_rtrs_create -b rtrs0 -n op-rw -d malloc0 -p tcp:127.0.0.1:$((PB + 40)) -D 1 >/dev/null || return 1
	rpc clt bdev_rtrs_create -b rtrs1 -n op-ro -d malloc0 -a ro -p tcp:127.0.0.1:$((PB + 40)) -D 1 >/dev/null || return 1
	rpc tgt rtrs_target_get_exports >"$APP_DIR/exports.json" || return 1
	rpc tgt rtrs_target_get_sessions >"$APP_DIR/tsess.json" || return 1
	python3 - "$APP_DIR/exports.json" "$APP_DIR/tsess.json" "$before" "$(date +%s)" "$((PB + 40))" <<'PY' || return 1
import json, sys
exports = {e["export_name"]: e for e in json.load(open(sys.argv[1]))}
sessions = json.load(open(sys.argv[2]))
t0, t1, port = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
op = {o["sessname"]: o for o in exports["malloc0"]["openers"]}
assert sorted(op) == ["op-ro", "op-rw"], exports["malloc0"]
assert op["op-rw"]["access_mode"] == "rw" and op["op-ro"]["access_mode"] == "ro", op
for o in op.values():
    assert o["transport"] == "tcp" and o["export"] == "malloc0", o
    assert t0 - 5 <= o["opened_at"] <= t1 + 5, "opened_at %d not within [%d, %d]" % (o["opened_at"], t0, t1)
    assert len(o["paths"]) == 1, o
    p = o["paths"][0]
    assert p["addr"].startswith("127.0.0.1:") and p["addr"].endswith("@127.0.0.1:" + port), p
    assert p["state"] == "connected" and "hca_name" in p and "hca_port" in p, p
assert exports["malloc1"]["openers"] == [], exports["malloc1"]
for s in sessions:
    devs = s["devices"]
    want = op[s["sessname"]]
    assert [(d["export_name"], d["access_mode"], d["device_id"]) for d in devs] == \
        [("malloc0", want["access_mode"], want["device_id"])], s
print("openers: %s" % ", ".join("%s (%s, device %d, %s)" % (n, o["access_mode"], o["device_id"],
                                 o["paths"][0]["addr"]) for n, o in sorted(op.items())))
PY
	python3 "$REPO/ci/spdk/stats_shape.py" target "$APP_DIR/tsess.json"
}

# The target closes one client's mapping (the kernel's force_close) while the client
# writes: the IO to that device fails, its bdev shows the device closed by the target,
# and the session's other device goes on; with the host list now leaving the client out
# its re-open (bdev_rtrs_remap) is refused with -EACCES; allowed again, it maps again and
# IO is clean.
scenario_force_close() {
	local port=$((PB + 41))
	app_start tgt "$SPDK_TGT" -m $TGT_MASK "${TGT_MEM[@]}" || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	make_exports tgt -H 127.0.0.1 || return 1
	start_bdevperf bpfc $port '{"io_timeout_sec": 5}' -q 8 -o 4096 -w write -t 3 -f || return 1
	bdevperf_perform bpfc 3 >"$APP_DIR/fc1.json" || return 1
	results_clean "$APP_DIR/fc1.json" || return 1
	rpc tgt rtrs_target_force_close malloc0 sess-rtrs0 >"$APP_DIR/fc-closed.json" || return 1
	rpc tgt rtrs_target_export_remove_host malloc0 127.0.0.1 || return 1
	rpc tgt rtrs_target_get_exports -e malloc0 >"$APP_DIR/fc-exp.json" || return 1
	bdevperf_perform bpfc 3 >"$APP_DIR/fc2.json" || return 1
	rpc bpfc bdev_rtrs_get_sessions >"$APP_DIR/fc-sess.json" || return 1
	python3 - "$APP_DIR/fc-closed.json" "$APP_DIR/fc-exp.json" "$APP_DIR/fc2.json" "$APP_DIR/fc-sess.json" <<'PY' || return 1
import json, sys
closed = json.load(open(sys.argv[1]))
assert [(c["export"], c["sessname"], c["access_mode"]) for c in closed] == [("malloc0", "sess-rtrs0", "rw")], closed
assert json.load(open(sys.argv[2]))[0]["openers"] == [], "the mapping is still listed"
jobs = {j["job"]: j for j in json.load(open(sys.argv[3]))["results"]}
assert jobs["rtrs0"]["io_failed"] > 0, "IO to the closed device did not fail: %s" % jobs["rtrs0"]
assert jobs["rtrs1"]["io_failed"] == 0, "the session's other device failed IO: %s" % jobs["rtrs1"]
devs = {d["name"]: d for d in json.load(open(sys.argv[4]))[0]["devices"]}
assert devs["rtrs0"]["device_state"] == "closed by the server", devs["rtrs0"]
assert devs["rtrs1"]["device_state"] == "open", devs["rtrs1"]
print("rtrs0: %d writes failed, closed by the server; rtrs1: %d IOs, none failed"
      % (jobs["rtrs0"]["io_failed"], jobs["rtrs1"]["iops"] * jobs["rtrs1"]["runtime"]))
PY
	local out
	if out=$(rpc bpfc bdev_rtrs_remap rtrs0 2>&1); then
		echo "the remap was allowed although the host list leaves the client out: $out"
		return 1
	fi
	[[ "$out" == *EACCES* ]] || { echo "remap refused without -EACCES: $out"; return 1; }
	echo "   remap refused: $(grep -o 'server refused open[^"]*' <<<"$out" | head -n 1)"
	rpc bpfc bdev_rtrs_get_sessions >"$APP_DIR/fc-sess2.json" || return 1
	grep -q '"closed by the server"' "$APP_DIR/fc-sess2.json" || { echo "no longer closed after a refused remap"; return 1; }
	rpc tgt rtrs_target_export_add_host malloc0 127.0.0.1 || return 1
	rpc bpfc bdev_rtrs_remap rtrs0 >"$APP_DIR/fc-remap.json" || return 1
	rpc tgt rtrs_target_get_exports -e malloc0 >"$APP_DIR/fc-exp2.json" || return 1
	grep -q '"sess-rtrs0"' "$APP_DIR/fc-exp2.json" || { echo "not mapped again"; cat "$APP_DIR/fc-exp2.json"; return 1; }
	bdevperf_perform bpfc 3 >"$APP_DIR/fc3.json" || return 1
	results_clean "$APP_DIR/fc3.json"
}

# The state of the client's path to port $3 in bdev $2's session of app $1 ("" if none).
path_state() {
	rpc "$1" bdev_rtrs_get_sessions -b "$2" 2>/dev/null | python3 -c '
import json, sys
port = sys.argv[1]
for p in json.load(sys.stdin)[0]["paths"]:
    if p["path"].endswith(":" + port):
        print(p["state"])' "$3"
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

# One path disconnected by RPC under bdevperf verify, and reconnected by RPC later: its IO
# fails over to the other path, it stays closed until the reconnect (no automatic
# reconnect), then connects again; zero IO errors.
scenario_path_rpc() {
	local a=$((PB + 42)) b=$((PB + 43))
	start_target tgt "$a,$b" || return 1
	start_bdevperf bppr "$a,$b" '{"reconnect_delay_sec": 1}' -q 32 -o 4096 -w verify -t 12 || return 1
	bdevperf_perform bppr 12 >"$APP_DIR/pr.json" &
	local perf=$!
	path_wait bppr rtrs0 $b 20 connected || return 1
	sleep 2
	rpc bppr bdev_rtrs_disconnect_path rtrs0 -a 127.0.0.1 -s $b || return 1
	path_wait bppr rtrs0 $b 20 closed || return 1
	# Longer than the reconnect delay: a disconnected path does not come back by itself.
	sleep 3
	[[ "$(path_state bppr rtrs0 $b)" == closed ]] || { echo "the disconnected path reconnected by itself"; return 1; }
	rpc bppr bdev_rtrs_reconnect_path rtrs0 -a 127.0.0.1 -s $b || return 1
	path_wait bppr rtrs0 $b 20 connected || return 1
	rpc bppr bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/pr-sess.json" || return 1
	wait "$perf" || { tail -n 20 "$APP_DIR/bppr.log"; return 1; }
	results_clean "$APP_DIR/pr.json" || return 1
	python3 - "$APP_DIR/pr-sess.json" "$a" "$b" <<'PY'
import json, sys
paths = {p["path"].rsplit(":", 1)[1]: p for p in json.load(open(sys.argv[1]))[0]["stats"]["paths"]}
a, b = paths[sys.argv[2]], paths[sys.argv[3]]
print("path :%s reconnected %d time(s), path :%s %d" % (sys.argv[3], b["reconnects"]["successful"],
      sys.argv[2], a["reconnects"]["successful"]))
assert b["reconnects"]["successful"] == 1 and a["reconnects"]["successful"] == 0, paths
assert a["state"] == b["state"] == "connected", paths
PY
}

# max_reconnect_attempts changed at run time and obeyed: a session created to retry for
# ever is set to 2 attempts (a refused call with a bad field changes nothing); its path to
# a listener that is then stopped (and the path disconnected by the target) gives up
# after 2 failed attempts, closed and saying so, while IO goes on over the other path
# with zero errors; save_config keeps the new value.
scenario_reconnect_attempts() {
	local a=$((PB + 44)) b=$((PB + 45))
	start_target tgt "$a,$b" || return 1
	start_bdevperf bpra "$a,$b" '{"reconnect_delay_sec": 1, "max_reconnect_attempts": -1}' \
		-q 16 -o 4096 -w verify -t 14 || return 1
	bdevperf_perform bpra 14 >"$APP_DIR/ra.json" &
	local perf=$!
	path_wait bpra rtrs0 $b 20 connected || return 1
	rpc bpra bdev_rtrs_set_session_options rtrs0 -r 2 || return 1
	local resp
	resp=$(rpc_raw bpra bdev_rtrs_set_session_options '{"name": "rtrs0", "max_reconnect_attempts": 7, "loss_timeout_sec": -5}')
	[[ "$resp" == *loss_timeout_sec* && "$resp" == *error* ]] || { echo "bad loss_timeout_sec accepted: $resp"; return 1; }
	rpc tgt rtrs_target_stop_listener -t tcp -a 127.0.0.1 -s $b || return 1
	local path
	path=$(rpc tgt rtrs_target_get_sessions | python3 -c '
import json, sys
for s in json.load(sys.stdin):
    for p in s["paths"]:
        if p["addr"].endswith("@127.0.0.1:" + sys.argv[1]):
            print(p["addr"])' $b)
	[[ -n "$path" ]] || { echo "the target has no path on port $b"; return 1; }
	rpc tgt rtrs_target_disconnect sess-rtrs0 -p "$path" >/dev/null || return 1
	local i failure=""
	for ((i = 0; i < 300; i++)); do
		failure=$(rpc bpra bdev_rtrs_get_sessions -b rtrs0 | python3 -c '
import json, sys
for p in json.load(sys.stdin)[0]["paths"]:
    if p["path"].endswith(":" + sys.argv[1]) and p.get("failure"):
        print(p["failure"])' $b)
		[[ -n "$failure" ]] && break
		sleep 0.1
	done
	echo "   path :$b: ${failure:-no failure within 30 s}"
	[[ "$failure" == "gave up after 2 failed attempts (max_reconnect_attempts 2)"* ]] || return 1
	[[ "$(path_state bpra rtrs0 $b)" == closed ]] || { echo "the path is not closed"; return 1; }
	wait "$perf" || { tail -n 20 "$APP_DIR/bpra.log"; return 1; }
	results_clean "$APP_DIR/ra.json" || return 1
	rpc bpra save_config >"$APP_DIR/ra-saved.json" || return 1
	python3 - "$APP_DIR/ra-saved.json" <<'PY'
import json, sys
for sub in json.load(open(sys.argv[1]))["subsystems"]:
    for c in sub.get("config") or []:
        if c["method"] == "bdev_rtrs_create":
            p = c["params"]
            assert (p["max_reconnect_attempts"], p["loss_timeout_sec"]) == (2, -1), p
print("save_config: max_reconnect_attempts 2, loss_timeout_sec -1")
PY
}

# bdev_raid1 over two rtrs bdevs on two targets, under bdevperf verify; one target is
# killed (SIGKILL): the raid goes degraded and IO goes on with zero errors, and once the
# session has had no path for loss_timeout_sec its rtrs bdev is unregistered.
scenario_raid_loss() {
	local a=$((PB + 46)) b=$((PB + 47))
	DEVS=1 start_target tgta $a || return 1
	DEVS=1 start_target tgtb $b || return 1
	python3 - "$a" "$b" >"$APP_DIR/raid.json" <<'PY'
import json, sys
def rtrs(name, port):
    return {"method": "bdev_rtrs_create", "params": {
        "name": name, "sessname": "sess-" + name, "device": "malloc0", "access_mode": "rw",
        "paths": [{"transport": "tcp", "dst_addr": "127.0.0.1", "port": int(port)}],
        "reconnect_delay_sec": 1, "hb_interval_ms": 500, "hb_missed_max": 2,
        "io_timeout_sec": 2, "loss_timeout_sec": 4}}
config = [rtrs("ra", sys.argv[1]), rtrs("rb", sys.argv[2]),
          {"method": "bdev_raid_create", "params": {"name": "raid1", "raid_level": "raid1",
                                                    "base_bdevs": ["ra", "rb"]}},
          {"method": "bdev_wait_for_examine"}]
print(json.dumps({"subsystems": [{"subsystem": "bdev", "config": config}]}, indent=2))
PY
	app_start bpraid "$BDEVPERF" -m $CLT_MASK "${MEM[@]}" --json "$APP_DIR/raid.json" -z \
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
	python3 - "$APP_DIR/raid-state.json" <<'PY'
import json, sys
r = [x for x in json.load(open(sys.argv[1])) if x["name"] == "raid1"][0]
print("raid1: %s, %d of %d base bdevs" % (r["state"], r["num_base_bdevs_discovered"], r["num_base_bdevs"]))
assert r["state"] == "online" and r["num_base_bdevs_discovered"] == 1 and r["num_base_bdevs"] == 2, r
PY
}

# bdev_null_resize on the target reaches the client's rtrs bdev: at once through
# bdev_rtrs_remap, and at the re-open after a reconnect (the target disconnects the
# session); bdev_get_bdevs shows each new size.
scenario_resize() {
	local port=$((PB + 48))
	app_start tgt "$SPDK_TGT" -m $TGT_MASK "${TGT_MEM[@]}" || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	rpc tgt bdev_null_create null0 64 4096 >/dev/null || return 1
	rpc tgt rtrs_target_export null0 || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n rs-sess -d null0 -p tcp:127.0.0.1:$port -D 1 -i 1000 -M 5 >/dev/null || return 1
	size_mib() { rpc clt bdev_get_bdevs -b rtrs0 | python3 -c 'import json,sys; b=json.load(sys.stdin)[0]; print(b["num_blocks"]*b["block_size"]>>20)'; }
	[[ $(size_mib) -eq 64 ]] || { echo "rtrs0 is $(size_mib) MiB, expected 64"; return 1; }
	rpc tgt bdev_null_resize null0 128 >/dev/null || return 1
	[[ $(size_mib) -eq 64 ]] || { echo "the size changed before any OPEN"; return 1; }
	local out
	out=$(rpc clt bdev_rtrs_remap rtrs0) || return 1
	[[ $(size_mib) -eq 128 ]] || { echo "after bdev_rtrs_remap rtrs0 is $(size_mib) MiB, expected 128 ($out)"; return 1; }
	echo "   remap: 64 -> 128 MiB"
	rpc tgt bdev_null_resize null0 192 >/dev/null || return 1
	rpc tgt rtrs_target_disconnect rs-sess >/dev/null || return 1
	local i
	for ((i = 0; i < 300; i++)); do
		[[ $(size_mib) -eq 192 ]] && break
		sleep 0.1
	done
	[[ $(size_mib) -eq 192 ]] || { echo "after a reconnect rtrs0 is $(size_mib) MiB, expected 192"; return 1; }
	grep -q 're-opened after a reconnect' "$APP_DIR/clt.log" || { echo "no reconnect happened"; return 1; }
	echo "   reconnect: 128 -> 192 MiB"
}

# The geometry of the exported bdev reaches the client: a malloc bdev with 512-byte
# blocks, 4 KiB physical blocks, an 8 KiB optimal IO boundary it splits at and a write
# cache gives the rtrs bdev the same block sizes, IO no larger than the boundary, the
# boundary itself and the write cache with FUA (driver_specific shows what OPEN_RSP
# carried).
scenario_geometry() {
	local port=$((PB + 49))
	app_start tgt "$SPDK_TGT" -m $TGT_MASK "${TGT_MEM[@]}" || return 1
	rpc tgt rtrs_target_listen -t tcp -a 127.0.0.1 -s $port || return 1
	rpc tgt bdev_malloc_create -b geo0 -p 4096 -o 16 32 512 >/dev/null || return 1
	rpc tgt rtrs_target_export geo0 || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n geo-sess -d geo0 -p tcp:127.0.0.1:$port >/dev/null || return 1
	rpc clt bdev_get_bdevs -b rtrs0 >"$APP_DIR/geo.json" || return 1
	python3 - "$APP_DIR/geo.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))[0]
i = b["driver_specific"]["rtrs"]["device_info"]
print("block %d, physical %d, max IO %d, io boundary %d, write cache %s" % (
    b["block_size"], i["physical_block_size"], i["max_io_size"], i["io_boundary"], i["write_cache"]))
assert b["block_size"] == 512 and b["num_blocks"] * 512 == 32 << 20, b
assert i["physical_block_size"] == 4096, i
assert i["max_io_size"] == 8192 and i["io_boundary"] == 8192, i
# A malloc bdev has a volatile write cache: the target says so, and honours FUA (as a
# write and a flush).
assert i["write_cache"] is True and i["fua"] is True, i
PY
}

# The day-two controls refuse bad input naming the field (unknown bdev, session, path or
# export, values out of range, unknown fields), and a refused call changes nothing: the
# session's settings and the target's mapping stand.
scenario_bad_controls() {
	local port=$((PB + 50)) bad=0
	start_target tgt $port || return 1
	app_start clt "$SPDK_TGT" -m $CLT_MASK "${MEM[@]}" || return 1
	rpc clt bdev_rtrs_create -b rtrs0 -n bad-sess -d malloc0 -p tcp:127.0.0.1:$port >/dev/null || return 1
	local good="\"paths\":[{\"transport\":\"tcp\",\"dst_addr\":\"127.0.0.1\",\"port\":$port}]"
	expect_errors <<EOF || bad=1
clt|bdev_rtrs_create|{"name":"x","sessname":"s","device":"malloc0",$good,"loss_timeout_sec":-2}|loss_timeout_sec
clt|bdev_rtrs_disconnect_path|{"name":"rtrs0","transport":"tcp","dst_addr":"127.0.0.9","port":1}|dst_addr|no such path
clt|bdev_rtrs_disconnect_path|{"name":"nope","transport":"tcp","dst_addr":"127.0.0.1"}|name
clt|bdev_rtrs_reconnect_path|{"name":"rtrs0","transport":"tcp"}|dst_addr
clt|bdev_rtrs_set_session_options|{"name":"rtrs0","max_reconnect_attempts":3,"loss_timeout_sec":"soon"}|loss_timeout_sec
clt|bdev_rtrs_set_session_options|{"name":"rtrs0","loss_timeout_sec":9,"max_reconnect_attempts":-5}|max_reconnect_attempts
clt|bdev_rtrs_set_session_options|{"name":"rtrs0","reconnect_delay_sec":-1}|reconnect_delay_sec
clt|bdev_rtrs_set_session_options|{"name":"nope"}|name
clt|bdev_rtrs_set_session_options|{"name":"rtrs0","colour":1}|colour
clt|bdev_rtrs_remap|{"name":"nope"}|name
clt|bdev_rtrs_remap|{}|name
tgt|rtrs_target_force_close|{"export_name":"malloc0","sessname":"nope"}|sessname|no such session
tgt|rtrs_target_force_close|{"export_name":"nope","sessname":"bad-sess"}|export_name|no such export
tgt|rtrs_target_force_close|{"export_name":"malloc1","sessname":"bad-sess"}|export_name|no mapping
tgt|rtrs_target_force_close|{"sessname":"bad-sess"}|export_name
tgt|rtrs_target_disconnect|{"sessname":"nope"}|sessname|no such session
tgt|rtrs_target_disconnect|{"sessname":"bad-sess","path":"1.2.3.4:5"}|path|no such path
tgt|rtrs_target_disconnect|{}|sessname
EOF
	rpc clt bdev_rtrs_get_sessions -b rtrs0 >"$APP_DIR/bad-sess.json" || return 1
	rpc tgt rtrs_target_get_exports -e malloc0 >"$APP_DIR/bad-exp.json" || return 1
	python3 - "$APP_DIR/bad-sess.json" "$APP_DIR/bad-exp.json" <<'PY' || return 1
import json, sys
s = json.load(open(sys.argv[1]))[0]
got = (s["max_reconnect_attempts"], s["reconnect_delay_sec"], s["loss_timeout_sec"])
assert got == (-1, 30, -1), "settings changed by refused calls: %s" % (got,)
assert s["paths"][0]["state"] == "connected", s["paths"]
o = json.load(open(sys.argv[2]))[0]["openers"]
assert [x["sessname"] for x in o] == ["bad-sess"], o
print("refused controls changed nothing")
PY
	app_alive tgt && app_alive clt || { echo "an application died"; return 1; }
	return $bad
}

# ---- runner -----------------------------------------------------------------------------

run_scenario() {
	local name=$1 rc
	echo "== $name"
	(scenario_"$name") &
	local sub=$!
	# The watchdog's sleep goes with it: a sleep left behind would hold the output open
	# (a reader of a pipe would wait for it) until the timeout.
	(
		sleep "$SCENARIO_TIMEOUT" &
		nap=$!
		trap 'kill "$nap" 2>/dev/null; exit 0' TERM
		wait "$nap" || exit 0
		echo "   $name: timed out after ${SCENARIO_TIMEOUT}s"
		kill -TERM "$sub" 2>/dev/null
	) &
	local dog=$!
	wait "$sub"
	rc=$?
	kill "$dog" 2>/dev/null
	wait "$dog" 2>/dev/null
	for app in "$APP_DIR"/pids/*; do
		[[ -e "$app" ]] || continue
		local n
		n=$(basename "$app")
		if ! app_alive "$n"; then
			echo "   $n is not running any more (crash?); last lines of its log:"
			tail -n 15 "$APP_DIR/$n.log" | sed 's/^/     /'
		fi
	done
	apps_stop_all
	case $rc in
	0)
		echo "PASS $name"
		PASSED=$((PASSED + 1))
		;;
	2)
		echo "SKIP $name"
		SKIPPED=$((SKIPPED + 1))
		SKIPPED_NAMES+=("$name")
		;;
	*)
		echo "FAIL $name (rc $rc); logs in $APP_DIR"
		KEEP_APP_DIR=1
		FAILED=$((FAILED + 1))
		FAILED_NAMES+=("$name")
		;;
	esac
}

ALL=(basic verify fio save_config path_flap unexport outage outage_timeout reset admission psk write_zeroes bad_params refused pace late_memory exit
	openers force_close path_rpc reconnect_attempts raid_loss resize geometry bad_controls interrupt)
SELECTED=("$@")
[[ ${#SELECTED[@]} -gt 0 ]] || SELECTED=("${ALL[@]}")
for s in "${SELECTED[@]}"; do
	run_scenario "$s"
done
echo "SPDK tests: $PASSED passed, $FAILED failed${FAILED_NAMES:+ (${FAILED_NAMES[*]})}${SKIPPED_NAMES:+, $SKIPPED skipped (${SKIPPED_NAMES[*]})}"
[[ $FAILED -eq 0 ]]
