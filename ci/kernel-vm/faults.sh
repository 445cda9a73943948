#!/usr/bin/env bash
# Which faults in a guest's kernel log are the one fault of the kernel's own that the
# interop checks know (docs/INTEROP.md, "A kernel fault the checks know"). Sourced by
# ci/kernel-vm/guest.sh; `bash ci/kernel-vm/faults.sh --self-test` checks it on logs kept
# below (ci/test.sh runs that).
#
# kernel_faults DMESG prints one line per fault, "known<TAB>first line" or
# "unknown<TAB>first line". A fault's report runs from its first line (WARNING, BUG, Oops,
# general protection, segfault) to its "end trace" or the next fault. Known is only rxe's
# warning in __rxe_cleanup reached from rxe_dereg_mr, unmap_cont_bufs and
# rtrs_srv_close_work: the kernel's server deregistering a cut path's chunks while its own
# queue pair still holds a half-received RDMA WRITE's reference to one of them.

kernel_faults() {
	awk '
	function flush() {
		if (first == "") return
		known = first ~ /WARNING:/ && first ~ /__rxe_cleanup/ && body ~ /rxe_dereg_mr/ &&
			body ~ /unmap_cont_bufs/ && body ~ /rtrs_srv_close_work/
		printf "%s\t%s\n", known ? "known" : "unknown", first
		first = ""; body = ""
	}
	/WARNING:|BUG:|Oops|general protection|segfault/ { flush(); first = $0; body = ""; next }
	first != "" { body = body "\n" $0 }
	/---\[ end trace/ { flush() }
	END { flush() }' "$1"
}

faults_self_test() {
	local d bad=0
	d=$(mktemp -d)
	# The fault as CI saw it on 6.1 (a path on a removed rxe device, the kernel's server).
	cat >"$d/known" <<'EOF'
[  563.266793] rnbd_server L253: RTRS Session dev3 disconnected
[  591.030835] WARNING: CPU: 0 PID: 2276 at drivers/infiniband/sw/rxe/rxe_pool.c:255 __rxe_cleanup+0x118/0x160 [rdma_rxe]
[  591.031715] Workqueue: rtrs_server_wq rtrs_srv_close_work [rtrs_server]
[  591.031806] RIP: 0010:__rxe_cleanup+0x118/0x160 [rdma_rxe]
[  591.032640]  rxe_dereg_mr+0x24/0x40 [rdma_rxe]
[  591.032763]  unmap_cont_bufs+0x24/0xb0 [rtrs_server]
[  591.032779]  rtrs_srv_close_work+0x90/0x270 [rtrs_server]
[  591.032800] ---[ end trace 0000000000000000 ]---
[  591.379921] infiniband rxe1: set active
EOF
	# The same warning from another caller, a BUG, and a segfault: each one unknown.
	cp "$d/known" "$d/mixed"
	cat >>"$d/mixed" <<'EOF'
[  600.000001] WARNING: CPU: 1 PID: 99 at drivers/infiniband/sw/rxe/rxe_pool.c:255 __rxe_cleanup+0x118/0x160 [rdma_rxe]
[  600.000002]  rxe_destroy_qp+0x24/0x40 [rdma_rxe]
[  600.000003]  ib_destroy_qp_user+0x9a/0x1a0 [ib_core]
[  600.000004] ---[ end trace 0000000000000000 ]---
[  601.000001] BUG: kernel NULL pointer dereference, address: 0000000000000008
[  602.000001] rtrs-target[123]: segfault at 0 ip 0000 sp 0000 error 4
EOF
	# A known warning whose report is cut before its trace is not known.
	head -n 3 "$d/known" >"$d/cut"
	: >"$d/none"
	local got want
	for c in "known|known" "mixed|known unknown unknown unknown" "cut|unknown" "none|"; do
		want=${c#*|}
		got=$(kernel_faults "$d/${c%%|*}" | cut -f1 | paste -sd' ')
		if [[ $got != "$want" ]]; then
			echo "faults.sh self-test: ${c%%|*}: got '$got', want '$want'" >&2
			bad=1
		fi
	done
	rm -rf "$d"
	((bad == 0)) && echo "faults.sh self-test: 4 logs classified as expected"
	return "$bad"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	case ${1:-} in
	--self-test) faults_self_test ;;
	*) echo "usage: $0 --self-test (or source it for kernel_faults)" >&2; exit 2 ;;
	esac
fi
