#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test. `.ci/run` and the README call this.
# Each phase prints how long it took, and the last line the whole run's time, so that the
# suite's budget (well under 20 minutes on 2 cores) stays visible.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
TP=$T0
phase() {
	local now
	now=$(date +%s)
	[[ $# -eq 0 ]] || echo "== $*"
	if ((now > TP)); then echo "   (previous phase: $((now - TP)) s)"; fi
	TP=$now
}
ci/setup.sh

phase "cargo fmt --check"
cargo fmt --check
# No module of src/ imports one that imports it back (docs/ARCHITECTURE.md, "Layers and
# who owns what").
phase "ci/modcycles.py src plugin/src (import circles between modules)"
python3 ci/modcycles.py --self-test
python3 ci/modcycles.py src plugin/src
# The interop checks' one known kernel fault is told from any other (docs/INTEROP.md).
phase "ci/kernel-vm/faults.sh --self-test (the kernel faults the interop checks know)"
bash ci/kernel-vm/faults.sh --self-test
# The bench's report helper: what no bench run checks (layer names, per-IO costs).
phase "bench/perf_report.py self-test"
python3 bench/perf_report.py self-test
phase "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -q -- -D warnings
# The API docs build without a broken or private link.
phase "cargo doc --no-deps (-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q
phase "cargo test (lib, tests, doc tests)"
cargo test
# Benches are plain programs; build them so they cannot rot.
phase "cargo build --benches"
cargo build --benches -q
# The verbs fabric against the kernel's RTRS/RNBD in a QEMU guest with Soft-RoCE, on the
# debug binaries just built (one SKIPPED line where no guest can run): the whole matrix on
# Debian 12's kernel, then on 6.12 (Debian 13's) the groups whose results depend on the
# kernel (rxe, the kernel's server and client, op 5 and queue limits; docs/INTEROP.md).
phase "ci/kernel-vm.sh --kernel 6.1 (interop with the kernel's RTRS/RNBD over rxe)"
ci/kernel-vm.sh --kernel 6.1
phase "ci/kernel-vm.sh --kernel 6.12 (the groups that differ by kernel)"
ci/kernel-vm.sh --kernel 6.12 --only verbs,to-kernel,from-kernel,limits,spdk,spdk-intr
# The SPDK plugin tests (one SKIPPED line when SPDK is not found).
phase "ci/spdk-test.sh"
ci/spdk-test.sh
# Failover, reconnects and heartbeats with every application in SPDK's interrupt mode
# (docs/ARCHITECTURE.md, "Interrupt mode"; the whole list passes so too, by hand:
# RTRS_SPDK_INTERRUPT=1 ci/spdk-test.sh).
phase "ci/spdk-test.sh in interrupt mode (path_flap outage reconnect_attempts pace)"
RTRS_SPDK_INTERRUPT=1 ci/spdk-test.sh path_flap outage reconnect_attempts pace
# The RTRS target inside spdk_tgt, driven by the project's own client (same skip rule).
phase "ci/spdk-target-test.sh"
ci/spdk-target-test.sh
phase
echo "ci/test.sh: all passed in $(($(date +%s) - T0)) s"
