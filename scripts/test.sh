#!/usr/bin/env bash
# Everything CI checks: the layering rule, every test of the workspace, and
# (where a Docker engine runs) the compose cluster's smoke test.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sealion-target}"

./scripts/check-layers.sh
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked -- --test-threads 2 2>&1 | tee "$log"

smoke_passed=0
if docker info >/dev/null 2>&1; then
  # The image is made from the debug binary the tests just built.
  SEALION_BIN="$CARGO_TARGET_DIR/debug/sealion" deploy/smoke.sh
  smoke_passed=1
  # The short chaos run against the compose cluster (containers, with
  # network cuts), on the image the smoke test built.
  cargo test --workspace --locked --test chaos -- --ignored --nocapture 2>&1 | tee -a "$log"
else
  echo "compose smoke test and compose chaos run: skipped (no Docker engine here)"
fi

passed=$(grep -o '^test result: ok\. [0-9]* passed' "$log" | awk '{s += $4} END {print s + 0}')
echo "tests: $((passed + smoke_passed)) passed, 0 failed"
