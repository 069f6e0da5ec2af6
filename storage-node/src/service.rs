//! The storage node's gRPC surface: the `Storage` service for writes and the
//! Arrow Flight service for scans.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::ipc::reader::StreamReader;
use arrow::record_batch::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use sealion_common::catalog::arrow_schema;
use sealion_common::local::{LocalScans, LocalWrites, ScanItem, ScanItems};
use sealion_common::meta_client::MetaClient;
use sealion_common::proto::storage_server::Storage;
use sealion_common::proto::{
    ClusterState, Column, DeleteReply, DeleteRequest, DropPartitionsReply, DropPartitionsRequest,
    InstallReply, InstallRequest, PartitionStats, PartitionStatsReply, PartitionStatsRequest,
    ResyncReply, ResyncRequest, ScanMetrics, ScanRequest, SealReply, SealRequest, SealResult,
    WriteReply, WriteRequest,
};
use tonic::{Request, Response, Status, Streaming};

use crate::engine::{EncodedWrite, Engine, Here, ScanPlace};
use crate::{Error, Result};
use sealion_format::scan::{Mode, Query, aggregate_schema};

/// Largest write request a node accepts, in bytes of Arrow IPC.
pub const MAX_WRITE_BYTES: usize = 64 << 20;
/// Batches a scan may have in flight towards the client before it waits.
const SCAN_CHANNEL_BATCHES: usize = 4;
/// Longest a scan waits for its reader to take the next batch.
const SCAN_SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// What the services share: the engine, this node's id and meta.
pub struct NodeContext {
    pub engine: Engine,
    pub node_id: AtomicU64,
    pub meta: Arc<MetaClient>,
    /// When each partition last took a write, since this process started.
    pub last_write: std::sync::Mutex<std::collections::HashMap<u64, std::time::Instant>>,
    pub seal_policy: SealPolicy,
    pub started: std::time::Instant,
    /// Tag filters this node has published to meta, per partition (true:
    /// non-empty ones are in meta). A partition missing here is judged by
    /// the cluster state.
    pub published_filters: std::sync::Mutex<std::collections::HashMap<u64, bool>>,
    /// Writes hold it shared from their filter check to their answer;
    /// publishing filters holds it alone, so a late row is never written
    /// between "this partition has no late rows" and the filters going out.
    pub filter_gate: tokio::sync::RwLock<()>,
    /// Channels to the other storage nodes (forwarded writes, resyncs).
    pub peers: crate::replication::Peers,
    /// Per-partition order of writes on a primary.
    pub locks: crate::replication::PartitionLocks,
    /// Threads one scan may use (`Engine::scan_until`).
    pub scan_threads: usize,
    /// The extra threads all scans share: `scan_threads - 1`, so one scan
    /// alone gets `scan_threads`, and concurrent ones split them.
    pub scan_budget: Arc<crate::engine::ScanThreadBudget>,
}

impl NodeContext {
    pub fn node_id(&self) -> u64 {
        self.node_id.load(Ordering::Acquire)
    }

    /// Records that partitions `ids` took a write now (sealing waits for
    /// them to be quiet).
    fn touch(&self, ids: &[u64]) {
        if let Ok(mut last) = self.last_write.lock() {
            let now = std::time::Instant::now();
            for id in ids {
                last.insert(*id, now);
            }
        }
    }

    /// Forgets what this node published for `pid` (its copy was replaced).
    pub fn forget_published(&self, pid: u64) {
        if let Ok(mut m) = self.published_filters.lock() {
            m.remove(&pid);
        }
    }

    /// Partitions of `ids` whose published tag filters a write would make
    /// wrong (they describe the sealed file only, and the write adds late
    /// rows that may carry other tag values).
    fn filters_to_clear(&self, ids: &[u64]) -> Vec<u64> {
        let published = self
            .published_filters
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        let state = self.meta.state();
        ids.iter()
            .copied()
            .filter(|pid| match published.get(pid) {
                Some(&has) => has,
                None => state
                    .partitions
                    .iter()
                    .any(|p| p.id == *pid && !p.tag_filters.is_empty()),
            })
            .collect()
    }

    fn set_published(&self, pid: u64, has: bool) {
        if let Ok(mut m) = self.published_filters.lock() {
            m.insert(pid, has);
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct SealPolicy {
    pub idle: std::time::Duration,
    pub reseal_fraction: f64,
}

/// Whether partition `pid` should be sealed now: it has rows in RocksDB, it
/// has been quiet for the idle period, and it is open or its late rows have
/// passed the reseal fraction. (The caller checks that its time has passed.)
pub async fn seal_due(ctx: &Arc<NodeContext>, pid: u64) -> Result<bool> {
    let quiet_since = ctx
        .last_write
        .lock()
        .map_err(|_| Error::Internal("last-write map poisoned".into()))?
        .get(&pid)
        .copied()
        .unwrap_or(ctx.started);
    if quiet_since.elapsed() < ctx.seal_policy.idle {
        return Ok(false);
    }
    let engine = ctx.engine.clone();
    let fraction = ctx.seal_policy.reseal_fraction;
    tokio::task::spawn_blocking(move || -> Result<bool> {
        Ok(match engine.sealed_file(pid)? {
            None => engine.open_rows(pid)? > 0,
            Some(f) => {
                let stats = engine.stats(pid)?;
                let changed = stats.late_rows + stats.deleted_rows;
                changed > 0 && changed as f64 >= fraction * f.summary().rows as f64
            }
        })
    })
    .await
    .map_err(|e| Error::Internal(format!("seal check task failed: {e}")))?
}

async fn set_state(ctx: &NodeContext, pid: u64, state: sealion_common::proto::PartitionState) {
    set_state_with(ctx, pid, state, Vec::new()).await;
}

/// Largest tag filter published to meta (meta refuses more); a partition
/// over it publishes none and is never skipped by tag.
const MAX_PUBLISHED_FILTER_BYTES: usize = 64 << 10;

async fn set_state_with(
    ctx: &NodeContext,
    pid: u64,
    state: sealion_common::proto::PartitionState,
    tag_filters: Vec<u8>,
) -> bool {
    let cmd = sealion_common::proto::meta_command::Cmd::SetPartitionState(
        sealion_common::proto::SetPartitionState {
            partition_id: pid,
            state: state as i32,
            tag_filters,
        },
    );
    match ctx.meta.propose(cmd).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(partition_id = pid, error = %e, "could not record the partition state in meta");
            false
        }
    }
}

/// As its primary, seals (or reseals) partition `pid` with its table's
/// current columns, records the state in meta and has the in-sync backups
/// seal to the same rows. Holds the partition's lock throughout, so no
/// write lands between the copies' seals (reads do not wait).
pub async fn seal_partition(ctx: &Arc<NodeContext>, pid: u64) -> Result<SealResult> {
    use sealion_common::proto::PartitionState;
    let _lock = ctx.locks.lock_all(&[pid]).await?;
    let state = crate::replication::primary_view(ctx, &[pid]).await?;
    let partition = state
        .partitions
        .iter()
        .find(|p| p.id == pid)
        .ok_or_else(|| Error::Invalid(format!("partition {pid} is not in the partition map")))?;
    let table = sealion_common::catalog::table_by_id(&state, partition.table_id)
        .ok_or_else(|| Error::Invalid(format!("table of partition {pid} is not in the catalog")))?;
    let columns = table.columns.clone();
    let was_sealed = partition.state() == PartitionState::Sealed;
    if !was_sealed {
        set_state(ctx, pid, PartitionState::Sealing).await;
    }
    let engine = ctx.engine.clone();
    let started = std::time::Instant::now();
    let outcome = tokio::task::spawn_blocking(move || engine.seal(pid, &columns))
        .await
        .map_err(|e| Error::Internal(format!("seal task failed: {e}")))?;
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            if !was_sealed {
                set_state(ctx, pid, PartitionState::Open).await;
            }
            return Err(e);
        }
    };
    use crate::engine::SealOutcome;
    let (name, rows, bytes) = outcome.summary();
    if outcome == SealOutcome::Empty {
        if !was_sealed {
            set_state(ctx, pid, PartitionState::Open).await;
        }
    } else {
        // Publish the file's tag filters with the state, for planners; but
        // none while late rows exist (written during the seal, or since):
        // the filters would not describe them. No write runs meanwhile.
        let _gate = ctx.filter_gate.write().await;
        let engine = ctx.engine.clone();
        let file_and_late = tokio::task::spawn_blocking(move || {
            Ok::<_, Error>((engine.sealed_file(pid)?, engine.open_rows(pid)?))
        })
        .await
        .map_err(|e| Error::Internal(format!("seal check task failed: {e}")))?;
        let filters = match file_and_late {
            Ok((Some(f), 0)) if f.tag_filter_bytes().len() <= MAX_PUBLISHED_FILTER_BYTES => {
                f.tag_filter_bytes().to_vec()
            }
            Ok((Some(f), 0)) => {
                tracing::warn!(
                    partition_id = pid,
                    bytes = f.tag_filter_bytes().len(),
                    "tag filters too large to publish"
                );
                Vec::new()
            }
            _ => Vec::new(),
        };
        let has = !filters.is_empty();
        let recorded = set_state_with(ctx, pid, PartitionState::Sealed, filters).await;
        // When meta did not take it, older filters may still be there: a
        // late write must then withdraw them, so count them as published.
        ctx.set_published(pid, has || !recorded);
        metrics::counter!("sealion_storage_partitions_sealed_total").increment(1);
        tracing::info!(
            partition_id = pid,
            outcome = name,
            rows,
            bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "sealed"
        );
    }
    // A backup that cannot seal to these rows leaves the in-sync set here
    // (and resyncs); the seal itself stands either way.
    if let Err(e) = crate::replication::seal_backups(ctx, &state, pid).await {
        tracing::warn!(partition_id = pid, error = %e, "could not settle the backups' seal");
    }
    Ok(SealResult {
        partition_id: pid,
        outcome: name.to_string(),
        rows,
        bytes,
    })
}

pub struct StorageService {
    pub ctx: Arc<NodeContext>,
}

/// Decodes a write's Arrow IPC and encodes its rows for the engine, on
/// the blocking pool; gives the request back beside them.
pub async fn encode_write(req: WriteRequest) -> Result<(WriteRequest, EncodedWrite)> {
    tokio::task::spawn_blocking(move || -> Result<(WriteRequest, EncodedWrite)> {
        let mut parts = Vec::with_capacity(req.partitions.len());
        for p in &req.partitions {
            parts.push((p.partition_id, decode_ipc(&p.arrow_ipc)?));
        }
        let rows = EncodedWrite::encode(&req.columns, &parts)?;
        Ok((req, rows))
    })
    .await
    .map_err(|e| Error::Internal(format!("write encoding task failed: {e}")))?
}

/// Applies a write on this node alone (synced): `rows`, encoded from a
/// request with batch id `batch_id`. `withdraw_filters`: as the primary,
/// first withdraw from meta the published tag filters of sealed
/// partitions that the write adds late rows to (backups leave meta alone).
pub async fn apply_write(
    ctx: &Arc<NodeContext>,
    rows: EncodedWrite,
    batch_id: &[u8],
    withdraw_filters: bool,
) -> Result<u64> {
    let ids = rows.partition_ids();
    let _gate = ctx.filter_gate.read().await;
    // Late rows for a sealed partition: withdraw its tag filters from meta
    // before the rows exist, so no planner skips the partition for a tag
    // value only the late rows hold. A reseal publishes new ones.
    if withdraw_filters {
        for pid in ctx.filters_to_clear(&ids) {
            let cmd = sealion_common::proto::meta_command::Cmd::SetPartitionState(
                sealion_common::proto::SetPartitionState {
                    partition_id: pid,
                    state: sealion_common::proto::PartitionState::Sealed as i32,
                    tag_filters: Vec::new(),
                },
            );
            ctx.meta.propose(cmd).await.map_err(|e| {
                Error::Unavailable(format!(
                    "could not withdraw the tag filters of sealed partition {pid} before a late write: {e}"
                ))
            })?;
            ctx.set_published(pid, false);
        }
    }
    ctx.touch(&ids);
    let engine = ctx.engine.clone();
    let batch_id = batch_id.to_vec();
    let now_ms = sealion_common::time::now_ms().max(0) as u64;
    tokio::task::spawn_blocking(move || engine.write_encoded(rows, &batch_id, now_ms))
        .await
        .map_err(|e| Error::Internal(format!("write task failed: {e}")))?
}

/// Applies a delete on this node alone (synced).
pub async fn apply_delete(ctx: &Arc<NodeContext>, req: &DeleteRequest) -> Result<u64> {
    let pred = req
        .predicate
        .clone()
        .ok_or_else(|| Error::Invalid("delete without a predicate".into()))?;
    let engine = ctx.engine.clone();
    let ids = req.partition_ids.clone();
    let deleted = tokio::task::spawn_blocking(move || -> Result<u64> {
        let mut n = 0;
        for pid in ids {
            n += engine.delete(pid, &pred)?;
        }
        Ok(n)
    })
    .await
    .map_err(|e| Error::Internal(format!("delete task failed: {e}")))??;
    ctx.touch(&req.partition_ids);
    Ok(deleted)
}

pub(crate) fn decode_ipc(bytes: &[u8]) -> Result<Vec<RecordBatch>> {
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    reader
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(Error::from)
}

/// A write from a router (or, `replicated`, a primary's forward), as the
/// `Write` RPC and a query node in this process make it.
/// Checks that `columns`, which a write names its rows' fields by (the
/// index of a field's column there is what the rows store), agree with
/// the table's columns as this node knows them: the same column at every
/// position both lists have. One list may be longer (a column added that
/// one side has not seen yet); a table this node does not know yet is not
/// checked.
pub fn check_columns(state: &ClusterState, table_id: u64, columns: &[Column]) -> Result<()> {
    let Some(table) = sealion_common::catalog::table_by_id(state, table_id) else {
        return Ok(());
    };
    for (i, (ours, theirs)) in table.columns.iter().zip(columns).enumerate() {
        if ours != theirs {
            return Err(Error::Invalid(format!(
                "the write's column {i} is {:?} ({:?} {:?}); table {} has {:?} ({:?} {:?}) there",
                theirs.name,
                theirs.kind(),
                theirs.data_type(),
                table.name,
                ours.name,
                ours.kind(),
                ours.data_type()
            )));
        }
    }
    Ok(())
}

async fn write(ctx: &Arc<NodeContext>, req: WriteRequest) -> Result<u64, Status> {
    let bytes: usize = req.partitions.iter().map(|p| p.arrow_ipc.len()).sum();
    if bytes > MAX_WRITE_BYTES {
        return Err(Status::resource_exhausted(format!(
            "write of {bytes} bytes is over the limit of {MAX_WRITE_BYTES}"
        )));
    }
    check_columns(&ctx.meta.state(), req.table_id, &req.columns)?;
    let rows = if req.replicated {
        let epochs: Vec<(u64, u64)> = req
            .partitions
            .iter()
            .map(|p| (p.partition_id, p.epoch))
            .collect();
        crate::replication::check_backup(ctx, &epochs).await?;
        let (req, rows) = encode_write(req).await?;
        apply_write(ctx, rows, &req.batch_id, false).await?
    } else {
        crate::replication::primary_write(ctx, req).await?
    };
    metrics::counter!("sealion_storage_rows_written_total").increment(rows);
    Ok(rows)
}

/// Writes for a query node in this process: the `Write` RPC without its
/// transport.
impl LocalWrites for StorageService {
    fn write(
        &self,
        request: WriteRequest,
    ) -> futures::future::BoxFuture<'static, Result<u64, Status>> {
        let ctx = self.ctx.clone();
        Box::pin(async move { write(&ctx, request).await })
    }
}

#[tonic::async_trait]
impl Storage for StorageService {
    async fn write(&self, request: Request<WriteRequest>) -> Result<Response<WriteReply>, Status> {
        let rows = write(&self.ctx, request.into_inner()).await?;
        Ok(Response::new(WriteReply { rows_written: rows }))
    }

    async fn stats(
        &self,
        request: Request<PartitionStatsRequest>,
    ) -> Result<Response<PartitionStatsReply>, Status> {
        let ids = request.into_inner().partition_ids;
        let engine = self.ctx.engine.clone();
        let stats = tokio::task::spawn_blocking(move || {
            ids.iter()
                .map(|&pid| {
                    engine.stats(pid).map(|s| PartitionStats {
                        partition_id: pid,
                        rows: s.rows,
                        bytes: s.bytes,
                        sealed: s.sealed,
                        late_rows: s.late_rows,
                        sealed_rows: s.sealed_rows,
                        deleted_rows: s.deleted_rows,
                    })
                })
                .collect::<Result<Vec<_>>>()
        })
        .await
        .map_err(|e| Status::internal(format!("stats task failed: {e}")))??;
        Ok(Response::new(PartitionStatsReply { stats }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteReply>, Status> {
        let req = request.into_inner();
        if req.predicate.is_none() {
            return Err(Status::invalid_argument("delete without a predicate"));
        }
        let deleted = if req.replicated {
            if req.epochs.len() != req.partition_ids.len() {
                return Err(Status::invalid_argument(
                    "a forwarded delete needs one epoch per partition",
                ));
            }
            let epochs: Vec<(u64, u64)> = req
                .partition_ids
                .iter()
                .copied()
                .zip(req.epochs.iter().copied())
                .collect();
            crate::replication::check_backup(&self.ctx, &epochs).await?;
            apply_delete(&self.ctx, &req).await?
        } else {
            crate::replication::primary_delete(&self.ctx, req).await?
        };
        Ok(Response::new(DeleteReply {
            rows_deleted: deleted,
        }))
    }

    async fn resync(
        &self,
        request: Request<ResyncRequest>,
    ) -> Result<Response<ResyncReply>, Status> {
        let req = request.into_inner();
        let rows = crate::replication::resync(&self.ctx, req.partition_id, req.node_id).await?;
        Ok(Response::new(ResyncReply { rows_copied: rows }))
    }

    async fn install(
        &self,
        request: Request<InstallRequest>,
    ) -> Result<Response<InstallReply>, Status> {
        crate::replication::install(&self.ctx, request.into_inner()).await?;
        Ok(Response::new(InstallReply {}))
    }

    async fn seal(&self, request: Request<SealRequest>) -> Result<Response<SealReply>, Status> {
        let req = request.into_inner();
        if !req.checks.is_empty() {
            let results = crate::replication::seal_as_backup(&self.ctx, &req.checks).await?;
            return Ok(Response::new(SealReply { results }));
        }
        let state = self.ctx.meta.state();
        let now_ns = sealion_common::time::now_ms().saturating_mul(1_000_000);
        let mut results = Vec::with_capacity(req.partition_ids.len());
        for pid in req.partition_ids {
            let ended = state
                .partitions
                .iter()
                .find(|p| p.id == pid)
                .map(|p| p.end_ns <= now_ns);
            let result = match ended {
                None => SealResult {
                    partition_id: pid,
                    outcome: "not in the partition map".into(),
                    ..Default::default()
                },
                Some(false) => SealResult {
                    partition_id: pid,
                    outcome: "not_ended".into(),
                    ..Default::default()
                },
                Some(true) if !req.ignore_idle && !seal_due(&self.ctx, pid).await? => SealResult {
                    partition_id: pid,
                    outcome: "not_due".into(),
                    ..Default::default()
                },
                Some(true) => match seal_partition(&self.ctx, pid).await {
                    Ok(r) => r,
                    Err(e) => SealResult {
                        partition_id: pid,
                        outcome: format!("error: {e}"),
                        ..Default::default()
                    },
                },
            };
            results.push(result);
        }
        Ok(Response::new(SealReply { results }))
    }

    async fn drop_partitions(
        &self,
        request: Request<DropPartitionsRequest>,
    ) -> Result<Response<DropPartitionsReply>, Status> {
        let ids = request.into_inner().partition_ids;
        let engine = self.ctx.engine.clone();
        tokio::task::spawn_blocking(move || engine.drop_partitions(&ids))
            .await
            .map_err(|e| Status::internal(format!("drop task failed: {e}")))??;
        Ok(Response::new(DropPartitionsReply {}))
    }
}

pub struct FlightScanService {
    pub ctx: Arc<NodeContext>,
}

/// A scan under way on a blocking thread.
struct StartedScan {
    schema: arrow::datatypes::SchemaRef,
    /// Its batches, with backpressure; an error ends them.
    batches: tokio_stream::wrappers::ReceiverStream<Result<RecordBatch, Status>>,
    /// Its counters, sent once the last batch is; never sent when the scan
    /// failed or gave up on its reader.
    metrics: tokio::sync::oneshot::Receiver<ScanMetrics>,
}

/// What a scan needs of its node: the engine and the threads it may use.
#[derive(Clone)]
struct Scanner {
    engine: Engine,
    budget: Arc<crate::engine::ScanThreadBudget>,
    /// Threads one scan may use at most (its own included).
    threads: usize,
}

impl Scanner {
    fn of(ctx: &NodeContext) -> Scanner {
        Scanner {
            engine: ctx.engine.clone(),
            budget: ctx.scan_budget.clone(),
            threads: ctx.scan_threads,
        }
    }

    /// Runs `scan` on this thread with the extra threads free now (taken
    /// when it starts, given back when it ends), handing each batch to
    /// `emit`; its counters on success, the bytes of its batches counted.
    fn run(
        &self,
        scan: &ScanRequest,
        cancelled: &(dyn Fn() -> bool + Sync),
        place: &dyn ScanPlace,
        mut emit: impl FnMut(RecordBatch) -> bool + Send,
    ) -> Result<ScanMetrics> {
        let permit = self.budget.take(self.threads.saturating_sub(1));
        let mut bytes = 0u64;
        let mut m = self
            .engine
            .scan_placed(scan, permit.threads(), cancelled, place, |batch| {
                bytes += sealion_format::batch_bytes(&batch);
                emit(batch)
            })?;
        m.bytes_returned = bytes;
        Ok(m)
    }
}

/// Adds a finished scan's counters to the node's.
fn count_scan(m: &ScanMetrics) {
    metrics::counter!("sealion_storage_rows_scanned_total").increment(m.rows_scanned);
    metrics::counter!("sealion_storage_rows_returned_total").increment(m.rows_returned);
    metrics::counter!("sealion_storage_pages_decoded_total").increment(m.pages_decoded);
}

/// Checks and compiles `scan`: its query and the schema of its batches.
fn compile_scan(scan: &ScanRequest) -> Result<(Query, arrow::datatypes::SchemaRef), Status> {
    if scan.table_columns.is_empty() {
        return Err(Status::invalid_argument(
            "scan ticket names no table columns",
        ));
    }
    let query = Query::compile(scan).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let schema = match &query.mode {
        Mode::Aggregate(plan) => aggregate_schema(plan),
        _ => arrow_schema(&scan.projection),
    };
    Ok((query, schema))
}

/// Checks and compiles `scan` and starts it on a blocking thread: what a
/// `DoGet` and a scan from a query node in this process share.
fn start_scan(scanner: Scanner, scan: ScanRequest) -> Result<StartedScan, Status> {
    let (_, schema) = compile_scan(&scan)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch, Status>>(SCAN_CHANNEL_BATCHES);
    let (metrics_tx, metrics_rx) = tokio::sync::oneshot::channel::<ScanMetrics>();
    tokio::task::spawn_blocking(move || {
        let mut gave_up = false;
        let handle = tokio::runtime::Handle::current();
        let result = scanner.run(&scan, &|| tx.is_closed(), &Here, |batch| {
            // A reader that stops reading for this long loses its scan
            // (and this thread and the snapshot it holds are freed).
            match handle.block_on(tx.send_timeout(Ok(batch), SCAN_SEND_TIMEOUT)) {
                Ok(()) => true,
                Err(tokio::sync::mpsc::error::SendTimeoutError::Timeout(_)) => {
                    gave_up = true;
                    false
                }
                Err(tokio::sync::mpsc::error::SendTimeoutError::Closed(_)) => false,
            }
        });
        match result {
            // Cut short: no counters, so the reader, should it come back,
            // sees an answer that ended before its last batch.
            Ok(_) if gave_up => {
                tracing::warn!(
                    "a scan's reader took no batch for {SCAN_SEND_TIMEOUT:?}: scan ended"
                );
            }
            Ok(m) => {
                count_scan(&m);
                let _ = metrics_tx.send(m);
            }
            Err(e) => {
                let _ = tx.blocking_send(Err(e.into()));
            }
        }
    });
    Ok(StartedScan {
        schema,
        batches: tokio_stream::wrappers::ReceiverStream::new(rx),
        metrics: metrics_rx,
    })
}

/// How often (in calls) an in-place scan's stop check reads the clock:
/// open partitions ask once a row.
const DEADLINE_CHECK_CALLS: u32 = 64;

/// Whether `query` is answered whole before its first batch leaves the
/// node (aggregate states, each series' newest rows, the first rows by
/// time): then a scan in the caller's thread holds no more memory than the
/// node builds anyway, and nothing is gained by streaming it.
fn answered_whole(query: &Query) -> bool {
    match query.mode {
        Mode::Aggregate(_) | Mode::Last { .. } | Mode::Ordered { .. } => true,
        Mode::Rows => false,
    }
}

/// Whether this thread may run a blocking scan in place: a worker of a
/// multi-threaded runtime (which hands its other tasks to another worker
/// meanwhile) or a thread of no runtime.
fn may_block_in_place() -> bool {
    tokio::runtime::Handle::try_current().map_or(true, |h| {
        h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
    })
}

/// A scan's long steps run in tokio's `block_in_place`: the worker's other
/// tasks go to another thread first (woken or started for it), and the
/// scan's thread rejoins the pool once the task yields.
struct BlockInPlace;

impl ScanPlace for BlockInPlace {
    fn run_long(&self, step: &mut dyn FnMut()) {
        metrics::counter!("sealion_storage_scan_steps_blocking_total").increment(1);
        tokio::task::block_in_place(step)
    }
}

/// `scan` run where the returned stream is first polled, its answer then
/// yielded from memory. Its short steps run right there on the worker and
/// its long ones in `block_in_place` ([`BlockInPlace`]): a small answer (a
/// last point, a one-hour aggregate) wakes no other thread and waits for
/// none, which would be a good part of its time, and a large one holds up
/// no other task.
///
/// The stream cannot be dropped while the scan runs, so the scan stops by
/// itself once `deadline` passes and the stream ends in
/// `DEADLINE_EXCEEDED` (no batches, no counters). A client that goes away
/// is seen when the scan has ended, as with any other operator of a query.
fn scan_in_place(
    scanner: Scanner,
    scan: ScanRequest,
    deadline: Option<std::time::Instant>,
) -> ScanItems {
    futures::stream::once(async move {
        let items = run_in_place(&scanner, &scan, deadline, &BlockInPlace);
        futures::stream::iter(items)
    })
    .flatten()
    .boxed()
}

/// The items of [`scan_in_place`]'s stream.
fn run_in_place(
    scanner: &Scanner,
    scan: &ScanRequest,
    deadline: Option<std::time::Instant>,
    place: &dyn ScanPlace,
) -> Vec<Result<ScanItem, Status>> {
    use std::sync::atomic::{AtomicBool, AtomicU32};
    let late = AtomicBool::new(false);
    let calls = AtomicU32::new(0);
    let past_deadline = || {
        let Some(deadline) = deadline else {
            return false;
        };
        if late.load(Ordering::Relaxed) {
            return true;
        }
        if !calls
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(DEADLINE_CHECK_CALLS)
        {
            return false;
        }
        let past = std::time::Instant::now() >= deadline;
        if past {
            late.store(true, Ordering::Relaxed);
        }
        past
    };
    let mut items = Vec::new();
    let result = scanner.run(scan, &past_deadline, place, |batch| {
        items.push(Ok(ScanItem::Batch(batch)));
        true
    });
    if late.load(Ordering::Relaxed) {
        // Whatever it holds may be short.
        return vec![Err(Status::deadline_exceeded(
            "the query's deadline passed while a storage node scanned for it",
        ))];
    }
    match result {
        Ok(m) => {
            count_scan(&m);
            items.push(Ok(ScanItem::Metrics(m)));
        }
        Err(e) => items.push(Err(e.into())),
    }
    items
}

/// Scans for a query node in this process: the same scan as `DoGet`, its
/// batches handed over as they are. One answered whole runs in place
/// ([`scan_in_place`]) where the runtime allows; the others stream from a
/// blocking thread.
impl LocalScans for FlightScanService {
    fn scan(
        &self,
        request: ScanRequest,
        deadline: Option<std::time::Instant>,
    ) -> Result<ScanItems, Status> {
        let scanner = Scanner::of(&self.ctx);
        let (query, _) = compile_scan(&request)?;
        if answered_whole(&query) && may_block_in_place() {
            return Ok(scan_in_place(scanner, request, deadline));
        }
        Ok(streamed_items(start_scan(scanner, request)?))
    }
}

/// A started scan's batches, then its counters when it ran to the end.
fn streamed_items(started: StartedScan) -> ScanItems {
    let trailer = futures::stream::once(started.metrics)
        .filter_map(|m| async move { m.ok().map(|m| Ok(ScanItem::Metrics(m))) });
    started
        .batches
        .map_ok(ScanItem::Batch)
        .chain(trailer)
        .boxed()
}

type BoxedStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn unimplemented<T>(what: &str) -> Result<T, Status> {
    Err(Status::unimplemented(format!(
        "{what} is not served by a storage node; use DoGet with a scan ticket"
    )))
}

#[tonic::async_trait]
impl FlightService for FlightScanService {
    type HandshakeStream = BoxedStream<HandshakeResponse>;
    type ListFlightsStream = BoxedStream<FlightInfo>;
    type DoGetStream = BoxedStream<FlightData>;
    type DoPutStream = BoxedStream<PutResult>;
    type DoExchangeStream = BoxedStream<FlightData>;
    type DoActionStream = BoxedStream<arrow_flight::Result>;
    type ListActionsStream = BoxedStream<ActionType>;

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        unimplemented("Handshake")
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        unimplemented("ListFlights")
    }

    async fn get_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        unimplemented("GetFlightInfo")
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        unimplemented("PollFlightInfo")
    }

    async fn get_schema(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        unimplemented("GetSchema")
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let ticket = request.into_inner();
        let scan = ScanRequest::decode(ticket.ticket.as_ref())
            .map_err(|e| Status::invalid_argument(format!("bad scan ticket: {e}")))?;
        let started = start_scan(Scanner::of(&self.ctx), scan)?;
        let batches = started.batches.map_err(|s| FlightError::Tonic(Box::new(s)));
        // After the last batch, one message with no data whose app_metadata
        // is the scan's ScanMetrics (absent when the scan failed).
        let trailer = futures::stream::once(started.metrics)
            .filter_map(|m| async move { m.ok().map(|m| Ok(metrics_message(&m))) });
        let stream = FlightDataEncoderBuilder::new()
            .with_schema(started.schema)
            .build(batches)
            .map_err(Status::from)
            .chain(trailer)
            .boxed();
        Ok(Response::new(stream))
    }

    async fn do_put(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        unimplemented("DoPut")
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        unimplemented("DoExchange")
    }

    async fn do_action(
        &self,
        _request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        unimplemented("DoAction")
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        unimplemented("ListActions")
    }
}

/// A Flight message that carries no data, only `m` as its app_metadata: an
/// IPC message of header type NONE, which Flight decoders pass on as such.
pub fn metrics_message(m: &ScanMetrics) -> FlightData {
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let mut message = arrow::ipc::MessageBuilder::new(&mut fbb);
    message.add_version(arrow::ipc::MetadataVersion::V5);
    message.add_header_type(arrow::ipc::MessageHeader::NONE);
    message.add_bodyLength(0);
    let root = message.finish();
    fbb.finish(root, None);
    FlightData {
        data_header: fbb.finished_data().to_vec().into(),
        app_metadata: m.encode_to_vec().into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sealion_common::proto::{ColumnKind, DataType, Table};

    fn col(name: &str, kind: ColumnKind, data_type: DataType) -> Column {
        Column {
            name: name.into(),
            kind: kind as i32,
            data_type: data_type as i32,
        }
    }

    #[test]
    fn a_write_whose_columns_disagree_with_the_table_at_any_shared_position_is_refused() {
        let time = col("time", ColumnKind::Time, DataType::Timestamp);
        let host = col("host", ColumnKind::Tag, DataType::String);
        let u = col("u", ColumnKind::Field, DataType::Float64);
        let v = col("v", ColumnKind::Field, DataType::Int64);
        let state = ClusterState {
            tables: vec![Table {
                id: 7,
                name: "cpu".into(),
                columns: vec![time.clone(), host.clone(), u.clone()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let ok = |cols: &[Column], table| check_columns(&state, table, cols).is_ok();
        // A newer list (a column this node has not seen yet), an older one,
        // the same one, and a table this node does not know yet.
        assert!(ok(&[time.clone(), host.clone(), u.clone(), v.clone()], 7));
        assert!(ok(&[time.clone(), host.clone()], 7));
        assert!(ok(&[time.clone(), host.clone(), u.clone()], 7));
        assert!(ok(&[u.clone(), time.clone()], 8));
        // Moved, renamed or retyped columns would make stored indexes name
        // other columns.
        let e = check_columns(&state, 7, &[time.clone(), u.clone(), host.clone()]).unwrap_err();
        assert!(e.to_string().contains("column 1 is \"u\""), "{e}");
        let retyped = col("u", ColumnKind::Field, DataType::Int64);
        assert!(!ok(&[time.clone(), host.clone(), retyped], 7));
        assert!(!ok(&[time, host, v], 7));
    }
}

/// The two ways a node in this process runs a scan: on a blocking thread,
/// streamed, and in the caller's thread ([`scan_in_place`]).
#[cfg(test)]
mod local_scan_tests {
    use super::*;
    use arrow::array::{Float64Array, StringArray, TimestampNanosecondArray};
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    use sealion_common::proto::{
        AggregateCall, AggregateFunction, AggregateSpec, ColumnKind, DataType, ScanOrder, TagOp,
        TagPredicate,
    };

    fn columns() -> Vec<Column> {
        let c = |n: &str, k: ColumnKind, t: DataType| Column {
            name: n.into(),
            kind: k as i32,
            data_type: t as i32,
        };
        vec![
            c("time", ColumnKind::Time, DataType::Timestamp),
            c("host", ColumnKind::Tag, DataType::String),
            c("v", ColumnKind::Field, DataType::Float64),
        ]
    }

    /// 3 hosts, a row every 10 ns from `from` for `n` steps; v varies.
    fn rows(from: i64, n: i64) -> RecordBatch {
        let (mut t, mut h, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            for host in 0..3 {
                t.push(from + i * 10);
                h.push(format!("h{host}"));
                v.push(((i * 7 + host * 13) % 101) as f64 - 20.0);
            }
        }
        RecordBatch::try_new(
            arrow_schema(&columns()),
            vec![
                Arc::new(TimestampNanosecondArray::from(t).with_timezone("UTC")),
                Arc::new(StringArray::from(h)),
                Arc::new(Float64Array::from(v)),
            ],
        )
        .unwrap()
    }

    /// A node whose partition 1 is sealed with a late row besides and
    /// whose partition 2 is open.
    fn scanner(dir: &std::path::Path) -> Scanner {
        let engine = Engine::open(dir).unwrap();
        let cols = columns();
        engine.write(&cols, &[(1, vec![rows(0, 500)])]).unwrap();
        engine.seal(1, &cols).unwrap();
        engine.write(&cols, &[(1, vec![rows(3, 2)])]).unwrap();
        engine.write(&cols, &[(2, vec![rows(5_000, 300)])]).unwrap();
        Scanner {
            engine,
            budget: crate::engine::ScanThreadBudget::new(1),
            threads: 2,
        }
    }

    fn base() -> ScanRequest {
        ScanRequest {
            table_id: 1,
            partition_ids: vec![1, 2],
            start_ns: i64::MIN,
            end_ns: i64::MAX,
            projection: columns(),
            table_columns: columns(),
            ..Default::default()
        }
    }

    /// A request of each mode: aggregate states, the newest rows of each
    /// series, the first rows by time (both ways), and plain rows.
    fn requests() -> Vec<ScanRequest> {
        let call = |f: AggregateFunction, c: &str| AggregateCall {
            function: f as i32,
            column: c.into(),
        };
        vec![
            ScanRequest {
                aggregate: Some(AggregateSpec {
                    bucket_width_ns: 400,
                    bucket_origin_ns: 0,
                    group_tags: vec!["host".into()],
                    calls: vec![
                        call(AggregateFunction::AggCount, ""),
                        call(AggregateFunction::AggMax, "v"),
                        call(AggregateFunction::AggSum, "v"),
                    ],
                    states_as_answers: true,
                }),
                ..base()
            },
            ScanRequest {
                last_per_series: true,
                rows_per_series: 2,
                ..base()
            },
            ScanRequest {
                order: ScanOrder::OrderTimeDesc as i32,
                limit: 5,
                tag_predicates: vec![TagPredicate {
                    column: "host".into(),
                    op: TagOp::TagEq as i32,
                    values: vec!["h1".into()],
                }],
                ..base()
            },
            ScanRequest {
                order: ScanOrder::OrderTimeAsc as i32,
                limit: 7,
                start_ns: 2_000,
                ..base()
            },
            base(),
        ]
    }

    /// Rows as text, sorted (the in-place and streamed scans may split
    /// work over threads differently), and whether counters came last.
    fn answer(items: Vec<Result<ScanItem, Status>>) -> (Vec<String>, Option<ScanMetrics>) {
        let mut text = Vec::new();
        let mut metrics = None;
        for item in items {
            match item.unwrap() {
                ScanItem::Batch(b) => {
                    assert!(metrics.is_none(), "a batch after the counters");
                    let fmts: Vec<ArrayFormatter> = b
                        .columns()
                        .iter()
                        .map(|c| ArrayFormatter::try_new(c, &FormatOptions::default()).unwrap())
                        .collect();
                    for i in 0..b.num_rows() {
                        let row: Vec<String> =
                            fmts.iter().map(|f| f.value(i).to_string()).collect();
                        text.push(row.join("|"));
                    }
                }
                ScanItem::Metrics(m) => metrics = Some(m),
            }
        }
        text.sort();
        (text, metrics)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scan_run_in_place_answers_as_the_streamed_scan_does() {
        let dir = tempfile::tempdir().unwrap();
        let scanner = scanner(dir.path());
        let far = Some(std::time::Instant::now() + std::time::Duration::from_secs(600));
        for r in requests() {
            let streamed = streamed_items(start_scan(scanner.clone(), r.clone()).unwrap());
            let (want, want_m) = answer(streamed.collect().await);
            let in_place = scan_in_place(scanner.clone(), r.clone(), far);
            let (got, got_m) = answer(in_place.collect().await);
            assert!(!want.is_empty(), "{r:?} answers nothing");
            assert_eq!(got, want, "{r:?}");
            let (got_m, want_m) = (got_m.expect("in place: counters"), want_m.unwrap());
            assert_eq!(
                (got_m.rows_returned, got_m.bytes_returned),
                (want_m.rows_returned, want_m.bytes_returned),
                "{r:?}"
            );
            let (query, _) = compile_scan(&r).unwrap();
            assert_eq!(
                answered_whole(&query),
                r.aggregate.is_some() || r.last_per_series || r.order != 0,
                "{r:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_in_place_scan_past_its_deadline_ends_in_an_error_not_a_shorter_answer() {
        let dir = tempfile::tempdir().unwrap();
        let scanner = scanner(dir.path());
        let passed = std::time::Instant::now();
        for r in requests() {
            let items: Vec<_> = scan_in_place(scanner.clone(), r.clone(), Some(passed))
                .collect()
                .await;
            assert_eq!(items.len(), 1, "{r:?}: {items:?}");
            let e = items.into_iter().next().unwrap().unwrap_err();
            assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{r:?}: {e}");
            // No deadline: the whole answer.
            let (rows, m) = answer(
                scan_in_place(scanner.clone(), r.clone(), None)
                    .collect()
                    .await,
            );
            assert!(!rows.is_empty() && m.is_some(), "{r:?}");
        }
    }

    /// A current-thread runtime cannot lend its thread (`block_in_place`
    /// panics there): scans go to a blocking thread.
    #[test]
    fn only_a_multi_threaded_runtime_runs_scans_in_place() {
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(!current.block_on(async { may_block_in_place() }));
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        assert!(
            multi.block_on(async { tokio::spawn(async { may_block_in_place() }).await.unwrap() })
        );
    }
}
