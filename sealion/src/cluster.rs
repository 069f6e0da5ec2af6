//! `sealion cluster`: a real multi-process cluster on loopback, in one
//! command. Each role runs as a child process of this one, with its own data
//! directory and log file; Ctrl-C (or SIGTERM) stops them all, front to back.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// Meta replicas (1, 3 or 5).
    #[arg(long = "meta", env = "SEALION_CLUSTER_META", default_value_t = 3)]
    meta: u16,
    /// Storage nodes.
    #[arg(long = "storage", env = "SEALION_CLUSTER_STORAGE", default_value_t = 3)]
    storage: u16,
    /// Query nodes.
    #[arg(long = "query", env = "SEALION_CLUSTER_QUERY", default_value_t = 1)]
    query: u16,
    /// Directory under which each process gets its own data directory and log.
    #[arg(long, env = "SEALION_DATA_DIR", default_value = "./sealion-cluster")]
    data_dir: PathBuf,
    /// First port of the internal gRPC ports: meta N listens on base+N,
    /// storage node N on base+100+N.
    #[arg(long, env = "SEALION_BASE_PORT", default_value_t = 17_000)]
    base_port: u16,
    /// HTTP port of the first query node; the next ones count up from it.
    #[arg(long, env = "SEALION_HTTP_PORT", default_value_t = 8080)]
    http_port: u16,
    /// PostgreSQL port of the first query node; the next ones count up from it.
    #[arg(long, env = "SEALION_PG_PORT", default_value_t = 5433)]
    pg_port: u16,
    /// Replicas per new partition (capped at the number of storage nodes).
    #[arg(long, env = "SEALION_REPLICATION_FACTOR", default_value_t = 3)]
    replication_factor: usize,
}

struct Proc {
    name: String,
    child: Child,
}

fn spawn(name: &str, args: &[String], logs: &PathBuf) -> anyhow::Result<Proc> {
    let exe = std::env::current_exe().context("finding the sealion executable")?;
    let log_path = logs.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .env_remove("SEALION_CONFIG")
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    Ok(Proc {
        name: name.to_string(),
        child,
    })
}

fn wait_for_port(addr: &str, deadline: Instant) -> bool {
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(addr).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// SIGTERM to each process, newest first, then SIGKILL to any still running
/// after a grace period.
fn stop_all(procs: &mut Vec<Proc>) {
    for p in procs.iter().rev() {
        let _ = kill(Pid::from_raw(p.child.id() as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    for p in procs.iter_mut().rev() {
        loop {
            match p.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    eprintln!("{} did not stop in time; killing it", p.name);
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    break;
                }
            }
        }
    }
}

pub async fn run(a: ClusterArgs) -> anyhow::Result<()> {
    if a.meta == 0 || a.storage == 0 || a.query == 0 {
        bail!("a cluster needs at least one meta, one storage and one query process");
    }
    if a.meta > 7 || a.storage > 99 || a.query > 99 {
        bail!("at most 7 meta, 99 storage and 99 query processes");
    }
    let logs = a.data_dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let port = |offset: u16| -> anyhow::Result<u16> {
        a.base_port
            .checked_add(offset)
            .context("base port too high")
    };
    let dir = |name: &str| a.data_dir.join(name).display().to_string();
    let mut procs: Vec<Proc> = Vec::new();
    let result = (|| -> anyhow::Result<Vec<String>> {
        let meta_addrs: Vec<String> = (1..=a.meta)
            .map(|i| port(i).map(|p| format!("127.0.0.1:{p}")))
            .collect::<anyhow::Result<_>>()?;
        let mut endpoints = Vec::new();
        for i in 1..=a.meta {
            let addr = &meta_addrs[i as usize - 1];
            let mut args = vec![
                "meta".to_string(),
                "--node-id".into(),
                i.to_string(),
                "--listen-addr".into(),
                addr.clone(),
                "--data-dir".into(),
                dir(&format!("meta-{i}")),
                "--replication-factor".into(),
                a.replication_factor.to_string(),
            ];
            if i == 1 {
                args.push("--bootstrap".into());
            } else {
                args.push("--join".into());
                args.push(meta_addrs[0].clone());
            }
            procs.push(spawn(&format!("meta-{i}"), &args, &logs)?);
            endpoints.push(format!(
                "meta-{i}       grpc {addr}  pid {}",
                procs.last().map_or(0, |p| p.child.id())
            ));
        }
        let meta_list = meta_addrs.join(",");
        for i in 1..=a.storage {
            let addr = format!("127.0.0.1:{}", port(100 + i)?);
            let args = vec![
                "storage".to_string(),
                "--listen-addr".into(),
                addr.clone(),
                "--data-dir".into(),
                dir(&format!("storage-{i}")),
                "--meta".into(),
                meta_list.clone(),
            ];
            procs.push(spawn(&format!("storage-{i}"), &args, &logs)?);
            endpoints.push(format!(
                "storage-{i}    grpc+flight {addr}  pid {}",
                procs.last().map_or(0, |p| p.child.id())
            ));
        }
        let mut pg_addrs = Vec::new();
        for i in 0..a.query {
            let http = format!(
                "127.0.0.1:{}",
                a.http_port.checked_add(i).context("http port too high")?
            );
            let pg = format!(
                "127.0.0.1:{}",
                a.pg_port.checked_add(i).context("pg port too high")?
            );
            let args = vec![
                "query".to_string(),
                "--http-addr".into(),
                http.clone(),
                "--pg-addr".into(),
                pg.clone(),
                "--meta".into(),
                meta_list.clone(),
            ];
            procs.push(spawn(&format!("query-{}", i + 1), &args, &logs)?);
            endpoints.push(format!(
                "query-{}      http http://{http}  postgres postgresql://{pg}/public  pid {}",
                i + 1,
                procs.last().map_or(0, |p| p.child.id())
            ));
            pg_addrs.push(pg);
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        for pg in &pg_addrs {
            if !wait_for_port(pg, deadline) {
                bail!(
                    "query node at {pg} did not start; see the logs in {}",
                    logs.display()
                );
            }
        }
        Ok(endpoints)
    })();
    let endpoints = match result {
        Ok(e) => e,
        Err(e) => {
            stop_all(&mut procs);
            return Err(e);
        }
    };
    println!("sealion cluster is up (logs in {}):", logs.display());
    for e in endpoints {
        println!("  {e}");
    }
    println!("Ctrl-C stops every process.");
    crate::shutdown_signal().await;
    tokio::task::spawn_blocking(move || stop_all(&mut procs))
        .await
        .context("stopping the cluster")?;
    println!("sealion cluster stopped");
    Ok(())
}
