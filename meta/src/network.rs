//! Raft's transport: openraft's RPCs carried over the `Meta` gRPC service.
//!
//! The proto file deliberately knows nothing of openraft's message types
//! (they change between openraft versions), so each RPC carries the JSON of
//! openraft's request in `RaftMessage.payload`, and the answer carries the
//! JSON of `Result<response, RaftError>`. This module is the client half; the
//! server half is in `service`. It must never interpret the messages: that is
//! openraft's job.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use sealion_proto::RaftMessage;
use sealion_proto::meta_client::MetaClient as GrpcMetaClient;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

use crate::types::{Node, NodeId, TypeConfig};

/// Largest gRPC message meta sends or accepts. Snapshot chunks are kept well
/// below it (see `server::raft_config`).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A lazily connected channel to `addr` (host:port).
pub fn channel(addr: &str) -> Result<Channel, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .connect_lazy())
}

pub fn grpc_client(channel: Channel) -> GrpcMetaClient<Channel> {
    GrpcMetaClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// Makes one connection per peer, on demand.
#[derive(Clone, Default)]
pub struct Network;

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Self::Network {
        let client = channel(&node.addr).map(grpc_client).map_err(|e| {
            Arc::new(format!(
                "bad address {:?} of meta node {target}: {e}",
                node.addr
            ))
        });
        Connection { target, client }
    }
}

/// The connection to one peer.
pub struct Connection {
    target: NodeId,
    client: Result<GrpcMetaClient<Channel>, Arc<String>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
}

impl Connection {
    /// Sends `req` and decodes the peer's `Result<Resp, E>`, mapping transport
    /// failures to what openraft expects: a peer that cannot be reached is
    /// `Unreachable` (openraft backs off), anything else a network error.
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        ttl: Duration,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(&TransportError(
                    e.to_string(),
                ))));
            }
        };
        let payload =
            serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = tonic::Request::new(RaftMessage { payload });
        request.set_timeout(ttl);
        let reply = match rpc {
            Rpc::Append => client.raft_append(request).await,
            Rpc::Vote => client.raft_vote(request).await,
            Rpc::Snapshot => client.raft_snapshot(request).await,
        };
        let reply = match reply {
            Ok(r) => r.into_inner(),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&status)));
            }
            Err(status) => return Err(RPCError::Network(NetworkError::new(&status))),
        };
        let result: Result<Resp, RaftError<NodeId, E>> = serde_json::from_slice(&reply.payload)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(Rpc::Append, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(Rpc::Snapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, option.hard_ttl()).await
    }
}
