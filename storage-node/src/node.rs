//! Starting and stopping a storage node: open the engine, serve gRPC and
//! Flight, register with meta and keep heartbeating.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use sealion_common::local::LocalStorage;
use sealion_common::meta_client::MetaClient;
use sealion_common::proto::RegisterNode;
use sealion_common::proto::meta_command::Cmd;
use sealion_common::proto::storage_server::StorageServer as GrpcStorageServer;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::engine::Engine;
use crate::service::{
    FlightScanService, MAX_WRITE_BYTES, NodeContext, SealPolicy, StorageService, seal_due,
};
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// gRPC and Flight listen address; port 0 picks a free port.
    pub listen_addr: SocketAddr,
    /// Address others use to reach this node; defaults to the bound address.
    pub advertise_addr: Option<String>,
    pub data_dir: PathBuf,
    pub meta_addrs: Vec<String>,
    pub heartbeat_interval_ms: u64,
    /// How often the node deletes the rows of partitions that meta no longer
    /// maps (expired by retention, or of dropped tables); 0 turns it off.
    pub sweep_interval_ms: u64,
    /// How often the node looks for partitions to seal; 0 turns automatic
    /// sealing off (`POST /api/v1/admin/seal` still works).
    pub seal_check_interval_ms: u64,
    /// A partition whose end has passed is sealed once it has had no write
    /// for this long.
    pub seal_idle_ms: u64,
    /// A sealed partition is sealed again when its late rows pass this
    /// fraction of its sealed rows.
    pub reseal_fraction: f64,
    /// Threads one scan may use to read a sealed partition (its row groups
    /// shared out among them); 0 takes the machine's cores. At most
    /// `engine::MAX_SCAN_THREADS`. The threads beyond each scan's own are
    /// one budget for all the node's scans at once.
    pub scan_threads: usize,
}

pub struct StorageServer {
    local_addr: SocketAddr,
    /// What a query node in this process calls instead of dialing
    /// `advertise`.
    local_scans: LocalStorage,
    node_id: u64,
    shutdown_tx: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    heartbeat: JoinHandle<()>,
    catch_up: JoinHandle<()>,
    sweeper: Option<JoinHandle<()>>,
    sealer: Option<JoinHandle<()>>,
}

const NODE_ID_FILE: &str = "node_id";

/// The threads a scan may use: `asked`, or the machine's cores for 0, never
/// more than `MAX_SCAN_THREADS`.
fn scan_threads(asked: usize) -> usize {
    let n = if asked == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        asked
    };
    n.clamp(1, crate::engine::MAX_SCAN_THREADS)
}

impl StorageServer {
    pub async fn start(cfg: StorageConfig) -> Result<StorageServer> {
        std::fs::create_dir_all(&cfg.data_dir)?;
        let engine = {
            let path = cfg.data_dir.clone();
            tokio::task::spawn_blocking(move || Engine::open(&path))
                .await
                .map_err(|e| Error::Internal(format!("open task failed: {e}")))??
        };
        let listener = tokio::net::TcpListener::bind(cfg.listen_addr).await?;
        let local_addr = listener.local_addr()?;
        let advertise = cfg
            .advertise_addr
            .clone()
            .unwrap_or_else(|| local_addr.to_string());

        let meta = MetaClient::connect(&cfg.meta_addrs, Duration::from_secs(60)).await?;
        let id_path = cfg.data_dir.join(NODE_ID_FILE);
        let known_id: u64 = match std::fs::read_to_string(&id_path) {
            Ok(s) => s.trim().parse().map_err(|_| {
                Error::Internal(format!("{} does not hold a node id", id_path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e.into()),
        };
        let node_id = register(&meta, known_id, &advertise).await?;
        if node_id != known_id {
            let tmp = id_path.with_extension("tmp");
            std::fs::write(&tmp, node_id.to_string())?;
            std::fs::rename(&tmp, &id_path)?;
        }

        let threads = scan_threads(cfg.scan_threads);
        let ctx = Arc::new(NodeContext {
            engine,
            node_id: AtomicU64::new(node_id),
            meta: meta.clone(),
            last_write: Default::default(),
            seal_policy: SealPolicy {
                idle: Duration::from_millis(cfg.seal_idle_ms),
                reseal_fraction: cfg.reseal_fraction,
            },
            started: std::time::Instant::now(),
            published_filters: Default::default(),
            filter_gate: Default::default(),
            peers: Default::default(),
            locks: Default::default(),
            scan_threads: threads,
            scan_budget: crate::engine::ScanThreadBudget::new(threads - 1),
        });
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let storage = GrpcStorageServer::new(StorageService { ctx: ctx.clone() })
            .max_decoding_message_size(MAX_WRITE_BYTES + (1 << 20));
        let flight = FlightServiceServer::new(FlightScanService { ctx: ctx.clone() });
        let local_scans = LocalStorage {
            addr: advertise.clone(),
            scans: Arc::new(FlightScanService { ctx: ctx.clone() }),
            writes: Arc::new(StorageService { ctx: ctx.clone() }),
        };
        // Small answers (a partial state, a last point) must not wait for
        // Nagle's algorithm: a custom incoming stream gets no TCP_NODELAY
        // from the server builder.
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(storage)
                .add_service(flight)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = shutdown_rx.await;
                }),
        );
        let interval = Duration::from_millis(cfg.heartbeat_interval_ms.max(50));
        let heartbeat = tokio::spawn(heartbeat_loop(ctx.clone(), advertise.clone(), interval));
        let catch_up = tokio::spawn(catch_up_loop(ctx.clone(), interval));
        let sweeper = (cfg.sweep_interval_ms > 0).then(|| {
            tokio::spawn(sweep_loop(
                ctx.clone(),
                Duration::from_millis(cfg.sweep_interval_ms),
            ))
        });
        let sealer = (cfg.seal_check_interval_ms > 0).then(|| {
            tokio::spawn(seal_loop(
                ctx,
                Duration::from_millis(cfg.seal_check_interval_ms),
            ))
        });
        tracing::info!(node_id, addr = %advertise, "storage node serving");
        Ok(StorageServer {
            local_addr,
            local_scans,
            node_id,
            shutdown_tx: Some(shutdown_tx),
            server,
            heartbeat,
            catch_up,
            sweeper,
            sealer,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// This node's scans, for a query node in the same process.
    pub fn local_storage(&self) -> LocalStorage {
        self.local_scans.clone()
    }

    /// Stops serving (in-flight calls finish), then stops heartbeats.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(tx) = self.shutdown_tx.take() {
            let _ = tx.send(());
        }
        self.heartbeat.abort();
        self.catch_up.abort();
        if let Some(s) = &self.sweeper {
            s.abort();
        }
        if let Some(s) = &self.sealer {
            s.abort();
        }
        match (&mut self.server).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::Internal(format!("server: {e}"))),
            Err(e) => Err(Error::Internal(format!("server task: {e}"))),
        }
    }
}

async fn register(meta: &MetaClient, id: u64, addr: &str) -> Result<u64> {
    let reply = meta
        .propose(Cmd::RegisterNode(RegisterNode {
            id,
            addr: addr.to_string(),
            now_ms: sealion_common::time::now_ms(),
        }))
        .await?;
    reply
        .node
        .map(|n| n.id)
        .ok_or_else(|| Error::Internal("meta registered the node but returned no id".into()))
}

async fn heartbeat_loop(ctx: Arc<NodeContext>, addr: String, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let id = ctx.node_id.load(Ordering::Acquire);
        match ctx.meta.heartbeat(id, &addr).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    node_id = id,
                    "meta does not know this node; registering again"
                );
                if let Err(e) = register(&ctx.meta, id, &addr).await {
                    tracing::warn!(error = %e, "re-registration failed");
                }
            }
            Err(e) => tracing::debug!(error = %e, "heartbeat failed"),
        }
    }
}

/// Brings the replicas this node holds out of sync back in sync, by asking
/// their primaries to resync them; and, as a primary at a new epoch, checks
/// that its in-sync backups hold its rows (`replication::settle_once`).
async fn catch_up_loop(ctx: Arc<NodeContext>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        crate::replication::catch_up_once(&ctx).await;
        crate::replication::settle_once(&ctx).await;
    }
}

/// Deletes the rows of partitions that meta no longer maps. Only partitions
/// meta has certainly created and since removed are deleted: the map is read
/// linearizably, and a partition id at or above `next_partition_id` (one this
/// node cannot know yet) is never touched.
pub async fn sweep_once(ctx: &NodeContext) -> Result<Vec<u64>> {
    let engine = ctx.engine.clone();
    let before_ms = (sealion_common::time::now_ms().max(0) as u64)
        .saturating_sub(crate::engine::BATCH_ID_RETENTION_MS);
    let pruned = tokio::task::spawn_blocking(move || engine.prune_batch_marks(before_ms))
        .await
        .map_err(|e| Error::Internal(format!("sweep task failed: {e}")))??;
    if pruned > 0 {
        tracing::debug!(pruned, "forgot batch ids past their retention");
    }
    let engine = ctx.engine.clone();
    let local = tokio::task::spawn_blocking(move || engine.partition_ids())
        .await
        .map_err(|e| Error::Internal(format!("sweep task failed: {e}")))??;
    if local.is_empty() {
        return Ok(vec![]);
    }
    let state = ctx.meta.get_state(true).await?.state.unwrap_or_default();
    let doomed: Vec<u64> = local
        .into_iter()
        .filter(|pid| {
            *pid < state.next_partition_id && !state.partitions.iter().any(|p| p.id == *pid)
        })
        .collect();
    if doomed.is_empty() {
        return Ok(doomed);
    }
    let engine = ctx.engine.clone();
    let ids = doomed.clone();
    tokio::task::spawn_blocking(move || engine.drop_partitions(&ids))
        .await
        .map_err(|e| Error::Internal(format!("sweep task failed: {e}")))??;
    metrics::counter!("sealion_storage_partitions_swept_total").increment(doomed.len() as u64);
    tracing::info!(partitions = ?doomed, "deleted rows of partitions meta no longer maps");
    Ok(doomed)
}

async fn sweep_loop(ctx: Arc<NodeContext>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(e) = sweep_once(&ctx).await {
            tracing::warn!(error = %e, "sweep failed");
        }
    }
}

/// Seals every partition this node holds whose time has passed and that has
/// been quiet for the idle period, and reseals those whose late rows have
/// grown past the reseal fraction.
async fn seal_loop(ctx: Arc<NodeContext>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let node_id = ctx.node_id.load(Ordering::Acquire);
        let state = ctx.meta.state();
        let now_ns = sealion_common::time::now_ms().saturating_mul(1_000_000);
        let candidates: Vec<u64> = state
            .partitions
            .iter()
            // The primary seals; it has its in-sync backups seal with it.
            .filter(|p| p.replicas.first() == Some(&node_id) && p.end_ns <= now_ns)
            .map(|p| p.id)
            .collect();
        for pid in candidates {
            match seal_due(&ctx, pid).await {
                Ok(false) => {}
                Ok(true) => {
                    if let Err(e) = crate::service::seal_partition(&ctx, pid).await {
                        tracing::warn!(partition_id = pid, error = %e, "automatic seal failed");
                    }
                }
                Err(e) => tracing::warn!(partition_id = pid, error = %e, "seal check failed"),
            }
        }
    }
}
