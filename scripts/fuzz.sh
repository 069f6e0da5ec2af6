#!/usr/bin/env bash
# Fuzzes every decoder for a while: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Needs the nightly toolchain (cargo fuzz instruments with -Z flags) and
# cargo-fuzz; installs cargo-fuzz if it is missing. Seeds come from
# `format/examples/fuzz_seeds.rs`; findings land in fuzz/artifacts/<target>/
# and make this script fail. The fuzz build has its own target directory
# (fuzz/target), so it never disturbs the main build.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(page sealed_file tag_filters row_codec partial_state)

command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz
export CARGO_TARGET_DIR_MAIN="${CARGO_TARGET_DIR:-$HOME/.cache/sealion-target}"
# Built with --workspace like every other build of the main tree (a -p build
# would resolve features differently and rebuild dependencies).
CARGO_TARGET_DIR="$CARGO_TARGET_DIR_MAIN" cargo build --workspace --quiet --examples
"$CARGO_TARGET_DIR_MAIN/debug/examples/fuzz_seeds" fuzz/seeds
unset CARGO_TARGET_DIR

for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t"
  echo "== fuzz $t for ${secs}s"
  # -rss_limit_mb bounds memory: a decoder that allocates by an untrusted
  # length fails here.
  log="fuzz/last-$t.log"
  status=0
  cargo +nightly fuzz run --fuzz-dir fuzz "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 >"$log" 2>&1 || status=$?
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|SUMMARY|thread '.*panicked)" "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log" >&2
    echo "fuzz $t: exit status $status (log: $log)" >&2
    exit 1
  fi
  if [ -n "$(ls -A "fuzz/artifacts/$t" 2>/dev/null)" ]; then
    echo "fuzz $t: findings in fuzz/artifacts/$t" >&2
    exit 1
  fi
done
echo "fuzz: ${#targets[@]} targets, ${secs}s each, no findings"
