#!/usr/bin/env bash
# The long chaos run: ten minutes of faults by default against processes on
# loopback (3 meta, 3 storage with RF 3, 1 query). Prints the seed, the
# schedule of faults and a summary table; fails if an acknowledged row is
# lost or duplicated, a row appears that was never written, or replicas
# differ after healing.
#   chaos/run.sh [seconds] [seed]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sealion-target}"
export SEALION_CHAOS_SECONDS="${1:-600}"
export SEALION_CHAOS_SEED="${2:-$(( (RANDOM << 15) | RANDOM ))}"
exec cargo test -p sealion --locked --test chaos -- --nocapture
