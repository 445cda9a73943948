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
# The SPDK plugin tests (one SKIPPED line when SPDK is not found).
ci/spdk-test.sh
# The RTRS target inside spdk_tgt, driven by the project's own client (same skip rule).
ci/spdk-target-test.sh
