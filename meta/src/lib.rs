//! Sealion's metadata service: the catalog, storage-node membership and the
//! partition map, replicated by Raft (openraft) over RocksDB.
//!
//! Meta is the only consensus in Sealion. Everything it knows is one value,
//! `ClusterState`, changed only by `MetaCommand`s that go through the Raft
//! log; storage and query nodes read it through `sealion_common::meta_client`.
//!
//! Codemap:
//! - [`machine`]: how a command changes the state (pure, deterministic);
//! - [`placement`]: leader-only liveness and the placement of new partitions;
//! - [`store`]: the Raft log and state machine in RocksDB;
//! - [`network`]: Raft RPCs over gRPC;
//! - [`service`]: the `Meta` gRPC service, with forwarding to the leader;
//! - [`server`]: [`MetaServer`], which starts and stops all of it.
//!
//! The binary only needs [`MetaConfig`] and [`MetaServer`]:
//!
//! ```no_run
//! # async fn run() -> sealion_meta::Result<()> {
//! let mut cfg = sealion_meta::MetaConfig::new(1, "127.0.0.1:7000".parse().unwrap(), "/var/lib/sealion/meta");
//! cfg.bootstrap = true;
//! let server = sealion_meta::MetaServer::start(cfg).await?;
//! // ... until asked to stop:
//! server.shutdown().await?;
//! # Ok(()) }
//! ```

pub mod error;
pub mod machine;
pub mod network;
pub mod placement;
pub mod server;
pub mod service;
pub mod store;
pub mod types;

pub use error::{Error, Result};
pub use server::{
    DEFAULT_NODE_TIMEOUT_MS, DEFAULT_RETENTION_CHECK_INTERVAL_MS, MetaConfig, MetaServer,
};
