#!/usr/bin/env bash
# Builds the image, starts the compose cluster (3 meta, 3 storage, 2 query),
# and checks it end to end: create a table through query node 1, write line
# protocol through query node 2, read the same answers through both, over
# HTTP and PostgreSQL. Tears the cluster down afterwards.
#
#   deploy/smoke.sh                        # release build + image + test
#   SEALION_BIN=path/to/sealion deploy/smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
project="sealion-smoke-$$"
export SEALION_HTTP_PORT_1="${SEALION_HTTP_PORT_1:-28080}" SEALION_HTTP_PORT_2="${SEALION_HTTP_PORT_2:-28081}"
export SEALION_PG_PORT_1="${SEALION_PG_PORT_1:-25433}" SEALION_PG_PORT_2="${SEALION_PG_PORT_2:-25434}"
dc() { "${compose[@]}" -p "$project" -f deploy/docker-compose.yml "$@"; }

deploy/build-image.sh
cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then dc down -v --remove-orphans >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
dc up -d

q1="http://127.0.0.1:$SEALION_HTTP_PORT_1"
q2="http://127.0.0.1:$SEALION_HTTP_PORT_2"
wait_for() { # url
  for _ in $(seq 1 120); do
    if curl -fsS "$1/health" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "no answer from $1" >&2; dc logs --tail 50 >&2; return 1
}
wait_for "$q1"; wait_for "$q2"
for _ in $(seq 1 60); do
  up=$(curl -fsS "$q1/api/v1/sql" --data-urlencode "q=SELECT count(*) FROM system.nodes WHERE state = 'up'" -G | grep -o '"rows":\[\[[0-9]*' | grep -o '[0-9]*$' || true)
  [ "$up" = "3" ] && break
  sleep 1
done
[ "$up" = "3" ] || { echo "expected 3 storage nodes up, got '$up'" >&2; exit 1; }

sql() { curl -fsS -G "$1/api/v1/sql" --data-urlencode "q=$2"; }
sql "$q1" "CREATE TABLE cpu (host TEXT, usage DOUBLE, time TIMESTAMP NOT NULL, PRIMARY KEY (host, time))" >/dev/null
body=""
for d in 0 1 2; do for h in 0 1 2 3 4; do for k in 0 1 2 3; do
  body+="cpu,host=h$h usage=$((h * 10 + k)).0 $(( (1704067200 + d * 86400 + k * 3600) * 1000000000 ))"$'\n'
done; done; done
code=$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$q2/api/v1/write?db=public" --data-binary "$body")
[ "$code" = 204 ] || { echo "write answered $code" >&2; exit 1; }

want='[["h0",12,18.0],["h1",12,138.0],["h2",12,258.0],["h3",12,378.0],["h4",12,498.0]]'
for q in "$q1" "$q2"; do
  got=$(sql "$q" "SELECT host, count(*), sum(usage) FROM cpu GROUP BY host ORDER BY host" | grep -o '"rows":.*' | sed 's/^"rows"://; s/}$//')
  [ "$got" = "$want" ] || { echo "$q answered $got, want $want" >&2; exit 1; }
done
parts=$(sql "$q1" "SELECT count(DISTINCT partition_id) FROM system.partitions WHERE table_name = 'cpu'" | grep -o '"rows":\[\[[0-9]*' | grep -o '[0-9]*$')
[ "$parts" = 3 ] || { echo "expected 3 partitions, got $parts" >&2; exit 1; }
# Three replicas each by default, every one in sync.
replicas=$(sql "$q1" "SELECT count(*) FROM system.partitions WHERE table_name = 'cpu' AND in_sync" | grep -o '"rows":\[\[[0-9]*' | grep -o '[0-9]*$')
[ "$replicas" = 9 ] || { echo "expected 9 in-sync replicas, got $replicas" >&2; exit 1; }
if command -v psql >/dev/null; then
  for p in "$SEALION_PG_PORT_1" "$SEALION_PG_PORT_2"; do
    n=$(psql -h 127.0.0.1 -p "$p" -U sealion -d public -At -c "SELECT count(*) FROM cpu")
    [ "$n" = 60 ] || { echo "psql on port $p counted $n rows, want 60" >&2; exit 1; }
  done
fi
echo "compose smoke test: ok (3 meta, 3 storage, 2 query nodes)"
