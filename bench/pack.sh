#!/usr/bin/env bash
# A relocatable bundle of the benchmarks, for a machine with no Rust toolchain, no SPDK
# tree and no network: the release binaries, the SPDK plugin, SPDK's runtime (spdk_tgt,
# bdevperf, its shared libraries and DPDK's, rpc.py with SPDK's Python package, bdevperf.py),
# the shared libraries they load from this system (glibc's own excepted), the plugin's
# rpc.py module and the bench scripts, laid out as the repository is, with a run.sh at the
# top.
#
#   bench/pack.sh [OUT.tar.gz]      (default target/rtrs-bundle.tar.gz)
#
# On the other machine (x86-64, glibc at least as new as this one's, python3):
#   tar xzf rtrs-bundle.tar.gz && cd rtrs-bundle && ./run.sh scaling [bench/scaling.sh args]
#   ./run.sh check                  # the bundle's programs start (no benchmark)
# run.sh sets SPDK_DIR, LD_LIBRARY_PATH and RTRS_PREBUILT=1 for bench/scaling.sh, which
# then builds nothing. Needs SPDK ($SPDK_DIR or /opt/spdk) built with shared libraries.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
# shellcheck source=ci/spdk/lib.sh
. ci/spdk/lib.sh
OUT=${1:-$REPO/target/rtrs-bundle.tar.gz}
SPDK_DIR=$(spdk_find)
[[ -n "$SPDK_DIR" ]] || { echo "SPDK not found: set SPDK_DIR (see README)" >&2; exit 1; }
export SPDK_DIR
spdk_setup_paths
[[ -n "$BDEVPERF_PY" ]] || { echo "bdevperf.py not found under $SPDK_DIR" >&2; exit 1; }

echo "== building (release): rtrs-bench, rtrs-target, the plugin against $SPDK_DIR"
cargo build --release -q --bins
plugin_build
BIN=${CARGO_TARGET_DIR:-$REPO/target}/release

STAGE=$(mktemp -d /tmp/rtrs-pack.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
B=$STAGE/rtrs-bundle
mkdir -p "$B/target/release" "$B/ci/spdk" "$B/bench" "$B/plugin/python" "$B/sys/lib"
install -m 755 "$BIN/rtrs-bench" "$BIN/rtrs-target" "$B/target/release/"
install -m 755 "$PLUGIN_SO" "$B/target/release/librtrs_spdk.so"
install -m 644 ci/spdk/lib.sh ci/spdk/rpc_raw.py "$B/ci/spdk/"
install -m 755 bench/scaling.sh "$B/bench/"
install -m 644 bench/perf_report.py "$B/bench/"
install -m 644 plugin/python/rtrs_rpc.py "$B/plugin/python/"

# SPDK's runtime, in the source tree's layout (spdk_setup_paths finds it the same way).
S=$B/spdk
copy_rel() { # copy_rel FILE...: files of $SPDK_DIR at the same relative place under $S
	local f rel
	for f in "$@"; do
		rel=${f#"$SPDK_DIR"/}
		mkdir -p "$S/$(dirname "$rel")"
		cp -a "$f" "$S/$rel"
	done
}
copy_rel "$SPDK_TGT" "$BDEVPERF" "$RPC_PY" "$BDEVPERF_PY"
mapfile -t LIBS < <(find "$SPDK_DIR/build/lib" "$SPDK_DIR/dpdk/build/lib" -maxdepth 1 -name '*.so*' 2>/dev/null)
copy_rel "${LIBS[@]}"
if [[ -d "$SPDK_DIR/dpdk/build/lib/dpdk" ]]; then
	mkdir -p "$S/dpdk/build/lib"
	cp -a "$SPDK_DIR/dpdk/build/lib/dpdk" "$S/dpdk/build/lib/"
fi
mkdir -p "$S/python"
(cd "$SPDK_DIR/python" && find spdk -name '*.py' -exec cp --parents {} "$S/python/" \;)

# Libraries of this system the programs load (and those SPDK's build left elsewhere in its
# tree, ISA-L's), glibc's own excepted (those come with the other machine's loader, and
# must not be mixed with it).
export LD_LIBRARY_PATH
{
	for p in "$B/target/release/"* "$S/build/bin/spdk_tgt" "$BDEVPERF"; do ldd "$p" 2>/dev/null || true; done
} | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
	case $lib in
	"$SPDK_DIR"/build/lib/* | "$SPDK_DIR"/dpdk/build/lib/* | "$BIN"/*) continue ;;
	*/libc.so.* | */libm.so.* | */libpthread.so.* | */libdl.so.* | */librt.so.* | */ld-linux*) continue ;;
	esac
	cp -L "$lib" "$B/sys/lib/"
done
missing=$(for p in "$B/target/release/"* "$S/build/bin/spdk_tgt" "$BDEVPERF"; do ldd "$p" 2>/dev/null; done | grep -c "not found" || true)
[[ "$missing" == 0 ]] || { echo "some libraries of the programs are not found here (ldd says 'not found')" >&2; exit 1; }

cat >"$B/run.sh" <<'EOF'
#!/usr/bin/env bash
# rtrs-spdk benchmark bundle (bench/pack.sh). ./run.sh scaling [args] | ./run.sh check
set -euo pipefail
ROOT=$(cd "$(dirname "$0")" && pwd)
export SPDK_DIR=$ROOT/spdk RTRS_PREBUILT=1
export LD_LIBRARY_PATH=$ROOT/spdk/build/lib:$ROOT/spdk/dpdk/build/lib:$ROOT/sys/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
command -v python3 >/dev/null || { echo "run.sh: python3 is needed (SPDK's rpc.py, bdevperf.py)" >&2; exit 1; }
case ${1:-} in
scaling) shift; exec "$ROOT/bench/scaling.sh" "$@" ;;
check)
	"$ROOT/target/release/rtrs-bench" --version
	"$ROOT/target/release/rtrs-target" --version
	for p in "$ROOT/spdk/build/bin/spdk_tgt" "$ROOT"/spdk/build/examples/bdevperf "$ROOT/target/release/librtrs_spdk.so"; do
		if ldd "$p" | grep "not found"; then echo "run.sh: $p misses libraries" >&2; exit 1; fi
	done
	PYTHONPATH=$ROOT/spdk/python python3 -c 'import spdk.rpc' && echo "SPDK's python package: ok"
	echo "bundle ok: $(nproc) cores here"
	;;
*) echo "usage: ./run.sh scaling [bench/scaling.sh args] | ./run.sh check" >&2; exit 2 ;;
esac
EOF
chmod 755 "$B/run.sh"
git -C "$REPO" rev-parse --short HEAD >"$B/COMMIT" 2>/dev/null || true
mkdir -p "$(dirname "$OUT")"
tar czf "$OUT" -C "$STAGE" rtrs-bundle
echo "bundle: $OUT ($(du -h "$OUT" | cut -f1)); unpack anywhere, then ./run.sh check; ./run.sh scaling"
