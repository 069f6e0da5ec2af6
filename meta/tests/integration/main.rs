//! Meta replicas on loopback: restart, replication, forwarding, failover,
//! watch, and openraft's storage suite over the RocksDB store. One test
//! binary for the crate.

#![allow(clippy::unwrap_used)]

mod cluster;
mod restart;
mod suite;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use sealion_meta::{MetaConfig, MetaServer};
use sealion_proto::meta_client::MetaClient as GrpcMetaClient;
use sealion_proto::meta_command::Cmd;
use sealion_proto::{
    ClusterState, Column, ColumnKind, CreateTable, DataType, GetStateRequest, MetaClusterRequest,
    Table,
};
use tonic::transport::Channel;

/// Polls `check` until it yields a value, failing the test after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn config(id: u64, addr: SocketAddr, dir: &Path) -> MetaConfig {
    MetaConfig::new(id, addr, dir)
}

pub fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

pub async fn start(cfg: MetaConfig) -> MetaServer {
    MetaServer::start(cfg).await.unwrap()
}

pub async fn grpc(addr: SocketAddr) -> GrpcMetaClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    GrpcMetaClient::new(channel)
}

/// The leader id a replica reports, if any.
pub async fn leader_of(addr: SocketAddr) -> Option<u64> {
    let info = grpc(addr)
        .await
        .cluster_info(MetaClusterRequest {})
        .await
        .ok()?
        .into_inner();
    (info.leader_id != 0).then_some(info.leader_id)
}

pub async fn local_state(addr: SocketAddr) -> Option<ClusterState> {
    grpc(addr)
        .await
        .get_state(GetStateRequest {
            linearizable: false,
        })
        .await
        .ok()?
        .into_inner()
        .state
}

/// The state without its version: what must survive restarts and
/// replication unchanged (the version grows with every new leader's blank
/// entry).
pub fn content(state: &ClusterState) -> ClusterState {
    ClusterState {
        version: 0,
        ..state.clone()
    }
}

pub fn col(name: &str, kind: ColumnKind, t: DataType) -> Column {
    Column {
        name: name.into(),
        kind: kind as i32,
        data_type: t as i32,
    }
}

pub fn create_table(db: &str, name: &str) -> Cmd {
    Cmd::CreateTable(CreateTable {
        table: Some(Table {
            database: db.into(),
            name: name.into(),
            columns: vec![
                col("time", ColumnKind::Time, DataType::Timestamp),
                col("host", ColumnKind::Tag, DataType::String),
                col("usage", ColumnKind::Field, DataType::Float64),
            ],
            ..Default::default()
        }),
        if_not_exists: false,
    })
}
