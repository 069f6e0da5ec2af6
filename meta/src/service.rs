//! The `Meta` gRPC service: what storage nodes, query nodes and the other
//! meta replicas call.
//!
//! It exists to put Raft behind a small, forgiving API: any replica accepts
//! any call, and a follower forwards what only the leader can answer
//! (proposals, linearizable reads, heartbeats, membership changes) to the
//! leader it knows. A forwarded call is marked so it is never forwarded a
//! second time: a replica that is asked by another replica and is not the
//! leader answers `Unavailable`, and the caller retries. Reads of the state
//! come from a watch channel the state machine publishes to, so they never
//! wait on Raft.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};
use sealion_proto::meta_client::MetaClient as GrpcMetaClient;
use sealion_proto::meta_command::Cmd;
use sealion_proto::meta_server::Meta;
use sealion_proto::{
    AddMetaNodeRequest, ClusterState, GetStateReply, GetStateRequest, HeartbeatReply,
    HeartbeatRequest, MetaClusterReply, MetaClusterRequest, MetaCommand, MetaMember, MetaResponse,
    NodeLiveness, ProposeRequest, RaftMessage, WatchRequest,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::network::{channel, grpc_client};
use crate::placement::{Liveness, place};
use crate::types::{Node, NodeId, Raft};
use crate::{Error, Result};

/// Metadata key that marks a call one replica forwarded to another.
const FORWARDED: &str = "x-sealion-forwarded";
/// How long a proposal may wait for commit before the caller is told to retry.
const WRITE_TIMEOUT: Duration = Duration::from_secs(8);
/// How long a read barrier may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long adding a replica may take (the learner must catch up first).
const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of a call forwarded to the leader.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(9);
/// How often a Watch stream checks whether liveness changed.
const LIVENESS_TICK: Duration = Duration::from_millis(500);
/// Messages a Watch stream may buffer for a slow client; the state is a
/// snapshot, so a client that lags just skips intermediate ones.
const WATCH_BUFFER: usize = 4;

/// What every handler shares: this replica's Raft, its published state and
/// the leader-only liveness table.
pub struct Shared {
    pub id: NodeId,
    pub addr: String,
    pub raft: Raft,
    pub state: watch::Receiver<Arc<ClusterState>>,
    pub liveness: Mutex<Liveness>,
    pub replication_factor: usize,
    /// Becomes true when the server shuts down; Watch streams end then.
    pub shutdown: watch::Receiver<bool>,
    peers: Mutex<HashMap<String, GrpcMetaClient<Channel>>>,
}

impl Shared {
    pub fn new(
        id: NodeId,
        addr: String,
        raft: Raft,
        state: watch::Receiver<Arc<ClusterState>>,
        liveness: Liveness,
        replication_factor: usize,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Shared {
            id,
            addr,
            raft,
            state,
            liveness: Mutex::new(liveness),
            replication_factor,
            shutdown,
            peers: Mutex::new(HashMap::new()),
        }
    }

    pub fn liveness(&self) -> MutexGuard<'_, Liveness> {
        // The table holds plain data; a panic while it was held cannot leave
        // it inconsistent, so a poisoned lock is still usable.
        self.liveness.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// The leader this replica knows of, with its address, unless it is this
    /// replica itself.
    pub fn remote_leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader?;
        if leader == self.id {
            return None;
        }
        let node = m.membership_config.membership().get_node(&leader)?;
        Some((leader, node.addr.clone()))
    }

    pub fn current_state(&self) -> Arc<ClusterState> {
        self.state.borrow().clone()
    }

    fn reply(&self, state: &ClusterState) -> GetStateReply {
        GetStateReply {
            state: Some(state.clone()),
            liveness: self.liveness_report(state),
        }
    }

    fn liveness_report(&self, state: &ClusterState) -> Vec<NodeLiveness> {
        if self.is_leader() {
            self.liveness().report(state)
        } else {
            vec![]
        }
    }

    fn peer(&self, addr: &str) -> Result<GrpcMetaClient<Channel>> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = peers.get(addr) {
            return Ok(c.clone());
        }
        let client = grpc_client(channel(addr)?);
        peers.insert(addr.to_string(), client.clone());
        Ok(client)
    }

    /// The leader to forward a call to, or why there is none.
    fn forward_target(&self, forwarded: bool) -> Result<(NodeId, GrpcMetaClient<Channel>)> {
        if forwarded {
            return Err(Error::Unavailable(format!(
                "meta node {} is not the leader (call was already forwarded)",
                self.id
            )));
        }
        let (leader, addr) = self
            .remote_leader()
            .ok_or_else(|| Error::Unavailable(format!("meta node {} knows no leader", self.id)))?;
        Ok((leader, self.peer(&addr)?))
    }

    /// Proposes `cmd` here if this replica leads, else on the leader.
    pub async fn propose(&self, cmd: MetaCommand, forwarded: bool) -> Result<MetaResponse> {
        if !self.is_leader() {
            return self.forward_propose(cmd, forwarded).await;
        }
        match self.propose_local(cmd.clone()).await {
            Err(Error::Raft(m)) if !forwarded && self.remote_leader().is_some() => {
                tracing::debug!(error = %m, "leadership moved while proposing; forwarding");
                self.forward_propose(cmd, forwarded).await
            }
            other => other,
        }
    }

    async fn forward_propose(&self, cmd: MetaCommand, forwarded: bool) -> Result<MetaResponse> {
        let (leader, mut client) = self.forward_target(forwarded)?;
        tracing::debug!(leader, "forwarding proposal to the meta leader");
        let request = forwarded_request(ProposeRequest { command: Some(cmd) });
        let reply = client.propose(request).await.map_err(Error::Remote)?;
        Ok(reply.into_inner())
    }

    async fn propose_local(&self, mut cmd: MetaCommand) -> Result<MetaResponse> {
        if let Some(Cmd::EnsurePartitions(ensure)) = &mut cmd.cmd {
            // Place on the latest state: a read barrier first, so that a new
            // leader does not place by a partition map it has not caught up on.
            self.read_barrier().await?;
            let state = self.current_state();
            let placed = {
                let liveness = self.liveness();
                place(
                    &state,
                    ensure,
                    |id| liveness.is_up(id),
                    self.replication_factor,
                )
            };
            if let Err(refusal) = placed {
                return Ok(refusal.into_response(state.version));
            }
        }
        match tokio::time::timeout(WRITE_TIMEOUT, self.raft.client_write(cmd)).await {
            Err(_) => Err(Error::Timeout(format!(
                "proposal not committed within {WRITE_TIMEOUT:?}; it may still be applied"
            ))),
            Ok(Ok(written)) => Ok(written.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => Err(Error::Raft(
                format!("not the leader any more (leader: {:?})", f.leader_id),
            )),
            Ok(Err(e)) => Err(Error::Raft(e.to_string())),
        }
    }

    /// Waits until this leader has applied everything committed before the
    /// call, and is confirmed leader by a quorum.
    pub async fn read_barrier(&self) -> Result<()> {
        match tokio::time::timeout(READ_TIMEOUT, self.raft.ensure_linearizable()).await {
            Err(_) => Err(Error::Timeout(format!(
                "read barrier not reached within {READ_TIMEOUT:?}"
            ))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Error::Raft(e.to_string())),
        }
    }

    pub async fn get_state(&self, linearizable: bool, forwarded: bool) -> Result<GetStateReply> {
        if !linearizable {
            return Ok(self.reply(&self.current_state()));
        }
        if !self.is_leader() {
            let (_, mut client) = self.forward_target(forwarded)?;
            let reply = client
                .get_state(forwarded_request(GetStateRequest { linearizable }))
                .await
                .map_err(Error::Remote)?;
            return Ok(reply.into_inner());
        }
        self.read_barrier().await?;
        Ok(self.reply(&self.current_state()))
    }

    pub async fn heartbeat(
        &self,
        req: HeartbeatRequest,
        forwarded: bool,
    ) -> Result<HeartbeatReply> {
        if req.node_id == 0 {
            return Err(Error::Invalid(
                "heartbeat from node id 0: register first".into(),
            ));
        }
        // Followers remember forwarded heartbeats too, so a replica that
        // becomes leader already knows who is alive.
        self.liveness()
            .record(req.node_id, sealion_common::time::now_ms());
        if !self.is_leader() {
            let (_, mut client) = self.forward_target(forwarded)?;
            let reply = client
                .heartbeat(forwarded_request(req))
                .await
                .map_err(Error::Remote)?;
            return Ok(reply.into_inner());
        }
        let known = self
            .current_state()
            .nodes
            .iter()
            .any(|n| n.id == req.node_id);
        Ok(HeartbeatReply { known })
    }

    pub async fn add_meta_node(
        &self,
        req: AddMetaNodeRequest,
        forwarded: bool,
    ) -> Result<MetaClusterReply> {
        if req.node_id == 0 || req.addr.trim().is_empty() {
            return Err(Error::Invalid(
                "a meta node needs an id >= 1 and an address".into(),
            ));
        }
        if !self.is_leader() {
            let (_, mut client) = self.forward_target(forwarded)?;
            let reply = client
                .add_meta_node(forwarded_request(req))
                .await
                .map_err(Error::Remote)?;
            return Ok(reply.into_inner());
        }
        let node = Node::new(req.addr.clone());
        let (is_voter, known_addr) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            (
                membership.voter_ids().any(|id| id == req.node_id),
                membership.get_node(&req.node_id).map(|n| n.addr.clone()),
            )
        };
        match known_addr {
            Some(addr) if addr == req.addr => {}
            Some(old) => {
                tracing::info!(node = req.node_id, %old, new = %req.addr, "meta node changed address");
                let mut nodes = BTreeMap::new();
                nodes.insert(req.node_id, node.clone());
                self.change_membership(ChangeMembers::SetNodes(nodes))
                    .await?;
            }
            None => {
                tracing::info!(node = req.node_id, addr = %req.addr, "adding meta node as learner");
                let added = tokio::time::timeout(
                    MEMBERSHIP_TIMEOUT,
                    self.raft.add_learner(req.node_id, node, true),
                )
                .await;
                match added {
                    Err(_) => {
                        return Err(Error::Timeout(format!(
                            "meta node {} did not catch up",
                            req.node_id
                        )));
                    }
                    Ok(Err(e)) => return Err(Error::Raft(e.to_string())),
                    Ok(Ok(_)) => {}
                }
            }
        }
        if !is_voter {
            tracing::info!(node = req.node_id, "promoting meta node to voter");
            self.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([req.node_id])))
                .await?;
        }
        Ok(self.cluster_info())
    }

    async fn change_membership(&self, change: ChangeMembers<NodeId, Node>) -> Result<()> {
        match tokio::time::timeout(
            MEMBERSHIP_TIMEOUT,
            self.raft.change_membership(change, false),
        )
        .await
        {
            Err(_) => Err(Error::Timeout("membership change not committed".into())),
            Ok(Err(e)) => Err(Error::Raft(e.to_string())),
            Ok(Ok(_)) => Ok(()),
        }
    }

    pub fn cluster_info(&self) -> MetaClusterReply {
        let m = self.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| MetaMember {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let membership_settled = membership.get_joint_config().len() == 1
            && m.membership_config
                .log_id()
                .is_none_or(|at| m.last_applied.is_some_and(|a| a.index >= at.index));
        let leader_id = m.current_leader.unwrap_or(0);
        let leader_addr = m
            .current_leader
            .and_then(|l| membership.get_node(&l))
            .map(|n| n.addr.clone())
            .unwrap_or_default();
        MetaClusterReply {
            leader_id,
            leader_addr,
            members,
            current_term: m.current_term,
            last_applied: m.last_applied.map_or(0, |l| l.index),
            node_id: self.id,
            membership_settled,
        }
    }
}

fn forwarded_request<T>(msg: T) -> Request<T> {
    let mut request = Request::new(msg);
    request.set_timeout(FORWARD_TIMEOUT);
    request
        .metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    request
}

fn is_forwarded<T>(request: &Request<T>) -> bool {
    request.metadata().contains_key(FORWARDED)
}

/// The gRPC face of one meta replica.
#[derive(Clone)]
pub struct MetaService {
    shared: Arc<Shared>,
}

impl MetaService {
    pub fn new(shared: Arc<Shared>) -> Self {
        MetaService { shared }
    }
}

fn decode<T: serde::de::DeserializeOwned>(msg: &RaftMessage) -> Result<T> {
    serde_json::from_slice(&msg.payload)
        .map_err(|e| Error::Invalid(format!("bad raft payload: {e}")))
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Response<RaftMessage>> {
    let payload = serde_json::to_vec(value)?;
    Ok(Response::new(RaftMessage { payload }))
}

/// The liveness part of a reply that a Watch stream compares to decide
/// whether to send again.
fn liveness_key(liveness: &[NodeLiveness]) -> Vec<(u64, i32)> {
    liveness.iter().map(|l| (l.node_id, l.state)).collect()
}

#[tonic::async_trait]
impl Meta for MetaService {
    async fn propose(
        &self,
        request: Request<ProposeRequest>,
    ) -> Result<Response<MetaResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let Some(cmd) = request.into_inner().command else {
            return Err(Error::Invalid("Propose without a command".into()).into());
        };
        Ok(Response::new(self.shared.propose(cmd, forwarded).await?))
    }

    async fn get_state(
        &self,
        request: Request<GetStateRequest>,
    ) -> Result<Response<GetStateReply>, Status> {
        let forwarded = is_forwarded(&request);
        let linearizable = request.into_inner().linearizable;
        Ok(Response::new(
            self.shared.get_state(linearizable, forwarded).await?,
        ))
    }

    type WatchStream = ReceiverStream<Result<GetStateReply, Status>>;

    async fn watch(
        &self,
        _request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // `after_version` needs no handling: the first message is always the
        // full current state, and every later one is newer.
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let mut state_rx = shared.state.clone();
            let mut shutdown = shared.shutdown.clone();
            let mut tick = tokio::time::interval(LIVENESS_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let first = shared.reply(&state_rx.borrow_and_update());
            let mut sent_liveness = liveness_key(&first.liveness);
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            loop {
                let next = tokio::select! {
                    changed = state_rx.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let state = state_rx.borrow_and_update().clone();
                        Some(shared.reply(&state))
                    }
                    _ = tick.tick() => {
                        // Only clone the state when liveness changed.
                        let state = shared.current_state();
                        let liveness = shared.liveness_report(&state);
                        (liveness_key(&liveness) != sent_liveness).then(|| GetStateReply {
                            state: Some((*state).clone()),
                            liveness,
                        })
                    }
                    _ = shutdown.wait_for(|stop| *stop) => break,
                    _ = tx.closed() => break,
                };
                if let Some(reply) = next {
                    sent_liveness = liveness_key(&reply.liveness);
                    if tx.send(Ok(reply)).await.is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let forwarded = is_forwarded(&request);
        Ok(Response::new(
            self.shared
                .heartbeat(request.into_inner(), forwarded)
                .await?,
        ))
    }

    async fn add_meta_node(
        &self,
        request: Request<AddMetaNodeRequest>,
    ) -> Result<Response<MetaClusterReply>, Status> {
        let forwarded = is_forwarded(&request);
        Ok(Response::new(
            self.shared
                .add_meta_node(request.into_inner(), forwarded)
                .await?,
        ))
    }

    async fn cluster_info(
        &self,
        _request: Request<MetaClusterRequest>,
    ) -> Result<Response<MetaClusterReply>, Status> {
        Ok(Response::new(self.shared.cluster_info()))
    }

    async fn raft_append(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = decode(request.get_ref())?;
        Ok(encode(&self.shared.raft.append_entries(rpc).await)?)
    }

    async fn raft_vote(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = decode(request.get_ref())?;
        Ok(encode(&self.shared.raft.vote(rpc).await)?)
    }

    async fn raft_snapshot(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = decode(request.get_ref())?;
        Ok(encode(&self.shared.raft.install_snapshot(rpc).await)?)
    }
}
