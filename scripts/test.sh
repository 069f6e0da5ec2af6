#!/usr/bin/env bash
# Everything CI checks: the layering rule, then every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sealion-target}"

./scripts/check-layers.sh
cargo test --workspace --locked -- --test-threads 2
