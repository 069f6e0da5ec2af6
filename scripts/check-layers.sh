#!/usr/bin/env bash
# Dependencies point one way (ARCHITECTURE.md): shared crates know no role,
# storage nodes know no DataFusion, query nodes know no RocksDB.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
forbid() { # crate, forbidden dependency
  if cargo tree --locked -e normal -p "$1" --prefix none 2>/dev/null | grep -q "^$2 "; then
    echo "layering: $1 must not depend on $2" >&2
    fail=1
  fi
}
for c in sealion-proto sealion-common; do
  for d in sealion-meta sealion-storage sealion-query datafusion rocksdb openraft; do forbid "$c" "$d"; done
done
for d in sealion-meta sealion-storage sealion-query datafusion rocksdb librocksdb-sys openraft; do
  forbid sealion-format "$d"
done
forbid sealion-storage datafusion
forbid sealion-storage sealion-query
forbid sealion-storage sealion-meta
forbid sealion-query rocksdb
forbid sealion-query librocksdb-sys
forbid sealion-query sealion-storage
forbid sealion-query sealion-meta
forbid sealion-meta datafusion
forbid sealion-meta sealion-query
forbid sealion-meta sealion-storage
[ $fail -eq 0 ] && echo "layering: ok"
exit $fail
