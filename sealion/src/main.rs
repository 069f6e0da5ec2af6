//! The `sealion` binary: one subcommand per role, all roles in one process
//! (`standalone`), and a launcher for a local multi-process cluster.
//!
//! Every flag can also be set by a `SEALION_*` environment variable or in a
//! TOML file given with `--config` (keys are the long flag names). A flag
//! beats the environment, which beats the file.

mod cluster;
mod config;

/// mimalloc, not glibc's malloc: a query allocates many small, short-lived
/// objects (plans, batches, states), where it is measurably faster.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "sealion",
    version,
    about = "Sealion: a distributed time-series database"
)]
struct Cli {
    /// TOML file with settings (keys are long flag names, e.g. `data-dir = "/var/lib/sealion"`).
    #[arg(long, global = true, env = "SEALION_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Meta, storage and query roles in one process over one data directory.
    Standalone(StandaloneArgs),
    /// A meta replica (Raft over RocksDB): catalog, membership, partition map.
    Meta(MetaArgs),
    /// A storage node: holds partition replicas, serves writes and scans.
    Storage(StorageArgs),
    /// A query node: PostgreSQL wire protocol and HTTP; stateless.
    Query(QueryArgs),
    /// Starts a local cluster of separate processes on loopback and stops it on Ctrl-C.
    Cluster(cluster::ClusterArgs),
}

#[derive(Args, Debug)]
struct StandaloneArgs {
    /// Directory for all data (meta's Raft log and state, storage's rows).
    #[arg(long, env = "SEALION_DATA_DIR", default_value = "./sealion-data")]
    data_dir: PathBuf,
    #[command(flatten)]
    front: FrontArgs,
    /// Internal gRPC address of the meta role (port 0 picks a free port).
    #[arg(long, env = "SEALION_META_ADDR", default_value = "127.0.0.1:0")]
    meta_addr: SocketAddr,
    /// Internal gRPC and Flight address of the storage role (port 0 picks a free port).
    #[arg(long, env = "SEALION_STORAGE_ADDR", default_value = "127.0.0.1:0")]
    storage_addr: SocketAddr,
    /// How often meta removes partitions past their table's retention (0: never).
    #[arg(
        long,
        env = "SEALION_RETENTION_CHECK_INTERVAL_MS",
        default_value_t = 60_000
    )]
    retention_check_interval_ms: u64,
    #[command(flatten)]
    tasks: StorageTaskArgs,
}

#[derive(Args, Debug)]
struct MetaArgs {
    /// This replica's id (1, 2, 3, ...), unique in the meta cluster.
    #[arg(long, env = "SEALION_NODE_ID")]
    node_id: u64,
    /// gRPC listen address.
    #[arg(long, env = "SEALION_LISTEN_ADDR", default_value = "127.0.0.1:7001")]
    listen_addr: SocketAddr,
    /// Address other processes use to reach this replica (default: the listen address).
    #[arg(long, env = "SEALION_ADVERTISE_ADDR")]
    advertise_addr: Option<String>,
    /// Directory of the Raft log and state machine.
    #[arg(long, env = "SEALION_DATA_DIR", default_value = "./sealion-data/meta")]
    data_dir: PathBuf,
    /// Start a new meta cluster with this replica as its first voter (ignored once initialized).
    #[arg(long, env = "SEALION_BOOTSTRAP")]
    bootstrap: bool,
    /// Addresses of existing meta replicas to join, comma-separated.
    #[arg(long, env = "SEALION_JOIN", value_delimiter = ',')]
    join: Vec<String>,
    /// A storage node is marked down after this long without a heartbeat.
    #[arg(long, env = "SEALION_NODE_TIMEOUT_MS", default_value_t = 5_000)]
    node_timeout_ms: u64,
    /// Replicas per new partition (capped at the number of storage nodes).
    #[arg(long, env = "SEALION_REPLICATION_FACTOR", default_value_t = 3)]
    replication_factor: usize,
    /// How often meta removes partitions past their table's retention (0: never).
    #[arg(
        long,
        env = "SEALION_RETENTION_CHECK_INTERVAL_MS",
        default_value_t = 60_000
    )]
    retention_check_interval_ms: u64,
    /// A storage node silent this long is gone for good: its replicas are
    /// copied from the survivors to other nodes (0: never).
    #[arg(long, env = "SEALION_REPLACE_AFTER_MS", default_value_t = 0)]
    replace_after_ms: u64,
}

#[derive(Args, Debug)]
struct StorageArgs {
    /// gRPC and Arrow Flight listen address.
    #[arg(long, env = "SEALION_LISTEN_ADDR", default_value = "127.0.0.1:7101")]
    listen_addr: SocketAddr,
    /// Address other processes use to reach this node (default: the listen address).
    #[arg(long, env = "SEALION_ADVERTISE_ADDR")]
    advertise_addr: Option<String>,
    /// Directory of this node's partitions.
    #[arg(
        long,
        env = "SEALION_DATA_DIR",
        default_value = "./sealion-data/storage"
    )]
    data_dir: PathBuf,
    /// Meta replica addresses, comma-separated.
    #[arg(long, env = "SEALION_META", value_delimiter = ',', required = true)]
    meta: Vec<String>,
    /// Interval between heartbeats to meta.
    #[arg(long, env = "SEALION_HEARTBEAT_INTERVAL_MS", default_value_t = 1_000)]
    heartbeat_interval_ms: u64,
    #[command(flatten)]
    tasks: StorageTaskArgs,
}

#[derive(Args, Debug)]
struct QueryArgs {
    #[command(flatten)]
    front: FrontArgs,
    /// Meta replica addresses, comma-separated.
    #[arg(long, env = "SEALION_META", value_delimiter = ',', required = true)]
    meta: Vec<String>,
}

/// The client-facing listeners of a query node (and of standalone).
#[derive(Args, Debug)]
struct FrontArgs {
    /// HTTP API address (line protocol writes, SQL, /health, /metrics).
    #[arg(long, env = "SEALION_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// PostgreSQL wire protocol address.
    #[arg(long, env = "SEALION_PG_ADDR", default_value = "127.0.0.1:5433")]
    pg_addr: SocketAddr,
    /// Most PostgreSQL connections served at once.
    #[arg(long, env = "SEALION_PG_MAX_CONNECTIONS", default_value_t = 256)]
    pg_max_connections: usize,
    /// Most memory one query may hold for its operators (sorts, joins,
    /// aggregation), in MiB; a query that needs more fails with a resources
    /// error and the node goes on (0: no limit).
    #[arg(long, env = "SEALION_QUERY_MEMORY_LIMIT_MB", default_value_t = 1024)]
    query_memory_limit_mb: u64,
    /// Longest one query may run, in seconds, over HTTP and PostgreSQL; a
    /// query still running then is cancelled with an error (SQLSTATE
    /// 57014, HTTP 504). A pgwire session's `SET statement_timeout` can
    /// shorten it, not lift it (0: no limit).
    #[arg(long, env = "SEALION_QUERY_TIMEOUT_SECS", default_value_t = 300)]
    query_timeout_secs: u64,
}

impl FrontArgs {
    fn query_timeout(&self) -> Option<std::time::Duration> {
        (self.query_timeout_secs > 0)
            .then(|| std::time::Duration::from_secs(self.query_timeout_secs))
    }
}

/// The background work of a storage node (and of standalone).
#[derive(Args, Debug)]
struct StorageTaskArgs {
    /// How often the storage node deletes rows of partitions meta no longer maps (0: never).
    #[arg(long, env = "SEALION_SWEEP_INTERVAL_MS", default_value_t = 60_000)]
    sweep_interval_ms: u64,
    /// How often the storage node looks for partitions to seal (0: only on demand).
    #[arg(long, env = "SEALION_SEAL_CHECK_INTERVAL_MS", default_value_t = 30_000)]
    seal_check_interval_ms: u64,
    /// A partition whose end has passed is sealed after this long without a write.
    #[arg(long, env = "SEALION_SEAL_IDLE_MS", default_value_t = 300_000)]
    seal_idle_ms: u64,
    /// A sealed partition is sealed again once its late rows pass this fraction of its rows.
    #[arg(long, env = "SEALION_RESEAL_FRACTION", default_value_t = 0.1)]
    reseal_fraction: f64,
    /// Threads one scan may use to read a sealed partition, its row groups shared out among
    /// them (rows without a LIMIT, aggregates); 0 takes the machine's cores, 1 reads on one.
    /// Concurrent scans share the threads beyond their own: N at once use at most N plus
    /// this less one.
    #[arg(long, env = "SEALION_SCAN_THREADS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=sealion_storage::engine::MAX_SCAN_THREADS as u64))]
    scan_threads: u64,
}

fn main() -> anyhow::Result<()> {
    config::load_config_file_into_env()?;
    let cli = Cli::parse();
    sealion_common::telemetry::init_logging("info");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sealion")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run(cli.command))
}

/// Resolves when SIGINT or SIGTERM arrives.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Standalone(a) => standalone(a).await,
        Command::Meta(a) => {
            let server = sealion_meta::MetaServer::start(sealion_meta::MetaConfig {
                node_id: a.node_id,
                listen_addr: a.listen_addr,
                advertise_addr: a.advertise_addr,
                data_dir: a.data_dir,
                bootstrap: a.bootstrap,
                join: a.join,
                node_timeout_ms: a.node_timeout_ms,
                replication_factor: a.replication_factor,
                retention_check_interval_ms: a.retention_check_interval_ms,
                replace_after_ms: a.replace_after_ms,
            })
            .await
            .context("starting meta")?;
            println!("meta {} listening on {}", a.node_id, server.local_addr());
            shutdown_signal().await;
            server.shutdown().await.context("stopping meta")?;
            Ok(())
        }
        Command::Storage(a) => {
            let server = sealion_storage::StorageServer::start(sealion_storage::StorageConfig {
                listen_addr: a.listen_addr,
                advertise_addr: a.advertise_addr,
                data_dir: a.data_dir,
                meta_addrs: a.meta,
                heartbeat_interval_ms: a.heartbeat_interval_ms,
                sweep_interval_ms: a.tasks.sweep_interval_ms,
                seal_check_interval_ms: a.tasks.seal_check_interval_ms,
                seal_idle_ms: a.tasks.seal_idle_ms,
                reseal_fraction: a.tasks.reseal_fraction,
                scan_threads: a.tasks.scan_threads as usize,
            })
            .await
            .context("starting storage node")?;
            println!(
                "storage node {} listening on {}",
                server.node_id(),
                server.local_addr()
            );
            shutdown_signal().await;
            server.shutdown().await.context("stopping storage node")?;
            Ok(())
        }
        Command::Query(a) => {
            let server = sealion_query::QueryServer::start(sealion_query::QueryConfig {
                http_addr: a.front.http_addr,
                pg_addr: a.front.pg_addr,
                meta_addrs: a.meta,
                pg_max_connections: a.front.pg_max_connections,
                query_memory_limit_bytes: a.front.query_memory_limit_mb.saturating_mul(1 << 20),
                query_timeout: a.front.query_timeout(),
                local_storage: None,
            })
            .await
            .context("starting query node")?;
            println!(
                "query node: http {} postgres {}",
                server.http_addr(),
                server.pg_addr()
            );
            shutdown_signal().await;
            server.shutdown().await;
            Ok(())
        }
        Command::Cluster(a) => cluster::run(a).await,
    }
}

async fn standalone(a: StandaloneArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("creating data directory {}", a.data_dir.display()))?;
    let meta = sealion_meta::MetaServer::start(sealion_meta::MetaConfig {
        node_id: 1,
        listen_addr: a.meta_addr,
        advertise_addr: None,
        data_dir: a.data_dir.join("meta"),
        bootstrap: true,
        join: vec![],
        node_timeout_ms: 5_000,
        replication_factor: 1,
        retention_check_interval_ms: a.retention_check_interval_ms,
        replace_after_ms: 0,
    })
    .await
    .context("starting meta")?;
    let meta_addr = meta.local_addr().to_string();
    let storage = sealion_storage::StorageServer::start(sealion_storage::StorageConfig {
        listen_addr: a.storage_addr,
        advertise_addr: None,
        data_dir: a.data_dir.join("storage"),
        meta_addrs: vec![meta_addr.clone()],
        heartbeat_interval_ms: 1_000,
        sweep_interval_ms: a.tasks.sweep_interval_ms,
        seal_check_interval_ms: a.tasks.seal_check_interval_ms,
        seal_idle_ms: a.tasks.seal_idle_ms,
        reseal_fraction: a.tasks.reseal_fraction,
        scan_threads: a.tasks.scan_threads as usize,
    })
    .await
    .context("starting storage")?;
    let query = sealion_query::QueryServer::start(sealion_query::QueryConfig {
        http_addr: a.front.http_addr,
        pg_addr: a.front.pg_addr,
        meta_addrs: vec![meta_addr],
        pg_max_connections: a.front.pg_max_connections,
        query_memory_limit_bytes: a.front.query_memory_limit_mb.saturating_mul(1 << 20),
        query_timeout: a.front.query_timeout(),
        // One process: scans call the storage node instead of dialing it.
        local_storage: Some(storage.local_storage()),
    })
    .await
    .context("starting query node")?;
    println!(
        "sealion standalone: http http://{} postgres postgresql://{}/public data {}",
        query.http_addr(),
        query.pg_addr(),
        a.data_dir.display()
    );
    shutdown_signal().await;
    // Front first, so no new work arrives while the back ends stop.
    query.shutdown().await;
    storage.shutdown().await.context("stopping storage")?;
    meta.shutdown().await.context("stopping meta")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// `--help` documents every flag of every subcommand, and each flag can
    /// also come from a `SEALION_*` variable.
    #[test]
    fn every_flag_has_help_and_an_environment_variable() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(
                    arg.get_help().is_some(),
                    "sealion {} --{id} has no help text",
                    sub.get_name()
                );
                let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or("");
                assert!(
                    env.starts_with("SEALION_"),
                    "sealion {} --{id} has no SEALION_* variable",
                    sub.get_name()
                );
            }
        }
    }
}
