//! Sealion's storage node.
//!
//! A storage node holds partition replicas. It accepts write batches for the
//! partitions meta has placed on it, makes them durable (synced to disk)
//! before it acknowledges, and serves scans over Arrow Flight.
//!
//! It must never depend on DataFusion: what a query wants from it arrives as
//! Sealion's own `ScanRequest` (proto), so the storage layer stays small and
//! its fast paths are testable against plain models.

pub mod engine;
pub mod error;
pub mod node;
pub mod replication;
pub mod service;

// The data formats live in their own crate (no RocksDB there, so they can be
// fuzzed and benchmarked alone); the engine reaches them by these paths.
pub use sealion_format::{columnar, rows, sealed};

pub use error::{Error, Result};
pub use node::{StorageConfig, StorageServer};
