//! A storage node in the query node's own process (`sealion standalone`):
//! scans and writes reach it by a call instead of an Arrow Flight stream or
//! a gRPC request over loopback, so scan batches are handed over as they
//! are and write requests are never framed, encoded as protobuf or copied
//! through the kernel.

use std::sync::Arc;

use arrow::array::RecordBatch;
use futures::stream::BoxStream;

use crate::proto::{ScanMetrics, ScanRequest, WriteRequest};

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
    /// same errors and the same answer. `deadline` is when the query it
    /// serves must have ended: a scan run where the caller polls it (not
    /// on a thread of its own) cannot be dropped while it runs, so it
    /// stops there itself and ends in `DEADLINE_EXCEEDED`, never in a
    /// shorter answer.
    fn scan(
        &self,
        request: ScanRequest,
        deadline: Option<std::time::Instant>,
    ) -> Result<ScanItems, tonic::Status>;
}

/// Writes served in this process.
pub trait LocalWrites: Send + Sync {
    /// Makes the write a `Write` RPC with this request would make, with the
    /// same answer and the same errors (as `Status`es with the same codes).
    fn write(
        &self,
        request: WriteRequest,
    ) -> futures::future::BoxFuture<'static, Result<u64, tonic::Status>>;
}

/// A storage node in this process, known by the address it advertises in
/// meta (the address query nodes would otherwise dial).
#[derive(Clone)]
pub struct LocalStorage {
    pub addr: String,
    pub scans: Arc<dyn LocalScans>,
    pub writes: Arc<dyn LocalWrites>,
}

impl std::fmt::Debug for LocalStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalStorage({})", self.addr)
    }
}
