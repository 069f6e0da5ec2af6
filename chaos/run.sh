#!/usr/bin/env bash
# The long chaos run: ten minutes of faults by default against processes on
# loopback (3 meta, 3 storage with RF 3, 1 query), or with --compose against
# the compose cluster (containers, network cuts included; the image is built
# from the debug binary first). Prints the seed, the schedule of faults and a
# summary table; fails if an acknowledged row is lost or duplicated, a row
# appears that was never written, or replicas differ after healing.
#   chaos/run.sh [--compose] [seconds] [seed]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sealion-target}"
compose=0
if [ "${1:-}" = "--compose" ]; then compose=1; shift; fi
export SEALION_CHAOS_SECONDS="${1:-600}"
export SEALION_CHAOS_SEED="${2:-$(( (RANDOM << 15) | RANDOM ))}"
if [ "$compose" = 1 ]; then
  cargo build --workspace --locked
  SEALION_BIN="$CARGO_TARGET_DIR/debug/sealion" deploy/build-image.sh
  exec cargo test --workspace --locked --test chaos -- --ignored --nocapture
fi
exec cargo test --workspace --locked --test chaos -- --nocapture chaos_every
