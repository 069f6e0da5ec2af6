//! Sealion's query node.
//!
//! Stateless: everything it knows comes from meta (catalog, partition map)
//! and storage nodes (rows). It serves SQL over the PostgreSQL wire protocol
//! and HTTP, plans with DataFusion through its extension points (a catalog,
//! a TableProvider, a data sink), and routes writes to the storage nodes
//! that own their partitions. It must never depend on RocksDB.

pub mod aggregate;
pub mod asof;
pub mod catalog;
pub mod error;
pub mod functions;
pub mod gapfill;
pub mod http;
pub mod insert;
pub mod ipc;
#[macro_use]
mod leaf;
pub mod lineproto;
pub mod pg;
pub mod plan_cache;
pub mod pushdown;
pub mod router;
pub mod scan_exec;
pub mod server;
pub mod sorted_runs;
pub mod sql;
pub mod table;
pub mod topn;

use std::sync::Arc;

pub use error::{Error, Result};
pub use server::{QueryConfig, QueryServer};

/// What every request handler shares.
pub struct QueryContext {
    pub shared: catalog::Shared,
    pub sql: Arc<sql::SqlEngine>,
    /// Encoded schema messages of Arrow answers over HTTP (crate::ipc).
    pub schemas: ipc::SchemaMessages,
}
