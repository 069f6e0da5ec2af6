//! What every Sealion role shares and no role owns.
//!
//! This crate sits below meta, storage and query nodes: it must never depend
//! on any of them, on DataFusion or on RocksDB. It holds the catalog helpers
//! (time partitions, Arrow schemas of tables), the client of the meta service
//! that storage and query nodes use, and the one place that sets up logging
//! and metrics.

pub mod catalog;
pub mod channels;
pub mod error;
pub mod local;
pub mod meta_client;
pub mod telemetry;
pub mod time;

pub use error::{Error, Result};
pub use sealion_proto as proto;
