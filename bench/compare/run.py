#!/usr/bin/env python3
"""Sealion against peer systems, in one command.

    python3 bench/compare/run.py --scale quick --sealion PATH_TO_SEALION_BINARY

Installs what is missing (Python packages with pip; PostgreSQL, and for the
ingest-only peers VictoriaMetrics and InfluxDB, with apt-get), generates the
data (gen.py), starts every system in a temp dir on free loopback ports
(systems.py), loads the same rows into each, checks that every system gives
the same answer to every query (parity.py) and withholds the pairs that do
not, times the rest (a warm-up, then ``--runs`` timed runs; median, min,
max), measures each system's noise floor (``SELECT 1``), measures ingest
(line protocol batches into Sealion, VictoriaMetrics and InfluxDB, COPY
batches into PostgreSQL, from 1, 2 and 4 clients), records bytes on disk,
stops everything (also on error or Ctrl-C) and writes
``bench/results/compare-<date>-<scale>.{md,json}`` and PNG charts
(report.py). Every flag is documented in bench/README.md.

``--query-data iot`` runs the query part on the IoT shape instead
(gen_iot.py's trucks, loaded into every query system as table
``readings``; queries.build_iot) and writes
``compare-<date>-<scale>-iot.{md,json}``; it measures no ingest unless
``--ingest-systems`` is given.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.util
import json
import os
import platform
import shutil
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PIP = {"duckdb": "duckdb", "chdb": "chdb", "datafusion": "datafusion", "pyarrow": "pyarrow",
       "matplotlib": "matplotlib", "psycopg": "psycopg[binary]", "numpy": "numpy",
       "zstandard": "zstandard"}
QUERY_SYSTEMS = ["sealion", "sealion-pg", "sealion-cluster", "postgres-plain", "postgres-part", "duckdb", "chdb",
                 "datafusion"]
# What single-row ingest results are named after (system name + this).
SINGLE_ROWS = " single rows"
INGEST_SYSTEMS = ["sealion", "sealion-pg", "sealion-cluster-rf1", "sealion-cluster-rf3", "postgres",
                  "victoriametrics", "influxdb"]


def log(msg: str) -> None:
    print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {msg}", flush=True)


def ensure_pip() -> list[str]:
    """pip installs the Python packages that are missing; returns them."""
    missing = [pkg for mod, pkg in PIP.items() if importlib.util.find_spec(mod) is None]
    if missing:
        log(f"pip install {' '.join(missing)}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)
        importlib.invalidate_caches()
    return missing


def ensure_deps(want_ingest_peers: list[str], pip_installed: list[str]) -> dict:
    """apt installs what is missing (pip ran first: gen.py needs numpy
    before the arguments can be read); returns notes on what was done."""
    notes = {}
    missing = pip_installed + ensure_pip()
    if missing:
        notes["pip"] = missing
    apt = []
    if not Path("/usr/lib/postgresql/15/bin/initdb").exists():
        apt.append("postgresql")
    if "victoriametrics" in want_ingest_peers and not shutil.which("victoria-metrics"):
        apt.append("victoria-metrics")
    if "influxdb" in want_ingest_peers and not shutil.which("influxd"):
        apt.append("influxdb")
    if apt:
        log(f"apt-get install {' '.join(apt)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        r = subprocess.run(["apt-get", "install", "-y", *apt], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True)
            r = subprocess.run(["apt-get", "install", "-y", *apt], env=env, capture_output=True, text=True)
        notes["apt"] = {"packages": apt, "rc": r.returncode, "stderr_tail": r.stderr[-500:]}
    return notes


def machine() -> dict:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(int(mem) / 2**20, 1),
            "kernel": platform.release(), "os": platform.platform(), "python": platform.python_version()}


class OtherCpu:
    """CPU seconds used by processes that are not this run's (not this
    process or its descendants, not the benchmark's PostgreSQL, which runs
    as user postgres) between ``start()`` and ``stop()``: the load the rest
    of the machine put on the figures."""

    def __init__(self):
        self.tick = os.sysconf("SC_CLK_TCK")

    def _snap(self) -> dict[int, tuple[float, str, int, int]]:
        out = {}
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                stat = (p / "stat").read_text()
                uid = (p / "status").stat().st_uid
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            f = stat[stat.rindex(")") + 2:].split()
            out[int(p.name)] = ((int(f[11]) + int(f[12])) / self.tick, comm, int(f[1]), uid)
        return out

    def _ours(self, snap) -> set[int]:
        import pwd
        try:
            pg_uid = pwd.getpwnam("postgres").pw_uid
        except KeyError:
            pg_uid = -1
        ours = {os.getpid()}
        changed = True
        while changed:
            changed = False
            for pid, (_, _, ppid, uid) in snap.items():
                if pid not in ours and (ppid in ours or uid == pg_uid):
                    ours.add(pid)
                    changed = True
        return ours

    def _busy(self) -> float:
        """CPU seconds the whole machine has been busy (all cores), /proc/stat."""
        f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
        return (user + nice + system + irq + softirq + steal) / self.tick

    def start(self) -> None:
        self.t0, self.b0, self.s0 = time.time(), self._busy(), self._snap()

    def stop(self) -> dict:
        s1, b1, wall = self._snap(), self._busy(), time.time() - self.t0
        ours = self._ours(s1) | self._ours(self.s0)
        used: dict[str, float] = {}
        ours_s = 0.0
        for pid, (cpu, comm, _, _) in s1.items():
            d = cpu - self.s0[pid][0] if pid in self.s0 else cpu
            if pid in ours:
                ours_s += max(d, 0.0)
            elif d > 0:
                used[comm] = used.get(comm, 0.0) + d
        # The machine's busy time less ours counts the processes that came
        # and went between the two snapshots too (a compiler run, a test).
        other = max(b1 - self.b0 - ours_s, 0.0)
        top = sorted(used.items(), key=lambda kv: -kv[1])[:5]
        return {"wall_s": wall, "busy_cpu_s": b1 - self.b0, "ours_cpu_s": ours_s, "other_cpu_s": other,
                "other_cores_busy": other / wall if wall else 0.0,
                "top": [{"comm": c, "cpu_s": round(s, 1)} for c, s in top]}


# A query every system answers by reading two columns of every row: no
# statistics can rule a range of rows out (two random walks are never both
# constant and equal over a page). `usage_user + usage_system > 250`, the
# reference until 2026-12-04, is not one: DuckDB proves it empty from its
# column statistics (EXPLAIN ANALYZE: Empty Result) and Sealion's page
# statistics rule out every page.
FULL_SCAN_SQL = "SELECT count(*) FROM cpu WHERE usage_user <> usage_system"


def timed(fn, warmup: int, runs: int, min_time: float = 0.0, max_runs: int = 0) -> list[float]:
    """`warmup` untimed runs, then `runs` timed ones; then more, while the
    timed runs add up to less than `min_time` seconds, up to `max_runs` in
    all. Every system gets the same rule, so a query of a fraction of a
    millisecond gets a median of tens of runs instead of five (the spread
    of five such runs was wider than most of the ratios they gave)."""
    for _ in range(warmup):
        fn()
    out = []
    while len(out) < runs or (sum(out) < min_time and len(out) < max_runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def stats(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"min": s[0], "median": s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2,
            "max": s[-1], "runs": xs}


def csv_batches(path: Path, rows_per_batch: int, limit: int) -> list[bytes]:
    import io
    from gen import open_data
    out, cur, n = [], [], 0
    with open_data(path) as raw:
        f = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw, 1 << 20)
        f.readline()  # header
        for line in f:
            cur.append(line)
            n += 1
            if len(cur) == rows_per_batch:
                out.append(b"".join(cur))
                cur = []
            if n >= limit:
                break
    if cur:
        out.append(b"".join(cur))
    return out


def main() -> int:
    # gen.py, which names the scales, needs numpy: on a fresh machine the
    # Python packages are installed before it is imported.
    pip_installed = [] if "--no-install" in sys.argv[1:] else ensure_pip()
    from gen import SCALES
    ap = argparse.ArgumentParser(description="Sealion against peer systems (issue 7).")
    ap.add_argument("--scale", choices=list(SCALES), default="quick")
    ap.add_argument("--sealion", type=Path, help="the sealion binary (required unless sealion is left out of --systems)")
    ap.add_argument("--build-label", default=None,
                    help="how the Sealion binary was built, for the report and the output file names (a "
                         "commit will do for a release build; a label containing 'debug' marks Sealion's "
                         "timings as not representative; default: guessed from the path: "
                         "'debug' if it contains /debug/, 'release' if /release/)")
    ap.add_argument("--sealion-arg", action="append", default=[],
                    help="an extra argument for `sealion standalone` (repeat it; e.g. "
                         "--sealion-arg=--query-memory-limit-mb --sealion-arg=4096)")
    ap.add_argument("--sealion-http-client", choices=["httpconn", "http.client"], default="httpconn",
                    help="how Sealion's queries travel: httpconn (a keep-alive socket read into one buffer, "
                         "bench/compare/httpconn.py) or Python's http.client, which parses each answer's "
                         "headers in Python (about 0.1 ms a query)")
    ap.add_argument("--systems", default=",".join(QUERY_SYSTEMS), help="query systems, comma-separated")
    ap.add_argument("--ingest-systems", default=None,
                    help="ingest systems, comma-separated ('' for no ingest; default: all of them with "
                         "--query-data cpu, none with --query-data iot)")
    ap.add_argument("--ingest-clients", default="1,2,4,8,16")
    ap.add_argument("--ingest-rows", type=int, default=None,
                    help="rows per ingest run (default: 50,000 quick, 1,000,000 full)")
    ap.add_argument("--ingest-runs", type=int, default=5)
    ap.add_argument("--single-row-rows", type=int, default=None,
                    help="rows per single-row ingest run: every system is also given one row per request (or "
                         "per COPY / INSERT) from each client count (default: 500 quick, 5,000 full; 0: none)")
    ap.add_argument("--ingest-data", choices=["cpu", "iot"], default="cpu",
                    help="rows the ingest runs send: cpu-only, or the IoT shape (trucks with jitter, gaps, sparse "
                         "rows and 5%% late, out-of-order rows; gen_iot.py)")
    ap.add_argument("--query-data", "--dataset", dest="query_data", choices=["cpu", "iot"], default="cpu",
                    help="rows the query systems load and the queries they are asked: TSBS cpu-only (gen.py, "
                         "queries.build), or the IoT shape (gen_iot.py, table `readings`, queries.build_iot; "
                         "the report is compare-<date>-<scale>-iot)")
    ap.add_argument("--iot-days", type=float, default=None,
                    help="days of IoT readings for --query-data iot (default: 2 quick, 3 full; "
                         "gen_iot.QUERY_DAYS)")
    ap.add_argument("--batch-rows", type=int, default=1000, help="rows per write request / COPY")
    ap.add_argument("--load-clients", type=int, default=4, help="clients loading the data set over line protocol")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per query per system (at least 5)")
    ap.add_argument("--min-time", type=float, default=0.25,
                    help="after --runs, keep timing a query while its runs add up to less than this many seconds")
    ap.add_argument("--max-runs", type=int, default=50, help="timed runs per query per system at most (--min-time)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--noise-runs", type=int, default=20)
    ap.add_argument("--only", default="", help="only the queries whose name contains this (several, comma-separated: any of them)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", type=Path, default=None, help="work dir (default: a new temp dir, removed at the end)")
    ap.add_argument("--keep-work", action="store_true", help="keep the work dir (data dirs, logs)")
    ap.add_argument("--data", type=Path, default=None,
                    help="where the generated files go (default: <work>/data; reused when the same scale and "
                         "seed are there)")
    ap.add_argument("--out", type=Path, default=HERE.parent / "results")
    ap.add_argument("--no-install", action="store_true", help="do not pip/apt install anything")
    a = ap.parse_args()
    if a.runs < 5:
        ap.error("--runs must be at least 5")
    if a.min_time < 0:
        ap.error("--min-time must not be negative")
    a.max_runs = max(a.max_runs, a.runs)
    systems = [s for s in a.systems.split(",") if s]
    if a.ingest_systems is None:
        a.ingest_systems = ",".join(INGEST_SYSTEMS) if a.query_data == "cpu" else ""
    ingest_systems = [s for s in a.ingest_systems.split(",") if s]
    if any(s.startswith("sealion") for s in systems + ingest_systems) and not a.sealion:
        ap.error("--sealion PATH is required")
    scale = SCALES[a.scale]
    ingest_rows = a.ingest_rows or (50_000 if a.scale == "quick" else 1_000_000)
    if a.single_row_rows is None:
        a.single_row_rows = 500 if a.scale == "quick" else 5_000
    clients = [int(c) for c in a.ingest_clients.split(",") if c]

    t_start = time.time()
    result: dict = {"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "command": shlex.join(["python3"] + sys.argv), "machine": machine(), "scale": a.scale,
                    "query_data": a.query_data,
                    "settings": {"runs": a.runs, "warmup": a.warmup, "noise_runs": a.noise_runs,
                                 "min_time_s": a.min_time, "max_runs": a.max_runs,
                                 "batch_rows": a.batch_rows, "load_clients": a.load_clients,
                                 "ingest_rows": ingest_rows, "ingest_runs": a.ingest_runs,
                                 "single_row_rows": a.single_row_rows,
                                 "ingest_clients": clients, "seed": a.seed, "only": a.only,
                                 "sealion_http_client": a.sealion_http_client},
                    "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]}
    if not a.no_install:
        result["installed"] = ensure_deps(ingest_systems, pip_installed)

    import gen
    import parity
    import queries
    import report
    import systems as sysmod
    sysmod.HTTP_CLIENT = a.sealion_http_client

    work = a.work or Path(tempfile.mkdtemp(prefix="sealion-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    data = a.data or work / "data"
    log(f"work dir {work}")

    if a.sealion:
        label = a.build_label or ("debug" if "/debug/" in str(a.sealion) else
                                  "release" if "/release/" in str(a.sealion) else "unknown")
        result["sealion_build"] = label
        result["sealion_binary"] = str(a.sealion.resolve())
        result["sealion_args"] = a.sealion_arg
        result["sealion_binary_mtime"] = dt.datetime.fromtimestamp(
            a.sealion.stat().st_mtime, dt.timezone.utc).isoformat(timespec="seconds")

    # What the query systems load: the cpu-only files in `data`, or the IoT
    # shape's in `data/iot` (apart from the files --ingest-data iot writes
    # into `data`, which are as many days as the ingest runs need).
    shape, qdata = sysmod.CPU_SHAPE, data
    if a.query_data == "cpu" or ingest_systems:
        t = time.perf_counter()
        log(f"generating {scale.rows:,} rows ({scale.hosts} hosts x {scale.readings_per_host:,} readings) "
            f"into {data}")
        cpu = gen.generate(scale, data, a.seed)
        cpu["generate_s"] = time.perf_counter() - t
        result["data" if a.query_data == "cpu" else "cpu_data"] = cpu
    if a.query_data == "iot":
        import gen_iot
        shape, qdata = sysmod.IOT_SHAPE, data / "iot"
        iot_days = a.iot_days or gen_iot.QUERY_DAYS.get(a.scale, gen_iot.QUERY_DAYS["full"])
        t = time.perf_counter()
        log(f"generating {iot_days:g} days of IoT readings ({gen_iot.trucks_of(scale)} trucks) into {qdata}")
        result["data"] = {"shape": "iot", **gen_iot.generate_iot(scale, qdata, a.seed, iot_days),
                          "generate_s": time.perf_counter() - t, "start": gen.iso(gen.START_S),
                          "end": gen.iso(gen.START_S + int(iot_days * gen.DAY_S)), "interval_s": gen.STEP_S}

    # Stop everything on SIGTERM too.
    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    running: list = []
    cluster = None
    qsys: dict[str, object] = {}
    try:
        span_s = scale.seconds if a.query_data == "cpu" else int(iot_days * gen.DAY_S)
        days = int(-(-span_s // gen.DAY_S))
        for name in systems:
            log(f"starting and loading {name}")
            if name == "sealion":
                s = sysmod.Sealion(a.sealion, work, a.sealion_arg)
            elif name == "sealion-cluster":
                s = sysmod.SealionClusterQueries(a.sealion, work)
            elif name == "sealion-pg":
                if "sealion" not in qsys:
                    result.setdefault("load_errors", {})[name] = "needs `sealion` before it in --systems"
                    continue
                s = sysmod.SealionPg(qsys["sealion"])
            elif name.startswith("postgres-"):
                if cluster is None:
                    cluster = sysmod.PostgresCluster(work)
                    cluster.start()
                s = sysmod.Postgres(cluster, name.split("-", 1)[1])
            elif name == "duckdb":
                s = sysmod.DuckDB(work)
            elif name == "chdb":
                s = sysmod.ChDB(work)
            elif name == "datafusion":
                s = sysmod.DataFusion(work)
            else:
                raise SystemExit(f"unknown system {name}")
            try:
                running.append(s)
                s.start()
                if name in ("sealion", "sealion-cluster"):
                    info = s.load(qdata, a.batch_rows, a.load_clients, shape)
                elif name == "sealion-pg":
                    info = s.load()
                elif name.startswith("postgres-"):
                    info = s.load(qdata, days, shape)
                else:
                    info = s.load(qdata, shape)
                info["version"] = s.version()
            except Exception as e:
                # A system that cannot start or load is left out, and said so.
                err = f"{type(e).__name__}: {str(e)[:2000]}"
                result.setdefault("load_errors", {})[name] = err
                log(f"  {name} left out: {err}")
                continue
            result.setdefault("load", {})[name] = info
            qsys[name] = s
            log(f"  {name}: {json.dumps({k: v for k, v in info.items() if k not in ('partitions', 'seal_answer')})}")
        if cluster is not None:
            result["postgres_settings"] = cluster.SETTINGS

        # Parity.
        qs = [q for q in (queries.build(scale) if a.query_data == "cpu" else queries.build_iot(scale, iot_days))
              if any(part in q.name for part in a.only.split(","))]
        result["queries"] = [{"name": q.name, "group": q.group, "sql": q.sql, "skip": q.skip} for q in qs]
        parity_res: dict[str, dict] = {}
        log(f"parity: {len(qs)} queries x {len(qsys)} systems")
        for q in qs:
            answers, errors, rows_n = {}, {}, {}
            for name, s in qsys.items():
                sql = q.sql.get(s.dialect)
                if sql is None:
                    continue
                try:
                    cols, rows = s.query(sql)
                    answers[name] = parity.canonical(cols, rows, q.by_name)
                    rows_n[name] = len(rows)
                except Exception as e:  # an error is a finding: recorded, withheld
                    errors[name] = f"{type(e).__name__}: {str(e).strip()[:1500]}"
            agree, differ = parity.groups(answers, prefer="postgres-plain")
            parity_res[q.name] = {"agree": agree, "differ": differ, "errors": errors, "rows": rows_n}
            bad = {**differ, **errors}
            if not answers and not errors:
                log(f"  {q.name}: not run: {'; '.join(q.skip.values()) or 'no system has it'}")
                continue
            log(f"  {q.name}: agree {agree}" + (f"; withheld {sorted(bad)}" if bad else ""))
        result["parity"] = parity_res

        # Timing, after parity: only the pairs that agree.
        timings: dict[str, dict] = {}
        oc = OtherCpu()
        oc.start()
        log(f"timing: {a.warmup} warm-up + {a.runs} runs per pair, more up to {a.max_runs} "
            f"while they add up to less than {a.min_time} s")
        for q in qs:
            timings[q.name] = {}
            for name in parity_res[q.name]["agree"]:
                s = qsys[name]
                sql = q.sql[s.dialect]
                try:
                    timings[q.name][name] = stats(timed(lambda: s.run(sql), a.warmup, a.runs,
                                                         a.min_time, a.max_runs))
                except Exception as e:
                    parity_res[q.name]["errors"][name] = f"while timing: {type(e).__name__}: {str(e)[:1500]}"
            if timings[q.name]:
                log(f"  {q.name}: " + ", ".join(f"{n} {t['median'] * 1e3:.1f} ms"
                                              for n, t in timings[q.name].items()))
        result["timings"] = timings
        noise = {}
        for name, s in qsys.items():
            noise[name] = stats(timed(lambda: s.run("SELECT 1"), a.warmup, a.noise_runs))
        result["noise_floor"] = noise
        if a.query_data == "cpu":
            # What reading every row costs each system: the reference for
            # the lookups with no time predicate (issue 7: at least 100x
            # faster than a full scan). No system can prune by an
            # expression over two fields, so each reads the two columns of
            # every row.
            scan = {}
            for name, s in qsys.items():
                try:
                    scan[name] = stats(timed(lambda: s.run(FULL_SCAN_SQL), a.warmup, a.runs,
                                             a.min_time, a.max_runs))
                except Exception as e:
                    scan[name] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
            result["full_scan"] = {"sql": FULL_SCAN_SQL, "timings": scan}
            log("full scan: " + ", ".join(f"{n} {t['median'] * 1e3:.1f} ms" for n, t in scan.items()
                                          if "median" in t))
        result["other_cpu_during_queries"] = oc.stop()
        log(f"noise floor: " + ", ".join(f"{n} {t['median'] * 1e3:.2f} ms" for n, t in noise.items()))

        disk = {}
        for name, s in qsys.items():
            try:
                disk[name] = s.disk()
            except Exception as e:
                disk[name] = {"error": f"{type(e).__name__}: {e}"}
        result["disk"] = disk

        # Ingest.
        if ingest_systems:
            result["ingest"] = ingest(a, data, work, ingest_systems, clients, ingest_rows, qsys, cluster, running,
                                      sysmod, result)
    except BaseException as e:
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
        log(f"ERROR {result['error']}\n{result['traceback']}")
    finally:
        for s in reversed(running):
            try:
                s.stop()
            except Exception as e:
                log(f"stopping {getattr(s, 'name', s)}: {e}")
        if cluster is not None:
            cluster.stop()
        result["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        result["wall_s"] = time.time() - t_start
        for name in ("sealion",):
            s = qsys.get(name)
            if s is not None and getattr(s, "log", None) and Path(s.log).exists():
                result["sealion_log_tail"] = Path(s.log).read_text(errors="replace")[-3000:]
        if not a.keep_work and a.work is None:
            shutil.rmtree(work, ignore_errors=True)

    a.out.mkdir(parents=True, exist_ok=True)
    stem = a.out / f"compare-{dt.date.today().isoformat()}-{a.scale}" \
        f"{'-iot' if a.query_data == 'iot' else '-iot-ingest' if a.ingest_data == 'iot' else ''}" \
        f"{'-' + result.get('sealion_build', '') if result.get('sealion_build') not in (None, 'release') else ''}"
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    report.write(result, stem)
    log(f"wrote {stem}.md, {stem}.json and charts in {result['wall_s']:.0f} s")
    return 1 if "error" in result else 0


def ingest(a, data, work, names, clients, rows, qsys, cluster, running, sysmod, result) -> dict:
    """Batches of ``--batch-rows`` rows from each client count: line
    protocol into Sealion (standalone, and a local cluster of 3 storage
    nodes at replication factor 1 and 3), VictoriaMetrics and InfluxDB;
    multi-row INSERT over pgwire into Sealion; COPY into PostgreSQL. Each
    run writes into a new table (measurement) so no run appends to another's;
    a warm-up run first. Rows/s is rows over the wall time of the run."""
    import gen
    shape = sysmod.CPU_SHAPE
    out_shape: dict = {"data": "cpu"}
    if a.ingest_data == "iot":
        import gen_iot
        shape = sysmod.IOT_SHAPE
        scale = gen.SCALES[a.scale]
        # Enough days of readings for `rows` rows, gaps included.
        days = round(max(0.05, 1.3 * rows / (gen_iot.trucks_of(scale) * 8_640)), 2)
        out_shape = {"data": "iot", **gen_iot.generate_iot(scale, data, a.seed, days)}
        log(f"ingest data: IoT shape {out_shape}")
    lp = gen.lp_batches(data / shape.lp, a.batch_rows, rows)
    csvb = csv_batches(data / shape.csv, a.batch_rows, rows)
    n_rows = sum(b.count(b"\n") for b in lp)
    targets: dict[str, object] = {}
    out: dict = {"rows_per_run": n_rows, "results": {}, "notes": {}, "load": {}, "disk": {}, "versions": {},
                 "shape": out_shape}

    def load_whole(name: str, s) -> None:
        """The whole data set once over line protocol, for bytes on disk."""
        secs, total = s.ingest_target().send_iter(gen.iter_lp_batches(data / "cpu.lp", a.batch_rows),
                                                  a.load_clients)
        out["load"][name] = {"rows": total, "load_s": secs, "rows_per_s": total / secs}
        out["disk"][name] = s.disk()

    for name in names:
        try:
            if name == "sealion":
                s = qsys.get("sealion")
                if s is None:
                    s = sysmod.Sealion(a.sealion, work, a.sealion_arg)
                    s.start()
                    running.append(s)
                targets[name] = ("lp", s.ingest_target())
            elif name == "sealion-pg":
                s = qsys.get("sealion") or next((x for x in running if getattr(x, "name", "") == "sealion"), None)
                if s is None:
                    s = sysmod.Sealion(a.sealion, work, a.sealion_arg)
                    s.start()
                    running.append(s)
                targets[name] = ("copy", sysmod.SealionPgIngest(s, shape))
                out["versions"][name] = "the `sealion` process: multi-row INSERT over pgwire (psycopg)"
            elif name.startswith("sealion-cluster-rf"):
                s = sysmod.SealionCluster(a.sealion, work, int(name.removeprefix("sealion-cluster-rf")))
                running.append(s)
                s.start()
                out["versions"][name] = s.version()
                load_whole(name, s)  # bytes on disk of every replica
                targets[name] = ("lp", s.ingest_target())
            elif name == "postgres":
                if cluster is None:
                    raise RuntimeError("PostgreSQL needs a postgres-* query system in --systems")
                c = cluster.connect()
                c.execute("DROP DATABASE IF EXISTS ingest")
                c.execute("CREATE DATABASE ingest")
                c.close()
                targets[name] = ("copy", sysmod.PostgresCopyIngest(cluster, "ingest", shape))
                out["versions"][name] = "COPY (FORMAT csv), same B-tree as postgres-plain"
            elif name in ("victoriametrics", "influxdb"):
                s = sysmod.VictoriaMetrics(work) if name == "victoriametrics" else sysmod.InfluxDB(work)
                s.start()
                running.append(s)
                out["versions"][name] = s.version()
                load_whole(name, s)
                targets[name] = ("lp", s.ingest_target())
            else:
                raise RuntimeError(f"unknown ingest system {name}")
        except Exception as e:
            out["notes"][name] = f"not measured: {type(e).__name__}: {e}"
            log(f"ingest {name}: {out['notes'][name]}")
    # Batched runs, then (unless --single-row-rows 0) the same systems given
    # one row per request; those results are named "<system> single rows".
    passes = [("", "", lp, csvb, n_rows)]
    if a.single_row_rows > 0:
        lp1 = gen.lp_batches(data / shape.lp, 1, a.single_row_rows)
        csv1 = csv_batches(data / shape.csv, 1, a.single_row_rows)
        out["single_row_rows"] = len(lp1)
        passes.append((SINGLE_ROWS, "_one", lp1, csv1, len(lp1)))
    oc = OtherCpu()
    oc.start()
    for suffix, tag, lpb, csvbb, nr in passes:
        per_batch = 1 if suffix else a.batch_rows
        log(f"ingest: {nr:,} rows per run, {per_batch} rows per batch, clients {clients}, "
            f"1 warm-up + {a.ingest_runs} runs, systems {list(targets)}")
        # Client counts are interleaved run by run (every count's warm-up,
        # then every count's first timed run, ...) rather than run one count
        # after another: a store's background work (RocksDB's flushes and
        # compactions of the rows just written) falls on whatever runs next,
        # and run in blocks it always fell on the same count.
        for r in range(-1, a.ingest_runs):  # -1: warm-up
            for c in clients:
                for name, (kind, tgt) in targets.items():
                    if name in out["notes"]:
                        continue
                    table = f"ingest{tag}_c{c}_{'w' if r < 0 else r}"
                    try:
                        if kind == "lp":
                            secs = tgt.send(sysmod.rename_lp(lpb, shape.measurement, table), c)
                        else:
                            secs = tgt.send(table, csvbb, c)
                    except Exception as e:
                        out["notes"][name] = (f"failed at {c} clients{suffix and ' (' + suffix.strip() + ')'}: "
                                              f"{type(e).__name__}: {str(e)[:1000]}")
                        log(f"ingest {name}: {out['notes'][name]}")
                        continue
                    if r >= 0:
                        out["results"].setdefault(name + suffix, {}).setdefault(str(c), []).append(nr / secs)
            log(f"  run {'warm-up' if r < 0 else r + 1} done")
        for c in clients:
            log(f"  {c} clients: " + ", ".join(
                f"{n} {sorted(v[str(c)])[len(v[str(c)]) // 2]:,.0f} rows/s" for n, v in out["results"].items()
                if str(c) in v and n.endswith(suffix) and (suffix or not n.endswith(SINGLE_ROWS))))
    out["other_cpu"] = oc.stop()
    out["stats"] = {n: {c: stats(v) for c, v in per.items()} for n, per in out["results"].items()}
    return out


if __name__ == "__main__":
    sys.exit(main())
