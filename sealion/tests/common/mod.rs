//! Helpers for tests that run `sealion` processes on loopback.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A child process that is killed when dropped. When a test fails, each
/// of its processes prints the tail of its log as it is dropped, so a
/// failure on CI shows what the processes were doing.
pub struct Proc {
    pub name: String,
    pub child: Option<Child>,
    pub args: Vec<String>,
    pub log: std::path::PathBuf,
    /// Opened once and kept: the log stays readable even when the test's
    /// temporary directory goes before the process does.
    log_reader: Option<std::fs::File>,
}

/// How much of each process's log a failed test prints.
const LOG_TAIL_LINES: usize = 60;

impl Proc {
    pub fn start(name: &str, args: &[String], log_dir: &Path) -> Proc {
        let log = log_dir.join(format!("{name}.log"));
        let mut p = Proc {
            name: name.into(),
            child: None,
            args: args.to_vec(),
            log,
            log_reader: None,
        };
        p.restart();
        p.log_reader = std::fs::File::open(&p.log).ok();
        p
    }

    /// The last `LOG_TAIL_LINES` lines of the log.
    fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_sealion"))
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// SIGKILL: no chance to flush anything that was not already durable.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(Some(status)) = c.try_wait() {
                    assert!(
                        status.success(),
                        "{} exited with {status} after SIGTERM; log:\n{}",
                        self.name,
                        self.log_text()
                    );
                    return;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!(
                        "{} did not stop after SIGTERM; log:\n{}",
                        self.name,
                        self.log_text()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// SIGSTOP: the process stays, but answers nothing until `resume`.
    pub fn pause(&self) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg("-STOP")
                .arg(c.id().to_string())
                .status();
        }
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(c.id().to_string())
                .status();
        }
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The exit status, if the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The whole log, through the handle kept since the start (by path if
    /// it could not be opened then).
    pub fn log_text(&self) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let Some(mut f) = self.log_reader.as_ref() else {
            return std::fs::read_to_string(&self.log).unwrap_or_default();
        };
        let mut text = String::new();
        if f.seek(SeekFrom::Start(0)).is_ok() {
            let _ = f.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let tail = self.log_tail();
            eprintln!(
                "--- last {LOG_TAIL_LINES} log lines of {} ---\n{tail}",
                self.name
            );
        }
        // A cluster launcher stops its children on SIGTERM; SIGKILL would
        // leave them running after the test.
        if self.args.first().map(String::as_str) == Some("cluster")
            && let Some(mut c) = self.child.take()
        {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.kill();
    }
}

/// A port that was free a moment ago. It is drawn from below the kernel's
/// ephemeral range (32768 and up), so an outgoing connection can never take
/// it between this call and the process that binds it; and never the same
/// one twice in a test process.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..1_000 {
        let port = 10_000 + (rand_u16() % 10_000);
        let mut handed = HANDED_OUT.lock().unwrap();
        if handed.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed.push(port);
            return port;
        }
    }
    panic!("no free port below the ephemeral range");
}

/// Polls `f` until it returns `Some`, or panics after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[derive(Clone)]
pub struct Http {
    pub base: String,
    pub client: reqwest::Client,
}

impl Http {
    pub fn new(addr: &str) -> Http {
        Http {
            base: format!("http://{addr}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
        }
    }

    pub async fn healthy(&self) -> bool {
        matches!(self.client.get(format!("{}/health", self.base)).send().await, Ok(r) if r.status() == 200)
    }

    pub async fn write(&self, db: &str, body: String) -> (u16, String) {
        self.write_batch(db, body, None).await
    }

    /// A write naming its batch (`?batch_id=`).
    pub async fn write_batch(
        &self,
        db: &str,
        body: String,
        batch_id: Option<&str>,
    ) -> (u16, String) {
        let mut q = vec![("db", db)];
        if let Some(id) = batch_id {
            q.push(("batch_id", id));
        }
        let r = self
            .client
            .post(format!("{}/api/v1/write", self.base))
            .query(&q)
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// A query as `?q=`, or in the request body when it is too long for a
    /// URL.
    pub async fn sql(&self, db: &str, q: &str) -> (u16, Value) {
        let url = format!("{}/api/v1/sql", self.base);
        let request = if q.len() <= 2_000 {
            self.client.get(url).query(&[("db", db), ("q", q)])
        } else {
            self.client
                .post(url)
                .query(&[("db", db)])
                .body(q.to_string())
        };
        let r = request.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Rows of a query that must succeed.
    pub async fn rows(&self, db: &str, q: &str) -> Vec<Vec<Value>> {
        let (status, body) = self.sql(db, q).await;
        assert_eq!(status, 200, "{q}: {body}");
        serde_json::from_value(body["rows"].clone()).unwrap()
    }
}

pub async fn pg_connect(addr: &str, db: &str) -> tokio_postgres::Client {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let conn_str = format!("host={host} port={port} user=sealion dbname={db}");
    let (client, conn) = tokio_postgres::connect(&conn_str, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Line protocol for `hosts` hosts, one row per host every `step_s`
/// seconds over `days` days from 2024-01-01, with values derived from the
/// host and time so a model can recompute every aggregate.
pub struct Dataset {
    pub hosts: usize,
    pub days: i64,
    pub step_s: i64,
}

pub const DAY0_S: i64 = 1_704_067_200; // 2024-01-01T00:00:00Z

impl Dataset {
    pub fn value(host: usize, t_s: i64) -> i64 {
        ((host as i64 * 7919 + t_s / 60) % 100).abs()
    }

    pub fn rows(&self) -> Vec<(usize, i64, i64)> {
        let mut out = Vec::new();
        let n = self.days * 86_400 / self.step_s;
        for h in 0..self.hosts {
            for k in 0..n {
                let t = DAY0_S + k * self.step_s;
                out.push((h, t, Self::value(h, t)));
            }
        }
        out
    }

    /// Batches of line protocol (seconds precision → written as ns).
    pub fn batches(&self, per_batch: usize) -> Vec<String> {
        let rows = self.rows();
        rows.chunks(per_batch)
            .map(|chunk| {
                chunk
                    .iter()
                    .map(|(h, t, v)| {
                        format!(
                            "cpu,host=host_{h},region=r{} usage={v}.0,n={v}i {}\n",
                            h % 3,
                            t * 1_000_000_000
                        )
                    })
                    .collect()
            })
            .collect()
    }

    /// (host, count, sum, max) per host, from the model.
    pub fn per_host(&self) -> Vec<(String, i64, f64, f64)> {
        let mut m: std::collections::BTreeMap<String, (i64, f64, f64)> = Default::default();
        for (h, _, v) in self.rows() {
            let e = m.entry(format!("host_{h}")).or_insert((0, 0.0, f64::MIN));
            e.0 += 1;
            e.1 += v as f64;
            e.2 = e.2.max(v as f64);
        }
        m.into_iter().map(|(h, (c, s, x))| (h, c, s, x)).collect()
    }
}

pub const PER_HOST_SQL: &str = "SELECT host, count(*) AS c, sum(usage) AS s, max(usage) AS m FROM cpu GROUP BY host ORDER BY host";

/// (host, count, sum, max) of `cpu` over HTTP, for rows that `filter` (a
/// SQL condition) keeps.
pub async fn per_host_over_http(http: &Http, filter: &str) -> Vec<(String, i64, f64, f64)> {
    let q = format!(
        "SELECT host, count(*), sum(usage), max(usage) FROM cpu WHERE {filter} GROUP BY host ORDER BY host"
    );
    http.rows("public", &q)
        .await
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_string(),
                r[1].as_i64().unwrap(),
                r[2].as_f64().unwrap(),
                r[3].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Checks the per-host aggregates over HTTP and over the PostgreSQL wire.
pub async fn check_per_host(http: &Http, pg_addr: &str, data: &Dataset) {
    let want = data.per_host();
    let got = per_host_over_http(http, "true").await;
    assert_eq!(got, want, "per-host aggregates over HTTP");
    let pg = pg_connect(pg_addr, "public").await;
    let rows = pg.query(PER_HOST_SQL, &[]).await.unwrap();
    let got: Vec<(String, i64, f64, f64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        got, want,
        "per-host aggregates over pgwire (extended protocol)"
    );
    let simple = pg.simple_query(PER_HOST_SQL).await.unwrap();
    let n = simple
        .iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count();
    assert_eq!(n, want.len(), "per-host rows over pgwire (simple protocol)");
}

/// `sealion standalone` on free loopback ports, in a directory of its own.
pub struct Standalone {
    pub proc_: Proc,
    pub http: Http,
    pub pg_addr: String,
    pub _dir: tempfile::TempDir,
}

pub async fn start_standalone() -> Standalone {
    start_standalone_with(&[]).await
}

pub async fn start_standalone_with(extra: &[&str]) -> Standalone {
    let dir = tempfile::tempdir().unwrap();
    // A port picked free can be taken by another process before the server
    // binds it; a start that exits early is tried again with new ports.
    for attempt in 0..3 {
        let http_addr = format!("127.0.0.1:{}", free_port());
        let pg_addr = format!("127.0.0.1:{}", free_port());
        let args: Vec<String> = vec![
            "standalone".into(),
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
            "--http-addr".into(),
            http_addr.clone(),
            "--pg-addr".into(),
            pg_addr.clone(),
        ];
        let args: Vec<String> = args
            .into_iter()
            .chain(extra.iter().map(|s| s.to_string()))
            .collect();
        let mut proc_ = Proc::start(&format!("standalone-{attempt}"), &args, dir.path());
        let http = Http::new(&http_addr);
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            if http.healthy().await {
                return Standalone {
                    proc_,
                    http,
                    pg_addr,
                    _dir: dir,
                };
            }
            if let Some(status) = proc_.exited() {
                eprintln!(
                    "standalone exited at start ({status}), trying again; log:\n{}",
                    proc_.log_text()
                );
                break;
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "standalone did not become healthy; log:\n{}",
                    proc_.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    panic!("standalone did not start in three attempts");
}

pub async fn wait_healthy(http: &Http, p: &mut Proc) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while !http.healthy().await {
        if let Some(status) = p.exited() {
            panic!("standalone exited ({status}); log:\n{}", p.log_text());
        }
        if std::time::Instant::now() > deadline {
            panic!("standalone did not become healthy; log:\n{}", p.log_text());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Seals every partition of `table` whose end has passed; the outcome of each.
/// Waits until `n` storage nodes are up, as the query node behind `http`
/// sees them.
pub async fn storage_nodes_up(http: &Http, n: usize, within: Duration) {
    eventually(&format!("{n} storage nodes up"), within, || async {
        let (s, b) = http
            .sql(
                "public",
                "SELECT count(*) FROM system.nodes WHERE state = 'up'",
            )
            .await;
        (s == 200 && b["rows"][0][0] == n).then_some(())
    })
    .await;
}

pub async fn admin_seal(http: &Http, table: &str) -> Vec<String> {
    let r = http
        .client
        .post(format!(
            "{}/api/v1/admin/seal?db=public&table={table}",
            http.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["outcome"].as_str().unwrap().to_string())
        .collect()
}

/// A base port whose internal ports (base+1..=3, base+101..=103) are free.
pub fn free_base_port() -> u16 {
    for _ in 0..200 {
        // 20000..32600: below the ephemeral range, apart from free_port's.
        let base = 20_000 + (rand_u16() % 60) * 210;
        let ports = [1u16, 2, 3, 101, 102, 103].map(|o| base + o);
        if ports
            .iter()
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        {
            return base;
        }
    }
    panic!("no free base port");
}

/// splitmix64: a small seeded generator, so a random schedule can be
/// replayed from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A duration of `from..to` milliseconds.
    pub fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

/// Now, in nanoseconds since the epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// Midnight (UTC) `days` days before today's, in nanoseconds: the start of
/// a day partition that has ended, for rows a seal may take.
pub fn midnight_days_ago_ns(days: i64) -> i64 {
    let day = 86_400_000_000_000i64;
    (now_ns() / day - days) * day
}

/// A pseudo-random number, different on every call and in every process.
pub fn rand_u16() -> u16 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    Rng(nanos ^ ((std::process::id() as u64) << 32) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next()
        as u16
}

/// `sealion cluster` with one meta replica, `storage` storage nodes and one
/// query node, on free loopback ports; returns once every storage node is up.
pub struct LocalCluster {
    pub launcher: Proc,
    pub http: Http,
    pub http_addr: String,
    pub pg_addr: String,
    pub _dir: tempfile::TempDir,
}

pub async fn start_cluster(storage: usize) -> LocalCluster {
    let dir = tempfile::tempdir().unwrap();
    let http_port = free_port();
    let pg_port = free_port();
    let base = free_base_port();
    let launcher = Proc::start(
        "cluster",
        &[
            "cluster".into(),
            "--meta".into(),
            "1".into(),
            "--storage".into(),
            storage.to_string(),
            "--query".into(),
            "1".into(),
            "--data-dir".into(),
            dir.path().join("c").display().to_string(),
            "--base-port".into(),
            base.to_string(),
            "--http-port".into(),
            http_port.to_string(),
            "--pg-port".into(),
            pg_port.to_string(),
        ],
        dir.path(),
    );
    let http_addr = format!("127.0.0.1:{http_port}");
    let http = Http::new(&http_addr);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !http.healthy().await {
        assert!(
            Instant::now() < deadline,
            "cluster did not become healthy:\n{}",
            launcher.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    storage_nodes_up(&http, storage, Duration::from_secs(60)).await;
    LocalCluster {
        launcher,
        http,
        http_addr,
        pg_addr: format!("127.0.0.1:{pg_port}"),
        _dir: dir,
    }
}

/// Separate processes on loopback: `metas` meta replicas (replication
/// factor `rf`, a storage node down after 2 s of silence, plus `meta_args`),
/// `n` storage nodes (heartbeats every 300 ms) and one query node. `start`
/// returns once every storage node is up.
pub struct ProcCluster {
    pub metas: Vec<Proc>,
    pub meta_addrs: Vec<String>,
    pub storages: Vec<Proc>,
    pub query: Proc,
    pub http: Http,
    pub pg_addr: String,
    pub _dir: tempfile::TempDir,
}

impl ProcCluster {
    pub async fn start(metas: usize, n: usize, rf: usize, meta_args: &[&str]) -> ProcCluster {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path();
        let meta_addrs: Vec<String> = (0..metas)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let meta_list = meta_addrs.join(",");
        let mut meta_procs = Vec::new();
        for (i, addr) in meta_addrs.iter().enumerate() {
            let mut args: Vec<String> = vec![
                "meta".into(),
                "--node-id".into(),
                (i + 1).to_string(),
                "--listen-addr".into(),
                addr.clone(),
                "--data-dir".into(),
                dir.path()
                    .join(format!("meta-{}", i + 1))
                    .display()
                    .to_string(),
                "--node-timeout-ms".into(),
                "2000".into(),
                "--replication-factor".into(),
                rf.to_string(),
            ];
            if i == 0 {
                args.push("--bootstrap".into());
            } else {
                args.push("--join".into());
                args.push(meta_addrs[0].clone());
            }
            args.extend(meta_args.iter().map(|a| a.to_string()));
            meta_procs.push(Proc::start(&format!("meta-{}", i + 1), &args, logs));
        }
        let storages: Vec<Proc> = (0..n)
            .map(|i| {
                Proc::start(
                    &format!("storage-{}", i + 1),
                    &[
                        "storage".into(),
                        "--listen-addr".into(),
                        format!("127.0.0.1:{}", free_port()),
                        "--data-dir".into(),
                        dir.path()
                            .join(format!("storage-{}", i + 1))
                            .display()
                            .to_string(),
                        "--meta".into(),
                        meta_list.clone(),
                        "--heartbeat-interval-ms".into(),
                        "300".into(),
                    ],
                    logs,
                )
            })
            .collect();
        let http_addr = format!("127.0.0.1:{}", free_port());
        let pg_addr = format!("127.0.0.1:{}", free_port());
        let query = Proc::start(
            "query",
            &[
                "query".into(),
                "--http-addr".into(),
                http_addr.clone(),
                "--pg-addr".into(),
                pg_addr.clone(),
                "--meta".into(),
                meta_list.clone(),
            ],
            logs,
        );
        let http = Http::new(&http_addr);
        eventually(
            "the query node healthy",
            Duration::from_secs(120),
            || async { http.healthy().await.then_some(()) },
        )
        .await;
        storage_nodes_up(&http, n, Duration::from_secs(120)).await;
        ProcCluster {
            metas: meta_procs,
            meta_addrs,
            storages,
            query,
            http,
            pg_addr,
            _dir: dir,
        }
    }

    /// Prints every process's log (for a failing test).
    pub fn dump(&self) {
        for p in self
            .metas
            .iter()
            .chain(self.storages.iter())
            .chain(std::iter::once(&self.query))
        {
            eprintln!("--- {} ---\n{}", p.name, p.log_text());
        }
    }

    /// The index in `storages` of the process serving node `id`.
    pub async fn index_of(&self, id: u64) -> usize {
        let addr = self
            .http
            .rows(
                "public",
                &format!("SELECT addr FROM system.nodes WHERE node_id = {id}"),
            )
            .await[0][0]
            .as_str()
            .unwrap()
            .to_string();
        self.storages
            .iter()
            .position(|p| p.args.contains(&addr))
            .unwrap()
    }
}

/// The meta leader's id, as the first meta replica of `addrs` that knows
/// one says.
pub async fn meta_leader(addrs: &[String]) -> Option<u64> {
    use sealion_proto::MetaClusterRequest;
    use sealion_proto::meta_client::MetaClient;
    for a in addrs {
        if let Ok(mut c) = MetaClient::connect(format!("http://{a}")).await
            && let Ok(r) = c.cluster_info(MetaClusterRequest {}).await
        {
            let r = r.into_inner();
            if r.leader_id != 0 {
                return Some(r.leader_id);
            }
        }
    }
    None
}

/// Some when the meta leader counts `n` voters and no membership change is
/// under way (a replica joins as a learner first, then through a joint
/// configuration that needs a quorum of the old voters too: killing one
/// before the change settles can leave no quorum).
pub async fn meta_voters(addrs: &[String], n: usize) -> Option<()> {
    use sealion_proto::MetaClusterRequest;
    use sealion_proto::meta_client::MetaClient;
    for a in addrs {
        if let Ok(mut c) = MetaClient::connect(format!("http://{a}")).await
            && let Ok(r) = c.cluster_info(MetaClusterRequest {}).await
        {
            let r = r.into_inner();
            if r.leader_id != 0 && r.node_id == r.leader_id {
                let voters = r.members.iter().filter(|m| m.voter).count();
                return (r.membership_settled && voters == n).then_some(());
            }
        }
    }
    None
}
