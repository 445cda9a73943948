#!/bin/bash
# The interop matrix, run inside the guest of ci/kernel-vm.sh (Debian's kernel, Soft-RoCE on
# two dummy interfaces, the kernel's RTRS/RNBD modules) with the project's binaries from the
# host. One line per check in $OUT/results.txt: "PASS name: detail" or "FAIL name: detail",
# then "DONE". Logs as $OUT/<name>.*.log, the kernel log of a group as $OUT/<group>.dmesg.
# Every wait is bounded and waits for a state (wait_for), never for a fixed time; nothing
# here asserts on speed.
set -u
. "$RTRS_KVM_WORK/guest.env"
R=$OUT/results.txt
: >"$R"
exec > >(tee "$OUT/guest.log") 2>&1

IP1=10.99.0.1 # dummy0, rxe0
IP2=10.99.0.2
IP3=10.99.1.1 # dummy1, rxe1 (the devices group)
IP4=10.99.1.2
TGT=$BIN/rtrs-target
BENCH=$BIN/rtrs-bench
RNBD_CTL=/sys/devices/virtual/rnbd-client/ctl/map_device
MP=(modprobe -d "$MODROOT")
TMPD=$(mktemp -d)

log() { echo "[guest $(date +%T)] $*"; }
pass() { echo "PASS $1: ${2:-}" >>"$R"; log "PASS $1 ${2:-}"; }
fail() { echo "FAIL $1: ${2:-}" >>"$R"; log "FAIL $1 ${2:-}"; }
check() { # NAME RC DETAIL
	if [[ $2 == 0 ]]; then pass "$1" "$3"; else fail "$1" "$3"; fi
}
want() { [[ $ONLY == all || ",$ONLY," == *",$1,"* ]]; }
wait_for() { # [-p PID] SECONDS CMD...: runs CMD every 0.2 s until it succeeds (0); 1 once
	# SECONDS have passed, 2 once PID (the process the state belongs to) has exited
	local pid="" end
	if [[ $1 == -p ]]; then
		pid=$2
		shift 2
	fi
	end=$((SECONDS + $1))
	shift
	until "$@"; do
		[[ -z $pid ]] || kill -0 "$pid" 2>/dev/null || return 2
		((SECONDS < end)) || return 1
		sleep 0.2
	done
}
finish() {
	echo DONE >>"$R"
	sync
	exit 0
}

# The kernel asks for modules (crc32 for rxe, ...) through this, so it must know the tree.
printf '#!/bin/sh\nexec /sbin/modprobe -d %s "$@"\n' "$MODROOT" >/run/modprobe
chmod +x /run/modprobe
echo /run/modprobe >/proc/sys/kernel/modprobe

# ---- set-up: rxe0 on dummy0 ($IP1, $IP2) and rxe1 on dummy1 ($IP3, $IP4) -----------------
log "kernel $(uname -r); binaries $BIN; groups $ONLY"
for m in crc32_generic rdma_rxe ib_uverbs rdma_ucm "dummy numdummies=0" loop; do
	"${MP[@]}" $m || log "modprobe $m failed"
done
port_active() { ibv_devinfo -d "$1" 2>/dev/null | grep -q PORT_ACTIVE; }
ip link set lo up
: >"$OUT/setup.log"
for d in "0 $IP1 $IP2" "1 $IP3 $IP4"; do
	set -- $d
	ip link add dummy$1 type dummy &&
		ip addr add $2/24 dev dummy$1 &&
		ip addr add $3/24 dev dummy$1 &&
		ip link set dummy$1 up &&
		rdma link add rxe$1 type rxe netdev dummy$1 >>"$OUT/setup.log" 2>&1
done
set --
if ! wait_for 10 port_active rxe0 || ! wait_for 10 port_active rxe1; then
	ibv_devinfo >>"$OUT/setup.log" 2>&1
	fail setup "rxe0 on dummy0 and rxe1 on dummy1 did not both come up (see setup.log)"
	finish
fi
pass setup "rxe0 on dummy0 ($IP1, $IP2), rxe1 on dummy1 ($IP3, $IP4)"
dmesg -C

# A 256 MiB loop device over tmpfs for the kernel's server: it takes discards and
# write-zeroes, as a ram disk does not.
truncate -s 256M "$TMPD/disk.img"
LOOPDEV=$(losetup -f --show "$TMPD/disk.img")
LOOPNAME=${LOOPDEV#/dev/}

# Kernel messages of a group, and whether our exits left the kernel complaining.
group_dmesg() { dmesg -c >"$OUT/$1.dmesg"; }
# kernel_faults DMESG: which faults of the kernel's log are the one it is known to have
# (ci/kernel-vm/faults.sh).
. "$REPO/ci/kernel-vm/faults.sh"
clean() { # GROUP LOGS...: no kernel warning, no verbs teardown failure in our logs
	local g=$1 why="" known=""
	shift
	group_dmesg "$g"
	local faults
	if ! faults=$(kernel_faults "$OUT/$g.dmesg"); then
		why="kernel: its log could not be read ($g.dmesg)"
	elif grep -q '^unknown' <<<"$faults"; then
		why="kernel: $(grep -m1 '^unknown' <<<"$faults" | cut -f2-)"
	elif [[ -n $faults ]]; then
		known=" but the kernel's own known rxe fault ($(grep -c '^known' <<<"$faults") in all, docs/INTEROP.md: $(head -n1 <<<"$faults" | cut -f2-))"
	fi
	local f
	for f in "$@"; do
		[[ -f $f ]] || continue
		if grep -qE 'ibv_[a-z_]+ failed|leaking' "$f"; then
			why="$why $(basename "$f"): $(grep -m1 -E 'ibv_[a-z_]+ failed|leaking' "$f")"
		fi
	done
	if [[ -z $why ]]; then
		pass "$g.clean" "no kernel warning$known, no verbs teardown failure"
	else
		fail "$g.clean" "$why"
	fi
}

# ---- our target and bench ----------------------------------------------------------------
TPID=""
start_target() { # NAME ARGS...: rtrs-target on core 0, waits for "target ready"
	local name=$1
	shift
	"$TGT" "$@" -m 0x1 --idle adaptive -v >"$OUT/$name.target.log" 2>&1 &
	TPID=$!
	wait_for -p $TPID 60 grep -q "target ready" "$OUT/$name.target.log"
}
stop_target() { # NAME: SIGINT; a target that does not exit within 20 s fails NAME
	[[ -n $TPID ]] || return 0
	kill -INT $TPID 2>/dev/null
	local rc
	if ! wait_for 20 gone $TPID; then
		kill -KILL $TPID
		wait $TPID 2>/dev/null
		fail "$1" "rtrs-target still running 20 s after SIGINT"
	else
		wait $TPID
		rc=$?
		check "$1" $rc "rtrs-target exited with $rc on SIGINT"
	fi
	TPID=""
}
gone() { ! kill -0 "$1" 2>/dev/null; } # PID
drop_target() { # a target that did not start: reaped (killed if it still runs), no row
	[[ -n $TPID ]] || return 0
	kill -KILL $TPID 2>/dev/null
	wait $TPID 2>/dev/null
	TPID=""
}
bench() { # NAME ARGS...: rtrs-bench on core 1; its status
	local name=$1
	shift
	timeout 240 "$BENCH" "$@" -m 0x2 --idle adaptive >"$OUT/$name.log" 2>&1
}
summary() { grep -E 'IOPS|errors' "$1" 2>/dev/null | tr -s ' ' | tr '\n' ' ' | cut -c1-200; }
bench_row() { # NAME ARGS...
	local name=$1
	shift
	bench "$name" "$@"
	check "$name" $? "$(summary "$OUT/$name.log")"
}
# The --json report in a bench log (its last line that is a JSON object; -v puts log lines
# beside it), checked as MODE says; prints the figures, fails when the check does not hold.
#   mp:   "reconnects errors mismatches" summed over the paths (the caller judges)
#   devs: two paths, one on rxe0 and one on rxe1, each connected at the end and each
#         having carried IO; the timed run did IO; errors and mismatches 0; with the
#         link fault (LINK_FAULT=1) the rxe1 path also reconnected at least once, and the
#         rxe0 path never failed (unless the bench's or its target's log says librdmacm
#         gave rxe0's connections another context, which breaks them by design:
#         docs/ARCHITECTURE.md, "Devices that come and go")
cat >"$TMPD/bench_json.py" <<'EOF'
import json, sys
mode, log = sys.argv[1], sys.argv[2]
d = None
for line in open(log, errors="replace"):
    if line.startswith("{"):
        try:
            d = json.loads(line)
        except ValueError:
            pass
if d is None:
    print("no JSON report in " + log.rsplit("/", 1)[-1])
    sys.exit(1)
paths = (d.get("client_stats") or {}).get("paths") or []
if mode == "mp":
    print(sum(p["reconnects"]["successful"] for p in paths), d["errors"], d["verify_mismatches"])
    sys.exit(0)
why = []
if d["errors"] != 0 or d["verify_mismatches"] != 0:
    why.append("IO failed")
if d["ios"] == 0:
    why.append("the timed run did no IO")
hcas = sorted(str(p.get("hca_name")) for p in paths)
if hcas != ["rxe0", "rxe1"]:
    why.append("paths' hca_name %s, not rxe0 and rxe1" % hcas)
for p in paths:
    if p["state"] != "connected":
        why.append("the %s path is %s at the end" % (p.get("hca_name"), p["state"]))
    if p["rdma"]["read_cnt"] + p["rdma"]["write_cnt"] == 0:
        why.append("the %s path carried no IO" % p.get("hca_name"))
r1 = [p for p in paths if p.get("hca_name") == "rxe1"]
if sys.argv[3:] == ["fault"] and len(r1) == 1 and r1[0]["reconnects"]["successful"] < 1:
    why.append("the rxe1 path did not reconnect")
def stale_context():
    for f in (log, log[:-len(".log")] + ".target.log"):
        try:
            if "librdmacm gave connections on it another context" in open(f, errors="replace").read():
                return True
        except OSError:
            pass
    return False
r0 = [p for p in paths if p.get("hca_name") == "rxe0"]
if (sys.argv[3:] == ["fault"] and len(r0) == 1
        and r0[0]["reconnects"]["successful"] + r0[0]["reconnects"]["failed"] > 0 and not stale_context()):
    why.append("the rxe0 path failed though only rxe1 was removed")
desc = "; ".join("%s %s:%s %s, reconnects %s/%s" % (p.get("path"), p.get("hca_name"), p.get("hca_port"),
                 p.get("state"), p["reconnects"]["successful"], p["reconnects"]["failed"]) for p in paths)
print("%s%s IOPS, %s MiB/s, errors %s, mismatches %s; paths: %s" % (
    "FAILED (" + ", ".join(why) + "): " if why else "", d["iops"], d["mib_s"], d["errors"],
    d["verify_mismatches"], desc or "none"))
sys.exit(1 if why else 0)
EOF
bench_json() { python3 "$TMPD/bench_json.py" "$@" 2>&1 | tail -n 1 | cut -c1-400; return "${PIPESTATUS[0]}"; }

# ---- the kernel's client -------------------------------------------------------------------
rnbd_new() { # BEFORE: the first /dev/rnbd* not in BEFORE, when its node exists
	local p
	p=$(comm -13 <(echo "$1") <(ls /sys/block | grep '^rnbd' | sort) | head -n 1)
	[[ -n $p && -b /dev/$p ]] && echo "/dev/$p"
}
map() { # SESSNAME DEVICE PATH...: maps /dev/rnbd*; echoes the device. A PATH is DST or
	# SRC@DST (IPv4 addresses; the kernel wants "ip:SRC@ip:DST")
	local sess=$1 dev=$2 paths="" p before
	shift 2
	for p in "$@"; do
		case $p in
		*@*) paths="$paths path=ip:${p%@*}@ip:${p#*@}" ;;
		*) paths="$paths path=ip:$p" ;;
		esac
	done
	before=$(ls /sys/block | grep '^rnbd' | sort)
	echo "sessname=$sess$paths device_path=$dev" >$RNBD_CTL || return 1
	wait_for 20 rnbd_new "$before" >/dev/null && rnbd_new "$before"
}
unmap() { # /dev/rnbdN
	local n=${1#/dev/}
	echo normal >"/sys/block/$n/rnbd/unmap_device" || return 1
	wait_for 10 not_blk "$1"
}
not_blk() { [[ ! -b $1 ]]; }
dd_check() { # DEV NAME: 16 MiB in 1 MiB direct writes read back, then 4 KiB at odd offsets
	local dev=$1 name=$2
	dd if=/dev/urandom of="$TMPD/pat" bs=1M count=16 status=none
	dd if="$TMPD/pat" of="$dev" bs=1M oflag=direct status=none 2>>"$OUT/$name.log" &&
		dd if="$dev" of="$TMPD/back" bs=1M count=16 iflag=direct status=none 2>>"$OUT/$name.log" &&
		cmp "$TMPD/pat" "$TMPD/back" >>"$OUT/$name.log" 2>&1 &&
		dd if="$TMPD/pat" of="$dev" bs=4k seek=12345 count=100 oflag=direct status=none 2>>"$OUT/$name.log" &&
		dd if="$dev" of="$TMPD/back2" bs=12k skip=4115 count=33 iflag=direct status=none 2>>"$OUT/$name.log" &&
		cmp <(head -c $((99 * 4096)) "$TMPD/pat") <(head -c $((99 * 4096)) "$TMPD/back2") >>"$OUT/$name.log" 2>&1
}
fio_verify() { # NAME DEV BS RW DEPTH SIZE
	timeout 300 fio --name="$1" --filename="$2" --direct=1 --ioengine=libaio --bs="$3" --rw="$4" \
		--iodepth="$5" --size="$6" --verify=crc32c --do_verify=1 --verify_fatal=1 \
		--randrepeat=0 --group_reporting >"$OUT/$1.log" 2>&1 &&
		! grep -qE 'verify: bad|err= *[1-9]' "$OUT/$1.log"
}
fio_row() { # NAME DEV BS RW DEPTH SIZE
	fio_verify "$@"
	check "$1" $? "$(grep -E '^ +(read|write):' "$OUT/$1.log" | tr -s ' ' | tr '\n' ';' | cut -c1-160)"
}
path_state() { cat "$1/state" 2>/dev/null; }
path_is() { [[ $(path_state "$1") == "$2" ]]; } # PATHDIR STATE
# Writes a block device (NAME, rnbd0) has completed (/sys/block/NAME/stat's fifth field),
# and whether that grew past a count: IO is running on it.
blk_writes() { awk '{print $5}' "/sys/block/$1/stat" 2>/dev/null; }
blk_written() { (($(blk_writes "$1") > $2)); } # NAME COUNT
# The kernel server's side (rtrs-srv-sysfs.c): a session's path directory exists while the
# path is connected; its stats/rdma reads "read_cnt read_bytes write_cnt write_bytes".
srv_paths() { ls -d "/sys/class/rtrs-server/$1/paths/"* 2>/dev/null; } # SESSNAME
srv_hcas() { # SESSNAME: the hca_name of every connected path, sorted, on one line
	local p
	for p in $(srv_paths "$1"); do cat "$p/hca_name" 2>/dev/null; done | sort | tr '\n' ' ' | sed 's/ $//'
}
srv_io_running() { # SESSNAME PATHS BYTES: PATHS paths connected, each has carried IO, and
	# all of them together were written more than BYTES (past a prefill of BYTES)
	local p n=0 written=0 rc rb wc wb
	for p in $(srv_paths "$1"); do
		read -r rc rb wc wb 2>/dev/null <"$p/stats/rdma" || return 1
		((rc + wc > 0)) || return 1
		written=$((written + wb))
		n=$((n + 1))
	done
	((n == $2 && written > $3))
}
srv_written_now() { # SESSNAME: bytes written over the session's paths now
	local p total=0 rc rb wc wb
	for p in $(srv_paths "$1"); do
		read -r rc rb wc wb 2>/dev/null <"$p/stats/rdma" && total=$((total + wb))
	done
	echo "$total"
}
paths_up() { grep -c "path connected${2:+ on $2}" "$1"; } # LOG [DEVICE]: a bench's (-vv) so far
paths_up_beyond() { (($(paths_up "$1" "${3:-}") > $2)); } # LOG N [DEVICE]
srv_written() { (($(srv_written_now "$1") > $2)); } # SESSNAME BYTES: written more than BYTES
no_server_session() { [[ -z $(ls /sys/class/rtrs-server 2>/dev/null) ]]; }
rmmod_server() { # LOG: once the kernel server has no session left (bounded), unloads it
	if ! wait_for 30 no_server_session; then
		# rmmod would block in the kernel for as long as the session stays: the module
		# stays loaded, and the row that left the session says so.
		local left
		left=$(ls /sys/class/rtrs-server | tr '\n' ' ')
		echo "sessions left after 30 s: $left" >>"$1"
		fail "$(basename "$1" .log).server-session" "the kernel's rnbd-server kept session(s) $left 30 s after our client had gone; not unloaded"
		return 1
	fi
	rmmod rnbd_server rtrs_server >>"$1" 2>&1
}
srv_on_both() { # SESSNAME: a path on each device; SRV_SEEN: the devices last seen while
	# the session had a path
	local h
	h=$(srv_hcas "$1")
	[[ -n $h ]] && SRV_SEEN=$h
	[[ $h == "rxe0 rxe1" ]]
}
srv_both_io() { srv_on_both "$1" && srv_written "$1" 0; } # SESSNAME: ... and IO runs
clt_hcas() { # SESSNAME: the hca_name of every path of the kernel client's session, sorted
	local p
	for p in /sys/class/rtrs-client/$1/paths/*; do cat "$p/hca_name" 2>/dev/null; done | sort | tr '\n' ' ' | sed 's/ $//'
}
server_cut() { # SESSNAME LOG: the kernel server drops the session's first path (sysfs
	# "disconnect"); echoes the path's name, or nothing when there was none to cut
	local p
	p=$(ls -d "/sys/class/rtrs-server/$1/paths/"* 2>/dev/null | head -n 1)
	[[ -n $p ]] && echo 1 >"$p/disconnect" 2>>"$2" || return 1
	log "server disconnected $(basename "$p")" >&2 # stdout is the answer
	basename "$p"
}
all_connected() { # SESSNAME: every path of the kernel client's session connected
	local p
	for p in /sys/class/rtrs-client/$1/paths/*; do
		path_is "$p" connected || return 1
	done
}
wait_connected() { wait_for "$2" all_connected "$1"; } # SESSNAME SECONDS

# ---- groups ---------------------------------------------------------------------------------
if want verbs; then
	log "== verbs: the conformance suite and the hardware tests on rxe0"
	# hw_device_removed_and_taken_up_again deletes rxe1 and adds it again (RTRS_TEST_REMOVE).
	RTRS_TEST_DEVICE=rxe0 RTRS_TEST_ADDR=$IP1 RTRS_TEST_ADDR2=$IP3 RTRS_TEST_REMOVE=rxe1:dummy1 \
		timeout 900 "$VERBS_TESTS" --ignored --test-threads=1 >"$OUT/verbs.log" 2>&1
	rc=$?
	rxe1_back verbs
	n=0
	while read -r _ t _ verdict; do
		n=$((n + 1))
		if [[ $verdict == ok ]]; then
			pass "verbs.$t"
		else
			# The test's output runs from its header to the next one (its panic message
			# follows a blank line).
			awk -v h="---- $t stdout ----" '$0 == h { on = 1 } on && $0 != h && /^(---- |failures:$)/ { exit } on' \
				"$OUT/verbs.log" >"$OUT/verbs.$t.log"
			fail "verbs.$t" "see verbs.$t.log"
		fi
	done < <(grep -E '^test .* \.\.\. (ok|FAILED)$' "$OUT/verbs.log")
	((n > 0)) || fail verbs "the test binary ran no test (rc $rc)"
	((rc == 0)) || grep -q FAILED "$OUT/verbs.log" || fail verbs "the test binary ended with rc $rc"
	clean verbs "$OUT/verbs.log"
fi

if want loop; then
	log "== loop: rtrs-bench <-> rtrs-target over rdma, defaults (always_invalidate)"
	if start_target loop --listen rdma://$IP1:1235 --export vol=ram:256M; then
		pass loop.listen "rtrs-target listens on rdma://$IP1:1235"
		P=rdma://$IP1:1235
		bench_row loop.randrw-4k --path $P --device vol --rw randrw --bs 4K --qd 16 --time 4s --verify --size 8M
		bench_row loop.randrw-64k --path $P --device vol --rw randrw --bs 64K --qd 8 --time 4s --verify --size 32M
		bench_row loop.zero-native --path $P --device vol --rw zero --write-zeroes native --bs 64K --qd 4 --time 2s --verify --size 16M
		bench_row loop.trim --path $P --device vol --rw trim --bs 64K --qd 4 --time 2s --verify --size 16M
		bench_row loop.flush --path $P --device vol --rw flush --qd 2 --time 2s
		stop_target loop.target-exit
	else
		fail loop.listen "rtrs-target did not start: $(tail -n 2 "$OUT/loop.target.log" | tr '\n' ' ')"
		stop_target loop.target-exit
	fi
	clean loop "$OUT"/loop.*.log
fi

if want to-kernel; then
	log "== to-kernel: rtrs-bench -> the kernel's rnbd-server ($LOOPDEV)"
	if "${MP[@]}" rnbd_server dev_search_path=/dev; then
		P=rdma://$IP1
		# Verified regions sized so that the prefill and read-back (unmeasured, at the
		# row's block size) take about as long as the measured run under TCG.
		D=(--path $P --device "$LOOPNAME")
		bench_row to-kernel.read "${D[@]}" --size 8M --rw read --bs 4K --qd 16 --time 3s --verify
		bench_row to-kernel.write "${D[@]}" --size 8M --rw write --bs 4K --qd 16 --time 3s --verify
		bench_row to-kernel.randrw-4k "${D[@]}" --size 8M --rw randrw --bs 4K --qd 16 --time 4s --verify
		bench_row to-kernel.randrw-64k "${D[@]}" --size 32M --rw randrw --bs 64K --qd 8 --time 4s --verify
		bench_row to-kernel.flush "${D[@]}" --size 8M --rw flush --qd 2 --time 2s
		bench_row to-kernel.trim "${D[@]}" --size 8M --rw trim --bs 64K --qd 4 --time 2s --verify
		bench_row to-kernel.zero-emulate "${D[@]}" --size 8M --rw zero --write-zeroes emulate --bs 64K --qd 4 --time 2s --verify
		rmmod_server "$OUT/to-kernel.rmmod.log"
		check to-kernel.sessions-closed $? "the kernel's server unloads (every session of ours gone)"
	else
		fail to-kernel "rnbd_server did not load"
	fi
	clean to-kernel "$OUT"/to-kernel.*.log
fi

if want from-kernel; then
	log "== from-kernel: the kernel's rnbd-client -> rtrs-target, defaults"
	"${MP[@]}" rnbd_client || fail from-kernel "rnbd_client did not load"
	if start_target from-kernel --listen rdma://$IP1 --export vol=ram:256M; then
		if DEV=$(map k1 vol $IP1); then
			pass from-kernel.map "$DEV: $(blockdev --getsize64 "$DEV") bytes, max_sectors_kb $(cat /sys/block/${DEV#/dev/}/queue/max_sectors_kb)"
			dd_check "$DEV" from-kernel.dd
			check from-kernel.dd $? "16 MiB in 1 MiB O_DIRECT writes and 4 KiB at odd offsets read back identical"
			fio_row from-kernel.fio-4k "$DEV" 4k randwrite 16 16M
			fio_row from-kernel.fio-64k "$DEV" 64k randrw 8 32M
			fio_row from-kernel.fio-124k "$DEV" 124k write 4 16M
			# The target restarts under the mapped device: the client reconnects. Its own
			# timer waits 30 s (rnbd-client's fixed reconnect delay); the path's
			# `reconnect` attribute asks for the attempt at once.
			stop_target from-kernel.target-exit
			start_target from-kernel2 --listen rdma://$IP1 --export vol=ram:256M
			for p in /sys/class/rtrs-client/k1/paths/*; do
				echo 1 >"$p/reconnect" 2>>"$OUT/from-kernel.reconnect.log"
			done
			if wait_connected k1 90 && dd_check "$DEV" from-kernel.reconnect; then
				pass from-kernel.reconnect "the mapped device works again after rtrs-target restarted"
			else
				fail from-kernel.reconnect "paths: $(cat /sys/class/rtrs-client/k1/paths/*/state 2>/dev/null | tr '\n' ' ')"
			fi
			unmap "$DEV"
			check from-kernel.unmap $? "unmap_device"
		else
			fail from-kernel.map "no /dev/rnbd* after map_device"
		fi
		# Re-map after another restart, from a fresh session.
		stop_target from-kernel2.target-exit
		start_target from-kernel3 --listen rdma://$IP1 --export vol=ram:256M
		if DEV=$(map k2 vol $IP1) && dd_check "$DEV" from-kernel.remap && unmap "$DEV"; then
			pass from-kernel.remap-after-restart "mapped, written, read back and unmapped against a restarted rtrs-target"
		else
			fail from-kernel.remap-after-restart "see from-kernel.remap.log"
		fi
		stop_target from-kernel3.target-exit
		# The target closes the kernel client's mapping (`rtrs-target ctl force-close`, the
		# kernel server's force_close): the mapped device's IO fails, the session stays,
		# the device unmaps, and a new map of the export works again.
		CTL=$TMPD/ctl.sock
		start_target from-kernel4 --listen rdma://$IP1 --export vol=ram:256M --control-socket "$CTL"
		if DEV=$(map k3 vol $IP1) && dd_check "$DEV" from-kernel.force-close; then
			L=$OUT/from-kernel.force-close.log
			"$TGT" ctl --socket "$CTL" openers >>"$L" 2>&1
			grep -q '"k3"' "$L"
			listed=$?
			"$TGT" ctl --socket "$CTL" force-close vol k3 >>"$L" 2>&1
			closed=$?
			# O_DIRECT, so the read reaches the target rather than the page cache.
			timeout 120 dd if="$DEV" of=/dev/null bs=4k count=1 iflag=direct >>"$L" 2>&1
			io=$?
			unmap "$DEV"
			unmapped=$?
			DEV2=$(map k4 vol $IP1) && dd_check "$DEV2" from-kernel.force-close && unmap "$DEV2"
			again=$?
			check from-kernel.force-close $((listed + closed + (io == 0) + unmapped + again)) \
				"openers listed the kernel's session: $((listed == 0)); force-close exit $closed; IO after it failed: $((io != 0)) (dd exit $io); unmapped: $((unmapped == 0)); mapped again and verified: $((again == 0))"
		else
			fail from-kernel.force-close "map or the first IO failed: see from-kernel.force-close.log"
		fi
		stop_target from-kernel4.target-exit
	else
		fail from-kernel.map "rtrs-target did not start: $(tail -n 2 "$OUT/from-kernel.target.log" | tr '\n' ' ')"
	fi
	rmmod rnbd_client rtrs_client >"$OUT/from-kernel.rmmod.log" 2>&1
	clean from-kernel "$OUT"/from-kernel*.log
fi

if want multipath; then
	log "== multipath: two paths each way, one broken and restored under verify"
	if "${MP[@]}" rnbd_server dev_search_path=/dev; then
		# The run is long enough for the cut path to come back even after the kernel's own
		# 50 s wait (docs/INTEROP.md, "A kernel fault the checks know") and is ended once
		# it has (SIGINT: the bench reports what it measured and exits 130).
		bench mp.to-kernel --path rdma://$IP1 --path rdma://$IP2 --sessname mp1 --device "$LOOPNAME" \
			--size 8M --rw randrw --bs 4K --qd 16 --time 150s --verify --json --reconnect-delay 1s -vv &
		BP=$!
		# The cut waits for both paths connected on the server, IO on each, and the 8 MiB
		# prefill written (the measured run has begun).
		P1=""
		back=""
		wait_for -p $BP 120 srv_io_running mp1 2 $((8 << 20))
		up=$?
		if ((up == 0)); then
			ups=$(paths_up "$OUT/mp.to-kernel.log")
			P1=$(server_cut mp1 "$OUT/mp.to-kernel.sysfs.log")
			# Back: one more "path connected" in the bench's log, then 4 MiB more written
			# over two paths that each carry IO (the new path's counters start at 0).
			if [[ -n $P1 ]] && wait_for -p $BP 120 paths_up_beyond "$OUT/mp.to-kernel.log" "$ups"; then
				back="reconnected"
				w=$(srv_written_now mp1)
				wait_for -p $BP 60 srv_io_running mp1 2 $((w + (4 << 20))) && back="$back, IO on both paths"
				pkill -INT -P $BP # the bench's timeout, which hands the signal on
			fi
		fi
		wait $BP
		rc=$?
		recon=$(bench_json mp "$OUT/mp.to-kernel.log")
		read -r n_recon n_err n_mis <<<"${recon:-x x x}"
		if [[ ($rc == 0 || $rc == 130) && -n $P1 && $back == "reconnected, IO on both paths" &&
			$n_recon -ge 1 && $n_err == 0 && $n_mis == 0 ]] 2>/dev/null; then
			pass mp.to-kernel "2 paths, one disconnected by the kernel's server and reconnected; reconnects, errors, mismatches: $recon"
		else
			case $up in
			0) why="path ${P1:-cut failed}${P1:+ ${back:-not reconnected within 120 s}}" ;;
			1) why="no path cut: the server's session did not have 2 paths with IO running within 120 s (paths: $(srv_hcas mp1))" ;;
			*) why="no path cut: the bench ended before 2 paths ran IO" ;;
			esac
			fail mp.to-kernel "rc $rc, $why, reconnects/errors/mismatches: ${recon:-?}"
		fi
		rmmod_server "$OUT/mp.to-kernel.sysfs.log"
	else
		fail mp.to-kernel "rnbd_server did not load"
	fi
	"${MP[@]}" rnbd_client
	if start_target mp.from-kernel --listen rdma://$IP1 --listen rdma://$IP2 --export vol=ram:256M &&
		DEV=$(map mp2 vol $IP1 $IP2); then
		# Once fio's writes complete, one path is disconnected; once more writes complete
		# over the other, it is reconnected. Each step waits for its state (bounded).
		N=${DEV#/dev/}
		W=$(blk_writes "$N")
		fio_verify mp.from-kernel "$DEV" 4k randwrite 16 48M &
		FP=$!
		P1=$(ls -d /sys/class/rtrs-client/mp2/paths/* | head -n 1)
		steps=""
		if wait_for -p $FP 120 blk_written "$N" "$W"; then
			echo 1 >"$P1/disconnect"
			wait_for 30 path_is "$P1" disconnected && steps="disconnected"
			log "client disconnected $(basename "$P1"): $(path_state "$P1")"
			W=$(blk_writes "$N")
			wait_for -p $FP 60 blk_written "$N" "$W" && steps="$steps, IO on the other path"
			echo 1 >"$P1/reconnect"
			wait_for 60 path_is "$P1" connected && steps="$steps, reconnected"
			log "client reconnected $(basename "$P1"): $(path_state "$P1")"
		fi
		wait $FP
		rc=$?
		wait_connected mp2 30 || rc=$((rc + 1))
		[[ $steps == "disconnected, IO on the other path, reconnected" ]] || rc=$((rc + 1))
		check mp.from-kernel $rc "fio verify over 2 paths with one disconnected and reconnected (${steps:-fio wrote nothing within 120 s}): $(grep -E '^ +(read|write):' "$OUT/mp.from-kernel.log" | tr -s ' ' | tr '\n' ';' | cut -c1-120)"
		unmap "$DEV"
	else
		fail mp.from-kernel "rtrs-target or map_device failed"
	fi
	stop_target mp.target-exit
	rmmod rnbd_client rtrs_client 2>/dev/null
	clean multipath "$OUT"/mp.*.log
fi

# ---- limits: what differs between kernel series ---------------------------------------------
# Op 5 (a WRITE_ZEROES from Linux 6.8; unused and ignored before), the queue limits the
# kernel's client checks at map time (6.9 and later refuse limits they find inconsistent
# where earlier series clamped them), flush and FUA reaching the backing device, and
# requests larger than one RTRS chunk, each way, against every kind of export.
kernel_at_least() { printf '%s\n%s\n' "$1" "$(uname -r | cut -d- -f1)" | sort -V -C; } # SERIES
queue_limits() { # /dev/rnbdN: the limits the kernel's client set at map, on one line
	local n=${1#/dev/} a out=""
	for a in logical_block_size physical_block_size max_hw_sectors_kb max_segments \
		discard_max_bytes write_zeroes_max_bytes write_cache fua; do
		out="$out $a=$(cat "/sys/block/$n/queue/$a" 2>/dev/null | tr ' ' _)"
	done
	echo "${out# } ro=$(cat "/sys/block/$n/ro")"
}
qlimit() { cat "/sys/block/${1#/dev/}/queue/$2" 2>/dev/null; } # /dev/rnbdN ATTR
blk_flushes() { awk '{print $16}' "/sys/block/$1/stat"; } # NAME: flushes it completed
map_ro() { # SESSNAME DEVICE DST: maps DEVICE read-only; echoes the device
	local before
	before=$(ls /sys/block | grep '^rnbd' | sort)
	echo "sessname=$1 path=ip:$3 device_path=$2 access_mode=ro" >$RNBD_CTL || return 1
	wait_for 20 rnbd_new "$before" >/dev/null && rnbd_new "$before"
}
# Write-zeroes as the kernel's client sends it for `blkdiscard -z` (op 5 from a 6.8+
# client, zero-filled writes from an older one): 4 MiB of random data read back first, the
# middle 2 MiB zeroed, then the zeroed range reads as zeros and the rest as the data.
zeroes_check() { # DEV NAME
	local dev=$1 l=$OUT/$2.log
	dd if=/dev/urandom of="$TMPD/zpat" bs=1M count=4 status=none
	dd if="$TMPD/zpat" of="$dev" bs=1M oflag=direct status=none 2>>"$l" &&
		dd if="$dev" of="$TMPD/zback" bs=1M count=4 iflag=direct status=none 2>>"$l" &&
		cmp "$TMPD/zpat" "$TMPD/zback" >>"$l" 2>&1 &&
		blkdiscard -z -o $((1 << 20)) -l $((2 << 20)) "$dev" >>"$l" 2>&1 &&
		dd if="$dev" of="$TMPD/zback" bs=1M count=4 iflag=direct status=none 2>>"$l" &&
		cmp -n $((1 << 20)) "$TMPD/zpat" "$TMPD/zback" >>"$l" 2>&1 &&
		cmp -n $((2 << 20)) -i $((1 << 20)) /dev/zero "$TMPD/zback" >>"$l" 2>&1 &&
		cmp -i $((3 << 20)) "$TMPD/zpat" "$TMPD/zback" >>"$l" 2>&1
}
# 4 MiB in 1 MiB direct writes and 4 KiB at an odd offset read back (exports of 8 MiB and up).
rw_check() { # DEV NAME
	local dev=$1 l=$OUT/$2.log
	dd if=/dev/urandom of="$TMPD/rwpat" bs=1M count=4 status=none
	dd if="$TMPD/rwpat" of="$dev" bs=1M oflag=direct status=none 2>>"$l" &&
		dd if="$TMPD/rwpat" of="$dev" bs=4k seek=1234 count=3 oflag=direct status=none 2>>"$l" &&
		dd if="$dev" of="$TMPD/rwback" bs=1M count=4 iflag=direct status=none 2>>"$l" &&
		cmp "$TMPD/rwpat" "$TMPD/rwback" >>"$l" 2>&1 &&
		dd if="$dev" of="$TMPD/rwback" bs=4k skip=1234 count=3 iflag=direct status=none 2>>"$l" &&
		cmp -n 12288 "$TMPD/rwpat" "$TMPD/rwback" >>"$l" 2>&1
}
# A mapped read-only export: its first MiB reads as WANT (a file; - reads anything), a
# write is refused.
ro_check() { # DEV NAME WANT
	local l=$OUT/$2.log
	dd if="$1" of="$TMPD/roback" bs=1M count=1 iflag=direct status=none 2>>"$l" &&
		{ [[ $3 == - ]] || cmp "$3" "$TMPD/roback" >>"$l" 2>&1; } &&
		! dd if=/dev/zero of="$1" bs=4k count=1 oflag=direct status=none 2>>"$l"
}
# The export, mapped by the kernel's client (SESSNAME, EXPORT; RO=1 read-only): the map
# holds, rw_check passes (a read-only export reads as WANT and refuses writes), CHECK (a
# function of the device, or :) holds; the row names the limits the client set.
map_row() { # NAME SESSNAME EXPORT RO WANT CHECK...
	local name=$1 sess=$2 exp=$3 ro=$4 want=$5 dev rc lim
	shift 5
	if [[ $ro == 1 ]]; then dev=$(map_ro "$sess" "$exp" $IP1); else dev=$(map "$sess" "$exp" $IP1); fi
	if [[ -z $dev ]]; then
		fail "$name" "map_device of $exp failed: $(dmesg | grep -E 'rnbd|rtrs' | tail -n 1)"
		return
	fi
	lim=$(queue_limits "$dev")
	if [[ $ro == 1 ]]; then
		ro_check "$dev" "$name" "$want"
	else
		rw_check "$dev" "$name"
	fi
	rc=$?
	"$@" "$dev" || rc=$((rc + 1))
	unmap "$dev" || rc=$((rc + 1))
	check "$name" $rc "$exp mapped ($lim), $([[ $ro == 1 ]] && echo 'read back, a write refused' || echo 'written and read back'), unmapped"
}
no_discard() { [[ $(qlimit "$1" discard_max_bytes) == 0 ]]; } # /dev/rnbdN
is_4k() { [[ $(qlimit "$1" logical_block_size) == 4096 ]]; }
LIMITS_FLUSH=""
flush_fua_check() { # /dev/rnbdN: flushes and FUA writes reach $LIMITS_LOOP (its flush count);
	# LIMITS_FLUSH says what was seen
	local dev=$1 f0 f1 f2 l=$OUT/limits.flush-fua.log
	[[ $(qlimit "$dev" write_cache) == "write back" && $(qlimit "$dev" fua) == 1 ]] || {
		LIMITS_FLUSH="the client set write_cache '$(qlimit "$dev" write_cache)', fua '$(qlimit "$dev" fua)'"
		return 1
	}
	f0=$(blk_flushes "$LIMITS_LOOP")
	# conv=fsync: the client's flush (a PREFLUSH request) becomes the target's fdatasync.
	dd if=/dev/urandom of="$dev" bs=4k count=8 oflag=direct conv=fsync status=none 2>>"$l" || return 1
	f1=$(blk_flushes "$LIMITS_LOOP")
	# oflag=dsync on O_DIRECT: each write carries FUA, the target's RWF_DSYNC write.
	dd if=/dev/urandom of="$dev" bs=4k count=8 oflag=direct,dsync status=none 2>>"$l" || return 1
	f2=$(blk_flushes "$LIMITS_LOOP")
	LIMITS_FLUSH="backing $LIMITS_LOOP flushes: $f0, after a flush $f1, after 8 FUA writes $f2"
	((f1 > f0 && f2 - f1 >= 8))
}

# Sets SPDK_WHY: why SPDK cannot run in the guest (empty when it can); the first call sets
# SPDK up. Not in $(...): what it sets must stay.
SPDK_WHY=unset
spdk_check() {
	if [[ $SPDK_WHY == unset ]]; then
		SPDK_WHY=""
		if [[ -z ${SPDK_DIR:-} ]]; then
			SPDK_WHY="SPDK not found on the host (SPDK_DIR, /opt/spdk)"
		else
			LD_LIBRARY_PATH=$SPDK_DIR/build/lib:$SPDK_DIR/dpdk/build/lib "$SPDK_DIR/build/bin/spdk_tgt" -h >/dev/null 2>&1
			# SIGILL: built for instructions QEMU's TCG does not emulate (AVX-512 and up).
			[[ $? == 132 ]] && SPDK_WHY="SPDK at $SPDK_DIR uses instructions the guest's CPU lacks (built with -march=native on an AVX-512 host?): build it with ./configure --target-arch=x86-64-v2 for this test"
		fi
		if [[ -z $SPDK_WHY ]]; then
			. "$REPO/ci/spdk/lib.sh"
			APP_DIR=$TMPD/spdk
			apps_init
			spdk_setup_paths
			APP_START_WAIT=1200
			MEM=(--no-huge -s 1024 --disable-cpumask-locks)
		fi
	fi
}
# bdevperf's Total line: IOPS > 0 and no failed IO (Fail/s). Its progress line ends in
# carriage returns, which may lead the summary lines: read them as line ends.
bdevperf_ok() { # LOG TXT: TXT gets the log with line ends
	tr '\r' '\n' <"$1" >"$2"
	awk '$1 == "Total" { ok = ($3 > 0 && $5 == "0.00") } END { exit !ok }' "$2"
}

if want spdk; then
	spdk_check
	if [[ -n $SPDK_WHY ]]; then
		echo "SKIP spdk: $SPDK_WHY" >>"$R"
	else
		log "== spdk: the plugin's bdev over rdma -> the kernel's server; its target <- the kernel's client"
		"${MP[@]}" rnbd_server dev_search_path=/dev
		# Once the IO runs, the kernel's server disconnects the session's one path (its
		# sysfs "disconnect"): the bdev must reconnect (reconnect_delay_sec 1; 30 by
		# default, as long as the IO timeout), re-open the device and re-send what was in
		# flight, and the verify ends with no failed IO. The same recovery covers rxe under
		# TCG failing the server's fast-reg now and then ("rxe_reg_fast_mr: mr->lkey ...
		# not free", then "REG MR failed"), after which the server closes the session.
		# A cut that lands inside a WRITE's packets makes the server hold the path, and
		# refuse it again, until its close has waited 50 s for the chunk (docs/INTEROP.md,
		# "A kernel fault the checks know"): IO waits up to 90 s for the path
		# (io_timeout_sec; 30 by default).
		cat >"$TMPD/bdev.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_rtrs_create", "params": {"name": "rtrs0", "sessname": "spdk1",
   "paths": [{"transport": "rdma", "dst_addr": "$IP1", "port": 1234}],
   "device": "$LOOPNAME", "access_mode": "rw", "reconnect_delay_sec": 1,
   "io_timeout_sec": 90}},
  {"method": "bdev_wait_for_examine"}]}]}
EOF
		timeout 300 env LD_PRELOAD="$PLUGIN_SO" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$TMPD/bdev.json" \
			-q 16 -o 4096 -w verify -t 10 >"$OUT/spdk.bdev-to-kernel.log" 2>&1 &
		BP=$!
		# The cut once the IO runs: bdevperf says so, and the server's path has carried
		# reads and writes.
		CUT=
		if wait_for -p $BP 120 grep -q "Running I/O" "$OUT/spdk.bdev-to-kernel.log" &&
			wait_for -p $BP 60 srv_io_running spdk1 1 0; then
			CUT=$(server_cut spdk1 "$OUT/spdk.bdev-to-kernel.sysfs.log")
		fi
		wait $BP
		rc=$?
		bdevperf_ok "$OUT/spdk.bdev-to-kernel.log" "$TMPD/bdevperf.txt"
		ok=$?
		errs=$(grep -c 'path error' "$TMPD/bdevperf.txt")
		conns=$(grep -c 'path connected' "$TMPD/bdevperf.txt")
		# Disconnected, then connected again (the first connect and at least one more).
		[[ -n $CUT && $errs -ge 1 && $conns -ge 2 ]] || ok=1
		check spdk.bdev-to-kernel $((rc + ok)) "bdevperf verify on an rtrs bdev over rdma to the kernel's rnbd-server, its path disconnected by the server once (exit status $rc; path ${CUT:-not disconnected}; path errors $errs, connects $conns): $(grep -E '^ *Total' "$TMPD/bdevperf.txt" | tail -n 1 | tr -s ' ')"
		# The bdev's write_zeroes "native" over 4 MiB of data read back first: op 5 on a
		# 6.8+ server (the session's writes carry no data), zero-filled writes by SPDK's
		# bdev layer on an older one, whose OPEN_RSP announces no op-5 limit (the bdev
		# then has no write-zeroes); zeros either way.
		L=$OUT/spdk.zero-native.log
		dd if=/dev/urandom of="$TMPD/zpat" bs=1M count=4 status=none
		dd if="$TMPD/zpat" of="$LOOPDEV" bs=1M oflag=direct status=none 2>>"$L" &&
			dd if="$LOOPDEV" of="$TMPD/zback" bs=1M count=4 iflag=direct status=none 2>>"$L" &&
			cmp "$TMPD/zpat" "$TMPD/zback" >>"$L" 2>&1
		rc=$?
		cat >"$TMPD/zbdev.json" <<EOJ
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_rtrs_create", "params": {"name": "rtrs0", "sessname": "spdkz",
   "paths": [{"transport": "rdma", "dst_addr": "$IP1", "port": 1234}],
   "device": "$LOOPNAME", "access_mode": "rw", "write_zeroes": "native"}},
  {"method": "bdev_wait_for_examine"}]}]}
EOJ
		timeout 300 env LD_PRELOAD="$PLUGIN_SO" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$TMPD/zbdev.json" \
			-q 1 -o 65536 -w write_zeroes -t 2 >>"$L" 2>&1 &
		BP=$!
		# The server's write requests and bytes, last seen while the session was up.
		zst="0 0"
		while kill -0 $BP 2>/dev/null; do
			for p in $(srv_paths spdkz); do
				read -r _ _ wc wb 2>/dev/null <"$p/stats/rdma" && ((wc > 0)) && zst="$wc $wb"
			done
			sleep 0.2
		done
		wait $BP
		rc=$((rc + $?))
		read -r zwc zwb <<<"$zst"
		dd if="$LOOPDEV" of="$TMPD/zback" bs=1M count=1 iflag=direct status=none 2>>"$L" &&
			cmp -n $((1 << 20)) /dev/zero "$TMPD/zback" >>"$L" 2>&1
		rc=$((rc + $?))
		# A write request's bytes are its message plus its data (docs/PROTOCOL.md §8).
		# The kernel counts a request, then adds its bytes (two counters): a sample taken
		# in between counts one request whose bytes are not in yet.
		if kernel_at_least 6.8; then
			how="op 5"
			((zwc > 0 && zwb / zwc < 4096)) || rc=$((rc + 1))
		else
			how="zero-filled writes"
			((zwc > 1 && zwb / (zwc - 1) >= 65536)) || rc=$((rc + 1))
		fi
		check spdk.zero-native $rc "bdev write_zeroes native over data: zeros read back, sent as $how (the server saw $zwc writes, $zwb bytes)"
		# Requests larger than a chunk: the bdev layer splits them at the session's
		# largest IO.
		for bs in 128 512; do
			sed -e "s/\"spdkz\"/\"spdk$bs\"/" -e 's/, "write_zeroes": "native"//' "$TMPD/zbdev.json" >"$TMPD/lbdev.json"
			timeout 300 env LD_PRELOAD="$PLUGIN_SO" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$TMPD/lbdev.json" \
				-q 4 -o $((bs << 10)) -w verify -t 2 >"$OUT/spdk.bdev-${bs}k.log" 2>&1
			rc=$?
			bdevperf_ok "$OUT/spdk.bdev-${bs}k.log" "$TMPD/lbp.txt"
			check spdk.bdev-${bs}k $((rc + $?)) "bdevperf verify, ${bs} KiB requests, on an rtrs bdev to the kernel's rnbd-server: $(grep -E '^ *Total' "$TMPD/lbp.txt" | tail -n 1 | tr -s ' ')"
		done
		rmmod_server "$OUT/spdk.bdev-to-kernel.sysfs.log"
		"${MP[@]}" rnbd_client
		if app_start tgt "$SPDK_TGT" -m 0x1 "${MEM[@]}" &&
			rpc tgt bdev_malloc_create -b malloc0 64 512 >/dev/null &&
			rpc tgt rtrs_target_listen -t rdma -a $IP1 -s 1234 &&
			rpc tgt rtrs_target_export malloc0 -e vol -a rw &&
			VOLDEV=$(map spdk2 vol $IP1); then
			dd_check "$VOLDEV" spdk.target-from-kernel &&
				fio_verify spdk.target-from-kernel.fio "$VOLDEV" 4k randwrite 16 16M
			rc=$?
			lim=$(queue_limits "$VOLDEV")
			# Every kind of bdev maps with the limits the client checks: 4 KiB blocks (an
			# AIO bdev over a file: the guest's SPDK has no memory left for a second
			# malloc bdev beside one session's chunk pool), no unmap (null), read-only
			# (null too). In the session of vol, whose mapping stays.
			RL=$OUT/spdk.rpc.log
			truncate -s 16M "$TMPD/a4k.img"
			if rpc tgt bdev_aio_create "$TMPD/a4k.img" m4k 4096 >>"$RL" 2>&1 &&
				rpc tgt bdev_null_create nul 64 4096 >>"$RL" 2>&1 &&
				rpc tgt bdev_null_create nro 64 512 >>"$RL" 2>&1 &&
				rpc tgt rtrs_target_export m4k -e s4k -a rw >>"$RL" 2>&1 &&
				rpc tgt rtrs_target_export nul -e snul -a rw >>"$RL" 2>&1 &&
				rpc tgt rtrs_target_export nro -e sro -a ro >>"$RL" 2>&1; then
				map_row spdk.map-4k spdk2 s4k 0 - is_4k
				# A null bdev keeps nothing: written and read, not compared.
				if DEV=$(map spdk2 snul $IP1); then
					lim2=$(queue_limits "$DEV")
					L=$OUT/spdk.map-nodiscard.log
					dd if=/dev/urandom of="$DEV" bs=64k count=16 oflag=direct status=none 2>>"$L" &&
						dd if="$DEV" of=/dev/null bs=64k count=16 iflag=direct status=none 2>>"$L" &&
						no_discard "$DEV"
					rc2=$?
					unmap "$DEV"
					check spdk.map-nodiscard $((rc2 + $?)) "snul (null bdev, no unmap) mapped ($lim2), written and read, unmapped"
				else
					fail spdk.map-nodiscard "map_device of snul failed"
				fi
				map_row spdk.map-ro spdk2 sro 1 - :
			else
				fail spdk.map-4k "its bdevs or exports: $(grep -m1 '"message"' "$RL" | tr -s ' ' | cut -c1-240)"
			fi
			unmap "$VOLDEV"
			check spdk.target-from-kernel $((rc + $?)) "map ($lim), dd, fio 4k verify, unmap against the plugin's target in spdk_tgt"
		else
			fail spdk.target-from-kernel "spdk_tgt, its RPCs or map_device failed"
		fi
		cp "$APP_DIR"/*.log "$OUT/" 2>/dev/null
		apps_stop_all
		rmmod rnbd_client rtrs_client 2>/dev/null
		clean spdk "$OUT"/spdk.*.log "$OUT"/tgt.log
	fi
fi

if want spdk-intr; then
	spdk_check
	if [[ -n $SPDK_WHY ]]; then
		echo "SKIP spdk-intr: $SPDK_WHY" >>"$R"
	else
		log "== spdk-intr: the plugin's target in SPDK's interrupt mode, over rdma, for the kernel's client"
		"${MP[@]}" rnbd_client
		# Interrupt mode over rdma (docs/ARCHITECTURE.md, "Interrupt mode"): the target's
		# pollers sleep on the verbs fabric's descriptors (the CQ's completion channels, the
		# listener's event channel), are woken by the kernel client's IO, and sleep again.
		L=$OUT/spdk-intr.log
		# nvmf_tgt, not spdk_tgt: spdk_tgt's iSCSI poll group spins in interrupt mode.
		truncate -s 64M "$TMPD/intr.img"
		cpu() { awk '{ print $14 + $15 }' "/proc/$(app_pid itgt)/stat"; }
		# The target's CPU over 5 s, in % of a core.
		cpu5() {
			local c0 c1
			c0=$(cpu)
			sleep 5
			c1=$(cpu)
			echo $(((c1 - c0) * 100 / ($(getconf CLK_TCK) * 5)))
		}
		if [[ -n $NVMF_TGT ]] && app_start itgt "$NVMF_TGT" -m 0x1 "${MEM[@]}" --interrupt-mode &&
			rpc itgt bdev_aio_create "$TMPD/intr.img" a0 512 >>"$L" 2>&1 &&
			FLOOR=$(cpu5) &&
			rpc itgt rtrs_target_listen -t rdma -a $IP1 -s 1234 >>"$L" 2>&1 &&
			rpc itgt rtrs_target_export a0 -e ivol -a rw >>"$L" 2>&1 &&
			IDEV=$(map spdk3 ivol $IP1); then
			asleep() { # LABEL
				local i
				for i in $(seq 80); do
					rpc itgt thread_get_pollers >"$TMPD/pollers.json" 2>>"$L" &&
						python3 "$REPO/ci/spdk/pollers_asleep.py" "$TMPD/pollers.json" "$1" >>"$L" && return 0
					sleep 0.25
				done
				return 1
			}
			# IO spaced so that the pollers sleep between requests: each is woken.
			spaced() {
				local i
				for i in $(seq 8); do
					sleep 0.3
					dd if="$IDEV" of=/dev/null bs=4k count=1 skip=$((i * 7)) iflag=direct status=none 2>>"$L" || return 1
				done
			}
			# The client drops its path and connects it again: the sleeping acceptor is
			# woken by the listener's channel, the old connections go on the timer.
			reconnect() {
				local p
				for p in /sys/class/rtrs-client/spdk3/paths/*; do
					echo 1 >"$p/reconnect" 2>>"$L" || return 1
				done
				sleep 1
				wait_connected spdk3 60 && dd_check "$IDEV" spdk-intr
			}
			asleep "connected, before IO" && dd_check "$IDEV" spdk-intr && spaced &&
				asleep "after IO" && reconnect && asleep "after the client's reconnect"
			rc=$?
			IDLE=$(cpu5)
			unmap "$IDEV"
			check spdk-intr.pollers $((rc + $?)) "nvmf_tgt --interrupt-mode, rtrs target over rdma: pollers asleep before and after IO and after the client reconnected its path, dd verify (before and after) and 8 spaced reads from the kernel's client; the target's CPU over 5 s (TCG): $IDLE % with the client connected and idle, $FLOOR % before the plugin listened ($(tail -n 1 "$L" | cut -c1-120))"
		else
			fail spdk-intr.pollers "nvmf_tgt ${NVMF_TGT:-(not found)} --interrupt-mode, its RPCs or map_device failed: $(tail -n 3 "$L" | tr -s ' \n' ' ' | cut -c1-200)"
		fi
		cp "$APP_DIR"/itgt.log "$OUT/" 2>/dev/null
		apps_stop_all
		rmmod rnbd_client rtrs_client 2>/dev/null
		clean spdk-intr "$OUT"/spdk-intr.log "$OUT"/itgt.log
	fi
fi

if want limits; then
	log "== limits: op 5, the client's queue limits, flush and FUA, large IO ($(uname -r))"
	# rtrs-bench -> the kernel's server: op 5 by the server's series, the largest request
	# one chunk carries (124 KiB with the kernel's default 128 KiB chunks).
	if "${MP[@]}" rnbd_server dev_search_path=/dev; then
		D=(--path rdma://$IP1 --device "$LOOPNAME")
		if kernel_at_least 6.8; then
			bench_row limits.zero-native "${D[@]}" --size 8M --rw zero --write-zeroes native --bs 64K --qd 4 \
				--time 2s --warmup-write --verify
		else
			# A 5.18 - 6.7 server announces no op-5 limit and would run op 5 as a READ:
			# asked for native write-zeroes, the client refuses before any IO.
			bench limits.zero-native "${D[@]}" --size 8M --rw zero --write-zeroes native --bs 64K --qd 4 \
				--time 2s --warmup-write --verify
			rc=$?
			grep -q "takes write-zeroes of at most 0 bytes" "$OUT/limits.zero-native.log"
			check limits.zero-native $(((rc == 0) + $?)) "refused (exit $rc), no op 5 sent: $(grep -m1 -o "device.*write-zeroes of at most [0-9]* bytes" "$OUT/limits.zero-native.log")"
		fi
		bench_row limits.to-kernel-124k "${D[@]}" --size $((64 * 124))K --rw randrw --bs 124K --qd 4 \
			--time 2s --verify
		rmmod_server "$OUT/limits.rmmod.log"
	else
		fail limits.zero-native "rnbd_server did not load"
	fi
	# The kernel's client -> rtrs-target: every kind of export maps with the limits the
	# client checks; write-zeroes, discard, flush, FUA and large requests.
	"${MP[@]}" rnbd_client || fail limits "rnbd_client did not load"
	truncate -s 64M "$TMPD/file.img" "$TMPD/blk.img"
	dd if=/dev/urandom of="$TMPD/ro.img" bs=1M count=1 status=none
	truncate -s 64M "$TMPD/ro.img"
	head -c $((1 << 20)) "$TMPD/ro.img" >"$TMPD/ro.head"
	LIMITS_DEV=$(losetup -f --show "$TMPD/blk.img")
	LIMITS_LOOP=${LIMITS_DEV#/dev/}
	if start_target limits --listen rdma://$IP1 --export vol=ram:256M --export file=file:$TMPD/file.img \
		--export blk=file:$LIMITS_DEV --export ro=file:$TMPD/ro.img:ro; then
		map_row limits.map-ram l1 vol 0 - :
		map_row limits.map-file l2 file 0 - :
		map_row limits.map-ro l3 ro 1 "$TMPD/ro.head" :
		map_row limits.map-blk l4 blk 0 - :
		if DEV=$(map l6 blk $IP1); then
			flush_fua_check "$DEV"
			rc=$?
			unmap "$DEV"
			check limits.flush-fua $((rc + $?)) "$LIMITS_FLUSH"
		else
			fail limits.flush-fua "map_device of blk failed"
		fi
		if DEV=$(map l5 vol $IP1); then
			zeroes_check "$DEV" limits.write-zeroes
			check limits.write-zeroes $? "blkdiscard -z over data read back first: zeros there, the data around (write_zeroes_max_bytes $(qlimit "$DEV" write_zeroes_max_bytes))"
			blkdiscard -o $((8 << 20)) -l $((4 << 20)) "$DEV" >"$OUT/limits.discard.log" 2>&1 &&
				dd_check "$DEV" limits.discard
			check limits.discard $? "blkdiscard of 4 MiB, then IO (discard_max_bytes $(qlimit "$DEV" discard_max_bytes))"
			fio_row limits.fio-128k "$DEV" 128k write 4 8M
			fio_row limits.fio-512k "$DEV" 512k write 4 16M
			unmap "$DEV"
		else
			fail limits.write-zeroes "map_device failed"
		fi
	else
		fail limits.map-ram "rtrs-target did not start: $(tail -n 2 "$OUT/limits.target.log" | tr '\n' ' ')"
		drop_target
	fi
	stop_target limits.target-exit
	losetup -d "$LIMITS_DEV"
	rmmod rnbd_client rtrs_client 2>/dev/null
	clean limits "$OUT"/limits.*.log
fi

# ---- devices: every path on its own Soft-RoCE device, one device removed and added again ----
# Removes rxe1 under IO (`rdma link delete`, which returns once every process and module has
# let the device go), waits (bounded) for STATE, the sign that the fault was seen, and for
# the removal to finish, then adds rxe1 again on dummy1. Returns 0 when the state was seen
# and the removal finished; a removal that does not finish fails NAME.rxe1-released (the
# device comes back once the process holding it has exited: rxe1_back).
RXE1_DEL=""
link_fault() { # NAME PID SECONDS STATE...: PID is the process doing the IO
	local name=$1 pid=$2 secs=$3 seen=0
	shift 3
	rdma link delete rxe1 >>"$OUT/$name.link.log" 2>&1 &
	RXE1_DEL=$!
	log "$name: rdma link delete rxe1"
	wait_for -p "$pid" "$secs" "$@" || seen=1
	# 90 s: the kernel's server may take 50 s to let a cut path go (docs/INTEROP.md, "A
	# kernel fault the checks know"), and the removal waits for it.
	if ! wait_for 90 gone "$RXE1_DEL"; then
		fail "$name.rxe1-released" "rdma link delete rxe1 had not finished 90 s later; holding /dev/infiniband: $(ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c uverbs) descriptors"
		return 1
	fi
	RXE1_DEL=""
	rdma link add rxe1 type rxe netdev dummy1 >>"$OUT/$name.link.log" 2>&1
	log "$name: rxe1 added again$( ((seen)) && echo ' (the fault was not seen within the wait, or the IO ended)')"
	wait_for 20 port_active rxe1 || fail "$name.rxe1" "rxe1 did not come back to PORT_ACTIVE after rdma link add"
	return $seen
}
# (One pgrep: a loop forking a reader per process took seconds per row under TCG.)
no_rxe1_delete() { ! pgrep -f '^rdma link delete rxe1' >/dev/null; } # no process runs it
# After a row: rxe1 exists and is active again (waits for a removal still under way).
rxe1_back() { # NAME
	[[ -z $RXE1_DEL ]] || wait_for 90 gone "$RXE1_DEL" || fail "$1.rxe1-released" "rdma link delete rxe1 still had not finished after the row"
	RXE1_DEL=""
	# A delete a test process left running (it finishes once that process has exited).
	wait_for 90 no_rxe1_delete || fail "$1.rxe1-released" "an rdma link delete rxe1 left by the row had not finished after 90 s"
	if ! rdma link show rxe1/1 >/dev/null 2>&1; then
		rdma link add rxe1 type rxe netdev dummy1 >>"$OUT/$1.link.log" 2>&1 || fail "$1.rxe1" "rdma link add rxe1 failed"
	fi
	wait_for 20 port_active rxe1 || fail "$1.rxe1" "rxe1 is not PORT_ACTIVE after the row"
}
# The first warning about a path in a log (-v; SPDK's log), for a row's detail.
path_warning() { grep -m1 -E 'connecting failed|path error' "$1" | sed 's/^.*\(connecting failed\|path error\)/\1/' | cut -c1-240; }
srv_rxe1_ops() { # SESSNAME: the reads and writes the server's paths on rxe1 have carried
	local p rc rb wc wb n=0
	for p in $(srv_paths "$1"); do
		[[ $(cat "$p/hca_name" 2>/dev/null) == rxe1 ]] || continue
		read -r rc rb wc wb 2>/dev/null <"$p/stats/rdma" && n=$((n + rc + wc))
	done
	echo $n
}
srv_rxe1_beyond() { (($(srv_rxe1_ops "$1") > $2)); } # SESSNAME N
srv_rxe1_io() { srv_rxe1_beyond "$1" 0; } # SESSNAME: its rxe1 path has carried IO
# After the rxe1 fault of a run against the kernel's server: waits (up to 120 s) for more
# than N "path connected on rxe1" lines in LOG and then (up to 60 s) for IO on the server's
# rxe1 path of SESSNAME, while PID runs; appends what it saw to the caller's $fault.
# Returns 0 when the path came back: the caller then ends the run.
rxe1_path_back() { # PID LOG N SESSNAME
	if wait_for -p "$1" 120 paths_up_beyond "$2" "$3" rxe1 && wait_for -p "$1" 60 srv_rxe1_io "$4"; then
		fault="$fault; the rxe1 path back and carrying IO on the server, the run ended"
		return 0
	fi
	fault="$fault; the rxe1 path not back with IO on the server within 180 s"
	return 1
}
# After rxe1_path_back, for a bench (-vv): waits (up to 120 s) for its timed run to begin
# (the path may be back during the prefill of --verify) and then (up to 60 s) for the
# server's rxe1 path to carry more IO, while PID runs; appends what it saw to $fault.
timed_rxe1_io() { # PID LOG SESSNAME
	local ops
	if ! wait_for -p "$1" 120 grep -q "the timed run begins" "$2"; then
		fault="$fault; the timed run had not begun 120 s after that"
		return 1
	fi
	ops=$(srv_rxe1_ops "$3")
	if ! wait_for -p "$1" 60 srv_rxe1_beyond "$3" "$ops"; then
		fault="$fault; the rxe1 path carried none of the timed run's IO within 60 s"
		return 1
	fi
	fault="$fault (IO of the timed run too)"
}
# A bench's path through rxe1 failed: -v logs its errors, naming the path src@dst; only
# the lines after the first SKIP count (those from before the fault do not).
bench_rxe1_failed() { tail -n +$(($2 + 1)) "$1" | grep -F "@$IP3:" | grep -qiE 'error|fail|closed|disconnect'; } # LOG SKIP
tgt_paths_up() { # LOG PORT: the target logged a connected path on each device
	grep -qF "@$IP1:$2 connected" "$1" && grep -qF "@$IP3:$2 connected" "$1"
}
clt_rxe1_down() { # SESSNAME: the kernel client's path on rxe1 is not connected
	local p
	for p in /sys/class/rtrs-client/$1/paths/*; do
		[[ $(cat "$p/hca_name" 2>/dev/null) == rxe1 ]] && ! path_is "$p" connected && return 0
	done
	return 1
}
# A bench (-vv) whose rxe1 path was cut, against our own target: once the path is back (more
# than N "path connected on rxe1" lines in LOG) and the timed run has gone on 3 s over both
# paths, ends the run (SIGINT to the bench's timeout, which hands it on: the bench reports
# as at its end, exit status 130) instead of letting it run out its time. Returns 0 when it
# ended it; otherwise (the path not back while PID ran) the run ends by itself, and the
# caller's checks say what was missing.
end_when_rxe1_back() { # PID LOG N
	wait_for -p "$1" 120 paths_up_beyond "$2" "$3" rxe1 || return 1
	wait_for -p "$1" 120 grep -q "the timed run begins" "$2" || return 1
	wait_for -p "$1" 3 false
	(($? == 1)) || return 1
	pkill -INT -P "$1"
}
# The two-device bench of dev.loop and dev.to-kernel, with the fault once both paths are up
# (UP: a command that says so); the row passes on exit status 0 and bench_json devs.
# With DEV_SRV_SESS (the kernel server's session name) the run lasts until the rxe1 path is
# back and has carried IO of the timed run on the server, then is ended (SIGINT, exit 130):
# the kernel's server may hold the cut path 50 s (docs/INTEROP.md, "A kernel fault the
# checks know"); not seeing that within the waits fails the row.
dev_bench() { # NAME PORT UP... -- BENCH-ARGS...
	local name=$1 port=$2 up=() rc detail fault ok warn time=8s ups ended=0 missed=0
	shift 2
	while [[ $1 != -- ]]; do up+=("$1"); shift; done
	shift
	if ((LINK_FAULT)); then time=$([[ -n ${DEV_SRV_SESS:-} ]] && echo 150s || echo 25s); fi
	bench "$name" --path "rdma://$IP1:$port?src=$IP2" --path "rdma://$IP3:$port?src=$IP4" \
		--rw randrw --bs 4K --qd 16 --time $time --verify --size 8M --json --require-all-paths \
		--reconnect-delay 1s -vv "$@" &
	local bp=$!
	wait_for -p $bp 120 "${up[@]}"
	case $? in
	0)
		ups=$(paths_up "$OUT/$name.log" rxe1)
		if ((LINK_FAULT == 0)); then
			fault="a path on each device up (no device fault: RTRS_KVM_LINK_FAULT=0)"
		elif link_fault "$name" $bp 30 bench_rxe1_failed "$OUT/$name.log" "$(wc -l <"$OUT/$name.log")"; then
			fault="the rxe1 path failed when rxe1 was removed; rxe1 added again"
			if [[ -z ${DEV_SRV_SESS:-} ]]; then
				if end_when_rxe1_back $bp "$OUT/$name.log" "$ups"; then
					fault="$fault; the rxe1 path back, the run ended 3 s into its timed part"
					ended=1
				fi
			elif rxe1_path_back $bp "$OUT/$name.log" "$ups" "$DEV_SRV_SESS" &&
				timed_rxe1_io $bp "$OUT/$name.log" "$DEV_SRV_SESS"; then
				pkill -INT -P $bp # the bench's timeout, which hands the signal on
				ended=1
			else
				missed=1
			fi
		else
			fault="the rxe1 path did not fail when rxe1 was removed, or the removal did not finish"
		fi
		;;
	1) fault="a path on each device was not up within 120 s" ;;
	*) fault="the bench ended before a path on each device was up" ;;
	esac
	wait $bp
	rc=$?
	((ended && rc == 130)) && rc=0
	rxe1_back "$name"
	detail=$(bench_json devs "$OUT/$name.log" $( ((LINK_FAULT)) && echo fault))
	ok=$?
	warn=$(path_warning "$OUT/$name.log")
	check "$name" $((rc + ok + missed)) "rc $rc; $fault${SRV_SEEN:+ (the kernel server saw paths on: $SRV_SEEN)}; $detail${warn:+; first path warning: $warn}; last line: $(grep -v '^{' "$OUT/$name.log" | tail -n 1 | cut -c1-240)"
}

# One bring-up row (see the devices group): STEP is an extended regex of the target's
# debug line for the step.
bringup_cut() { # NAME PORT STEP
	local name=$1 port=$2 step=$3 rc detail fault="the step was not logged within 60 s" ups ended=0
	if ! start_target "$name" --listen rdma://$IP1:$port --listen rdma://$IP3:$port --export vol=ram:64M -v; then
		fail "$name" "rtrs-target did not start: $(tail -n 2 "$OUT/$name.target.log" | tr '\n' ' ')"
		drop_target
		return
	fi
	bench "$name" --path "rdma://$IP1:$port?src=$IP2" --path "rdma://$IP3:$port?src=$IP4" \
		--rw randrw --bs 4K --qd 8 --time 15s --verify --size 8M --json --require-all-paths \
		--reconnect-delay 1s --connect-timeout 30s -vv --device vol &
	local bp=$!
	if wait_for -p $bp 60 grep -qE "$step" "$OUT/$name.target.log"; then
		kill -STOP "$TPID"
		ups=$(paths_up "$OUT/$name.log" rxe1)
		rdma link delete rxe1 >>"$OUT/$name.link.log" 2>&1 &
		RXE1_DEL=$!
		fault="rxe1 removed at the step: "
		if wait_for -p $bp 30 bench_rxe1_failed "$OUT/$name.log" 0; then
			fault+="the bench's rxe1 path failed"
		else
			fault+="the bench's rxe1 path did not fail within 30 s"
		fi
		kill -CONT "$TPID"
		if wait_for 60 gone "$RXE1_DEL"; then
			RXE1_DEL=""
			rdma link add rxe1 type rxe netdev dummy1 >>"$OUT/$name.link.log" 2>&1
			fault+="; removal finished, rxe1 added again"
			if end_when_rxe1_back $bp "$OUT/$name.log" "$ups"; then
				fault+="; the rxe1 path back, the run ended 3 s into its timed part"
				ended=1
			fi
		else
			fail "$name.rxe1-released" "rdma link delete rxe1 had not finished 60 s after the target ran again"
		fi
	fi
	wait $bp
	rc=$?
	((ended && rc == 130)) && rc=0
	rxe1_back "$name"
	stop_target "$name.target-exit"
	detail=$(bench_json devs "$OUT/$name.log" fault)
	check "$name" $((rc + $?)) "rc $rc; $fault; $detail"
}

SRV_SEEN=""
if want devices; then
	# The fault is rxe1 removed under IO and added again (`rdma link delete`/`add`), not its
	# link taken down: on Soft-RoCE a link that goes down while a connection on it moves data
	# leaves the device unable to make any new connection until it is deleted and added
	# again (6.1 and 6.12 alike; rdmacm-utils' ucmatose shows it with no project code
	# involved, docs/INTEROP.md). RTRS_KVM_LINK_FAULT=0 on the host runs the rows without it.
	LINK_FAULT=${LINK_FAULT:-1}
	if ((LINK_FAULT == 0)); then
		echo "SKIP dev.link-fault: RTRS_KVM_LINK_FAULT=0" >>"$R"
	fi
	log "== devices: two paths, one on rxe0 (dummy0) and one on rxe1 (dummy1)$( ((LINK_FAULT)) && echo ', rxe1 removed and added again under IO')"
	if start_target dev.loop --listen rdma://$IP1:1236 --listen rdma://$IP3:1236 --export vol=ram:256M; then
		dev_bench dev.loop 1236 tgt_paths_up "$OUT/dev.loop.target.log" 1236 -- --device vol
	else
		fail dev.loop "rtrs-target did not start: $(tail -n 2 "$OUT/dev.loop.target.log" | tr '\n' ' ')"
		drop_target
	fi
	stop_target dev.loop.target-exit

	# A path on rxe1 cut at each step of the session's bring-up: the target is stopped
	# (SIGSTOP) when it logs the step for that path, so the bench's bring-up waits there;
	# rxe1 is removed meanwhile (the removal finishes once both processes have let it go,
	# the target once it runs again) and added back. The bench must end with both paths
	# connected, 0 errors, 0 mismatches, and the rxe1 path reconnected.
	if ((LINK_FAULT)); then
		P4=${IP4//./\\.}
		bringup_cut dev.bringup.cid0 1237 "connection request peer=$P4:[0-9]+ cid=0 "
		bringup_cut dev.bringup.cid1 1238 "connection request peer=$P4:[0-9]+ cid=1 "
		bringup_cut dev.bringup.info 1239 "INFO_REQ .*peer=Some\\($P4:"
		bringup_cut dev.bringup.open 1240 "OPEN request"
	fi

	if "${MP[@]}" rnbd_server dev_search_path=/dev; then
		SRV_SEEN=""
		DEV_SRV_SESS=dev1 dev_bench dev.to-kernel 1234 srv_on_both dev1 -- \
			--device "$LOOPNAME" --sessname dev1
		rmmod_server "$OUT/dev.to-kernel.rmmod.log"
	else
		fail dev.to-kernel "rnbd_server did not load"
	fi

	"${MP[@]}" rnbd_client || fail dev.from-kernel "rnbd_client did not load"
	if ! start_target dev.from-kernel --listen rdma://$IP1 --listen rdma://$IP3 --export vol=ram:256M; then
		fail dev.from-kernel "rtrs-target did not start: $(tail -n 2 "$OUT/dev.from-kernel.target.log" | tr '\n' ' ')"
		drop_target
	elif ! DEV=$(map dev2 vol $IP2@$IP1 $IP4@$IP3); then
		fail dev.from-kernel "map_device with a path on each device failed: $(dmesg | grep -E 'rnbd|rtrs' | tail -n 1)"
	else
		hcas=$(clt_hcas dev2)
		N=${DEV#/dev/}
		W=$(blk_writes "$N")
		fio_verify dev.from-kernel "$DEV" 4k randwrite 16 48M &
		FP=$!
		fault="fio wrote nothing within 120 s"
		if wait_for -p $FP 120 blk_written "$N" "$W" && ((LINK_FAULT == 0)); then
			fault="fio running over both paths (no device fault: RTRS_KVM_LINK_FAULT=0)"
		elif ((LINK_FAULT)); then
			if link_fault dev.from-kernel $FP 30 clt_rxe1_down dev2; then
				fault="the rxe1 path went down when rxe1 was removed; rxe1 added again"
			else
				fault="the rxe1 path stayed connected for 30 s after rxe1's removal began, or the removal did not finish"
			fi
		fi
		wait $FP
		rc=$?
		rxe1_back dev.from-kernel
		# The kernel's client closes a path whose device was removed (rtrs-clt's
		# DEVICE_REMOVAL handling) and leaves it closed: an operator reconnects it, as here,
		# once the device is back. A path that failed otherwise is retried every 30 to 38 s
		# (rnbd-client's RECONNECT_DELAY, rtrs-clt's jitter); a first try the target
		# refuses leaves two more within the bound.
		for p in /sys/class/rtrs-client/dev2/paths/*; do
			path_is "$p" connected || echo 1 >"$p/reconnect" 2>/dev/null
		done
		wait_connected dev2 120 || rc=$((rc + 1))
		hcas2=$(clt_hcas dev2)
		[[ $hcas == "rxe0 rxe1" && $hcas2 == "rxe0 rxe1" ]] || rc=$((rc + 1))
		check dev.from-kernel $rc "paths' hca_name at map: ${hcas:-none}, at the end: ${hcas2:-none} ($(cat /sys/class/rtrs-client/dev2/paths/*/state 2>/dev/null | tr '\n' ' ')); $fault; fio: $(grep -E '^ +(read|write):' "$OUT/dev.from-kernel.log" | tr -s ' ' | tr '\n' ';' | cut -c1-120)"
		unmap "$DEV"
	fi
	stop_target dev.from-kernel.target-exit
	rmmod rnbd_client rtrs_client 2>/dev/null

	spdk_check
	if [[ -n $SPDK_WHY ]]; then
		echo "SKIP dev.spdk: $SPDK_WHY" >>"$R"
	else
		# (a) the plugin's bdev, one path per device (src_addr binds each to its device), to
		# the kernel's server, dummy1 down and up once the IO runs over both.
		"${MP[@]}" rnbd_server dev_search_path=/dev
		cat >"$TMPD/dev-bdev.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_rtrs_create", "params": {"name": "rtrs1", "sessname": "dev3",
   "paths": [{"transport": "rdma", "dst_addr": "$IP1", "src_addr": "$IP2", "port": 1234},
             {"transport": "rdma", "dst_addr": "$IP3", "src_addr": "$IP4", "port": 1234}],
   "device": "$LOOPNAME", "access_mode": "rw", "reconnect_delay_sec": 1}},
  {"method": "bdev_wait_for_examine"}]}]}
EOF
		# With the fault, bdevperf runs until its rxe1 path is back and carries IO on the
		# server, then is stopped (SIGINT through timeout; bdevperf prints its results and
		# exits 0): the kernel's server may hold the cut path 50 s (docs/INTEROP.md, "A
		# kernel fault the checks know"), longer than a fixed run would last.
		timeout 300 env LD_PRELOAD="$PLUGIN_SO" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$TMPD/dev-bdev.json" \
			-q 16 -o 4096 -w verify -t $( ((LINK_FAULT)) && echo 150 || echo 10) >"$OUT/dev.spdk-bdev.log" 2>&1 &
		BP=$!
		SRV_SEEN=""
		back=0
		wait_for -p $BP 120 grep -q "Running I/O" "$OUT/dev.spdk-bdev.log" &&
			wait_for -p $BP 60 srv_both_io dev3
		up=$?
		hcas=$SRV_SEEN
		case $up in
		0)
			ups=$(paths_up "$OUT/dev.spdk-bdev.log" rxe1)
			if ((LINK_FAULT == 0)); then
				fault="IO over a path on each device (no device fault: RTRS_KVM_LINK_FAULT=0)"
				back=1
			elif link_fault dev.spdk-bdev $BP 30 bench_rxe1_failed "$OUT/dev.spdk-bdev.log" "$(wc -l <"$OUT/dev.spdk-bdev.log")"; then
				fault="the rxe1 path failed when rxe1 was removed; rxe1 added again"
				if rxe1_path_back $BP "$OUT/dev.spdk-bdev.log" "$ups" dev3; then
					kill -INT $BP # timeout hands it to bdevperf
					back=1
				fi
			else
				fault="the rxe1 path did not fail when rxe1 was removed, or the removal did not finish"
			fi
			;;
		1) fault="IO over a path on each device did not run within the wait" ;;
		*) fault="bdevperf ended before IO ran over a path on each device" ;;
		esac
		wait $BP
		rc=$?
		rxe1_back dev.spdk-bdev
		bdevperf_ok "$OUT/dev.spdk-bdev.log" "$TMPD/dev-bdevperf.txt"
		ok=$?
		((up == 0 && back)) || ok=1
		[[ $hcas == "rxe0 rxe1" ]] || ok=1
		warn=$(path_warning "$TMPD/dev-bdevperf.txt")
		check dev.spdk-bdev $((rc + ok)) "bdevperf verify on an rtrs bdev with a path on rxe0 and one on rxe1 to the kernel's rnbd-server (exit status $rc; server's paths on: ${hcas:-none}; $fault): $(grep -E '^ *Total' "$TMPD/dev-bdevperf.txt" | tail -n 1 | tr -s ' ')${warn:+; first path warning: $warn}"
		rmmod_server "$OUT/dev.spdk-bdev.sysfs.log"
		# (b) the plugin's target listening on both devices, the kernel's client with a path
		# to each.
		"${MP[@]}" rnbd_client
		RL=$OUT/dev.spdk-target.rpc.log
		if app_start dtgt "$SPDK_TGT" -m 0x1 "${MEM[@]}" 2>"$RL" &&
			rpc dtgt bdev_malloc_create -b malloc0 64 512 >>"$RL" 2>&1 &&
			rpc dtgt rtrs_target_listen -t rdma -a $IP1 -s 1234 >>"$RL" 2>&1 &&
			rpc dtgt rtrs_target_listen -t rdma -a $IP3 -s 1234 >>"$RL" 2>&1 &&
			rpc dtgt rtrs_target_export malloc0 -e vol -a rw >>"$RL" 2>&1 &&
			DEV=$(map dev4 vol $IP2@$IP1 $IP4@$IP3); then
			hcas=$(clt_hcas dev4)
			dd_check "$DEV" dev.spdk-target &&
				fio_verify dev.spdk-target.fio "$DEV" 4k randwrite 16 16M
			rc=$?
			[[ $hcas == "rxe0 rxe1" ]] || rc=$((rc + 1))
			unmap "$DEV"
			check dev.spdk-target $((rc + $?)) "map with a path on each device (hca_name: ${hcas:-none}), dd, fio 4k verify, unmap against the plugin's target in spdk_tgt"
		else
			fail dev.spdk-target "spdk_tgt, its RPCs or map_device failed: $(grep -m1 '"message"' "$RL" | tr -s ' ' | cut -c1-240)"
		fi
		cp "$APP_DIR"/dtgt.log "$OUT/dev.spdk-target.dtgt.log" 2>/dev/null
		apps_stop_all
		rmmod rnbd_client rtrs_client 2>/dev/null
	fi
	clean devices "$OUT"/dev.*.log
fi

losetup -d "$LOOPDEV"
finish
