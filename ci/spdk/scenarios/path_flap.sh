# shellcheck shell=bash
# Scenario path_flap, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh path_flap).
#
# Two paths under bdevperf verify; the operating system breaks them alternately, on this
# scenario's ports only: every socket of a path killed with ss -K (the client's side or
# the server's), or the path made silent by an nft drop rule (a table of its own, deleted
# afterwards, also on a time-out) until the client's heartbeat (2 s x 4: longer than the
# few seconds a process on a crowded machine may wait for a CPU) declares it dead. A path is broken only once it carries IO again, so IO always has a path to fail
# over to. Zero IO errors, and each path reconnected exactly as often as it was broken:
# the path not broken was never closed.

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
	python3 "$REPO/ci/spdk/sock_destroy_works.py" || { echo "ss -K does not close sockets (no SOCK_DESTROY?)"; return 1; }
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
	python3 "$REPO/ci/spdk/flap_reconnects.py" "$APP_DIR/flap-sess.json" "${ports[0]}" "${breaks[0]}" "${ports[1]}" "${breaks[1]}"
}
