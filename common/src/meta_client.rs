//! The client that storage and query nodes use to reach meta.
//!
//! It keeps a local copy of the cluster state, fed by a watch stream from any
//! meta replica, so reads of the catalog and partition map never wait on the
//! network. Changes go through `propose`, which retries across replicas while
//! the leader changes, and returns only after the local copy has caught up
//! with the change (read-your-writes for the caller).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use crate::proto::meta_client::MetaClient as GrpcMetaClient;
use crate::proto::{
    ClusterState, GetStateReply, GetStateRequest, HeartbeatRequest, MetaCommand, MetaResponse,
    ProposeRequest, WatchRequest, meta_command,
};
use crate::{Error, Result};

/// How long a call keeps retrying while no meta leader is reachable.
const PROPOSE_DEADLINE: Duration = Duration::from_secs(15);
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

pub struct MetaClient {
    channels: Vec<(String, Channel)>,
    /// Index of the replica that answered last; tried first.
    preferred: AtomicUsize,
    state_rx: watch::Receiver<Arc<GetStateReply>>,
    /// The last state handed out by [`MetaClient::state`]: a state is fixed
    /// by its version (the meta log index), so callers share one copy until
    /// the version moves instead of copying the catalog on every call.
    shared_state: std::sync::Mutex<Option<Arc<ClusterState>>>,
}

impl MetaClient {
    /// Connects to the meta replicas at `addrs` (host:port) and waits until a
    /// first cluster state has arrived, or `wait` has passed.
    pub async fn connect(addrs: &[String], wait: Duration) -> Result<Arc<Self>> {
        if addrs.is_empty() {
            return Err(Error::Invalid("no meta address given".into()));
        }
        let mut channels = Vec::with_capacity(addrs.len());
        for addr in addrs {
            let endpoint = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| Error::Invalid(format!("bad meta address {addr}: {e}")))?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true);
            channels.push((addr.clone(), endpoint.connect_lazy()));
        }
        let (tx, rx) = watch::channel(Arc::new(GetStateReply {
            state: Some(ClusterState::default()),
            liveness: vec![],
        }));
        let client = Arc::new(MetaClient {
            channels,
            preferred: AtomicUsize::new(0),
            state_rx: rx,
            shared_state: std::sync::Mutex::new(None),
        });
        tokio::spawn(watch_loop(Arc::downgrade(&client), tx));
        let mut rx = client.state_rx.clone();
        let first = tokio::time::timeout(wait, async {
            loop {
                if rx.borrow().state.as_ref().is_some_and(|s| s.version > 0) {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        if first.is_err() {
            return Err(Error::MetaUnavailable(format!(
                "no cluster state from meta at {} within {:?}",
                addrs.join(","),
                wait
            )));
        }
        Ok(client)
    }

    /// The latest cluster state this client has seen.
    pub fn state(&self) -> Arc<ClusterState> {
        let reply = self.state_rx.borrow();
        let version = reply.state.as_ref().map(|s| s.version);
        let Ok(mut shared) = self.shared_state.lock() else {
            return Arc::new(reply.state.clone().unwrap_or_default());
        };
        if let (Some(v), Some(s)) = (version, shared.as_ref())
            && s.version == v
        {
            return s.clone();
        }
        let fresh = Arc::new(reply.state.clone().unwrap_or_default());
        *shared = Some(fresh.clone());
        fresh
    }

    /// A receiver that changes whenever the cluster state does.
    pub fn subscribe(&self) -> watch::Receiver<Arc<GetStateReply>> {
        self.state_rx.clone()
    }

    fn order(&self) -> impl Iterator<Item = &(String, Channel)> {
        let n = self.channels.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        (0..n).map(move |i| &self.channels[(first + i) % n])
    }

    fn prefer(&self, addr: &str) {
        if let Some(i) = self.channels.iter().position(|(a, _)| a == addr) {
            self.preferred.store(i, Ordering::Relaxed);
        }
    }

    /// Applies `cmd` through Raft. An error that meta returned for the command
    /// itself (a conflict, a missing table) is `Error::Rejected` and is not
    /// retried; unavailability is retried until `PROPOSE_DEADLINE`.
    pub async fn propose(&self, cmd: meta_command::Cmd) -> Result<MetaResponse> {
        let request = ProposeRequest {
            command: Some(MetaCommand { cmd: Some(cmd) }),
        };
        let deadline = tokio::time::Instant::now() + PROPOSE_DEADLINE;
        let mut last_error = String::new();
        loop {
            for (addr, channel) in self.order() {
                let mut client = GrpcMetaClient::new(channel.clone());
                let mut req = tonic::Request::new(request.clone());
                req.set_timeout(RPC_TIMEOUT);
                match client.propose(req).await {
                    Ok(reply) => {
                        self.prefer(addr);
                        let reply = reply.into_inner();
                        if !reply.error.is_empty() {
                            return Err(Error::Rejected {
                                kind: reply.error_kind,
                                message: reply.error,
                            });
                        }
                        self.wait_for_version(reply.version).await;
                        return Ok(reply);
                    }
                    Err(status) if status.code() == Code::InvalidArgument => {
                        return Err(Error::Invalid(status.message().to_string()));
                    }
                    Err(status) => last_error = format!("{addr}: {status}"),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::MetaUnavailable(last_error));
            }
            tokio::time::sleep(RETRY_BACKOFF).await;
        }
    }

    /// Asks meta for its state; with `linearizable`, the leader answers after a
    /// read barrier and includes node liveness.
    pub async fn get_state(&self, linearizable: bool) -> Result<GetStateReply> {
        let deadline = tokio::time::Instant::now() + PROPOSE_DEADLINE;
        let mut last_error = String::new();
        loop {
            for (addr, channel) in self.order() {
                let mut client = GrpcMetaClient::new(channel.clone());
                let mut req = tonic::Request::new(GetStateRequest { linearizable });
                req.set_timeout(RPC_TIMEOUT);
                match client.get_state(req).await {
                    Ok(reply) => {
                        self.prefer(addr);
                        return Ok(reply.into_inner());
                    }
                    Err(status) => last_error = format!("{addr}: {status}"),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::MetaUnavailable(last_error));
            }
            tokio::time::sleep(RETRY_BACKOFF).await;
        }
    }

    /// Reports that storage node `node_id` is alive; `Ok(false)` when meta
    /// does not know the node.
    pub async fn heartbeat(&self, node_id: u64, addr: &str) -> Result<bool> {
        let mut last_error = String::new();
        for (maddr, channel) in self.order() {
            let mut client = GrpcMetaClient::new(channel.clone());
            let mut req = tonic::Request::new(HeartbeatRequest {
                node_id,
                addr: addr.to_string(),
            });
            req.set_timeout(Duration::from_secs(3));
            match client.heartbeat(req).await {
                Ok(reply) => {
                    self.prefer(maddr);
                    return Ok(reply.into_inner().known);
                }
                Err(status) => last_error = format!("{maddr}: {status}"),
            }
        }
        Err(Error::MetaUnavailable(last_error))
    }

    /// Waits (bounded) until the local state includes `version`; if the
    /// watch stream lags, fetches the state directly.
    pub async fn wait_for_version(&self, version: u64) {
        let mut rx = self.state_rx.clone();
        let caught_up = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                if rx
                    .borrow()
                    .state
                    .as_ref()
                    .is_some_and(|s| s.version >= version)
                {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        if caught_up.is_err() {
            tracing::debug!(
                version,
                "watch stream lags; state stays as it is until it catches up"
            );
        }
    }

    /// The latest state, refreshed from meta when it is older than `version`.
    pub async fn state_at_least(&self, version: u64) -> Result<Arc<ClusterState>> {
        let state = self.state();
        if state.version >= version {
            return Ok(state);
        }
        self.wait_for_version(version).await;
        let state = self.state();
        if state.version >= version {
            return Ok(state);
        }
        let reply = self.get_state(true).await?;
        Ok(Arc::new(reply.state.unwrap_or_default()))
    }
}

/// Keeps `tx` fed from a watch stream of any reachable replica, until the
/// client is dropped.
async fn watch_loop(client: std::sync::Weak<MetaClient>, tx: watch::Sender<Arc<GetStateReply>>) {
    let mut index = 0usize;
    loop {
        let Some(this) = client.upgrade() else { return };
        let (addr, channel) = this.channels[index % this.channels.len()].clone();
        drop(this);
        index += 1;
        let after_version = tx.borrow().state.as_ref().map_or(0, |s| s.version);
        let mut grpc = GrpcMetaClient::new(channel);
        match grpc.watch(WatchRequest { after_version }).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(reply)) => {
                            let newer = reply.state.as_ref().map_or(0, |s| s.version)
                                >= tx.borrow().state.as_ref().map_or(0, |s| s.version);
                            if newer && tx.send(Arc::new(reply)).is_err() {
                                return;
                            }
                            if client.strong_count() == 0 {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::debug!(%addr, %status, "meta watch stream ended");
                            break;
                        }
                    }
                }
            }
            Err(status) => tracing::debug!(%addr, %status, "meta watch failed"),
        }
        if client.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(RETRY_BACKOFF).await;
    }
}
