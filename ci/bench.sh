#!/usr/bin/env bash
# The main job on an embedded default: fabrics and peers measured side by side on this
# machine over 127.0.0.1, no SPDK needed. Prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
cargo bench --bench fabric -- "$@"
