#!/usr/bin/env bash
# Interoperability with the Linux kernel's RTRS/RNBD over a real verbs stack.
#
# Boots Debian's own kernel in QEMU (TCG; no network device), with Soft-RoCE (rdma_rxe)
# on a dummy interface inside the guest and the kernel's RTRS/RNBD modules built out of
# tree from Debian's linux-source, and runs the matrix of docs/INTEROP.md in one boot:
# the verbs conformance suite, ours <-> ours, ours -> the kernel's rnbd-server, the
# kernel's rnbd-client -> ours, both multipath directions with a path broken and
# restored under verify, (where SPDK is found) the SPDK plugin both ways, and two paths
# on two Soft-RoCE devices (rxe0 on dummy0, rxe1 on dummy1) with dummy1 taken down and
# up under verify, each way and with SPDK. Ends with
# "interop: N passed, M failed" and the logs and dmesg of every failure.
#
#   ci/kernel-vm.sh [--kernel SERIES] [--release] [--only GROUPS] [--keep]
#
#   --kernel    the kernel series to boot, one Debian ships with image, headers and
#               source (linux-source-SERIES): 6.1 (the default) or 6.12 on bookworm;
#               `--kernel list` prints the series the package lists offer
#   --release   test release binaries (built here); default: the debug binaries that
#               `cargo test` builds (built here when missing)
#   --only      comma-separated groups: verbs,loop,to-kernel,from-kernel,multipath,spdk,
#               spdk-intr,limits,devices
#   --keep      keep the guest's output directory (always kept on failure)
#
# Environment: RTRS_KVM_WORK (work directory; default target/kernel-vm), RTRS_KVM_MEM
# (guest MiB, default 3072), SPDK_DIR (else /opt/spdk, when built), RTRS_KVM_LINK_FAULT=0
# (the devices group runs without removing rxe1 under IO; see ci/kernel-vm/guest.sh). Prints one "SKIPPED:"
# line and succeeds where the guest cannot run (no QEMU to install, too little memory).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"

PROFILE=debug
SERIES=6.1
ONLY=all
KEEP=0
while [[ $# -gt 0 ]]; do
	case $1 in
	--release) PROFILE=release ;;
	--only) ONLY=$2; shift ;;
	--kernel) SERIES=$2; shift ;;
	--keep) KEEP=1 ;;
	*) echo "ci/kernel-vm.sh: unknown argument '$1' (see the comment at its top)" >&2; exit 2 ;;
	esac
	shift
done

T0=$(date +%s)
say() { echo "[kernel-vm $(date +%T)] $*"; }
skip() { echo "SKIPPED: kernel interop VM — $*"; exit 0; }
die() { echo "kernel-vm: $*" >&2; exit 1; }

W=${RTRS_KVM_WORK:-$REPO/target/kernel-vm}
GUEST_MEM=${RTRS_KVM_MEM:-3072}
mkdir -p "$W"
W=$(cd "$W" && pwd)

# ---- can a guest run here? --------------------------------------------------------------
[[ "$(uname -m)" == x86_64 ]] || skip "needs an x86_64 host (this is $(uname -m))"
avail_mib=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
need_mib=$((GUEST_MEM + 1024))
((avail_mib >= need_mib)) || skip "needs ${need_mib} MiB of free memory for a ${GUEST_MEM} MiB guest, ${avail_mib} MiB available"
command -v apt-get >/dev/null || skip "no apt-get to install QEMU and Debian's kernel with"
sudo_cmd=()
[[ "$(id -u)" -eq 0 ]] || sudo_cmd=(sudo -n)

# The kernel of series $SERIES that Debian ships now, whose headers, image and source the
# guest is built from: the dependency of linux-image-SERIES-amd64, or of linux-image-amd64
# when that is the series (bookworm names its default kernel 6.1.0-N-amd64).
apt_quiet() { DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get "$@" >"$W/apt.log" 2>&1; }
series_list() { apt-cache search --names-only '^linux-source-[0-9.]+$' 2>/dev/null | sed -n 's/^linux-source-\([0-9.]*\) .*/\1/p' | sort -V; }
kernel_name() {
	local meta
	for meta in "linux-image-$SERIES-amd64" linux-image-amd64; do
		apt-cache depends "$meta" 2>/dev/null | sed -n 's/^ *Depends: linux-image-\(.*-amd64\)$/\1/p' |
			grep -E "^${SERIES//./\\.}[.-]" | head -n 1 | grep . && return 0
	done
	return 0
}
if [[ $SERIES == list ]]; then
	series_list
	exit 0
fi
[[ $SERIES =~ ^[0-9]+\.[0-9]+$ ]] || die "--kernel '$SERIES': a series such as 6.1 or 6.12 (--kernel list)"
K=$(kernel_name)
if [[ -z "$K" ]] || ! apt-cache show "linux-headers-$K" >/dev/null 2>&1; then
	apt_quiet update || skip "apt-get update failed (see $W/apt.log)"
	K=$(kernel_name)
fi
[[ -n "$K" ]] || die "--kernel $SERIES: no linux-image-$SERIES.*-amd64 in the package lists (series offered: $(series_list | tr '\n' ' '))"
KVER=$(apt-cache policy "linux-image-$K" | sed -n 's/^ *Candidate: //p')
SRCVER=$(apt-cache policy "linux-source-$SERIES" | sed -n 's/^ *Candidate: //p')
[[ -n "$SRCVER" ]] || die "--kernel $SERIES: no linux-source-$SERIES in the package lists"
[[ "$KVER" == "$SRCVER" ]] || say "note: linux-source-$SERIES is $SRCVER, linux-image-$K is $KVER"

pkgs=(qemu-system-x86 busybox-static rdma-core ibverbs-utils ibverbs-providers rdmacm-utils
	kmod iproute2 fio gcc make python3 "linux-headers-$K" "linux-source-$SERIES")
need=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [[ ${#need[@]} -gt 0 ]]; then
	say "installing ${need[*]}"
	apt_quiet install -y --no-install-recommends "${need[@]}" ||
		skip "could not install ${need[*]} (see $W/apt.log)"
fi
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 missing after install"

# ---- the guest's kernel, modules and initramfs ------------------------------------------
KIMG=$W/image-$K
if [[ ! -f $KIMG/boot/vmlinuz-$K ]]; then
	say "fetching linux-image-$K $KVER"
	rm -rf "$KIMG" "$W/deb"
	mkdir -p "$W/deb"
	(cd "$W/deb" && apt-get download "linux-image-$K" >/dev/null 2>&1) || die "apt-get download linux-image-$K failed"
	dpkg-deb -x "$W"/deb/linux-image-"$K"_*.deb "$KIMG"
	rm -rf "$W/deb"
fi

# RTRS and RNBD are not in Debian's kernel config: built out of tree from its source.
MODS=$W/modules-$K
if [[ ! -f $MODS/rnbd/rnbd-client.ko || ! -f $MODS/rtrs/rtrs-server.ko ]]; then
	say "building the kernel's rtrs and rnbd modules for $K"
	rm -rf "$MODS"
	mkdir -p "$MODS"
	tar -C "$MODS" -xJf "/usr/src/linux-source-$SERIES.tar.xz" --strip-components=1 \
		"linux-source-$SERIES/drivers/infiniband/ulp/rtrs" "linux-source-$SERIES/drivers/block/rnbd"
	mv "$MODS/drivers/infiniband/ulp/rtrs" "$MODS/rtrs"
	mv "$MODS/drivers/block/rnbd" "$MODS/rnbd"
	rm -rf "$MODS/drivers"
	# rnbd includes rtrs's headers by their in-tree path.
	sed -i "s|\$(srctree)/drivers/infiniband/ulp/rtrs|$MODS/rtrs|" "$MODS/rnbd/Makefile"
	KH=/usr/src/linux-headers-$K
	make -C "$KH" M="$MODS/rtrs" CONFIG_INFINIBAND_RTRS=m CONFIG_INFINIBAND_RTRS_CLIENT=m \
		CONFIG_INFINIBAND_RTRS_SERVER=m modules -j"$(nproc)" >"$W/rtrs-build.log" 2>&1 ||
		die "building rtrs failed (see $W/rtrs-build.log)"
	make -C "$KH" M="$MODS/rnbd" CONFIG_BLK_DEV_RNBD_CLIENT=m CONFIG_BLK_DEV_RNBD_SERVER=m \
		KBUILD_EXTRA_SYMBOLS="$MODS/rtrs/Module.symvers" modules -j"$(nproc)" >"$W/rnbd-build.log" 2>&1 ||
		die "building rnbd failed (see $W/rnbd-build.log)"
	rm -rf "$W/modroot"
fi

# A module tree the guest's modprobe reads with -d: the image's modules plus ours.
MR=$W/modroot/lib/modules/$K
if [[ ! -f $MR/modules.dep ]]; then
	say "module tree"
	mkdir -p "$MR/extra"
	cp -al "$KIMG/lib/modules/$K/kernel" "$MR/kernel" 2>/dev/null || cp -a "$KIMG/lib/modules/$K/kernel" "$MR/kernel"
	cp "$KIMG"/lib/modules/"$K"/modules.{builtin,builtin.modinfo,order} "$MR/" 2>/dev/null || true
	cp "$MODS"/rtrs/*.ko "$MODS"/rnbd/*.ko "$MR/extra/"
	depmod -b "$W/modroot" "$K" || die "depmod failed"
	rm -f "$W/initrd-$K.gz"
fi

# The initramfs: busybox, the modules that reach the host's filesystem (virtio, 9p), and
# ci/kernel-vm/init.
INITRD=$W/initrd-$K.gz
if [[ ! -f $INITRD || ci/kernel-vm/init -nt $INITRD ]]; then
	say "initramfs"
	D=$W/initrd.d
	rm -rf "$D"
	mkdir -p "$D/bin" "$D/mods"
	cp /bin/busybox "$D/bin/busybox"
	cp ci/kernel-vm/init "$D/init"
	chmod +x "$D/init"
	for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p; do
		f=$(find "$MR/kernel" -name "$m.ko" -o -name "$m.ko.xz" | head -n 1)
		case $f in
		"") ;; # built in
		*.xz) xz -dc "$f" >"$D/mods/$m.ko" ;;
		*) cp "$f" "$D/mods/" ;;
		esac
		echo "$m" >>"$D/mods/order"
	done
	(cd "$D" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$INITRD")
	rm -rf "$D"
fi

# ---- what the guest runs ----------------------------------------------------------------
flag=()
[[ $PROFILE == release ]] && flag=(--release)
say "building the project's binaries and verbs tests ($PROFILE)"
cargo build "${flag[@]}" -q --bins || die "cargo build failed"
VT=$(cargo test "${flag[@]}" -q --test fabric_verbs --no-run --message-format=json 2>/dev/null |
	sed -n 's/.*"executable":"\([^"]*fabric_verbs[^"]*\)".*/\1/p' | tail -n 1)
[[ -x "$VT" ]] || die "no fabric_verbs test binary"
BIN=$REPO/target/$PROFILE

SPDK=""
PLUGIN=""
if [[ ",$ONLY," =~ ,(all|spdk|spdk-intr|limits|devices), ]]; then
	. ci/spdk/lib.sh
	SPDK_DIR=$(spdk_find)
	if [[ -n "$SPDK_DIR" ]] && spdk_setup_paths >/dev/null 2>&1; then
		say "building the SPDK plugin against $SPDK_DIR"
		if PLUGIN_PROFILE=$PROFILE plugin_build; then
			SPDK=$SPDK_DIR
			PLUGIN=$PLUGIN_SO
		else
			die "building the SPDK plugin failed"
		fi
	else
		say "SPDK not found (SPDK_DIR, /opt/spdk): the SPDK rows are skipped"
	fi
fi

# The guest runs copies, so that a build in the tree during the run cannot pull a binary
# from under a process in the guest.
RUN=$W/bin
rm -rf "$RUN"
mkdir -p "$RUN"
cp "$BIN/rtrs-target" "$BIN/rtrs-bench" "$RUN/" || die "copying the binaries failed"
cp "$VT" "$RUN/fabric_verbs" || die "copying the verbs tests failed"
BIN=$RUN
VT=$RUN/fabric_verbs
if [[ -n $PLUGIN ]]; then
	cp "$PLUGIN" "$RUN/" || die "copying the plugin failed"
	PLUGIN=$RUN/$(basename "$PLUGIN")
fi

# One output directory per series, so that one kernel's run leaves the other's logs.
OUT=$W/out-$SERIES
rm -rf "$OUT"
mkdir -p "$OUT"
cat >"$W/guest.env" <<EOF
OUT=$OUT
REPO=$REPO
BIN=$BIN
VERBS_TESTS=$VT
ONLY=$ONLY
SPDK_DIR=$SPDK
PLUGIN_SO=$PLUGIN
MODROOT=$W/modroot
LINK_FAULT=${RTRS_KVM_LINK_FAULT:-1}
EOF
cp ci/kernel-vm/guest.sh "$W/guest.sh"

# Host directories the guest mounts at their own paths after its tmpfs /tmp: the work
# directory read-write, the checkout and SPDK read-only (either may live under /tmp).
shares=(-virtfs "local,path=$W,mount_tag=work,security_model=none,multidevs=remap"
	-virtfs "local,path=$REPO,mount_tag=repo,security_model=none,readonly=on,multidevs=remap")
if [[ -n $SPDK ]]; then
	shares+=(-virtfs "local,path=$SPDK,mount_tag=spdk,security_model=none,readonly=on,multidevs=remap")
fi

# QEMU's TCG, rarely, brings the kernel down while it is still booting (an int3 oops as it
# patches its own text with both vCPUs running, before /init has run). Such a boot ran none of
# the project's code, so it is booted once more, and said so; a guest that crashes after /init
# began is a failure like any other.
boot() {
	say "booting the guest ($K, ${GUEST_MEM} MiB, TCG)"
	tv=$(date +%s)
	set +e
	timeout 2700 qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$GUEST_MEM" -smp 2 \
		-kernel "$KIMG/boot/vmlinuz-$K" -initrd "$INITRD" \
		-append "console=ttyS0 loglevel=4 panic=-1 rtrswork=$W rtrsrepo=$REPO rtrsspdk=$SPDK" \
		-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
		"${shares[@]}" \
		-nic none -display none -monitor none -serial "file:$OUT/console.log" -no-reboot \
		>"$OUT/qemu.log" 2>&1
	qrc=$?
	set -e
	say "guest exited (rc $qrc) after $(($(date +%s) - tv)) s"
}
boot
if ! grep -q '^init: running' "$OUT/console.log" && ! [[ -s $OUT/results.txt ]]; then
	mv "$OUT/console.log" "$OUT/console.boot1.log"
	say "the kernel crashed while booting, before /init ran (console: $OUT/console.boot1.log," \
		"first sign: $(grep -m1 -E 'Oops|panic|BUG' "$OUT/console.boot1.log" || tail -n1 "$OUT/console.boot1.log")); booting once more"
	echo "NOTE guest: the first boot crashed before /init ran; booted once more" >>"$OUT/boot-notes.txt"
	boot
fi

# ---- results ----------------------------------------------------------------------------
R=$OUT/results.txt
touch "$R"
if ! grep -q '^DONE' "$R"; then
	echo "FAIL guest: the guest did not finish its tests (QEMU rc $qrc; crashed or timed out); console tail:" >>"$R"
	tail -n 40 "$OUT/console.log" | sed 's/^/    /' >>"$R"
fi
passed=$(grep -c '^PASS ' "$R" || true)
failed=$(grep -c '^FAIL ' "$R" || true)
echo "================ kernel interop matrix ($K, $PROFILE binaries) ================"
grep -E '^(PASS|FAIL|SKIP) ' "$R" || true
[[ ! -f $OUT/boot-notes.txt ]] || cat "$OUT/boot-notes.txt"
if ((failed > 0)); then
	echo "================ failures: logs and dmesg ================"
	grep '^FAIL ' "$R" | while read -r _ name rest; do
		name=${name%:}
		echo "---- $name: $rest"
		for f in "$OUT/$name".*.log "$OUT/$name.log"; do
			[[ -f $f ]] || continue
			echo "  -- $(basename "$f") (last 25 lines)"
			tail -n 25 "$f" | sed 's/^/    /'
		done
		# The kernel log is the group's: a row's name starts with its group (mp. and dev.
		# are multipath's and devices').
		g=${name%%.*}
		case $g in mp) g=multipath ;; dev) g=devices ;; esac
		if [[ -f "$OUT/$g.dmesg" ]]; then
			echo "  -- dmesg of $g (RTRS, RNBD, rxe and warnings)"
			grep -iE 'rtrs|rnbd|rxe|warning|bug|error|fail' "$OUT/$g.dmesg" | tail -n 25 | sed 's/^/    /'
		fi
	done
	grep -A40 '^FAIL guest' "$R" | tail -n +2 || true
fi
# How long each group took, from the guest's stamped group headers ("[guest T] == NAME:"),
# for the suite's budget (ci/test.sh): "groups: verbs 83 s, loop 41 s, ...".
if [[ -f $OUT/guest.log ]]; then
	sed -nE 's/^\[guest ([0-9]{2}):([0-9]{2}):([0-9]{2})\] (== ([a-z0-9-]+):)?.*/\1 \2 \3 \5/p' "$OUT/guest.log" |
		awk '{ t = $1 * 3600 + $2 * 60 + $3 + off; if (t < last) { off += 86400; t += 86400 }; last = t
			if ($4 != "") { if (g != "") { out = out sep g " " (t - start) " s"; sep = ", " }; g = $4; start = t } }
			END { if (g != "") print "groups: " out sep g " " (last - start) " s" }' || true
fi
echo "(guest output: $OUT; $(($(date +%s) - T0)) s in all)"
echo "interop: $passed passed, $failed failed"
if ((failed == 0)) && ((KEEP == 0)); then
	rm -rf "$OUT"
fi
((failed == 0))
