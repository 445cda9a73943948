#!/usr/bin/env bash
# The RTRS target inside SPDK, end to end: spdk_tgt with librtrs_spdk.so exporting a
# malloc bdev over tcp on 127.0.0.1, driven over JSON-RPC, with the project's own RNBD
# client (tests/spdk_target.rs) doing verified IO against it.
#
# Covers: bad parameters for every rtrs_target_* RPC (the error names the field, the
# application keeps running), the rdma transport without a device (the verbs fabric's
# "no RDMA device found"), set_options after the first listener, verified IO from two
# client cores, live sessions in rtrs_target_get_sessions (chunk pool in SPDK DMA
# memory), a read-only export refusing rw, unexport, save_config -> spdk_tgt --json
# round trip, an old kernel client's WRITE_SAME, per-export host lists (allowed_hosts,
# add/remove_host, get_exports, replay), a listener requiring a pre-shared key from SPDK's
# keyring (rtrs-bench --psk-file with the same key runs verified IO, another key or none
# is refused with "authentication failed", save_config keeps the key's name only), bdev
# hot removal under IO, stop_listener, a second (IPv6) listener, -ENOMEM
# from a tiny bdev_io pool (spdk_bdev_queue_io_wait), unexport while the client does IO,
# clean shutdown; and a client without a key (tests/spdk_target.rs): a host the host list
# refuses holding every session slot while an allowed client is served, a path asking for
# too many connections and an address asking for more than its share refused, a join of
# another client's session from a refused address refused with its data untouched, and
# every one of those refusals (and the isolation attacks' remote access errors, with key
# and range) in the target's log.
#
# Usage: ci/spdk-target-test.sh   (SPDK_DIR defaults to /opt/spdk; without SPDK it prints
# one SKIPPED line and exits 0; no part of it is ever skipped otherwise). Target on two
# cores (SPDK_TGT_MASK, default 0x3; the cores are shared), client pinned to core 1. The
# target listens on RTRS_TEST_PORT_BASE + 90 (the port after ci/spdk-test.sh's), or a
# random port in 20000..39999 when that is unset. Every wait is bounded. Ends with "spdk
# target tests: N passed, M failed".
#
# The target is application "tgt" of ci/spdk/lib.sh: started with app_start, stopped with
# app_wait, talked to with rpc_result (raw requests) and rpc (rpc.py: save_config), and gone
# at the end (apps_cleanup).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
# shellcheck source=ci/spdk/lib.sh
. ci/spdk/lib.sh
SPDK_DIR=${SPDK_DIR:-/opt/spdk}
if [ ! -f "$SPDK_DIR/include/spdk/bdev_module.h" ]; then
    echo "SKIPPED: SPDK target tests (SPDK_DIR not set and /opt/spdk not found) — see README"
    exit 0
fi
export SPDK_DIR
TGT=""
for t in "$SPDK_DIR/build/bin/spdk_tgt" "$SPDK_DIR/bin/spdk_tgt"; do
    [ -x "$t" ] && TGT=$t && break
done
if [ -z "$TGT" ]; then
    echo "SKIPPED: SPDK target tests (no spdk_tgt under $SPDK_DIR/build/bin or $SPDK_DIR/bin)"
    exit 0
fi
spdk_setup_rpc || exit 1
TARGET_DIR=${CARGO_TARGET_DIR:-target}
MASK=${SPDK_TGT_MASK:-0x3}
APP_DIR=$(mktemp -d /tmp/rtrs-spdk-target.XXXXXX)
apps_init
WORK=$APP_DIR
# Every start of the target adds to one log, $WORK/tgt.log; never in interrupt mode.
APP_LOG_APPEND=1
RTRS_SPDK_INTERRUPT=0
if [ -n "${RTRS_TEST_PORT_BASE:-}" ]; then
    PORT=$((RTRS_TEST_PORT_BASE + 90))
else
    PORT=$((20000 + RANDOM % 20000))
fi
FAILS=0
OKS=0

cleanup() {
    set +e
    apps_stop_all
    [ -n "${KEEP_LOG:-}" ] && cp "$WORK/tgt.log" "$KEEP_LOG" 2>/dev/null
    apps_cleanup
}
trap cleanup EXIT

echo "== building the plugin and the test client"
PLUGIN_PROFILE=debug plugin_build || exit 1
cargo test -q --test spdk_target --no-run
cargo build -q --bin rtrs-bench

# trpc METHOD [JSON]: one raw request to the target (rpc_result): prints the result as one
# line of JSON, or the error's message and returns 1.
trpc() { rpc_result tgt "$@"; }

# save_config: the target's config as `rpc.py save_config` writes it.
save_config() { rpc tgt save_config; }

ok() { echo "  ok: $*"; OKS=$((OKS + 1)); }
fail() { echo "  FAIL: $*"; FAILS=$((FAILS + 1)); }

# expect_err METHOD JSON WORD...: the call fails and its message contains every WORD.
expect_err() {
    local out w
    if out=$(trpc "$1" "$2"); then
        fail "$1 $2 succeeded: $out"
        return
    fi
    for w in "${@:3}"; do
        if [[ "$out" != *"$w"* ]]; then
            fail "$1 $2: error does not name '$w': $out"
            return
        fi
    done
    ok "$1 $2 -> $out"
}

expect_ok() {
    local out
    if out=$(trpc "$1" "${2:-}"); then ok "$1 ${2:-}"; else fail "$1 ${2:-}: $out"; fi
}

# start_target [ARGS...]: spdk_tgt with the plugin (app_start), up to framework_wait_init
# (to its RPC server only with --wait-for-rpc); exits with its log when it does not come up.
start_target() {
    # No core locks: other SPDK applications may share this machine's cores.
    if app_start tgt "$TGT" --no-huge -s 1024 -m "$MASK" --disable-cpumask-locks "$@" &&
        { [ "${1:-}" = --wait-for-rpc ] || trpc framework_wait_init >/dev/null 2>&1; }; then
        return 0
    fi
    echo "spdk_tgt did not come up; log:"; tail -20 "$WORK/tgt.log"; exit 1
}

# stop_target: SIGINT; the target must exit within 20 s with status 0.
stop_target() {
    local pid rc=0
    pid=$(app_pid tgt)
    kill -INT "$pid"
    if app_wait tgt 20; then
        rc=$APP_STATUS
    else
        fail "spdk_tgt still running 20 s after SIGINT"; kill -KILL "$pid"
        wait "$pid" || rc=$?
        rm -f "$APP_DIR/pids/tgt"
    fi
    [ "$rc" = 0 ] && ok "spdk_tgt exited cleanly" || fail "spdk_tgt exit code $rc"
}

# client [ENV=VALUE...]: verified IO against the target (tests/spdk_target.rs), core 1.
client() {
    env RTRS_TARGET_ADDR="127.0.0.1:$PORT" "$@" \
        timeout 300 taskset -c 1 cargo test -q --test spdk_target verified_io -- --ignored --nocapture 2>&1 |
        grep -E "verified|WRITE_SAME|refused as expected|panicked|FAILED|error" || true
}

# isolation: another session's writes into a victim session's chunks (with its keys)
# are refused while verified IO of a third session goes on (tests/spdk_target.rs).
isolation() {
    local out
    out=$(env RTRS_TARGET_ADDR="127.0.0.1:$PORT" timeout 300 taskset -c 1 \
        cargo test -q --test spdk_target isolation -- --ignored --nocapture 2>&1 |
        grep -E "isolated|verified|panicked|FAILED|error" || true)
    if [[ "$out" == *"isolated"* && "$out" != *panicked* ]]; then ok "isolation: $(echo "$out" | grep isolated | head -1)"; else fail "isolation: $out"; fi
}

# attack TEST WANT [ENV=VALUE...]: one of tests/spdk_target.rs's attacks as a client
# without a key; its printed line must contain WANT.
attack() {
    local test=$1 want=$2 out; shift 2
    out=$(env RTRS_TARGET_ADDR="127.0.0.1:$PORT" "$@" timeout 300 taskset -c 1 \
        cargo test -q --test spdk_target "$test" -- --ignored --nocapture 2>&1 |
        grep -E "$want|panicked|FAILED|error" || true)
    if [[ "$out" == *"$want"* && "$out" != *panicked* ]]; then ok "$test: $(echo "$out" | grep "$want" | head -1)"; else fail "$test: $out"; fi
}

# in_log WHAT WORD...: some line of the target's log has every WORD.
in_log() {
    local what=$1 line; shift
    line=$(python3 ci/spdk/log_line.py "$WORK/tgt.log" "$@")
    if [ -n "$line" ]; then ok "log: $what: $line"; else fail "log: no line for $what (${*})"; fi
}

expect_client() {
    local want=$1; shift
    local out; out=$(client "$@")
    if [[ "$out" == *"$want"* ]]; then ok "client $*: $(echo "$out" | head -1)"; else fail "client $*: $out"; fi
}

alive() {
    if trpc spdk_get_version >/dev/null; then ok "application still running"; else fail "application gone"; fi
}

echo "== spdk_tgt -m $MASK with the plugin (log: $WORK/tgt.log)"
start_target
expect_ok bdev_malloc_create '{"name":"Malloc0","num_blocks":16384,"block_size":4096}'

echo "== bad parameters"
expect_err rtrs_target_set_options '{"chunk_size":1000}' chunk_size
expect_err rtrs_target_set_options '{"queue_depth":"x"}' queue_depth
expect_err rtrs_target_set_options '{"always_invalidate":1}' always_invalidate
expect_err rtrs_target_set_options '{"bogus":1}' bogus
expect_err rtrs_target_set_options '[1]' params
expect_err rtrs_target_set_options '{"handshake_timeout_ms":0}' handshake_timeout_ms
expect_err rtrs_target_set_options '{"max_pending":4,"max_pending_per_source":5}' max_pending_per_source
expect_err rtrs_target_set_options '{"open_grace_ms":0}' open_grace_ms
expect_err rtrs_target_set_options '{"max_path_connections":1}' max_path_connections
expect_err rtrs_target_set_options '{"max_connections":1}' max_connections
expect_err rtrs_target_set_options '{"max_connections":16,"max_connections_per_source":17}' max_connections_per_source
expect_err rtrs_target_listen '{}' transport
expect_err rtrs_target_listen '{"transport":"udp","addr":"127.0.0.1"}' transport
expect_err rtrs_target_listen '{"transport":"tcp"}' addr
expect_err rtrs_target_listen '{"transport":"tcp","addr":"not-an-ip"}' addr
expect_err rtrs_target_listen '{"transport":"tcp","addr":"127.0.0.1","port":70000}' port
# rdma opens the verbs fabric; this machine has no RDMA device, and the fabric says so.
expect_err rtrs_target_listen '{"transport":"rdma","addr":"127.0.0.1"}' "'transport'" "no RDMA device found"
expect_err rtrs_target_stop_listener '{"transport":"tcp","addr":"127.0.0.1","port":1}' addr
expect_err rtrs_target_export '{}' bdev_name
expect_err rtrs_target_export '{"bdev_name":"NoSuchBdev"}' bdev_name
expect_err rtrs_target_export '{"bdev_name":"Malloc0","access":"rx"}' access
expect_err rtrs_target_export '{"bdev_name":"Malloc0","export_name":"a..b"}' export_name
expect_err rtrs_target_unexport '{}' export_name
expect_err rtrs_target_unexport '{"export_name":"nope"}' export_name
expect_err rtrs_target_get_sessions '{"x":1}' "'x'"
alive

echo "== listen, export, verified IO"
expect_ok rtrs_target_set_options '{"queue_depth":128,"chunk_size":131072,"always_invalidate":true,"handshake_timeout_ms":3000,"max_pending":128,"max_pending_per_source":16}'
expect_ok rtrs_target_listen "{\"transport\":\"tcp\",\"addr\":\"127.0.0.1\",\"port\":$PORT}"
expect_err rtrs_target_listen "{\"transport\":\"tcp\",\"addr\":\"127.0.0.1\",\"port\":$PORT}" "already listening"
expect_err rtrs_target_set_options '{"queue_depth":64}' "first listener"
expect_ok rtrs_target_export '{"bdev_name":"Malloc0","export_name":"vol","access":"rw"}'
expect_err rtrs_target_export '{"bdev_name":"Malloc0","export_name":"vol"}' export_name
expect_client "verified 256 blocks"
isolation
# The same run's old-kernel-client part: RNBD op 5 with one block of data (WRITE_SAME
# before Linux 5.18) is that block repeated over the range, emulated with writev.
expect_client "WRITE_SAME of one 4096-byte block over 300 blocks: first and last 16 read back; two blocks of data refused"

echo "== a second listener (IPv6) on the same server: one path there, then two paths in one session"
expect_ok rtrs_target_listen "{\"transport\":\"tcp\",\"addr\":\"::1\",\"port\":$PORT}"
expect_client "verified 256 blocks" RTRS_TARGET_ADDR="[::1]:$PORT"
expect_client "verified 256 blocks" RTRS_TARGET_ADDR="127.0.0.1:$PORT,[::1]:$PORT"
expect_ok rtrs_target_stop_listener "{\"transport\":\"tcp\",\"addr\":\"::1\",\"port\":$PORT}"

echo "== a live session in rtrs_target_get_sessions"
client RTRS_TARGET_ROUNDS=100 >"$WORK/long.out" &
LONG=$!
seen=""
for _ in $(seq 1 100); do
    s=$(trpc rtrs_target_get_sessions || true)
    if [[ "$s" == *'"sessname": "spdk-target-test"'* && "$s" == *'"connected"'* ]]; then seen=$s; break; fi
    sleep 0.1
done
[ -n "$seen" ] && ok "get_sessions: $(echo "$seen" | cut -c1-160)..." || fail "no live session seen"
# The chunk pool is SPDK DMA memory (spdk_vtophys-translatable, so NVMe PCIe bdevs work).
if [[ "$seen" == *'"chunk_memory": "spdk_dma"'* ]]; then
    ok "get_sessions: chunk_memory is spdk_dma"
else
    fail "get_sessions: chunk_memory is not spdk_dma: $(echo "$seen" | grep -o '"chunk_memory": "[a-z_]*"' | head -1)"
fi
# Every key of the answer and its JSON type.
if [ -n "$seen" ]; then
    printf '%s\n' "$seen" >"$WORK/sessions.json"
    if shape=$(python3 ci/spdk/stats_shape.py target "$WORK/sessions.json" 2>&1); then
        ok "get_sessions: $shape"
    else
        fail "get_sessions: $shape"
    fi
fi
wait "$LONG" || true
grep -q "verified 256 blocks" "$WORK/long.out" && ok "long run verified" || fail "long run: $(cat "$WORK/long.out")"

echo "== read-only export, unexport"
expect_ok rtrs_target_export '{"bdev_name":"Malloc0","export_name":"volro","access":"ro"}'
expect_client "refused as expected" RTRS_TARGET_DEV=volro RTRS_TARGET_EXPECT=fail
expect_ok rtrs_target_unexport '{"export_name":"volro"}'
expect_ok rtrs_target_unexport '{"export_name":"vol"}'
expect_client "refused as expected" RTRS_TARGET_EXPECT=fail
expect_ok rtrs_target_export '{"bdev_name":"Malloc0","export_name":"vol"}'
expect_client "verified 256 blocks"

echo "== host lists: allowed_hosts, add_host, remove_host, get_exports (replayed below)"
expect_err rtrs_target_export '{"bdev_name":"Malloc0","export_name":"hl","allowed_hosts":["localhost"]}' "'allowed_hosts[0]'" localhost
expect_err rtrs_target_export '{"bdev_name":"Malloc0","export_name":"hl","allowed_hosts":"127.0.0.2"}' allowed_hosts
expect_ok rtrs_target_export '{"bdev_name":"Malloc0","export_name":"hl","allowed_hosts":["127.0.0.2"]}'
expect_client "verified 256 blocks" RTRS_TARGET_DEV=hl RTRS_TARGET_SRC=127.0.0.2
# Another address: OPEN refused with -EACCES (13), not retried.
expect_client 'name: "hl", errno: EACCES' RTRS_TARGET_DEV=hl RTRS_TARGET_SRC=127.0.0.3 RTRS_TARGET_EXPECT=fail
expect_err rtrs_target_export_add_host '{"export_name":"hl","host":"10.0.0.1/8"}' "'host'" "10.0.0.0/8"
expect_err rtrs_target_export_add_host '{"export_name":"nope","host":"10.0.0.0/8"}' export_name
expect_ok rtrs_target_export_add_host '{"export_name":"hl","host":"sess:hl-sess"}'
expect_err rtrs_target_export_add_host '{"export_name":"hl","host":"sess:hl-sess"}' "already"
expect_ok rtrs_target_export_add_host '{"export_name":"hl","host":"[fd00::]/64"}'
expect_client "verified 256 blocks" RTRS_TARGET_DEV=hl RTRS_TARGET_SRC=127.0.0.3 RTRS_TARGET_SESSNAME=hl-sess
out=$(trpc rtrs_target_get_exports '{"export_name":"hl"}' || true)
[[ "$out" == *'"allow_any_host": false'* && "$out" == *'"allowed_hosts": ["127.0.0.2", "sess:hl-sess", "[fd00::]/64"]'* ]] &&
    ok "get_exports: $out" || fail "get_exports: $out"
out=$(trpc rtrs_target_get_exports '{"export_name":"vol"}' || true)
[[ "$out" == *'"allow_any_host": true'* ]] && ok "get_exports: vol open to any host" || fail "get_exports vol: $out"
expect_err rtrs_target_get_exports '{"export_name":"nope"}' export_name
# Removing a host keeps the device it has open (a long run from 127.0.0.2 goes on);
# its next OPEN is refused.
client RTRS_TARGET_DEV=hl RTRS_TARGET_SRC=127.0.0.2 RTRS_TARGET_SESSNAME=hl-long RTRS_TARGET_ROUNDS=40 >"$WORK/hl.out" &
HL=$!
for _ in $(seq 1 100); do
    [[ "$(trpc rtrs_target_get_sessions || true)" == *'"sessname": "hl-long"'* ]] && break
    sleep 0.1
done
sleep 0.5
expect_ok rtrs_target_export_remove_host '{"export_name":"hl","host":"127.0.0.2"}'
expect_err rtrs_target_export_remove_host '{"export_name":"hl","host":"127.0.0.2"}' "'host'" "not in"
wait "$HL" || true
grep -q "verified 256 blocks" "$WORK/hl.out" && ok "open device kept working after remove_host" ||
    fail "remove_host ended the open device: $(cat "$WORK/hl.out")"
expect_client 'name: "hl", errno: EACCES' RTRS_TARGET_DEV=hl RTRS_TARGET_SRC=127.0.0.2 RTRS_TARGET_EXPECT=fail

echo "== save_config -> spdk_tgt --json"
save_config >"$WORK/config.json"
python3 ci/spdk/subsystem_config.py rtrs_target "$WORK/config.json" >"$WORK/rtrs1.json"
echo "  rtrs_target config: $(cat "$WORK/rtrs1.json")"
grep -q '"handshake_timeout_ms": 3000' "$WORK/rtrs1.json" && ok "save_config keeps handshake_timeout_ms" ||
    fail "handshake_timeout_ms missing from the saved config"
grep -q '"allowed_hosts": \["sess:hl-sess", "\[fd00::\]/64"\]' "$WORK/rtrs1.json" && ok "save_config keeps allowed_hosts" ||
    fail "allowed_hosts missing from the saved config"
stop_target
start_target --json "$WORK/config.json"
save_config | python3 ci/spdk/subsystem_config.py rtrs_target >"$WORK/rtrs2.json"
cmp -s "$WORK/rtrs1.json" "$WORK/rtrs2.json" && ok "rtrs_target config identical after replay" ||
    fail "config differs: $(cat "$WORK/rtrs2.json")"
expect_client "verified 256 blocks"
# The replayed host list still admits by session name and refuses the rest.
expect_client "verified 256 blocks" RTRS_TARGET_DEV=hl RTRS_TARGET_SRC=127.0.0.3 RTRS_TARGET_SESSNAME=hl-sess
expect_client 'name: "hl", errno: EACCES' RTRS_TARGET_DEV=hl RTRS_TARGET_SRC=127.0.0.2 RTRS_TARGET_EXPECT=fail
expect_ok rtrs_target_unexport '{"export_name":"hl"}'

echo "== PSK: a listener requiring a key from SPDK's keyring; rtrs-bench --psk-file"
PSK_PORT=$((PORT + 1))
BENCH=$TARGET_DIR/debug/rtrs-bench
(umask 077
 python3 -c 'import os; print(os.urandom(32).hex())' >"$WORK/key0"
 python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())' >"$WORK/key1")
expect_ok keyring_file_add_key "{\"name\":\"key0\",\"path\":\"$WORK/key0\"}"
expect_err rtrs_target_listen "{\"transport\":\"tcp\",\"addr\":\"127.0.0.1\",\"port\":$PSK_PORT,\"psk\":\"nokey\"}" "'psk'" "no key" "keyring"
expect_err rtrs_target_listen "{\"transport\":\"rdma\",\"addr\":\"127.0.0.1\",\"port\":$PSK_PORT,\"psk\":\"key0\"}" "'psk'" "tcp transport only"
expect_ok rtrs_target_listen "{\"transport\":\"tcp\",\"addr\":\"127.0.0.1\",\"port\":$PSK_PORT,\"psk\":\"key0\"}"
# bench ARGS...: rtrs-bench against the PSK listener on core 1; prints "rc=N" and its last line.
bench() {
    local out rc=0
    out=$(timeout 120 "$BENCH" --path "tcp://127.0.0.1:$PSK_PORT" --device vol -m 0x2 --idle adaptive \
        --time 2s --connect-timeout 10s "$@" 2>&1) || rc=$?
    echo "rc=$rc $(echo "$out" | tail -n 1)"
}
out=$(bench --rw randrw --verify --qd 8 --json --psk-file "$WORK/key0")
[[ "$out" == "rc=0 "* && "$out" == *'"errors":0'* && "$out" == *'"verify_mismatches":0'* ]] &&
    ok "the same key (file vs. keyring): verified IO, $(echo "$out" | grep -o '"ios":[0-9]*')" ||
    fail "bench with the listener's key: $out"
for args in "--psk-file $WORK/key1" ""; do
    # shellcheck disable=SC2086 # the key file option, or nothing
    out=$(bench --rw read $args)
    [[ "$out" == "rc=1 "*"authentication failed"* ]] &&
        ok "${args:-no key}: $out" || fail "bench ${args:-without a key}: $out"
done
[ "$(grep -c 'refused .*authentication failed' "$WORK/tgt.log" || true)" -ge 1 ] &&
    ok "the target logged the refusals" || fail "no refusal in the target log"
saved=$(save_config)
grep -q '"psk": "key0"' <<<"$saved" && ok "save_config keeps the key's name" ||
    fail "save_config lacks the listener's psk"
grep -q "$(cut -c1-16 "$WORK/key0")" <<<"$saved" && fail "save_config holds the key itself" ||
    ok "save_config does not hold the key"
expect_ok rtrs_target_stop_listener "{\"transport\":\"tcp\",\"addr\":\"127.0.0.1\",\"port\":$PSK_PORT}"

# io_fails_cleanly NAME LABEL METHOD PARAMS: a client runs IO until it fails; once its
# session is connected, METHOD pulls the device from under it; its IO must fail cleanly.
io_fails_cleanly() {
    local name=$1 label=$2 method=$3 params=$4 pid
    client RTRS_TARGET_ROUNDS=100000 RTRS_TARGET_EXPECT=fail >"$WORK/$name.out" &
    pid=$!
    for _ in $(seq 1 100); do
        [[ "$(trpc rtrs_target_get_sessions || true)" == *'"connected"'* ]] && break
        sleep 0.1
    done
    sleep 0.5
    expect_ok "$method" "$params"
    wait "$pid" || true
    grep -q "refused as expected" "$WORK/$name.out" &&
        ok "client IO failed cleanly: $(head -1 "$WORK/$name.out")" ||
        fail "$label: $(cat "$WORK/$name.out")"
}

echo "== bdev hot removal under IO"
io_fails_cleanly hot "hot removal" bdev_malloc_delete '{"name":"Malloc0"}'
alive
# Into a variable first: `grep -q` stops reading at the first match, and under pipefail
# the writer's broken pipe would turn a match into "no match".
saved=$(save_config)
grep -q rtrs_target_export <<<"$saved" && fail "export still in the config" ||
    ok "export gone from the config"

echo "== stop_listener"
expect_ok rtrs_target_stop_listener "{\"transport\":\"tcp\",\"addr\":\"127.0.0.1\",\"port\":$PORT}"
if python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 2)" 2>/dev/null; then
    fail "port $PORT still accepts connections"
else
    ok "port $PORT closed"
fi
stop_target

echo "== a tiny bdev_io pool: -ENOMEM waits with spdk_bdev_queue_io_wait, data still verified"
start_target --wait-for-rpc
expect_ok bdev_set_options '{"bdev_io_pool_size":8,"bdev_io_cache_size":1}'
expect_ok framework_start_init
trpc framework_wait_init >/dev/null
expect_ok bdev_malloc_create '{"name":"Malloc0","num_blocks":16384,"block_size":4096}'
expect_ok rtrs_target_listen "{\"transport\":\"tcp\",\"addr\":\"127.0.0.1\",\"port\":$PORT}"
expect_ok rtrs_target_export '{"bdev_name":"Malloc0","export_name":"vol"}'
expect_client "verified 256 blocks" RTRS_TARGET_ROUNDS=10
grep -q "bdev_io pool exhausted (-ENOMEM)" "$WORK/tgt.log" && ok "the -ENOMEM path ran" ||
    fail "no -ENOMEM wait seen in the target log"

echo "== unexport while the client has the device open"
io_fails_cleanly unexp "unexport under IO" rtrs_target_unexport '{"export_name":"vol"}'
alive
expect_ok bdev_malloc_delete '{"name":"Malloc0"}'
stop_target

echo "== a client without a key: session slots, connections, joins, refusals in the log"
start_target
# Small pools: ten (the cap and the evicted still closing) fit in this -s 1024 instance.
expect_ok rtrs_target_set_options '{"queue_depth":16,"max_sessions":6,"open_grace_ms":3000,"max_connections":64}'
expect_ok bdev_malloc_create '{"name":"Malloc1","num_blocks":16384,"block_size":4096}'
expect_ok bdev_malloc_create '{"name":"Malloc2","num_blocks":4096,"block_size":4096}'
expect_ok rtrs_target_listen "{\"transport\":\"tcp\",\"addr\":\"127.0.0.1\",\"port\":$PORT}"
expect_ok rtrs_target_export '{"bdev_name":"Malloc1","export_name":"vol","allowed_hosts":["127.0.0.1"]}'
expect_ok rtrs_target_export '{"bdev_name":"Malloc2","export_name":"pub","access":"ro"}'
saved=$(save_config)
grep -q '"open_grace_ms": 3000' <<<"$saved" && grep -q '"max_connections": 64' <<<"$saved" &&
    ok "save_config keeps open_grace_ms and max_connections" || fail "save_config lacks the new options"
# The log prints 5 refusals a second and counts the rest: each attack below starts in a
# second of its own, so that its few refusals are printed, not only counted.
# 6 sessions at most: the refused host (127.0.0.2 .. 127.0.0.7) fills them, and gives way.
attack slots_against_external_target "slots: allowed client verified" RTRS_TARGET_MAX_SESSIONS=6
sleep 1.5
attack join_against_external_target "join: 2 joins from a refused address refused"
sleep 1.5
# 64 connections, 32 per source: two sessions of 16 from 127.0.0.2, then EUSERS.
attack connections_against_external_target "connections: a 1000-connection path refused" \
    RTRS_TARGET_DEV=pub RTRS_TARGET_CONNS_PER_SOURCE=32
alive
in_log "OPENs the host list refuses" "open refused" "access denied"
in_log "sessions giving way" "closing" "gave way" "not in use"
in_log "a join from a refused address" "refusing connection from 127.0.0.3" "path joining" "EACCES"
in_log "a path asking for too many connections" "refusing connection" "max_path_connections" "EINVAL"
in_log "an address over its share of connections" "refusing connection" "max_connections_per_source" "EUSERS"
in_log "the isolation attacks' remote access errors" "closing" "remote access error" "under rkey"
expect_ok bdev_malloc_delete '{"name":"Malloc1"}'
expect_ok bdev_malloc_delete '{"name":"Malloc2"}'
stop_target

if [ "$FAILS" -ne 0 ]; then
    echo "spdk target tests: $OKS passed, $FAILS failed (log: kept at $WORK.log)"
    cp "$WORK/tgt.log" "$WORK.log" 2>/dev/null || true
    exit 1
fi
echo "spdk target tests: $OKS passed, 0 failed"
