//! Query benchmark: Sealion as a user runs it (`sealion standalone`, and a
//! local cluster with three storage nodes) against DataFusion over zstd
//! Parquet files of the same rows, in the same run, with the same SQL.
//!
//! The data is TSBS cpu-only (10 tags, 10 fields, 10 s interval) for
//! `--hosts` hosts over `--days` days, written to Sealion as line protocol
//! over HTTP and sealed, and to one Parquet file per day (rows sorted by
//! host, then time, as a time-series writer lays them out).
//!
//! Queries: the TSBS devops set, the six of seed 002 (the as-of join is
//! Sealion's `asof_join`; DataFusion has no as-of join, and its SQL form (a
//! join then a window) is not run, so it is timed for Sealion only and said
//! so) and the no-time-predicate lookups of seed 000.
//! Every query is first run on every system and the answers compared
//! (floats to 9 significant digits); a query whose answers differ is not
//! timed and is listed as withheld. Then one warm-up and `--runs` timed runs
//! each; the report gives min / median / max, the ratio of medians, the
//! bytes the storage nodes shipped (EXPLAIN ANALYZE) and the noise floor
//! (`SELECT 1`). Sealion is asked over HTTP with `format=arrow`; DataFusion
//! runs in this process: the HTTP round trip is part of Sealion's times.
//!
//!   cargo build --release -p sealion -p sealion-bench
//!   target/release/query-bench --sealion target/release/sealion --hosts 100 --days 12 --runs 5

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use sealion_bench::tsbs::{FIELDS, TAGS, generate_hosts, median, parquet_file, sorted_by_host};

const DAY_NS: i64 = 86_400_000_000_000;
const HOUR_NS: i64 = 3_600_000_000_000;
const DAY0_NS: i64 = sealion_bench::tsbs::DAY0_NS;

struct Args {
    sealion: PathBuf,
    hosts: usize,
    days: usize,
    runs: usize,
    modes: Vec<String>,
    out: Option<PathBuf>,
    work: PathBuf,
    /// Only the queries whose name contains this.
    only: String,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        sealion: PathBuf::from("target/release/sealion"),
        hosts: 100,
        days: 12,
        runs: 5,
        modes: vec!["standalone".into(), "cluster".into()],
        out: None,
        work: std::env::temp_dir().join("sealion-query-bench"),
        only: String::new(),
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--sealion" => a.sealion = PathBuf::from(v),
            "--hosts" => a.hosts = v.parse()?,
            "--days" => a.days = v.parse()?,
            "--runs" => a.runs = v.parse()?,
            "--modes" => a.modes = v.split(',').map(str::to_string).collect(),
            "--out" => a.out = Some(PathBuf::from(v)),
            "--work" => a.work = PathBuf::from(v),
            "--only" => a.only = v,
            "--help" | "-h" => {
                println!(
                    "query-bench --sealion PATH [--hosts 100] [--days 12] [--runs 5] [--modes standalone,cluster] [--out FILE.md] [--work DIR] [--only NAME-PART]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}"),
        }
        i += 2;
    }
    if a.runs == 0 || a.hosts == 0 || a.days == 0 {
        bail!("--runs, --hosts and --days must be positive");
    }
    Ok(a)
}

fn ts(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// One query: a name, Sealion's SQL and DataFusion's (None: not timed on
/// DataFusion, with the reason).
struct Q {
    name: String,
    sealion: String,
    datafusion: Result<String, &'static str>,
}

/// A query asked in the same SQL of every system.
fn same(out: &mut Vec<Q>, name: &str, sql: String) {
    out.push(Q {
        name: name.into(),
        sealion: sql.clone(),
        datafusion: Ok(sql),
    })
}

fn queries(hosts: usize, days: usize) -> Vec<Q> {
    let mut rng = sealion_bench::tsbs::Rng(42);
    let host = |rng: &mut sealion_bench::tsbs::Rng| format!("host_{}", rng.below(hosts as u64));
    let span = days as i64 * DAY_NS;
    let start = |rng: &mut sealion_bench::tsbs::Rng, len: i64| {
        DAY0_NS + (rng.below(((span - len) / HOUR_NS).max(1) as u64) as i64) * HOUR_NS
    };
    let hosts_in = |rng: &mut sealion_bench::tsbs::Rng, n: usize| {
        let mut v: Vec<String> = (0..n).map(|_| format!("'{}'", host(rng))).collect();
        v.sort();
        v.dedup();
        v.join(", ")
    };
    let metrics = |n: usize| FIELDS[..n].to_vec();
    let mut out = Vec::new();
    for (name, nmetrics, nhosts, hours) in [
        ("single-groupby-1-1-1", 1, 1, 1),
        ("single-groupby-1-1-12", 1, 1, 12),
        ("single-groupby-1-8-1", 1, 8, 1),
        ("single-groupby-5-1-1", 5, 1, 1),
        ("single-groupby-5-1-12", 5, 1, 12),
        ("single-groupby-5-8-1", 5, 8, 1),
    ] {
        let t0 = start(&mut rng, hours * HOUR_NS);
        let sel: Vec<String> = metrics(nmetrics)
            .iter()
            .map(|m| format!("max({m})"))
            .collect();
        same(
            &mut out,
            name,
            format!(
                "SELECT date_bin(INTERVAL '1 minute', time) AS minute, {} FROM cpu WHERE hostname IN ({}) AND time >= '{}' AND time < '{}' GROUP BY minute ORDER BY minute",
                sel.join(", "),
                hosts_in(&mut rng, nhosts),
                ts(t0),
                ts(t0 + hours * HOUR_NS)
            ),
        );
    }
    for (name, nhosts) in [("cpu-max-all-1", 1), ("cpu-max-all-8", 8)] {
        let t0 = start(&mut rng, 8 * HOUR_NS);
        let sel: Vec<String> = FIELDS.iter().map(|m| format!("max({m})")).collect();
        same(
            &mut out,
            name,
            format!(
                "SELECT date_bin(INTERVAL '1 hour', time) AS hour, {} FROM cpu WHERE hostname IN ({}) AND time >= '{}' AND time < '{}' GROUP BY hour ORDER BY hour",
                sel.join(", "),
                hosts_in(&mut rng, nhosts),
                ts(t0),
                ts(t0 + 8 * HOUR_NS)
            ),
        );
    }
    for (name, nmetrics) in [
        ("double-groupby-1", 1),
        ("double-groupby-5", 5),
        ("double-groupby-all", 10),
    ] {
        let t0 = start(&mut rng, 12 * HOUR_NS);
        let sel: Vec<String> = metrics(nmetrics)
            .iter()
            .map(|m| format!("avg({m})"))
            .collect();
        same(
            &mut out,
            name,
            format!(
                "SELECT hostname, date_bin(INTERVAL '1 hour', time) AS hour, {} FROM cpu WHERE time >= '{}' AND time < '{}' GROUP BY hostname, hour ORDER BY hostname, hour",
                sel.join(", "),
                ts(t0),
                ts(t0 + 12 * HOUR_NS)
            ),
        );
    }
    let t0 = start(&mut rng, 12 * HOUR_NS);
    same(
        &mut out,
        "high-cpu-1",
        format!(
            "SELECT * FROM cpu WHERE usage_user > 90.0 AND hostname = '{}' AND time >= '{}' AND time < '{}' ORDER BY time",
            host(&mut rng),
            ts(t0),
            ts(t0 + 12 * HOUR_NS)
        ),
    );
    let t0 = start(&mut rng, 12 * HOUR_NS);
    same(
        &mut out,
        "high-cpu-all",
        format!(
            "SELECT count(*), max(usage_user), min(usage_system) FROM cpu WHERE usage_user > 90.0 AND time >= '{}' AND time < '{}'",
            ts(t0),
            ts(t0 + 12 * HOUR_NS)
        ),
    );
    same(
        &mut out,
        "lastpoint",
        "SELECT DISTINCT ON (hostname) hostname, time, usage_user FROM cpu ORDER BY hostname, time DESC".into(),
    );
    let t0 = start(&mut rng, 6 * HOUR_NS);
    same(
        &mut out,
        "groupby-orderby-limit",
        format!(
            "SELECT date_bin(INTERVAL '1 minute', time) AS minute, max(usage_user) FROM cpu WHERE time < '{}' GROUP BY minute ORDER BY minute DESC LIMIT 5",
            ts(t0 + 6 * HOUR_NS)
        ),
    );
    // Seed 002.
    let day = DAY0_NS + (days as i64 / 2) * DAY_NS;
    same(
        &mut out,
        "002 per-host aggregates over a day",
        format!(
            "SELECT hostname, count(*), avg(usage_user), max(usage_system), min(usage_idle) FROM cpu WHERE time >= '{}' AND time < '{}' GROUP BY hostname ORDER BY hostname",
            ts(day),
            ts(day + DAY_NS)
        ),
    );
    let week = DAY0_NS + (days as i64 - 7).max(0) * DAY_NS;
    same(
        &mut out,
        "002 fleet aggregates over a week",
        format!(
            "SELECT date_bin(INTERVAL '1 hour', time) AS hour, avg(usage_user), max(usage_user), count(*) FROM cpu WHERE time >= '{}' AND time < '{}' GROUP BY hour ORDER BY hour",
            ts(week),
            ts(week + 7 * DAY_NS)
        ),
    );
    same(
        &mut out,
        "002 selective filter",
        format!(
            "SELECT time, usage_user, usage_system FROM cpu WHERE hostname = '{}' AND usage_user > 95.0 AND time >= '{}' AND time < '{}' ORDER BY time",
            host(&mut rng),
            ts(day),
            ts(day + DAY_NS)
        ),
    );
    same(
        &mut out,
        "002 top ten",
        format!(
            "SELECT hostname, max(usage_user) AS m FROM cpu WHERE time >= '{}' AND time < '{}' GROUP BY hostname ORDER BY m DESC, hostname LIMIT 10",
            ts(day),
            ts(day + DAY_NS)
        ),
    );
    out.push(Q {
        name: "002 as-of join (events to readings)".into(),
        sealion: "SELECT count(*), avg(cpu_usage_user) FROM asof_join('events', 'cpu', 'hostname')"
            .into(),
        datafusion: Err("DataFusion has no as-of join; its SQL form (a join on host and time <= then a window) was not run here"),
    });
    // Seed 000: no time predicate.
    let h = host(&mut rng);
    same(
        &mut out,
        "000 one host's latest row",
        format!("SELECT * FROM cpu WHERE hostname = '{h}' ORDER BY time DESC LIMIT 1"),
    );
    same(
        &mut out,
        "000 one host's rows over all history",
        format!("SELECT time, usage_user FROM cpu WHERE hostname = '{h}' ORDER BY time"),
    );
    same(
        &mut out,
        "000 per-host count over all history",
        "SELECT hostname, count(*) FROM cpu GROUP BY hostname ORDER BY hostname".into(),
    );
    same(
        &mut out,
        "000 newest three readings of every host",
        "SELECT hostname, time, usage_user FROM (SELECT hostname, time, usage_user, row_number() OVER (PARTITION BY hostname ORDER BY time DESC) AS rn FROM cpu) AS t WHERE rn <= 3".into(),
    );
    out
}

/// Rows as comparable text (floats to 9 significant digits).
fn canonical(batches: &[RecordBatch]) -> anyhow::Result<Vec<String>> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        // Columns in name order: `SELECT *` lists them in each system's
        // own table order.
        let mut names: Vec<(String, usize)> = b
            .schema()
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name().clone(), i))
            .collect();
        names.sort();
        let cols: Vec<arrow::array::ArrayRef> = names
            .iter()
            .map(|(_, i)| b.column(*i))
            .map(|c| match c.data_type() {
                DataType::Timestamp(u, _) => {
                    arrow::compute::cast(c, &DataType::Timestamp(*u, None)).map_err(Into::into)
                }
                _ => Ok::<_, anyhow::Error>(c.clone()),
            })
            .collect::<Result<_, _>>()?;
        let formatters = cols
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        for r in 0..b.num_rows() {
            let mut cells = Vec::new();
            for (c, f) in cols.iter().zip(&formatters) {
                if c.data_type() == &DataType::Float64 && c.is_valid(r) {
                    let v = c.as_primitive::<Float64Type>().value(r);
                    cells.push(format!("{v:.9e}"));
                } else {
                    cells.push(f.value(r).to_string());
                }
            }
            rows.push(cells.join("|"));
        }
    }
    Ok(rows)
}

/// Counters of one query's scans.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    bytes_shipped: f64,
    partitions_read: u64,
    partitions_total: u64,
}

/// The sum of every `name<number>[ K|M|G]` in `text`.
fn sum_metric(text: &str, name: &str) -> f64 {
    let mut total = 0.0;
    for part in text.split(name).skip(1) {
        let num: String = part
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let rest = part[num.len()..].trim_start();
        let scale = match rest.chars().next() {
            Some('K') => 1e3,
            Some('M') => 1e6,
            Some('G') => 1e9,
            _ => 1.0,
        };
        total += num.parse::<f64>().unwrap_or(0.0) * scale;
    }
    total
}

struct Sealion {
    children: Vec<Child>,
    http: String,
    client: reqwest::Client,
}

impl Drop for Sealion {
    fn drop(&mut self) {
        // SIGTERM: a cluster launcher stops its children on it.
        for c in &mut self.children {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18_080)
}

impl Sealion {
    async fn start(bin: &Path, mode: &str, dir: &Path) -> anyhow::Result<Sealion> {
        std::fs::create_dir_all(dir)?;
        let http_port = free_port();
        let pg_port = free_port();
        let mut cmd = Command::new(bin);
        match mode {
            "standalone" => {
                cmd.args(["standalone", "--data-dir"]).arg(dir.join("data"));
            }
            "cluster" => {
                let base = 21_000 + (std::process::id() % 200) as u16 * 50;
                cmd.args([
                    "cluster",
                    "--meta",
                    "1",
                    "--storage",
                    "3",
                    "--query",
                    "1",
                    "--replication-factor",
                    "1",
                    "--data-dir",
                ])
                .arg(dir.join("data"))
                .args(["--base-port", &base.to_string()]);
            }
            other => bail!("unknown mode {other}"),
        }
        match mode {
            "standalone" => cmd.args([
                "--http-addr",
                &format!("127.0.0.1:{http_port}"),
                "--pg-addr",
                &format!("127.0.0.1:{pg_port}"),
                "--seal-check-interval-ms",
                "0",
            ]),
            _ => cmd.args([
                "--http-port",
                &http_port.to_string(),
                "--pg-port",
                &pg_port.to_string(),
            ]),
        };
        let log = std::fs::File::create(dir.join("sealion.log"))?;
        cmd.stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        cmd.env("SEALION_SEAL_CHECK_INTERVAL_MS", "0");
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let s = Sealion {
            children: vec![child],
            http: format!("http://127.0.0.1:{http_port}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(3_600))
                .build()?,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(r) = s.client.get(format!("{}/health", s.http)).send().await
                && r.status().is_success()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "Sealion ({mode}) did not become healthy; see {}",
                    dir.join("sealion.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if mode == "cluster" {
            // Every storage node has reported in.
            let deadline = Instant::now() + Duration::from_secs(60);
            while s
                .rows_text("SELECT count(*) FROM system.nodes WHERE state = 'up'")
                .await
                .map(|r| r.first().map(String::as_str) != Some("3"))
                .unwrap_or(true)
            {
                if Instant::now() > deadline {
                    bail!("storage nodes did not come up");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(s)
    }

    async fn write(&self, body: String) -> anyhow::Result<()> {
        let r = self
            .client
            .post(format!("{}/api/v1/write?db=public", self.http))
            .body(body)
            .send()
            .await?;
        if r.status().as_u16() != 204 {
            bail!("write: {} {}", r.status(), r.text().await?);
        }
        Ok(())
    }

    /// The answer as Arrow batches.
    async fn query(&self, sql: &str) -> anyhow::Result<Vec<RecordBatch>> {
        let r = self
            .client
            .get(format!("{}/api/v1/sql", self.http))
            .query(&[("db", "public"), ("q", sql), ("format", "arrow")])
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("{sql}: {} {}", r.status(), r.text().await?);
        }
        let bytes = r.bytes().await?;
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
        Ok(reader.collect::<Result<Vec<_>, _>>()?)
    }

    /// First column of each row, as text (JSON answer).
    async fn rows_text(&self, sql: &str) -> anyhow::Result<Vec<String>> {
        let r = self
            .client
            .get(format!("{}/api/v1/sql", self.http))
            .query(&[("db", "public"), ("q", sql)])
            .send()
            .await?;
        let v: serde_json::Value = r.json().await?;
        Ok(v["rows"]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .map(|r| match &r[0] {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// What EXPLAIN ANALYZE says the scans of `sql` did: bytes the storage
    /// nodes shipped, partitions read, partitions in the table.
    async fn counters(&self, sql: &str) -> anyhow::Result<Counters> {
        let r = self
            .client
            .get(format!("{}/api/v1/sql", self.http))
            .query(&[("db", "public"), ("q", &format!("EXPLAIN ANALYZE {sql}"))])
            .send()
            .await?;
        let text = r.text().await?;
        Ok(Counters {
            bytes_shipped: sum_metric(&text, "bytes_shipped="),
            partitions_read: sum_metric(&text, "partitions_read=") as u64,
            partitions_total: sum_metric(&text, "partitions_total=") as u64,
        })
    }

    async fn seal_all(&self) -> anyhow::Result<()> {
        for table in ["cpu", "events"] {
            let r = self
                .client
                .post(format!(
                    "{}/api/v1/admin/seal?db=public&table={table}",
                    self.http
                ))
                .send()
                .await?;
            if !r.status().is_success() {
                bail!("seal {table}: {}", r.text().await?);
            }
        }
        Ok(())
    }
}

fn line_protocol(batch: &RecordBatch) -> String {
    let mut out = String::with_capacity(batch.num_rows() * 400);
    let time = batch
        .column(0)
        .as_primitive::<arrow::datatypes::TimestampNanosecondType>();
    let tags: Vec<_> = (1..=TAGS.len())
        .map(|i| batch.column(i).as_string::<i32>())
        .collect();
    let fields: Vec<_> = (0..FIELDS.len())
        .map(|i| {
            batch
                .column(1 + TAGS.len() + i)
                .as_primitive::<Float64Type>()
        })
        .collect();
    for r in 0..batch.num_rows() {
        out.push_str("cpu");
        for (t, col) in TAGS.iter().zip(&tags) {
            out.push(',');
            out.push_str(t);
            out.push('=');
            out.push_str(col.value(r));
        }
        for (k, (f, col)) in FIELDS.iter().zip(&fields).enumerate() {
            out.push(if k == 0 { ' ' } else { ',' });
            out.push_str(f);
            out.push('=');
            out.push_str(&format!("{:?}", col.value(r)));
        }
        out.push(' ');
        out.push_str(&time.value(r).to_string());
        out.push('\n');
    }
    out
}

/// Events for the as-of join: one per host about every ten minutes, at
/// times that are not on the readings' 10 s grid.
fn events(hosts: usize, days: usize) -> String {
    let mut rng = sealion_bench::tsbs::Rng(7);
    let mut out = String::new();
    let per_host = days * 144;
    for h in 0..hosts {
        for k in 0..per_host {
            let t =
                DAY0_NS + k as i64 * 600_000_000_000 + (rng.below(590_000) as i64 + 3) * 1_000_000;
            out.push_str(&format!(
                "events,hostname=host_{h} kind={}i {t}\n",
                rng.below(5)
            ));
        }
    }
    out
}

type Timing = (f64, f64, f64);

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

async fn time_async<F, Fut>(runs: usize, mut f: F) -> anyhow::Result<Timing>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    f().await?;
    let mut secs = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f().await?;
        secs.push(t.elapsed().as_secs_f64());
    }
    Ok(median(secs))
}

fn ms(t: Timing) -> String {
    format!("{:.1} ({:.1}–{:.1})", t.1 * 1e3, t.0 * 1e3, t.2 * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let _ = std::fs::remove_dir_all(&args.work);
    std::fs::create_dir_all(args.work.join("parquet"))?;
    let rows_per_host = args.days * 8_640;
    let total_rows = rows_per_host * args.hosts;
    eprintln!(
        "generating {total_rows} rows ({} hosts, {} days)",
        args.hosts, args.days
    );

    // Parquet, one file per day, rows sorted by host then time.
    let t = Instant::now();
    let mut day_batches: Vec<Vec<RecordBatch>> = vec![Vec::new(); args.days];
    for b in generate_hosts(0, args.hosts, rows_per_host, 8_640 * args.hosts) {
        let day = ((b
            .column(0)
            .as_primitive::<arrow::datatypes::TimestampNanosecondType>()
            .value(0)
            - DAY0_NS)
            / DAY_NS) as usize;
        day_batches[day.min(args.days - 1)].push(b);
    }
    let mut parquet_bytes = 0;
    for (d, batches) in day_batches.iter().enumerate() {
        let sorted = sorted_by_host(batches, args.hosts)?;
        let bytes = parquet_file(&sorted)?;
        parquet_bytes += bytes.len();
        std::fs::write(
            args.work
                .join("parquet")
                .join(format!("day-{d:03}.parquet")),
            bytes,
        )?;
    }
    eprintln!(
        "parquet written in {:.1}s ({parquet_bytes} bytes)",
        t.elapsed().as_secs_f64()
    );

    let df = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
    df.register_parquet(
        "cpu",
        args.work.join("parquet").to_str().context("path")?,
        ParquetReadOptions::default(),
    )
    .await?;

    let qs: Vec<Q> = queries(args.hosts, args.days)
        .into_iter()
        .filter(|q| q.name.contains(&args.only))
        .collect();
    // results[query][system] = timing
    let mut results: BTreeMap<String, BTreeMap<String, Result<Timing, String>>> = BTreeMap::new();
    let mut shipped: BTreeMap<(String, String), Counters> = BTreeMap::new();
    let mut reference: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut load_notes = Vec::new();

    // DataFusion first: its answers are the reference.
    for q in &qs {
        let entry = results.entry(q.name.clone()).or_default();
        match &q.datafusion {
            Ok(sql) => {
                let batches = df.sql(sql).await?.collect().await?;
                let mut rows = canonical(&batches)?;
                rows.sort();
                reference.insert(q.name.clone(), rows);
                let timing = time_async(args.runs, || async {
                    df.sql(sql).await?.collect().await?;
                    Ok(())
                })
                .await?;
                entry.insert("datafusion".into(), Ok(timing));
            }
            Err(why) => {
                entry.insert("datafusion".into(), Err((*why).to_string()));
            }
        }
    }
    let noise_df = time_async(args.runs, || async {
        df.sql("SELECT 1").await?.collect().await?;
        Ok(())
    })
    .await?;
    let mut noise = vec![("datafusion".to_string(), noise_df)];

    for mode in &args.modes {
        let dir = args.work.join(mode);
        let s = Sealion::start(&args.sealion, mode, &dir).await?;
        let t = Instant::now();
        // Four writers at once, 10,000 rows a request.
        let batches = generate_hosts(0, args.hosts, rows_per_host, 10_000);
        send_all(batches, &s).await?;
        s.write(events(args.hosts, args.days)).await?;
        let load = t.elapsed().as_secs_f64();
        let t = Instant::now();
        s.seal_all().await?;
        let seal = t.elapsed().as_secs_f64();
        load_notes.push(format!(
            "{mode}: loaded {total_rows} rows in {load:.1}s ({:.0} rows/s over HTTP line protocol, 4 writers), sealed in {seal:.1}s",
            total_rows as f64 / load
        ));
        eprintln!("{}", load_notes.last().unwrap_or(&String::new()));
        for q in &qs {
            let got = s.query(&q.sealion).await;
            let entry = results.entry(q.name.clone()).or_default();
            let batches = match got {
                Ok(b) => b,
                Err(e) => {
                    entry.insert(mode.clone(), Err(format!("error: {e}")));
                    continue;
                }
            };
            let mut rows = canonical(&batches)?;
            rows.sort();
            if let Some(want) = reference.get(&q.name)
                && &rows != want
            {
                entry.insert(
                    mode.clone(),
                    Err(format!(
                        "withheld: {} rows differ from DataFusion's {} (first: {:?} vs {:?})",
                        rows.len(),
                        want.len(),
                        rows.first(),
                        want.first()
                    )),
                );
                continue;
            }
            let timing = time_async(args.runs, || async {
                s.query(&q.sealion).await?;
                Ok(())
            })
            .await?;
            entry.insert(mode.clone(), Ok(timing));
            shipped.insert(
                (q.name.clone(), mode.clone()),
                s.counters(&q.sealion).await?,
            );
        }
        let n = time_async(args.runs, || async {
            s.query("SELECT 1").await?;
            Ok(())
        })
        .await?;
        noise.push((mode.clone(), n));
        drop(s);
    }

    // The report.
    let mut md = String::new();
    md.push_str(&format!(
        "# Query benchmark: Sealion against DataFusion over Parquet\n\n{} rows of TSBS cpu-only data ({} hosts, {} days, 10 s), the same SQL on every system. Times in ms: median (min–max) of {} runs after one warm-up. Ratio: DataFusion's median over Sealion's (above 1: Sealion is faster). Bytes: what the storage nodes shipped to the query node (EXPLAIN ANALYZE `bytes_shipped`); partitions: how many the nodes read (`partitions_read`) of those in the table (`partitions_total`).\n\n",
        total_rows, args.hosts, args.days, args.runs
    ));
    md.push_str(&format!(
        "Machine: {}, {} cores. Sealion over HTTP (`format=arrow`) from this process; DataFusion {} in this process, 2 target partitions, over {} zstd Parquet files ({} bytes).\n\n",
        cpu_model(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        datafusion::DATAFUSION_VERSION,
        args.days,
        parquet_bytes
    ));
    for n in &load_notes {
        md.push_str(&format!("- {n}\n"));
    }
    md.push_str("\nNoise floor (`SELECT 1`): ");
    let noise_text: Vec<String> = noise
        .iter()
        .map(|(m, t)| format!("{m} {}", ms(*t)))
        .collect();
    md.push_str(&noise_text.join(", "));
    md.push_str("\n\n| query | DataFusion | ");
    for m in &args.modes {
        md.push_str(&format!(
            "Sealion {m} | ratio | bytes shipped | partitions read / in table | "
        ));
    }
    md.push_str("\n|---|---|");
    for _ in &args.modes {
        md.push_str("---|---|---|---|");
    }
    md.push('\n');
    let mut withheld = Vec::new();
    for q in &qs {
        let r = &results[&q.name];
        let df_t = r.get("datafusion");
        md.push_str(&format!(
            "| {} | {} |",
            q.name,
            match df_t {
                Some(Ok(t)) => ms(*t),
                Some(Err(_)) => "not run".into(),
                None => "-".into(),
            }
        ));
        for m in &args.modes {
            match r.get(m) {
                Some(Ok(t)) => {
                    let ratio = match df_t {
                        Some(Ok(d)) => format!("{:.2}x", d.1 / t.1),
                        _ => "-".into(),
                    };
                    let c = shipped
                        .get(&(q.name.clone(), m.clone()))
                        .copied()
                        .unwrap_or_default();
                    md.push_str(&format!(
                        " {} | {ratio} | {:.0} | {} / {} |",
                        ms(*t),
                        c.bytes_shipped,
                        c.partitions_read,
                        c.partitions_total
                    ));
                }
                Some(Err(e)) => {
                    withheld.push(format!("{} on {m}: {e}", q.name));
                    md.push_str(" withheld | - | - | - |");
                }
                None => md.push_str(" - | - | - | - |"),
            }
        }
        md.push('\n');
        if let Some(Err(why)) = df_t {
            withheld.push(format!("{} on DataFusion: {why}", q.name));
        }
    }
    if !withheld.is_empty() {
        md.push_str("\nWithheld or not run:\n\n");
        for w in withheld {
            md.push_str(&format!("- {w}\n"));
        }
    }
    md.push_str("\nSQL of every query:\n\n");
    for q in &qs {
        md.push_str(&format!("- {}: `{}`\n", q.name, q.sealion));
    }
    match &args.out {
        Some(p) => std::fs::write(p, &md)?,
        None => print!("{md}"),
    }
    Ok(())
}

/// Sends `batches` as line protocol, four requests in flight.
async fn send_all(batches: Vec<RecordBatch>, s: &Sealion) -> anyhow::Result<()> {
    let mut inflight = Vec::new();
    for b in batches {
        inflight.push(s.write(line_protocol(&b)));
        if inflight.len() == 4 {
            for r in futures::future::join_all(inflight.drain(..)).await {
                r?;
            }
        }
    }
    for r in futures::future::join_all(inflight).await {
        r?;
    }
    Ok(())
}
