"""Deterministic TSBS cpu-only data, written as line protocol, CSV and Parquet.

Every system in the comparison loads the same rows from these files:

- ``cpu.lp``: InfluxDB line protocol, one row a line, times in seconds
  (Sealion, VictoriaMetrics, InfluxDB);
- ``cpu.csv``: CSV with a header, times as ISO 8601 UTC (PostgreSQL COPY);
- ``parquet/day-NNN.parquet``: zstd Parquet, one file per day, rows sorted by
  (hostname, time) as a time-series writer lays them out (DuckDB, chDB,
  DataFusion);
- ``events.lp``, ``events.csv``, ``events.parquet``: the left side of the
  as-of join: one event per host every ten minutes, at a whole second that
  is mostly off the readings' 10 s grid.

The shape follows TSBS cpu-only: ten tags per host (hostname, region,
datacenter, rack, os, arch, team, service, service_version,
service_environment), ten fields usage_* that are integers 0..100 doing a
random walk (step -5..+5, clamped), one reading per host every 10 s. Field
values are integers stored as DOUBLE in every system (line protocol floats
without the ``i`` suffix), so averages compare equal everywhere.

Randomness is xorshift64* with one stream per (host, field), seeded from
``--seed`` (default 1), host and field, computed in numpy uint64 arithmetic,
so the rows do not depend on the numpy or Python version.

Scales (``SCALES``): ``quick`` is 20 hosts x 3 days (518,400 rows);
``full`` is 100 hosts x 100,000 readings (11.57 days), 10,000,000 rows;
``full-100m`` is 1,000 hosts x 100,000 readings, 100,000,000 rows. Scales
of more than 20M rows write ``cpu.lp.zst`` and ``cpu.csv.zst`` (zstd) in
place of the plain files (100M rows of line protocol are 33 GB plain);
``open_data`` reads either, and the loaders stream them.

The IoT shape (trucks with jitter, gaps and late rows) is in gen_iot.py.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import os
from pathlib import Path

import numpy as np

TAGS = [
    "hostname", "region", "datacenter", "rack", "os", "arch", "team",
    "service", "service_version", "service_environment",
]
FIELDS = [
    "usage_user", "usage_system", "usage_idle", "usage_nice", "usage_iowait",
    "usage_irq", "usage_softirq", "usage_steal", "usage_guest",
    "usage_guest_nice",
]
STEP_S = 10
DAY_S = 86_400
# 2024-01-01T00:00:00Z
START_S = 1_704_067_200

REGIONS = [
    "us-east-1", "us-west-1", "us-west-2", "eu-west-1", "eu-central-1",
    "ap-southeast-1", "ap-northeast-1", "sa-east-1",
]


@dataclasses.dataclass(frozen=True)
class Scale:
    name: str
    hosts: int
    readings_per_host: int  # 8,640 a day at 10 s

    @property
    def rows(self) -> int:
        return self.hosts * self.readings_per_host

    @property
    def seconds(self) -> int:
        return self.readings_per_host * STEP_S

    @property
    def days(self) -> float:
        return self.seconds / DAY_S


SCALES = {
    "quick": Scale("quick", 20, 3 * 8_640),
    "full": Scale("full", 100, 100_000),
    "full-100m": Scale("full-100m", 1_000, 100_000),
}

# Scales of more rows than this write their line protocol and CSV zstd
# compressed.
COMPRESS_ABOVE_ROWS = 20_000_000


def compressed(scale: Scale) -> bool:
    return scale.rows > COMPRESS_ABOVE_ROWS


def data_path(path: Path) -> Path:
    """``path``, or its ``.zst`` beside it when only that one exists."""
    z = path.with_name(path.name + ".zst")
    return z if not path.exists() and z.exists() else path


def open_data(path: Path):
    """A binary reader of the data file ``path`` (or of ``path.zst``,
    decompressed as it is read)."""
    p = data_path(path)
    if p.suffix == ".zst":
        import zstandard
        return zstandard.ZstdDecompressor().stream_reader(open(p, "rb"), closefd=True)
    return open(p, "rb")


def _create_text(path: Path, zst: bool):
    """A text writer of ``path`` (``path.zst``, zstd level 3, when ``zst``)."""
    if not zst:
        return open(path, "w", newline="")
    import io
    import zstandard
    raw = open(path.with_name(path.name + ".zst"), "wb")
    return io.TextIOWrapper(zstandard.ZstdCompressor(level=3, threads=-1).stream_writer(raw, closefd=True),
                            encoding="utf-8", newline="")


def host_tags(h: int) -> list[str]:
    """The ten tag values of host number ``h`` (the same as bench/src/tsbs.rs)."""
    r = REGIONS[h % len(REGIONS)]
    return [
        f"host_{h}",
        r,
        f"{r}{'abc'[h % 3]}",
        str((h * 7) % 100),
        ["Ubuntu16.10", "Ubuntu16.04LTS", "Ubuntu15.10"][h % 3],
        ["x64", "x86"][h % 2],
        ["SF", "NYC", "LON", "CHI"][h % 4],
        str((h * 3) % 20),
        str(h % 2),
        ["production", "staging", "test"][h % 3],
    ]


_MASK = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_MUL = np.uint64(0x2545_F491_4F6C_DD1D)


class XorShift:
    """Vectorised xorshift64*: ``n`` independent streams advanced together."""

    def __init__(self, seeds: np.ndarray):
        self.s = seeds.astype(np.uint64)
        self.s[self.s == 0] = np.uint64(0x9E37_79B9_7F4A_7C15)

    def next(self) -> np.ndarray:
        with np.errstate(over="ignore"):
            s = self.s
            s ^= s >> np.uint64(12)
            s ^= (s << np.uint64(25)) & _MASK
            s ^= s >> np.uint64(27)
            self.s = s
            return (s * _MUL) & _MASK

    def below(self, n: int) -> np.ndarray:
        return self.next() % np.uint64(n)


def walk(scale: Scale, seed: int = 1) -> np.ndarray:
    """Field values, shape (readings, hosts, fields), int16 in 0..100."""
    hosts, nf = scale.hosts, len(FIELDS)
    idx = np.arange(hosts * nf, dtype=np.uint64)
    seeds = (np.uint64(seed) * np.uint64(0x1000_0000_01B3)) ^ (idx * np.uint64(0x9E37_79B9)) ^ np.uint64(0xCBF2_9CE4_8422_2325)
    rng = XorShift(seeds)
    for _ in range(8):  # let nearby seeds diverge
        rng.next()
    cur = rng.below(101).astype(np.int16)
    out = np.empty((scale.readings_per_host, hosts * nf), dtype=np.int16)
    for k in range(scale.readings_per_host):
        step = rng.below(11).astype(np.int16) - 5
        cur = np.clip(cur + step, 0, 100).astype(np.int16)
        out[k] = cur
    return out.reshape(scale.readings_per_host, hosts, nf)


def event_times(scale: Scale, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Events for the as-of join: (host index, time s, kind), one per host
    every 600 s at a random whole-second offset 3..592 into the slot."""
    slots = scale.seconds // 600
    rng = XorShift(np.arange(1, scale.hosts + 1, dtype=np.uint64) * np.uint64(7919) + np.uint64(seed))
    hs, ts, ks = [], [], []
    for k in range(slots):
        off = rng.below(590).astype(np.int64) + 3
        kind = rng.below(5).astype(np.int64)
        hs.append(np.arange(scale.hosts))
        ts.append(START_S + k * 600 + off)
        ks.append(kind)
    return np.concatenate(hs), np.concatenate(ts), np.concatenate(ks)


def iso(t: int) -> str:
    return dt.datetime.fromtimestamp(int(t), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def generate(scale: Scale, out: Path, seed: int = 1) -> dict:
    """Writes every file for ``scale`` under ``out`` (skipped when a marker
    says the same scale and seed are there already). Returns a summary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    marker = out / f"done-{scale.name}-{seed}"
    summary = {
        "scale": scale.name, "hosts": scale.hosts,
        "readings_per_host": scale.readings_per_host, "rows": scale.rows,
        "start": iso(START_S), "end": iso(START_S + scale.seconds),
        "interval_s": STEP_S, "seed": seed,
    }
    if marker.exists():
        summary.update(_sizes(out))
        summary["events"] = int(marker.read_text().strip() or 0)
        summary["reused"] = True
        return summary

    vals = walk(scale, seed)  # (k, h, f)
    tags = [host_tags(h) for h in range(scale.hosts)]
    tag_prefix = [
        "cpu," + ",".join(f"{t}={v}" for t, v in zip(TAGS, tags[h])) + " "
        for h in range(scale.hosts)
    ]

    # Line protocol and CSV, time-major (as a fleet of agents reports).
    zst = compressed(scale)
    for name in ("cpu.lp", "cpu.csv"):
        for stale in (out / name, out / (name + ".zst")):
            stale.unlink(missing_ok=True)
    with _create_text(out / "cpu.lp", zst) as lp, _create_text(out / "cpu.csv", zst) as cf:
        w = csv.writer(cf)
        w.writerow(["time"] + TAGS + FIELDS)
        for k in range(scale.readings_per_host):
            t = START_S + k * STEP_S
            ts = iso(t)
            row = vals[k]
            lines = []
            for h in range(scale.hosts):
                fv = row[h].tolist()
                lines.append(tag_prefix[h] + ",".join(f"{f}={v}" for f, v in zip(FIELDS, fv)) + f" {t}\n")
                w.writerow([ts] + tags[h] + fv)
            lp.write("".join(lines))

    # Parquet, one file per day, sorted by (hostname, time).
    pdir = out / "parquet"
    pdir.mkdir(exist_ok=True)
    per_day = DAY_S // STEP_S
    names = [f"host_{h}" for h in range(scale.hosts)]
    order = sorted(range(scale.hosts), key=lambda h: names[h])
    day = 0
    for k0 in range(0, scale.readings_per_host, per_day):
        k1 = min(k0 + per_day, scale.readings_per_host)
        n = k1 - k0
        cols: dict[str, list | np.ndarray] = {}
        times = np.tile(START_S + np.arange(k0, k1, dtype=np.int64) * STEP_S, scale.hosts)
        cols["time"] = pa.array(times * 1_000_000, type=pa.timestamp("us", tz="UTC"))
        for ti, t in enumerate(TAGS):
            cols[t] = pa.array(np.repeat([tags[h][ti] for h in order], n))
        for fi, f in enumerate(FIELDS):
            cols[f] = pa.array(vals[k0:k1, order, fi].T.reshape(-1).astype(np.float64))
        pq.write_table(pa.table(cols), pdir / f"day-{day:03}.parquet", compression="zstd",
                       compression_level=3, row_group_size=1 << 20)
        day += 1

    # Events: line protocol, CSV, Parquet.
    hs, ts, ks = event_times(scale, seed)
    with open(out / "events.lp", "w") as lp, open(out / "events.csv", "w", newline="") as cf:
        w = csv.writer(cf)
        w.writerow(["time", "hostname", "kind"])
        for h, t, k in zip(hs.tolist(), ts.tolist(), ks.tolist()):
            lp.write(f"events,hostname=host_{h} kind={k}i {t}\n")
            w.writerow([iso(t), f"host_{h}", k])
    pq.write_table(pa.table({
        "time": pa.array(ts * 1_000_000, type=pa.timestamp("us", tz="UTC")),
        "hostname": pa.array([f"host_{h}" for h in hs.tolist()]),
        "kind": pa.array(ks, type=pa.int64()),
    }), out / "events.parquet", compression="zstd")
    marker.write_text(str(len(hs)))
    summary.update(_sizes(out))
    summary["events"] = len(hs)
    return summary


def _sizes(out: Path) -> dict:
    pbytes = sum(p.stat().st_size for p in (out / "parquet").glob("*.parquet"))
    return {
        "lp_file": data_path(out / "cpu.lp").name,
        "lp_bytes": data_path(out / "cpu.lp").stat().st_size,
        "csv_bytes": data_path(out / "cpu.csv").stat().st_size,
        "parquet_bytes": pbytes,
        "parquet_files": len(list((out / "parquet").glob("*.parquet"))),
    }


def iter_lp_batches(path: Path, rows_per_batch: int, limit: int | None = None):
    """The line protocol file as request bodies of ``rows_per_batch`` lines,
    read as they are asked for (the full scale's file is 3.2 GB; a ``.zst``
    one is decompressed as it is read)."""
    import io
    cur, n = [], 0
    with open_data(path) as raw:
        f = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw, 1 << 20)
        for line in f:
            cur.append(line)
            n += 1
            if len(cur) == rows_per_batch:
                yield b"".join(cur)
                cur = []
            if limit is not None and n >= limit:
                break
    if cur:
        yield b"".join(cur)


def lp_batches(path: Path, rows_per_batch: int, limit: int | None = None) -> list[bytes]:
    """The same, all in memory (for timed runs, so reading is not timed)."""
    return list(iter_lp_batches(path, rows_per_batch, limit))


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", choices=SCALES, default="quick")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    print(json.dumps(generate(SCALES[a.scale], a.out, a.seed), indent=1))
