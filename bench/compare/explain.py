#!/usr/bin/env python3
"""Where one query's time goes on Sealion, without the peers.

    python3 bench/compare/explain.py --sealion PATH_TO_SEALION_BINARY --data DIR \
        [--query SQL ...] [--runs 20] [--pg] [--keep WORK]

Starts a fresh ``sealion standalone`` in a temp dir, loads the cpu-only data
that ``gen.py --out DIR`` wrote (line protocol, 4 clients, batches of 1,000,
as run.py loads it) and seals it, then for each query prints its EXPLAIN
ANALYZE (what was pushed to the storage node, rows and bytes shipped, pages
decoded) and the median, min and max of ``--runs`` timed runs over HTTP
after one warm-up. Without ``--query`` it asks run.py's full-scan reference
and one host's latest row. With ``--pg`` each query is also timed over the
PostgreSQL port: with psycopg fetching every row as Python values (what
run.py's ``sealion-pg`` column does), and with libpq alone (psycopg's
``pgconn.exec_``: the rows are received but never converted), which leaves
out the client's own work on the values. With ``--keep WORK`` the process
runs in WORK instead of a temp dir and WORK is kept: a later run with the
same WORK and data (a marker file says which) skips the load and the seal,
so one loaded copy serves several runs or binaries. Every figure is of this one
process on this machine: compare it with nothing but another run of this
script.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import FULL_SCAN_SQL  # noqa: E402
from systems import Sealion, SealionPg  # noqa: E402

LATEST_ROW_SQL = "SELECT * FROM cpu WHERE hostname = 'host_0' ORDER BY time DESC LIMIT 1"


def timed(label: str, run, runs: int) -> None:
    """One warm-up of ``run``, then ``runs`` timed runs, printed."""
    run()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1000)
    print(f"-- {label}, {runs} runs: median {statistics.median(times):.2f} ms, "
          f"min {min(times):.2f}, max {max(times):.2f}")


def libpq_exec(conn, q: str) -> None:
    """``q`` over libpq with no conversion of the rows to Python values."""
    from psycopg import pq

    res = conn.pgconn.exec_(q.encode())
    if res.status != pq.ExecStatus.TUPLES_OK:
        raise RuntimeError(f"{q}: {res.error_message.decode(errors='replace')}")
    res.clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sealion", type=Path, required=True, help="the sealion binary")
    ap.add_argument("--data", type=Path, required=True, help="a directory gen.py wrote (cpu-only)")
    ap.add_argument("--query", action="append", default=[], help="SQL to explain and time (repeatable)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per query, after one warm-up")
    ap.add_argument("--pg", action="store_true", help="also time each query over pgwire (psycopg and libpq)")
    ap.add_argument("--keep", type=Path, help="run in this dir and keep it; reuse the rows loaded there")
    args = ap.parse_args()
    queries = args.query or [FULL_SCAN_SQL, LATEST_ROW_SQL]
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = args.keep
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sealion-explain-")))
        # Which data the kept dir holds, loaded and sealed.
        marker = work / "loaded-from"
        source = str(args.data.resolve())
        s = Sealion(args.sealion, work)
        s.start()
        pg = None
        try:
            if marker.exists() and marker.read_text() == source:
                print(f"reusing the rows loaded in {work} from {source}")
            else:
                if marker.exists():
                    raise SystemExit(f"{work} holds rows of {marker.read_text()}, not {source}")
                t = time.perf_counter()
                loaded = s.load(args.data, 1000, 4)
                print(f"loaded {loaded['rows']} rows and sealed in {time.perf_counter() - t:.1f} s")
                marker.write_text(source)
            for q in queries:
                print(f"\n== {q}")
                plan = json.loads(s.sql(f"EXPLAIN ANALYZE {q}", "json"))
                # {"columns": [...], "rows": [[plan_type, plan], ...]}
                for row in plan["rows"]:
                    print("\n".join(str(v) for v in row))
                timed("HTTP, format=arrow", lambda: s.run(q), args.runs)
                if args.pg:
                    if pg is None:
                        pg = SealionPg(s)
                        pg.start()
                    timed("pgwire, psycopg rows", lambda: pg.run(q), args.runs)
                    timed("pgwire, libpq only", lambda: libpq_exec(pg.conn, q), args.runs)
        finally:
            if pg is not None:
                pg.stop()
            s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
