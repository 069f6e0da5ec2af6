//! One meta replica as a running thing: RocksDB, Raft, the gRPC server, and
//! the background work that forms the cluster (bootstrap or join).
//!
//! This is the only module that owns tasks and resources, so it is where the
//! order of shutdown lives: stop serving, stop Raft, then wait until RocksDB
//! is released so the same directory can be opened again in this process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::{Config, ServerState, SnapshotPolicy};
use sealion_proto::AddMetaNodeRequest;
use sealion_proto::meta_server::MetaServer as GrpcMetaServer;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::network::{MAX_MESSAGE_BYTES, Network, channel, grpc_client};
use crate::placement::Liveness;
use crate::service::{MetaService, Shared};
use crate::store::{LogStore, StateMachine, open_db};
use crate::types::{Node, Raft};
use crate::{Error, Result};

/// Default for `MetaConfig::node_timeout_ms`.
pub const DEFAULT_NODE_TIMEOUT_MS: u64 = 5_000;
/// Default for `MetaConfig::retention_check_interval_ms`.
pub const DEFAULT_RETENTION_CHECK_INTERVAL_MS: u64 = 60_000;
/// Default for `MetaConfig::replace_after_ms`: 0, replicas are never moved.
pub const DEFAULT_REPLACE_AFTER_MS: u64 = 0;
/// How often the leader looks for in-sync replicas on nodes that are down.
const FAILOVER_TICK: Duration = Duration::from_millis(250);
/// Build a snapshot after this many log entries since the last one.
const SNAPSHOT_EVERY_LOGS: u64 = 1_000;
/// How long a joining replica waits between rounds of asking.
const JOIN_RETRY: Duration = Duration::from_millis(500);
/// Bounds of the orderly shutdown steps.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(5);
const DB_RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// How to run one meta replica.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// This replica's Raft id: at least 1 and unique in the cluster.
    pub node_id: u64,
    /// Where the gRPC server listens; port 0 picks a free port.
    pub listen_addr: SocketAddr,
    /// host:port the other replicas and clients use; defaults to the bound
    /// listen address.
    pub advertise_addr: Option<String>,
    /// Directory of this replica's RocksDB.
    pub data_dir: PathBuf,
    /// Start a new single-voter cluster of this replica, unless the data
    /// directory already holds one. When set, `join` is ignored.
    pub bootstrap: bool,
    /// Addresses of existing replicas to ask (any of them, until one
    /// succeeds) to add this replica as a voter. Nothing happens when this
    /// replica already is a voter.
    pub join: Vec<String>,
    /// A storage node is down after this long without a heartbeat.
    pub node_timeout_ms: u64,
    /// Replicas per new partition; capped at the number of storage nodes.
    pub replication_factor: usize,
    /// How often the leader looks for partitions past their table's
    /// retention and removes them from the map; 0 turns retention off.
    pub retention_check_interval_ms: u64,
    /// A storage node silent this long is gone for good: its replicas are
    /// re-created on other nodes from the survivors. 0 never replaces.
    pub replace_after_ms: u64,
}

impl MetaConfig {
    /// A config with the defaults for everything but the identity and places.
    pub fn new(node_id: u64, listen_addr: SocketAddr, data_dir: impl Into<PathBuf>) -> Self {
        MetaConfig {
            node_id,
            listen_addr,
            advertise_addr: None,
            data_dir: data_dir.into(),
            bootstrap: false,
            join: vec![],
            node_timeout_ms: DEFAULT_NODE_TIMEOUT_MS,
            replication_factor: 1,
            retention_check_interval_ms: DEFAULT_RETENTION_CHECK_INTERVAL_MS,
            replace_after_ms: DEFAULT_REPLACE_AFTER_MS,
        }
    }
}

/// The Raft settings meta runs with: heartbeats every 250 ms and elections
/// after 1–2 s of silence, which is quick on a LAN and on loopback yet far
/// above a busy machine's scheduling hiccups.
fn raft_config() -> Result<Arc<Config>> {
    let config = Config {
        cluster_name: "sealion-meta".to_string(),
        heartbeat_interval: 250,
        election_timeout_min: 1_000,
        election_timeout_max: 2_000,
        install_snapshot_timeout: 5_000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_LOGS),
        max_in_snapshot_log_to_keep: SNAPSHOT_EVERY_LOGS,
        // Chunks travel as JSON arrays of numbers (up to 4 bytes per byte):
        // keep them far below the gRPC message limit.
        snapshot_max_chunk_size: 1024 * 1024,
        ..Default::default()
    };
    Ok(Arc::new(
        config
            .validate()
            .map_err(|e| Error::Config(e.to_string()))?,
    ))
}

/// A running meta replica.
pub struct MetaServer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    server: JoinHandle<std::result::Result<(), tonic::transport::Error>>,
    background: Vec<JoinHandle<()>>,
    db_closed: oneshot::Receiver<()>,
}

impl MetaServer {
    /// Opens the data directory, starts Raft and the gRPC server, and forms
    /// or joins the cluster in the background. Returns once the server
    /// accepts connections.
    pub async fn start(cfg: MetaConfig) -> Result<MetaServer> {
        if cfg.node_id == 0 {
            return Err(Error::Config("meta node id must be at least 1".into()));
        }
        let node_timeout_ms = if cfg.node_timeout_ms == 0 {
            DEFAULT_NODE_TIMEOUT_MS
        } else {
            cfg.node_timeout_ms
        };
        let listener = TcpListener::bind(cfg.listen_addr).await?;
        let local_addr = listener.local_addr()?;
        let addr = cfg
            .advertise_addr
            .clone()
            .unwrap_or_else(|| local_addr.to_string());
        if cfg.advertise_addr.is_none() && local_addr.ip().is_unspecified() {
            tracing::warn!(%local_addr, "meta listens on an unspecified address and has no advertise address");
        }

        let db = {
            let dir = cfg.data_dir.clone();
            tokio::task::spawn_blocking(move || open_db(&dir))
                .await
                .map_err(|e| Error::Raft(format!("opening rocksdb: {e}")))??
        };
        let (db, db_closed) = db;
        let log_store = LogStore::new(db.clone());
        let (state_machine, state_rx) = StateMachine::open(db).await?;
        let raft = Raft::new(
            cfg.node_id,
            raft_config()?,
            Network,
            log_store,
            state_machine,
        )
        .await
        .map_err(|e| Error::Raft(e.to_string()))?;

        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared::new(
            cfg.node_id,
            addr.clone(),
            raft.clone(),
            state_rx,
            Liveness::new(Duration::from_millis(node_timeout_ms)),
            cfg.replication_factor.max(1),
            stop_rx.clone(),
        ));

        let service = GrpcMetaServer::new(MetaService::new(shared.clone()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let mut server_stop = stop_rx.clone();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(service)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                    async move {
                        let _ = server_stop.wait_for(|s| *s).await;
                    },
                ),
        );

        let mut background = vec![
            tokio::spawn(track_leadership(shared.clone())),
            tokio::spawn(form_cluster(
                shared.clone(),
                cfg.bootstrap,
                cfg.join.clone(),
                stop_rx.clone(),
            )),
        ];
        background.push(tokio::spawn(failover_loop(
            shared.clone(),
            Duration::from_millis(cfg.replace_after_ms),
            stop_rx.clone(),
        )));
        if cfg.retention_check_interval_ms > 0 {
            background.push(tokio::spawn(retention_loop(
                shared.clone(),
                Duration::from_millis(cfg.retention_check_interval_ms),
                stop_rx,
            )));
        }
        tracing::info!(node = cfg.node_id, %local_addr, advertise = %addr, "meta replica started");
        Ok(MetaServer {
            shared,
            local_addr,
            stop,
            server,
            background,
            db_closed,
        })
    }

    /// The address the gRPC server is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This replica's Raft id.
    pub fn node_id(&self) -> u64 {
        self.shared.id
    }

    /// The Raft handle, for callers that want metrics or to wait on them.
    pub fn raft(&self) -> &Raft {
        &self.shared.raft
    }

    /// The state this replica has applied, with the version it is at.
    pub fn state(&self) -> Arc<sealion_proto::ClusterState> {
        self.shared.current_state()
    }

    /// Stops serving, then stops Raft, then waits until RocksDB is closed.
    pub async fn shutdown(self) -> Result<()> {
        let node = self.shared.id;
        self.stop.send_replace(true);
        for task in &self.background {
            task.abort();
        }
        let mut server = self.server;
        match tokio::time::timeout(SERVER_STOP_TIMEOUT, &mut server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => {
                tracing::warn!(node, error = %e, "meta grpc server ended with an error")
            }
            Ok(Err(e)) => tracing::warn!(node, error = %e, "meta grpc server task failed"),
            Err(_) => {
                tracing::warn!(node, "meta grpc server did not stop in time; aborting it");
                server.abort();
            }
        }
        if let Err(e) = self.shared.raft.shutdown().await {
            tracing::warn!(node, error = %e, "raft shutdown failed");
        }
        for task in self.background {
            let _ = task.await;
        }
        drop(self.shared);
        // Raft's state machine worker and snapshot tasks end on their own
        // once the core has stopped; wait until the last handle is gone.
        if tokio::time::timeout(DB_RELEASE_TIMEOUT, self.db_closed)
            .await
            .is_err()
        {
            return Err(Error::Timeout(format!(
                "rocksdb of meta node {node} still in use after shutdown"
            )));
        }
        tracing::info!(node, "meta replica stopped");
        Ok(())
    }
}

/// On the leader, removes partitions whose time has passed their table's
/// retention from the map, every `interval`. Storage nodes then delete the
/// rows of partitions the map no longer holds (their sweeper).
async fn retention_loop(shared: Arc<Shared>, interval: Duration, mut stop: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticker.tick() => {}
        }
        if shared.raft.metrics().borrow().state != ServerState::Leader {
            continue;
        }
        let now_ns = sealion_common::time::now_ms().saturating_mul(1_000_000);
        let expired = crate::machine::expired_partitions(&shared.state.borrow(), now_ns);
        if expired.is_empty() {
            continue;
        }
        let count = expired.len();
        let cmd = sealion_proto::MetaCommand {
            cmd: Some(sealion_proto::meta_command::Cmd::ExpirePartitions(
                sealion_proto::ExpirePartitions {
                    partition_ids: expired,
                },
            )),
        };
        match shared.propose(cmd, false).await {
            Ok(_) => tracing::info!(count, "partitions past retention removed from the map"),
            Err(e) => tracing::warn!(error = %e, "retention: could not expire partitions"),
        }
    }
}

/// On the leader: takes replicas on nodes that are down out of the in-sync
/// sets (promoting an in-sync replica where the primary died), and, when
/// `replace_after` is not zero, re-creates the replicas of nodes silent that
/// long on other nodes. Every change is a compare-and-set on the epoch, so a
/// primary's own change racing this one makes one of them lose cleanly.
async fn failover_loop(
    shared: Arc<Shared>,
    replace_after: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(FAILOVER_TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticker.tick() => {}
        }
        if shared.raft.metrics().borrow().state != ServerState::Leader {
            continue;
        }
        let state = shared.current_state();
        let mut changes = {
            let liveness = shared.liveness();
            crate::placement::failover_changes(&state, |id| liveness.is_up(id))
        };
        if changes.is_empty() && !replace_after.is_zero() {
            let liveness = shared.liveness();
            changes = crate::placement::replacement_changes(
                &state,
                |id| liveness.is_up(id),
                |id| liveness.silent_for(id) >= replace_after,
            );
        }
        if changes.is_empty() {
            continue;
        }
        for c in &changes {
            tracing::info!(
                partition_id = c.partition_id,
                epoch = c.expected_epoch + 1,
                replicas = ?c.replicas,
                in_sync = ?c.in_sync,
                reason = %c.reason,
                "changing replicas"
            );
        }
        let cmd = sealion_proto::MetaCommand {
            cmd: Some(sealion_proto::meta_command::Cmd::UpdateReplicas(
                sealion_proto::UpdateReplicas { changes },
            )),
        };
        match shared.propose(cmd, false).await {
            Ok(r) if !r.error.is_empty() => {
                tracing::debug!(error = %r.error, "replica change lost a race; next tick looks again")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not change replicas"),
        }
    }
}

/// Starts the liveness grace period whenever this replica becomes leader.
async fn track_leadership(shared: Arc<Shared>) {
    let mut metrics = shared.raft.metrics();
    let mut led_term: Option<u64> = None;
    loop {
        let (leading, term) = {
            let m = metrics.borrow_and_update();
            (m.state == ServerState::Leader, m.current_term)
        };
        if leading && led_term != Some(term) {
            tracing::info!(node = shared.id, term, "became meta leader");
            shared.liveness().became_leader();
            led_term = Some(term);
        } else if !leading {
            led_term = None;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Makes this replica part of a cluster: initializes a new one when asked
/// to bootstrap, else asks the replicas in `join` to add it as a voter until
/// one of them has.
async fn form_cluster(
    shared: Arc<Shared>,
    bootstrap: bool,
    join: Vec<String>,
    mut stop: watch::Receiver<bool>,
) {
    let raft = &shared.raft;
    if bootstrap {
        match raft.is_initialized().await {
            Ok(true) => {
                tracing::info!(node = shared.id, "meta cluster already initialized");
                // A lone voter need not sit out an election timeout after a
                // restart (standalone mode restarts this way).
                if is_sole_voter(&shared).await
                    && let Err(e) = raft.trigger().elect().await
                {
                    tracing::warn!(node = shared.id, error = %e, "cannot trigger an election");
                }
            }
            Ok(false) => {
                let members = BTreeMap::from([(shared.id, Node::new(shared.addr.clone()))]);
                match raft.initialize(members).await {
                    Ok(()) => tracing::info!(node = shared.id, "bootstrapped a new meta cluster"),
                    Err(e) => tracing::warn!(node = shared.id, error = %e, "bootstrap failed"),
                }
            }
            Err(e) => {
                tracing::warn!(node = shared.id, error = %e, "cannot tell whether raft is initialized")
            }
        }
        return;
    }
    let peers: Vec<&String> = join.iter().filter(|a| **a != shared.addr).collect();
    if peers.is_empty() {
        return;
    }
    let mut attempt = 0u64;
    loop {
        if is_voter(&shared) {
            tracing::info!(node = shared.id, "meta replica is a voter");
            return;
        }
        for addr in &peers {
            let request = AddMetaNodeRequest {
                node_id: shared.id,
                addr: shared.addr.clone(),
            };
            let client = match channel(addr) {
                Ok(c) => grpc_client(c),
                Err(e) => {
                    tracing::warn!(%addr, error = %e, "bad join address");
                    continue;
                }
            };
            let mut client = client;
            let mut req = tonic::Request::new(request);
            req.set_timeout(Duration::from_secs(40));
            match client.add_meta_node(req).await {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    tracing::info!(node = shared.id, via = %addr, leader = reply.leader_id, "joined the meta cluster");
                    return;
                }
                Err(status) => {
                    if attempt.is_multiple_of(10) {
                        tracing::info!(node = shared.id, via = %addr, %status, "join attempt failed; retrying");
                    }
                }
            }
        }
        attempt += 1;
        tokio::select! {
            _ = tokio::time::sleep(JOIN_RETRY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

async fn is_sole_voter(shared: &Shared) -> bool {
    let id = shared.id;
    shared
        .raft
        .with_raft_state(move |st| {
            let voters: Vec<u64> = st
                .membership_state
                .effective()
                .membership()
                .voter_ids()
                .collect();
            voters == [id]
        })
        .await
        .unwrap_or(false)
}

fn is_voter(shared: &Shared) -> bool {
    let m = shared.raft.metrics();
    let m = m.borrow();
    m.membership_config
        .membership()
        .voter_ids()
        .any(|id| id == shared.id)
}
