"""The systems of the comparison: how each is started, loaded, asked and stopped.

Each class has the same small interface:

- ``start()``: start the server (if any) in the run's temp dir on free
  loopback ports;
- ``load(data, ..., shape)``: load the generated rows (``data`` is gen.py's
  output dir, or gen_iot.py's for ``IOT_SHAPE``: table ``readings``, no
  ``events``) and return what the load took;
- ``query(sql)``: the answer as (column names, rows of Python values), for
  the parity check;
- ``run(sql)``: the answer fetched in the system's fastest client format
  (Arrow where there is one) and thrown away: what is timed;
- ``disk()``: bytes on disk of the loaded rows;
- ``version()``; ``stop()``.

Query systems: Sealion (``sealion standalone`` over HTTP, ``format=arrow``),
PostgreSQL (one temp cluster, a database ``plain`` with a B-tree on
(hostname, time) and a database ``part`` with the table partitioned by day,
asked over TCP with psycopg), DuckDB (a file database, in process), chDB
(a MergeTree table ordered by (hostname, time), partitioned by day, in
process) and DataFusion (over the Parquet files, in process).

Ingest-only systems: VictoriaMetrics and InfluxDB 1.x (Debian packages),
written with the same line protocol batches as Sealion.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path

import gen_iot
import httpconn
from gen import DAY_S, FIELDS, START_S, TAGS, iso

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def du(path: Path) -> int:
    """Bytes allocated on disk by ``path``, a file or everything under a
    directory (blocks, as a disk counts them, not apparent sizes)."""
    if os.path.isfile(path):
        return os.lstat(path).st_blocks * 512
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def wait_http(host: str, port: int, path: str, timeout: float, proc: subprocess.Popen | None = None,
              log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}; see {log}")
        try:
            c = http.client.HTTPConnection(host, port, timeout=2)
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            c.close()
            if r.status < 300:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{host}:{port}{path} not healthy after {timeout}s; see {log}")


def deb_version(pkg: str) -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def stop_proc(p: subprocess.Popen | None, timeout: float = 30) -> None:
    if p is None or p.poll() is not None:
        return
    p.terminate()
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


class LineProtocolWriter:
    """Sends line protocol request bodies to ``host:port`` + ``path`` from
    ``clients`` threads, one keep-alive connection each; batch i goes to
    client i % clients. Returns the wall time of the whole send."""

    def __init__(self, port: int, path: str, ok: tuple[int, ...] = (204,)):
        self.port, self.path, self.ok = port, path, ok

    def _post(self, c: http.client.HTTPConnection, body: bytes) -> None:
        c.request("POST", self.path, body=body, headers={"Content-Type": "text/plain"})
        r = c.getresponse()
        answer = r.read()
        if r.status not in self.ok:
            raise RuntimeError(f"write {self.path}: {r.status} {answer[:500]!r}")

    def send(self, batches: list[bytes], clients: int) -> float:
        def worker(k: int) -> None:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            for i in range(k, len(batches), clients):
                self._post(c, batches[i])
            c.close()

        t = time.perf_counter()
        with cf.ThreadPoolExecutor(clients) as ex:
            for f in [ex.submit(worker, k) for k in range(clients)]:
                f.result()
        return time.perf_counter() - t

    def send_iter(self, batches, clients: int) -> tuple[float, int]:
        """Like ``send``, for batches read as they go (a load of the whole
        data set): each client takes the next batch when it is free.
        Returns (seconds, rows)."""
        import threading
        lock, it, rows = threading.Lock(), iter(batches), [0] * clients

        def worker(k: int) -> None:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            while True:
                with lock:
                    b = next(it, None)
                if b is None:
                    break
                self._post(c, b)
                rows[k] += b.count(b"\n")
            c.close()

        t = time.perf_counter()
        with cf.ThreadPoolExecutor(clients) as ex:
            for f in [ex.submit(worker, k) for k in range(clients)]:
                f.result()
        return time.perf_counter() - t, sum(rows)


def binary_version(binary: Path) -> str:
    """What ``binary --version`` prints."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip()
    except OSError as e:
        return f"unknown ({e})"


def psycopg_query(conn, q: str):
    """Column names and every row of ``q`` over a psycopg connection."""
    with conn.cursor() as cur:
        cur.execute(q)
        return [d.name for d in cur.description], cur.fetchall()


def run_clients(worker, conns: list) -> float:
    """Runs ``worker(k)`` for each client k (one connection each in
    ``conns``) at once; returns the wall time; closes the connections."""
    try:
        t = time.perf_counter()
        with cf.ThreadPoolExecutor(len(conns)) as ex:
            for f in [ex.submit(worker, k) for k in range(len(conns))]:
                f.result()
        return time.perf_counter() - t
    finally:
        for c in conns:
            c.close()


def rename_lp(batches: list[bytes], old: str, new: str) -> list[bytes]:
    """The same batches with measurement ``old`` written as ``new``."""
    o, n = old.encode() + b",", new.encode() + b","
    return [n + b.removeprefix(o).replace(b"\n" + o, b"\n" + n) for b in batches]


# How Sealion's queries travel: "httpconn" (httpconn.Connection, a keep-alive
# socket read into one buffer) or "http.client" (Python's own); run.py's
# --sealion-http-client sets it.
HTTP_CLIENT = "httpconn"


# --------------------------------------------------------------------------
class Sealion:
    name = "sealion"
    dialect = "sealion"

    def __init__(self, binary: Path, work: Path, extra: list[str] | None = None):
        self.binary, self.dir = binary, work / "sealion"
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.http_port, self.pg_port = free_port(), free_port()
        self.log = self.dir / "sealion.log"
        cmd = [str(self.binary), "standalone", "--data-dir", str(self.dir / "data"),
               "--http-addr", f"127.0.0.1:{self.http_port}", "--pg-addr", f"127.0.0.1:{self.pg_port}",
               "--seal-check-interval-ms", "0", *self.extra]
        self.cmd = cmd
        env = dict(os.environ, SEALION_SEAL_CHECK_INTERVAL_MS="0")
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        wait_http("127.0.0.1", self.http_port, "/health", 300, self.proc, self.log)
        self.conn = self._connect()

    def _connect(self):
        """The connection queries go over: ``httpconn`` (the default; see
        that module for why) or, with ``HTTP_CLIENT = "http.client"``,
        Python's own, for comparing the two."""
        if HTTP_CLIENT == "http.client":
            return http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=3600)
        return httpconn.Connection("127.0.0.1", self.http_port, timeout=3600)

    def _post(self, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if isinstance(self.conn, httpconn.Connection):
            # Reconnects by itself when the server closed an idle connection.
            return self.conn.request("POST", path, body)
        for attempt in range(2):
            try:
                self.conn.request("POST", path, body=body)
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, ConnectionError):
                # A dropped keep-alive connection: reconnect once.
                self.conn.close()
                self.conn = self._connect()
                if attempt:
                    raise
        raise AssertionError

    def sql(self, q: str, fmt: str = "arrow") -> bytes:
        status, body = self._post(f"/api/v1/sql?db=public&format={fmt}", q.encode())
        if status >= 300:
            try:
                err = json.loads(body)
                msg = f"HTTP {status} sqlstate {err.get('sqlstate')}: {err.get('error')}"
            except ValueError:
                msg = f"HTTP {status}: {body[:1000]!r}"
            raise RuntimeError(msg)
        return body

    def table(self, q: str):
        import pyarrow as pa
        return pa.ipc.open_stream(self.sql(q)).read_all()

    def query(self, q: str):
        t = self.table(q)
        return t.column_names, [tuple(r.values()) for r in t.to_pylist()]

    def run(self, q: str) -> None:
        self.table(q)

    def load(self, data: Path, batch_rows: int, clients: int, shape: "IngestShape | None" = None) -> dict:
        from gen import iter_lp_batches
        shape = shape or CPU_SHAPE
        self.table_name = shape.measurement
        writer = LineProtocolWriter(self.http_port, "/api/v1/write?db=public&precision=s")
        batches = iter_lp_batches(data / shape.lp, batch_rows)
        # The first batch alone creates the table; then all clients at once.
        first = next(batches)
        s1, _ = writer.send_iter([first], 1)
        s2, rest = writer.send_iter(batches, clients)
        secs, rows = s1 + s2, first.count(b"\n") + rest
        if shape.events:
            writer.send_iter(iter_lp_batches(data / "events.lp", batch_rows), clients)
        t = time.perf_counter()
        seal = {}
        for table in (shape.measurement, *(("events",) if shape.events else ())):
            status, body = self._post(f"/api/v1/admin/seal?db=public&table={table}")
            if status >= 300:
                raise RuntimeError(f"seal {table}: HTTP {status} {body[:1000]!r}")
            seal[table] = body.decode(errors="replace")[:2000]
        seal_s = time.perf_counter() - t
        parts = json.loads(self.sql("SELECT * FROM system.partitions", "json"))
        return {"command": " ".join(self.cmd), "rows": rows, "load_s": secs, "rows_per_s": rows / secs,
                "clients": clients,
                "batch_rows": batch_rows, "seal_s": seal_s, "seal_answer": seal, "partitions": parts}

    def disk(self) -> dict:
        parts = json.loads(self.sql("SELECT * FROM system.partitions", "json"))
        cols = [c["name"] if isinstance(c, dict) else c for c in parts["columns"]]
        cpu_bytes = None
        table = getattr(self, "table_name", "cpu")
        tcol = "table_name" if "table_name" in cols else "table"
        if "bytes" in cols and tcol in cols:
            bi, ti = cols.index("bytes"), cols.index(tcol)
            cpu_bytes = sum(int(r[bi] or 0) for r in parts["rows"] if r[ti] == table)
        # Where the bytes are: sealed files, and RocksDB (open partitions'
        # rows) split into write-ahead logs and table files.
        # One walk, so the parts add up to the total even while RocksDB
        # deletes and compacts files in the background.
        root = self.dir / "data"
        split = {"data_dir_bytes": 0, "sealed_dir_bytes": 0, "rocksdb_dir_bytes": 0, "rocksdb_log_bytes": 0,
                 "rocksdb_sst_bytes": 0, "meta_dir_bytes": 0}
        for d, _, files in os.walk(root):
            rel = Path(d).relative_to(root).parts
            for f in files:
                try:
                    b = os.lstat(os.path.join(d, f)).st_blocks * 512
                except FileNotFoundError:
                    continue
                split["data_dir_bytes"] += b
                if rel[:2] == ("storage", "sealed"):
                    split["sealed_dir_bytes"] += b
                elif rel[:2] == ("storage", "rows"):
                    split["rocksdb_dir_bytes"] += b
                    if f.endswith(".log"):
                        split["rocksdb_log_bytes"] += b
                    elif f.endswith(".sst"):
                        split["rocksdb_sst_bytes"] += b
                elif rel[:1] == ("meta",):
                    split["meta_dir_bytes"] += b
        return {"table": table, "system_partitions_table_bytes": cpu_bytes, **split}

    def version(self) -> str:
        return binary_version(self.binary)

    def ingest_target(self):
        return LineProtocolWriter(self.http_port, "/api/v1/write?db=public&precision=s")

    def stop(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
        stop_proc(self.proc)


class SealionPg:
    """The same ``sealion standalone`` process asked over its PostgreSQL
    wire port with psycopg, as PostgreSQL is: a second Sealion column whose
    client path matches PostgreSQL's."""

    name = "sealion-pg"
    dialect = "sealion"

    def __init__(self, sealion: Sealion):
        self.sealion = sealion

    def start(self) -> None:
        import psycopg
        self.conn = psycopg.connect(host="127.0.0.1", port=self.sealion.pg_port, user="sealion", dbname="public",
                                    autocommit=True)

    def load(self) -> dict:
        return {"from": "the `sealion` process's data, over its PostgreSQL port"}

    def query(self, q: str):
        return psycopg_query(self.conn, q)

    def run(self, q: str) -> None:
        psycopg_query(self.conn, q)

    def disk(self) -> dict:
        return {"note": "see sealion"}

    def version(self) -> str:
        return self.sealion.version() + " (pgwire, psycopg)"

    def stop(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


class SealionCluster:
    """``sealion cluster``: one meta, three storage and one query process on
    loopback, each with its own data dir, every new partition on ``rf``
    storage nodes. Ingest only (line protocol to the query node)."""

    def __init__(self, binary: Path, work: Path, rf: int):
        self.binary, self.rf = binary, rf
        self.name = f"sealion-cluster-rf{rf}"
        self.dir = work / self.name
        self.proc: subprocess.Popen | None = None
        self.env: dict | None = None

    def _base_port(self) -> int:
        # Meta N listens on base+N, storage node N on base+100+N.
        import random
        for _ in range(100):
            base = random.randrange(20_000, 60_000, 200)
            ports = [base + 1] + [base + 100 + n for n in (1, 2, 3)]
            ok = True
            for port in ports:
                with socket.socket() as sk:
                    try:
                        sk.bind(("127.0.0.1", port))
                    except OSError:
                        ok = False
            if ok:
                return base
        raise RuntimeError("no free port range for the cluster")

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.http_port, self.pg_port = free_port(), free_port()
        self.log = self.dir / "cluster.log"
        self.cmd = [str(self.binary), "cluster", "--meta", "1", "--storage", "3", "--query", "1",
                    "--replication-factor", str(self.rf), "--data-dir", str(self.dir / "data"),
                    "--base-port", str(self._base_port()), "--http-port", str(self.http_port),
                    "--pg-port", str(self.pg_port)]
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env=self.env)
        wait_http("127.0.0.1", self.http_port, "/health", 300, self.proc, self.log)
        # Writes need every storage node registered (placement uses them all).
        deadline = time.time() + 120
        while True:
            c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
            try:
                c.request("POST", "/api/v1/sql?db=public&format=json",
                          body=b"SELECT count(*) FROM system.nodes WHERE role = 'storage' AND state = 'up'")
                r = c.getresponse()
                body = r.read()
                if r.status == 200 and json.loads(body)["rows"][0][0] >= 3:
                    return
            except (OSError, ValueError, KeyError, IndexError):
                pass
            finally:
                c.close()
            if time.time() > deadline:
                raise RuntimeError(f"{self.name}: three storage nodes not up after 120 s (log {self.log})")
            time.sleep(0.5)

    def ingest_target(self):
        return LineProtocolWriter(self.http_port, "/api/v1/write?db=public&precision=s")

    def disk(self) -> dict:
        return {"data_dir_bytes": du(self.dir / "data")}

    def version(self) -> str:
        return binary_version(self.binary) + f" (cluster: 1 meta, 3 storage, 1 query; replication factor {self.rf})"

    def stop(self) -> None:
        # SIGTERM to `sealion cluster`, which stops its processes; then the
        # whole process group, for any it left behind.
        stop_proc(self.proc, timeout=60)
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class SealionClusterQueries(Sealion):
    """``sealion cluster`` (one meta, three storage and one query process on
    loopback, replication factor 1) loaded and asked exactly as ``sealion``
    is, over HTTP: the same queries with the partitions spread over three
    nodes and every scan an Arrow Flight stream between processes."""

    name = "sealion-cluster"
    dialect = "sealion"

    def __init__(self, binary: Path, work: Path):
        super().__init__(binary, work)
        self.cluster = SealionCluster(binary, work, 1)
        self.cluster.name = self.name
        self.cluster.dir = self.dir = work / self.name
        # Background sealing off, as for standalone: the harness seals.
        self.cluster.env = dict(os.environ, SEALION_SEAL_CHECK_INTERVAL_MS="0")

    def start(self) -> None:
        self.cluster.start()
        self.cmd, self.http_port, self.pg_port = self.cluster.cmd, self.cluster.http_port, self.cluster.pg_port
        self.conn = self._connect()

    def disk(self) -> dict:
        return self.cluster.disk()

    def version(self) -> str:
        return self.cluster.version()

    def stop(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
        self.cluster.stop()


class SealionPgIngest:
    """Batched multi-row ``INSERT ... VALUES`` over Sealion's PostgreSQL wire
    port (psycopg), into a table created first with the cpu schema; one
    connection per client, batch i on client i % clients, each statement
    its own transaction. The statements are built before the clock starts."""

    def __init__(self, sealion: "Sealion", shape: IngestShape):
        self.sealion, self.shape = sealion, shape

    def statements(self, table: str, csv_batches: list[bytes]) -> list[str]:
        n = self.shape.n_tags
        out = []
        for b in csv_batches:
            rows = []
            for line in b.decode().splitlines():
                v = line.split(",")
                tags = ", ".join("'" + x.replace("'", "''") + "'" for x in v[1:1 + n])
                fields = ", ".join(x or "NULL" for x in v[1 + n:])
                rows.append(f"('{v[0]}', {tags}, {fields})")
            out.append(f"INSERT INTO {table} ({self.shape.csv_header}) VALUES " + ", ".join(rows))
        return out

    def send(self, table: str, batches: list[bytes], clients: int) -> float:
        import psycopg
        # The process also takes the line protocol runs, into `table`.
        table = "pg_" + table
        connect = lambda: psycopg.connect(host="127.0.0.1", port=self.sealion.pg_port, user="sealion",
                                          dbname="public", autocommit=True)
        with connect() as c:
            c.execute(f"CREATE TABLE {table} ({self.shape.columns_sealion})")
        stmts = self.statements(table, batches)
        conns = [connect() for _ in range(clients)]

        def worker(k: int) -> None:
            cur = conns[k].cursor()
            for i in range(k, len(stmts), clients):
                cur.execute(stmts[i])

        return run_clients(worker, conns)


# --------------------------------------------------------------------------
class PostgresCluster:
    """One PostgreSQL 15 cluster in the temp dir, run as user ``postgres``
    when this process is root (initdb refuses root)."""

    SETTINGS = {
        "shared_buffers": "2GB", "work_mem": "64MB", "maintenance_work_mem": "512MB",
        "effective_cache_size": "8GB", "max_parallel_workers_per_gather": "2",
        "random_page_cost": "1.1", "jit": "off", "max_wal_size": "4GB",
        "checkpoint_timeout": "30min", "timezone": "UTC", "fsync": "on",
        "synchronous_commit": "on",
    }

    def __init__(self, work: Path):
        self.dir = work / "postgres"
        self.proc_started = False

    def _as_pg(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        if os.geteuid() == 0:
            args = ["runuser", "-u", "postgres", "--"] + args
        return subprocess.run(args, check=True, capture_output=True, text=True, **kw)

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            os.chmod(self.dir, 0o700)
            # Every directory above must be traversable by postgres.
            for p in list(self.dir.parents)[:-1]:
                try:
                    os.chmod(p, os.stat(p).st_mode | 0o011)
                except PermissionError:
                    pass
        self.port = free_port()
        data = self.dir / "data"
        self._as_pg([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                     "-E", "UTF8", "--locale=C"])
        with open(data / "postgresql.conf", "a") as f:
            f.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.dir}'\n")
            for k, v in self.SETTINGS.items():
                f.write(f"{k} = '{v}'\n")
        self._as_pg([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "log.txt"), "-w", "-t", "120",
                     "start"])
        self.proc_started = True

    def connect(self, db: str = "postgres"):
        import psycopg
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=db, autocommit=True)

    def stop(self) -> None:
        if self.proc_started:
            try:
                self._as_pg([str(PG_BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop"])
            except subprocess.CalledProcessError as e:
                print(f"pg_ctl stop: {e.stderr}")
            self.proc_started = False


CPU_CSV_HEADER = ", ".join(["time", *TAGS, *FIELDS])
CPU_COLUMNS_SEALION = ("time TIMESTAMP NOT NULL, " + ", ".join(f"{t} TEXT" for t in TAGS) + ", "
                       + ", ".join(f"{f} DOUBLE" for f in FIELDS) + ", PRIMARY KEY (" + ", ".join(TAGS) + ", time)")
CPU_COLUMNS_PG = ("time timestamptz NOT NULL, " + ", ".join(f"{t} text NOT NULL" for t in TAGS) + ", "
                  + ", ".join(f"{f} double precision" for f in FIELDS))


@dataclasses.dataclass(frozen=True)
class IngestShape:
    """A data set's rows: its files (under the data dir), measurement (the
    table every system loads it into), columns and key. The ingest runs
    send one shape's rows; the query systems load one shape's rows
    (``--query-data``)."""
    name: str
    measurement: str
    lp: str
    csv: str
    columns_pg: str
    columns_sealion: str
    csv_header: str
    n_tags: int
    key: str  # PostgreSQL's B-tree is on (key, time); chDB and DuckDB order by it
    tags: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    parquet: str = "parquet"  # a file, or a directory of files
    events: bool = False  # the as-of join's `events` table comes with it
    nullable_fields: bool = False  # some rows lack some fields (NULL)


CPU_SHAPE = IngestShape("cpu", "cpu", "cpu.lp", "cpu.csv", CPU_COLUMNS_PG, CPU_COLUMNS_SEALION, CPU_CSV_HEADER,
                        len(TAGS), "hostname", tuple(TAGS), tuple(FIELDS), "parquet", events=True)
IOT_SHAPE = IngestShape("iot", "readings", "iot.lp", "iot.csv", gen_iot.IOT_COLUMNS_PG, gen_iot.IOT_COLUMNS_SEALION,
                        gen_iot.IOT_CSV_HEADER, len(gen_iot.IOT_TAGS), "name", tuple(gen_iot.IOT_TAGS),
                        tuple(gen_iot.IOT_FIELDS), "iot.parquet", nullable_fields=True)


def parquet_files(data: Path, shape: IngestShape) -> list[Path]:
    p = data / shape.parquet
    return sorted(p.glob("*.parquet")) if p.is_dir() else [p]


def parquet_glob(data: Path, shape: IngestShape) -> str:
    p = data / shape.parquet
    return f"{p}/*.parquet" if p.is_dir() else str(p)


class Postgres:
    """A PostgreSQL database of the shared cluster: ``plain`` (one table,
    B-tree on (hostname, time)) or ``part`` (partitioned by day on time,
    the same index on the parent)."""

    dialect = "postgres"

    def __init__(self, cluster: PostgresCluster, layout: str):
        self.cluster, self.layout = cluster, layout
        self.name = f"postgres-{layout}"

    def start(self) -> None:
        with self.cluster.connect() as c:
            c.execute(f"DROP DATABASE IF EXISTS {self.layout}")
            c.execute(f"CREATE DATABASE {self.layout}")
        self.conn = self.cluster.connect(self.layout)

    def load(self, data: Path, days: int, shape: "IngestShape | None" = None) -> dict:
        shape = shape or CPU_SHAPE
        c, tb = self.conn, shape.measurement
        self.table_name = tb
        if self.layout == "plain":
            c.execute(f"CREATE TABLE {tb} ({shape.columns_pg})")
        else:
            c.execute(f"CREATE TABLE {tb} ({shape.columns_pg}) PARTITION BY RANGE (time)")
            for d in range(days):
                # The IoT shape's jitter puts its first readings up to 2 s
                # before the start: its first day takes everything before.
                lo = "(MINVALUE)" if d == 0 and shape.name == "iot" else f"('{iso(START_S + d * DAY_S)}')"
                c.execute(f"CREATE TABLE {tb}_d{d:03} PARTITION OF {tb} FOR VALUES FROM "
                          f"{lo} TO ('{iso(START_S + (d + 1) * DAY_S)}')")
        if shape.events:
            c.execute("CREATE TABLE events (time timestamptz NOT NULL, hostname text NOT NULL, kind bigint)")
        t = time.perf_counter()
        rows = self.copy_csv(tb, data / shape.csv)
        copy_s = time.perf_counter() - t
        if shape.events:
            self.copy_csv("events", data / "events.csv")
        t = time.perf_counter()
        c.execute(f"CREATE INDEX ON {tb} ({shape.key}, time)")
        if shape.events:
            c.execute("CREATE INDEX ON events (hostname, time)")
        index_s = time.perf_counter() - t
        t = time.perf_counter()
        c.execute("VACUUM ANALYZE")
        vac_s = time.perf_counter() - t
        return {"rows": rows, "copy_s": copy_s, "rows_per_s": rows / copy_s, "index_s": index_s,
                "vacuum_analyze_s": vac_s}

    def copy_csv(self, table: str, path: Path) -> int:
        n = 0
        from gen import open_data
        with self.conn.cursor() as cur, open_data(path) as f:
            with cur.copy(f"COPY {table} FROM STDIN (FORMAT csv, HEADER true)") as cp:
                while chunk := f.read(1 << 20):
                    n += chunk.count(b"\n")
                    cp.write(chunk)
        return n - 1

    def query(self, q: str):
        return psycopg_query(self.conn, q)

    def run(self, q: str) -> None:
        psycopg_query(self.conn, q)

    def disk(self) -> dict:
        # pg_partition_tree lists a partitioned table and its partitions; a
        # plain table is measured on its own.
        tb = getattr(self, "table_name", "cpu")
        rels = f"SELECT relid FROM pg_partition_tree('{tb}')" if self.layout == "part" else f"SELECT '{tb}'::regclass"
        row = self.conn.execute(
            "SELECT coalesce(sum(pg_table_size(r)), 0), coalesce(sum(pg_indexes_size(r)), 0) "
            f"FROM ({rels}) AS t(r)").fetchone()
        return {"table_bytes": int(row[0]), "index_bytes": int(row[1]), "total_bytes": int(row[0] + row[1])}

    def version(self) -> str:
        return self.conn.execute("SELECT version()").fetchone()[0]

    def stop(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


class PostgresCopyIngest:
    """COPY of CSV batches into a fresh table per run (same index as the
    plain table), one connection per client, batch i on client i % clients,
    each batch its own COPY and transaction (autocommit)."""

    def __init__(self, cluster: PostgresCluster, db: str, shape: IngestShape):
        self.cluster, self.db, self.shape = cluster, db, shape

    def send(self, table: str, batches: list[bytes], clients: int) -> float:
        with self.cluster.connect(self.db) as c:
            c.execute(f"CREATE TABLE {table} ({self.shape.columns_pg})")
            c.execute(f"CREATE INDEX ON {table} ({self.shape.key}, time)")
        conns = [self.cluster.connect(self.db) for _ in range(clients)]

        def worker(k: int) -> None:
            cur = conns[k].cursor()
            for i in range(k, len(batches), clients):
                with cur.copy(f"COPY {table} FROM STDIN (FORMAT csv)") as cp:
                    cp.write(batches[i])

        return run_clients(worker, conns)


# --------------------------------------------------------------------------
class DuckDB:
    name = "duckdb"
    dialect = "duckdb"

    def __init__(self, work: Path):
        self.path = work / "duckdb" / "bench.duckdb"

    def start(self) -> None:
        import duckdb
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.con = duckdb.connect(str(self.path))
        self.con.execute("SET TimeZone = 'UTC'")

    def load(self, data: Path, shape: "IngestShape | None" = None) -> dict:
        shape = shape or CPU_SHAPE
        tb = shape.measurement
        t = time.perf_counter()
        self.con.execute(f"CREATE TABLE {tb} AS SELECT * FROM read_parquet('{parquet_glob(data, shape)}') "
                         f"ORDER BY {shape.key}, time")
        if shape.events:
            self.con.execute(f"CREATE TABLE events AS SELECT * FROM read_parquet('{data}/events.parquet') "
                             "ORDER BY hostname, time")
        self.con.execute("CHECKPOINT")
        secs = time.perf_counter() - t
        rows = self.con.execute(f"SELECT count(*) FROM {tb}").fetchone()[0]
        return {"rows": rows, "load_s": secs, "rows_per_s": rows / secs, "from": "Parquet"}

    def query(self, q: str):
        cur = self.con.execute(q)
        return [d[0] for d in cur.description], cur.fetchall()

    def run(self, q: str) -> None:
        self.con.sql(q).to_arrow_table()

    def disk(self) -> dict:
        return {"file_bytes": self.path.stat().st_size, "allocated_bytes": du(self.path.parent)}

    def version(self) -> str:
        import duckdb
        return f"DuckDB {duckdb.__version__}"

    def stop(self) -> None:
        try:
            self.con.close()
        except Exception:
            pass


class ChDB:
    name = "chdb"
    dialect = "chdb"

    def __init__(self, work: Path):
        self.dir = work / "chdb"

    def start(self) -> None:
        from chdb import session
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sess = session.Session(str(self.dir / "db"))
        self.sess.query("SELECT 1")

    def _q(self, q: str, fmt: str = "CSV"):
        return self.sess.query(q, fmt)

    def load(self, data: Path, shape: "IngestShape | None" = None) -> dict:
        shape = shape or CPU_SHAPE
        tb = self.table_name = shape.measurement
        # Fields that some rows lack are Nullable: a plain Float64 would
        # read a missing value as 0.
        ftype = "Nullable(Float64)" if shape.nullable_fields else "Float64"
        cols = ("time DateTime('UTC'), " + ", ".join(f"{t} String" for t in shape.tags) + ", "
                + ", ".join(f"{f} {ftype}" for f in shape.fields))
        self._q("CREATE DATABASE IF NOT EXISTS bench")
        self._q("USE bench")
        self._q(f"CREATE TABLE {tb} ({cols}) ENGINE = MergeTree PARTITION BY toDate(time) "
                f"ORDER BY ({shape.key}, time)")
        if shape.events:
            self._q("CREATE TABLE events (time DateTime('UTC'), hostname String, kind Int64) ENGINE = MergeTree "
                    "ORDER BY (hostname, time)")
        t = time.perf_counter()
        names = ", ".join(["time", *shape.tags, *shape.fields])
        self._q(f"INSERT INTO {tb} SELECT {names} FROM file('{parquet_glob(data, shape)}', Parquet)")
        if shape.events:
            self._q(f"INSERT INTO events SELECT time, hostname, kind FROM file('{data}/events.parquet', Parquet)")
        self._q(f"OPTIMIZE TABLE {tb} FINAL")
        if shape.events:
            self._q("OPTIMIZE TABLE events FINAL")
        secs = time.perf_counter() - t
        rows = int(str(self._q(f"SELECT count() FROM {tb}")).strip())
        return {"rows": rows, "load_s": secs, "rows_per_s": rows / secs, "from": "Parquet",
                "note": "includes OPTIMIZE TABLE FINAL (one part per day)"}

    def table(self, q: str):
        return self.sess.query(q, "ArrowTable")

    def query(self, q: str):
        t = self.table(q)
        return t.column_names, [tuple(r.values()) for r in t.to_pylist()]

    def run(self, q: str) -> None:
        self.table(q)

    def disk(self) -> dict:
        tb = getattr(self, "table_name", "cpu")
        b = str(self._q(f"SELECT sum(bytes_on_disk) FROM system.parts WHERE database = 'bench' AND table = '{tb}' "
                        "AND active")).strip()
        return {"parts_bytes": int(b or 0), "allocated_bytes_all_tables": du(self.dir / "db")}

    def version(self) -> str:
        import chdb
        v = str(self._q("SELECT version()")).strip().strip('"')
        return f"chDB {chdb.__version__} (ClickHouse {v})"

    def stop(self) -> None:
        try:
            self.sess.close()
        except Exception:
            pass


class DataFusion:
    name = "datafusion"
    dialect = "datafusion"

    def __init__(self, work: Path):
        pass

    def start(self) -> None:
        from datafusion import SessionConfig, SessionContext
        self.ctx = SessionContext(SessionConfig().with_target_partitions(2))

    def load(self, data: Path, shape: "IngestShape | None" = None) -> dict:
        shape = shape or CPU_SHAPE
        t = time.perf_counter()
        self.ctx.register_parquet(shape.measurement, str(data / shape.parquet))
        if shape.events:
            self.ctx.register_parquet("events", str(data / "events.parquet"))
        self.data, self.shape = data, shape
        return {"load_s": time.perf_counter() - t, "from": "Parquet (registered, not copied)"}

    def table(self, q: str):
        import pyarrow as pa
        batches = self.ctx.sql(q).collect()
        return pa.Table.from_batches(batches) if batches else None

    def query(self, q: str):
        df = self.ctx.sql(q)
        batches = df.collect()
        import pyarrow as pa
        if not batches:
            return [f.name for f in df.schema()], []
        t = pa.Table.from_batches(batches)
        return t.column_names, [tuple(r.values()) for r in t.to_pylist()]

    def run(self, q: str) -> None:
        self.ctx.sql(q).collect()

    def disk(self) -> dict:
        return {"parquet_bytes": sum(p.stat().st_size for p in parquet_files(self.data, self.shape))}

    def version(self) -> str:
        import datafusion
        return f"DataFusion (Python) {datafusion.__version__}"

    def stop(self) -> None:
        pass


# --------------------------------------------------------------------------
class VictoriaMetrics:
    """Ingest only: ``victoria-metrics`` with its Influx line protocol
    endpoint ``/write``."""

    name = "victoriametrics"

    def __init__(self, work: Path):
        self.dir = work / "victoriametrics"
        self.proc = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log = self.dir / "log.txt"
        self.proc = subprocess.Popen(
            [shutil.which("victoria-metrics") or "victoria-metrics", f"-httpListenAddr=127.0.0.1:{self.port}",
             f"-storageDataPath={self.dir / 'data'}", "-retentionPeriod=100y", "-search.disableCache"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_http("127.0.0.1", self.port, "/health", 60, self.proc, self.log)

    def ingest_target(self):
        return LineProtocolWriter(self.port, "/write?precision=s", ok=(204, 200))

    def flush(self) -> None:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("GET", "/internal/force_flush")
        c.getresponse().read()
        c.close()

    def disk(self) -> dict:
        """After a flush, waits (up to 60 s) until the data dir stops growing:
        VictoriaMetrics writes its in-memory parts in the background."""
        self.flush()
        last, same, waited = -1, 0, 0
        while waited < 60 and same < 2:
            time.sleep(2)
            waited += 2
            now = du(self.dir / "data" / "data") + du(self.dir / "data" / "indexdb")
            same = same + 1 if now == last else 0
            last = now
        return {"data_dir_bytes": last, "waited_s": waited,
                "note": "data/ and indexdb/ of -storageDataPath (caches left out)"}

    def version(self) -> str:
        # The Debian build prints an empty version; ask the package manager.
        return f"VictoriaMetrics {deb_version('victoria-metrics')} (Debian package)"

    def stop(self) -> None:
        stop_proc(self.proc)


class InfluxDB:
    """Ingest only: ``influxd`` 1.x with its own config in the temp dir."""

    name = "influxdb"

    def __init__(self, work: Path):
        self.dir = work / "influxdb"
        self.proc = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port, rpc = free_port(), free_port()
        conf = self.dir / "influxdb.conf"
        conf.write_text(f"""reporting-disabled = true
bind-address = "127.0.0.1:{rpc}"
[meta]
  dir = "{self.dir}/meta"
[data]
  dir = "{self.dir}/data"
  wal-dir = "{self.dir}/wal"
  query-log-enabled = false
  index-version = "tsi1"
[http]
  bind-address = "127.0.0.1:{self.port}"
  log-enabled = false
  max-body-size = 0
[monitor]
  store-enabled = false
""")
        self.log = self.dir / "log.txt"
        self.proc = subprocess.Popen([shutil.which("influxd") or "influxd", "run", "-config", str(conf)],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_http("127.0.0.1", self.port, "/ping", 60, self.proc, self.log)
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", "/query?" + urllib.parse.urlencode({"q": "CREATE DATABASE bench"}))
        c.getresponse().read()
        c.close()

    def ingest_target(self):
        return LineProtocolWriter(self.port, "/write?db=bench&precision=s", ok=(204,))

    def disk(self) -> dict:
        return {"data_dir_bytes": du(self.dir / "data"), "wal_dir_bytes": du(self.dir / "wal")}

    def version(self) -> str:
        return f"InfluxDB {deb_version('influxdb')} (Debian package)"

    def stop(self) -> None:
        stop_proc(self.proc)
