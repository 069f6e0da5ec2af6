#!/usr/bin/env python3
"""Where one query's time goes on Sealion, without the peers.

    python3 bench/compare/explain.py --sealion PATH_TO_SEALION_BINARY --data DIR \
        [--query SQL ...] [--runs 20]

Starts a fresh ``sealion standalone`` in a temp dir, loads the cpu-only data
that ``gen.py --out DIR`` wrote (line protocol, 4 clients, batches of 1,000,
as run.py loads it) and seals it, then for each query prints its EXPLAIN
ANALYZE (what was pushed to the storage node, rows and bytes shipped, pages
decoded) and the median, min and max of ``--runs`` timed runs over HTTP
after one warm-up. Without ``--query`` it asks run.py's full-scan reference
and one host's latest row. Every figure is of this one process on this
machine: compare it with nothing but another run of this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import FULL_SCAN_SQL  # noqa: E402
from systems import Sealion  # noqa: E402

LATEST_ROW_SQL = "SELECT * FROM cpu WHERE hostname = 'host_0' ORDER BY time DESC LIMIT 1"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sealion", type=Path, required=True, help="the sealion binary")
    ap.add_argument("--data", type=Path, required=True, help="a directory gen.py wrote (cpu-only)")
    ap.add_argument("--query", action="append", default=[], help="SQL to explain and time (repeatable)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per query, after one warm-up")
    args = ap.parse_args()
    queries = args.query or [FULL_SCAN_SQL, LATEST_ROW_SQL]
    with tempfile.TemporaryDirectory(prefix="sealion-explain-") as work:
        s = Sealion(args.sealion, Path(work))
        s.start()
        try:
            t = time.perf_counter()
            loaded = s.load(args.data, 1000, 4)
            print(f"loaded and sealed in {time.perf_counter() - t:.1f} s: "
                  f"{json.dumps({k: v for k, v in loaded.items() if k != 'seal'})[:300]}")
            for q in queries:
                print(f"\n== {q}")
                plan = json.loads(s.sql(f"EXPLAIN ANALYZE {q}", "json"))
                for row in plan:
                    for v in row.values():
                        print(v)
                s.run(q)
                times = []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    s.run(q)
                    times.append((time.perf_counter() - t) * 1000)
                print(f"-- {args.runs} runs: median {statistics.median(times):.2f} ms, "
                      f"min {min(times):.2f}, max {max(times):.2f}")
        finally:
            s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
