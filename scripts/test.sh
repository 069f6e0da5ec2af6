#!/usr/bin/env bash
# Everything CI checks: the layering rule, every test of the workspace, and
# (where a Docker engine runs) the compose cluster's smoke test.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sealion-target}"

./scripts/check-layers.sh
cargo test --workspace --locked -- --test-threads 2

if docker info >/dev/null 2>&1; then
  # The image is made from the debug binary the tests just built.
  SEALION_BIN="$CARGO_TARGET_DIR/debug/sealion" deploy/smoke.sh
else
  echo "compose smoke test: skipped (no Docker engine here)"
fi
