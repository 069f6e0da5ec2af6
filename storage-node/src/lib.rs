//! Sealion's storage node.
//!
//! A storage node holds partition replicas. It accepts write batches for the
//! partitions meta has placed on it, makes them durable (synced to disk)
//! before it acknowledges, and serves scans over Arrow Flight.
//!
//! It must never depend on DataFusion: what a query wants from it arrives as
//! Sealion's own `ScanRequest` (proto), so the storage layer stays small and
//! its fast paths are testable against plain models.

pub mod columnar;
pub mod engine;
pub mod error;
pub mod node;
pub mod rows;
pub mod sealed;
pub mod service;

pub use error::{Error, Result};
pub use node::{StorageConfig, StorageServer};
