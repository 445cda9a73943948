#!/usr/bin/env bash
# Installs what the default build needs, when it is missing: rdma-core's development
# files (the `verbs` fabric links libibverbs and librdmacm) and libclang (rdma-sys
# generates its bindings with bindgen); and what the fault tests use to break paths the
# way the operating system does: iproute2 (`ss -K`) and nftables (`nft`).
# Idempotent; quiet when all is there.
set -euo pipefail

need=()
for pkg in libibverbs-dev librdmacm-dev libclang-dev pkg-config iproute2 nftables; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "ci/setup.sh: installing ${need[*]}"
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "ci/setup.sh: cargo not found (install Rust with rustup)" >&2; exit 1; }
