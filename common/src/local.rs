//! A storage node in the query node's own process (`sealion standalone`):
//! scans reach it by a call instead of an Arrow Flight stream over
//! loopback, so batches are handed over as they are, never encoded, framed
//! or copied through the kernel.

use std::sync::Arc;

use arrow::array::RecordBatch;
use futures::stream::BoxStream;

use crate::proto::{ScanMetrics, ScanRequest};

/// What a scan yields: its batches, then (only when it succeeded) its
/// counters, as a `DoGet` stream carries them.
#[derive(Debug)]
pub enum ScanItem {
    Batch(RecordBatch),
    Metrics(ScanMetrics),
}

pub type ScanItems = BoxStream<'static, Result<ScanItem, tonic::Status>>;

/// Scans served in this process.
pub trait LocalScans: Send + Sync {
    /// Starts the scan a `DoGet` with this ticket would start, with the
    /// same errors.
    fn scan(&self, request: ScanRequest) -> Result<ScanItems, tonic::Status>;
}

/// A storage node in this process, known by the address it advertises in
/// meta (the address query nodes would otherwise dial).
#[derive(Clone)]
pub struct LocalStorage {
    pub addr: String,
    pub scans: Arc<dyn LocalScans>,
}

impl std::fmt::Debug for LocalStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalStorage({})", self.addr)
    }
}
