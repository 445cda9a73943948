#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test. `.ci/run` and the README call this.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -q -- -D warnings
echo "== cargo test (lib, tests, doc tests)"
cargo test
# Benches are plain programs; build them so they cannot rot.
echo "== cargo build --benches"
cargo build --benches -q
# The verbs fabric against the kernel's RTRS/RNBD in a QEMU guest with Soft-RoCE, on the
# debug binaries just built (one SKIPPED line where no guest can run).
echo "== ci/kernel-vm.sh (interop with the kernel's RTRS/RNBD over rxe)"
ci/kernel-vm.sh
# The SPDK plugin tests (one SKIPPED line when SPDK is not found).
ci/spdk-test.sh
# The RTRS target inside spdk_tgt, driven by the project's own client (same skip rule).
ci/spdk-target-test.sh
