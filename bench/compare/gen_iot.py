"""Deterministic IoT-shaped data (TSBS IoT in spirit): trucks reporting
readings, with jitter, gaps, sparse rows and late, out-of-order rows.

Written as ``iot.lp`` (line protocol, measurement ``readings``, times in
seconds, in arrival order), ``iot.csv`` (the same rows in the same order,
times as ISO 8601 UTC, empty cells for missing fields) and
``iot.parquet`` (zstd, sorted by (name, time)), so every system loads the
same rows. What makes it unlike cpu-only:

- ``trucks = 5 x hosts`` of the scale, each with five tags (name, fleet,
  driver, model, device_version) and seven DOUBLE fields (latitude,
  longitude, elevation, velocity, heading, grade, fuel_consumption);
- a reading every 10 s, each time moved by a jitter of -2..+2 s (a truck's
  times still ascend);
- gaps: at each reading a truck goes offline with probability 0.2%, for 1
  to 30 minutes (no rows);
- sparse rows: 1% of readings lack velocity and heading;
- late rows: 5% of readings arrive 1 to 60 minutes after their time, so the
  file holds them out of order (a reading is written when it arrives).

``python3 bench/compare/gen_iot.py --scale quick --out DIR`` writes them
alone. ``run.py --query-data iot`` loads ``QUERY_DAYS[scale]`` days of them
into the query systems (in ``<data>/iot/``); ``run.py --ingest-data iot``
writes as many days as its ingest runs need (in ``<data>/``).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from gen import SCALES, START_S, STEP_S, Scale, XorShift, iso

IOT_TAGS = ["name", "fleet", "driver", "model", "device_version"]
IOT_FIELDS = ["latitude", "longitude", "elevation", "velocity", "heading", "grade", "fuel_consumption"]
FLEETS = ["East", "West", "North", "South"]
DRIVERS = ["Albert", "Derek", "Andy", "Seth", "Trish", "Rodney"]
MODELS = ["F-150", "G-2000", "H-2"]
VERSIONS = ["v1.0", "v1.5", "v2.0", "v2.3"]
# Arrival delays of late rows, seconds.
LATE_MIN_S, LATE_MAX_S = 60, 3600
LATE_SHARE = 0.05
GAP_START_P = 0.002
SPARSE_SHARE = 0.01
# Days of readings the IoT query pass loads (run.py --query-data iot):
# quick 100 trucks x 2 days (~1.45M rows), full 500 trucks x 3 days (~11M).
QUERY_DAYS = {"quick": 2.0, "full": 3.0}


def trucks_of(scale: Scale) -> int:
    return 5 * scale.hosts


def truck_tags(k: int) -> list[str]:
    return [f"truck_{k}", FLEETS[k % 4], DRIVERS[k % 6], MODELS[k % 3], VERSIONS[k % 4]]


def readings(scale: Scale, seed: int = 1, days: float = 1.0):
    """Rows (arrival time, truck, time s, fields or None per field) in
    arrival order, over ``days`` days from START_S."""
    n = trucks_of(scale)
    steps = int(days * 86_400) // STEP_S
    rng = XorShift(np.arange(1, n + 1, dtype=np.uint64) * np.uint64(104_729) + np.uint64(seed))
    for _ in range(8):
        rng.next()
    lat = 20.0 + (rng.below(4000).astype(np.float64) / 100.0)
    lon = -120.0 + (rng.below(5000).astype(np.float64) / 100.0)
    elev = rng.below(1000).astype(np.float64)
    fuel = 10.0 + rng.below(200).astype(np.float64) / 10.0
    offline_until = np.zeros(n, dtype=np.int64)
    last_t = np.full(n, -1, dtype=np.int64)
    rows = []  # (arrival, truck, t, fields)
    for k in range(steps):
        base = START_S + k * STEP_S
        jitter = rng.below(5).astype(np.int64) - 2
        gap = rng.below(100_000)
        gap_len = (rng.below(30).astype(np.int64) + 1) * 60
        late = rng.below(10_000)
        delay = rng.below(LATE_MAX_S - LATE_MIN_S).astype(np.int64) + LATE_MIN_S
        sparse = rng.below(10_000)
        steer = rng.below(21).astype(np.float64) - 10.0
        vel = rng.below(1200).astype(np.float64) / 10.0
        grade = rng.below(200).astype(np.float64) / 10.0 - 10.0
        lat = np.clip(lat + steer / 1000.0, -90, 90)
        lon = np.clip(lon + steer / 800.0, -180, 180)
        elev = np.clip(elev + steer, 0, 4000)
        fuel = np.clip(fuel + steer / 50.0, 1, 60)
        for i in range(n):
            t = base + int(jitter[i])
            if t <= last_t[i]:
                t = int(last_t[i]) + 1
            if t < offline_until[i]:
                continue
            if gap[i] < GAP_START_P * 100_000:
                offline_until[i] = t + int(gap_len[i])
                continue
            last_t[i] = t
            fields = [round(float(lat[i]), 4), round(float(lon[i]), 4), float(elev[i]),
                      None if sparse[i] < SPARSE_SHARE * 10_000 else float(vel[i]),
                      None if sparse[i] < SPARSE_SHARE * 10_000 else float((k * 7 + i) % 360),
                      round(float(grade[i]), 1), round(float(fuel[i]), 2)]
            arrival = t + (int(delay[i]) if late[i] < LATE_SHARE * 10_000 else 0)
            rows.append((arrival, i, t, fields))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return rows


def generate_iot(scale: Scale, out: Path, seed: int = 1, days: float = 1.0) -> dict:
    """Writes ``iot.lp``, ``iot.csv`` and ``iot.parquet`` under ``out``
    (skipped when a marker says the same scale, seed and days are there).
    Returns a summary with what makes the shape."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    marker = out / f"done-iot-{scale.name}-{seed}-{days}"
    if marker.exists():
        return {**json.loads(marker.read_text()), "reused": True}
    # The files are about to be replaced: no marker may describe old ones.
    for old in out.glob("done-iot-*"):
        old.unlink()
    rows = readings(scale, seed, days)
    tags = [truck_tags(k) for k in range(trucks_of(scale))]
    prefix = ["readings," + ",".join(f"{t}={v}" for t, v in zip(IOT_TAGS, tg)) + " " for tg in tags]
    late = 0
    newest_seen = {}
    out_of_order = 0
    prev_t = None
    with open(out / "iot.lp", "w") as lp, open(out / "iot.csv", "w", newline="") as cf:
        w = csv.writer(cf)
        w.writerow(["time"] + IOT_TAGS + IOT_FIELDS)
        for arrival, i, t, fields in rows:
            if arrival != t:
                late += 1
            if prev_t is not None and t < prev_t:
                out_of_order += 1
            prev_t = t
            newest_seen[i] = max(newest_seen.get(i, t), t)
            fv = ",".join(f"{f}={v}" for f, v in zip(IOT_FIELDS, fields) if v is not None)
            lp.write(f"{prefix[i]}{fv} {t}\n")
            w.writerow([iso(t)] + tags[i] + ["" if v is None else v for v in fields])
    by_truck = sorted(rows, key=lambda r: (tags[r[1]][0], r[2]))
    cols = {"time": pa.array([r[2] * 1_000_000 for r in by_truck], type=pa.timestamp("us", tz="UTC"))}
    for ti, t in enumerate(IOT_TAGS):
        cols[t] = pa.array([tags[r[1]][ti] for r in by_truck])
    for fi, f in enumerate(IOT_FIELDS):
        cols[f] = pa.array([r[3][fi] for r in by_truck], type=pa.float64())
    pq.write_table(pa.table(cols), out / "iot.parquet", compression="zstd")
    summary = {
        "trucks": trucks_of(scale), "rows": len(rows), "days": days, "seed": seed,
        "late_rows": late, "out_of_order_rows": out_of_order,
        "sparse_rows": sum(1 for r in rows if r[3][3] is None),
        "lp_bytes": (out / "iot.lp").stat().st_size, "csv_bytes": (out / "iot.csv").stat().st_size,
        "parquet_bytes": (out / "iot.parquet").stat().st_size,
    }
    marker.write_text(json.dumps(summary))
    return summary


IOT_COLUMNS_PG = ("time timestamptz NOT NULL, " + ", ".join(f"{t} text NOT NULL" for t in IOT_TAGS) + ", "
                  + ", ".join(f"{f} double precision" for f in IOT_FIELDS))
IOT_CSV_HEADER = ", ".join(["time", *IOT_TAGS, *IOT_FIELDS])
IOT_COLUMNS_SEALION = ("time TIMESTAMP NOT NULL, " + ", ".join(f"{t} TEXT" for t in IOT_TAGS) + ", "
                       + ", ".join(f"{f} DOUBLE" for f in IOT_FIELDS) + ", PRIMARY KEY ("
                       + ", ".join(IOT_TAGS) + ", time)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=list(SCALES), default="quick")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--days", type=float, default=1.0)
    a = ap.parse_args()
    print(json.dumps(generate_iot(SCALES[a.scale], a.out, a.seed, a.days), indent=1))
