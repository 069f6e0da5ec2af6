//! The storage engine of a node: open partitions in RocksDB, sealed
//! partitions in Sealion's column files, and the switch from one to the
//! other.
//!
//! Every call here blocks on disk; async callers run them on the blocking
//! pool. A write returns only after RocksDB has synced its WAL, so an
//! acknowledged write survives a crash of the process or the machine.
//!
//! Sealing a partition writes a column file beside the open rows from a
//! RocksDB snapshot, renames it into place, and then, in one synced RocksDB
//! batch, records the file and deletes exactly the open rows the file holds
//! (a row rewritten after the snapshot stays, as a late row). Until that
//! batch commits the file is not part of the partition, so a crash at any
//! point loses nothing and duplicates nothing: on restart a file that no
//! batch recorded is deleted and the rows are still in RocksDB.
//!
//! Rows written to a sealed partition (late rows) go to RocksDB like any
//! other row, with a mark for the partition in the same batch; every read
//! merges them over the file, the later write winning on (series, time),
//! and a reseal folds them in. A sealed partition with no mark is read from
//! its file alone.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use arrow::record_batch::RecordBatch;
use prost::Message;
use rocksdb::{
    ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, ReadOptions, WriteBatch,
    WriteOptions,
};
use sealion_common::proto::{Column, DeletePredicate, ScanMetrics, ScanRequest};

use crate::rows::{EncodedRows, decode_key, decode_series, encode_rows, partition_prefix};
use crate::sealed::{SealedFile, SortedRow, write_sealed};
use crate::{Error, Result};
use sealion_format::digest::RowDigest;
use sealion_format::scan::{Metrics, Mode, Output, Query, scan_rows};
use sealion_format::{Error as FError, Result as FResult};

/// A RocksDB error met while iterating rows for the format crate's row
/// path (which knows no RocksDB).
fn rocks_error(e: rocksdb::Error) -> FError {
    FError::Io(std::io::Error::other(format!("rocksdb: {e}")))
}

/// Rows per Arrow batch that a scan emits.
pub use sealion_format::SCAN_BATCH_ROWS;

/// Write-ahead log bytes past which RocksDB flushes the column families
/// that keep the oldest log alive (two default memtables).
const MAX_TOTAL_WAL_BYTES: u64 = 128 << 20;
/// How far ahead a seal reads the partition's table files.
const SEAL_READAHEAD_BYTES: usize = 4 << 20;
/// Column family that records which file holds each sealed partition.
const SEALED_CF: &str = "sealed";
/// Column family of the delete log: (partition, sequence) -> predicate.
const DELETES_CF: &str = "deletes";
/// Batch ids of applied writes, per partition: key partition id (u64 BE) |
/// batch id, value the time it was applied (ms since the epoch, u64 BE).
const BATCHES_CF: &str = "batches";
/// Sealed partitions that may hold late rows: key partition id (u64 BE),
/// empty value. Written in the same RocksDB batch as the rows that make it
/// true (a write to a sealed partition, a seal that leaves rows behind) and
/// removed in the batch that empties the partition's open key range (a seal
/// that folds every row in, a copied file, a drop). A read of a sealed
/// partition with no mark in its snapshot skips the open key range: right
/// after a seal that range is one range tombstone over every sealed row,
/// and RocksDB steps over each covered row until a compaction drops them.
const LATE_CF: &str = "late";
/// The key in `LATE_CF` that says the marks are complete (a store made
/// before the marks existed has them derived once, at open).
const LATE_MARKS_COMPLETE: &[u8] = b"marks complete";
/// How long a write's batch id is remembered: a retry of the batch within
/// this time is applied once. Older marks are pruned by the sweeper.
pub const BATCH_ID_RETENTION_MS: u64 = 60 * 60 * 1000;
/// Longest batch id a write may carry.
pub const MAX_BATCH_ID_BYTES: usize = 128;
const SEALED_DIR: &str = "sealed";
/// Most threads one scan may use (`Engine::scan_until`).
pub const MAX_SCAN_THREADS: usize = 64;
/// The threads a node's scans may start beside their own, all scans
/// together: a scan takes what it can of them (never waiting) and gives
/// them back when it ends, so concurrent scans share the cores instead of
/// each starting as many threads as one scan alone would.
#[derive(Debug)]
pub struct ScanThreadBudget {
    free: std::sync::atomic::AtomicUsize,
}

/// Extra scan threads taken from a [`ScanThreadBudget`], given back when
/// dropped.
#[derive(Debug)]
pub struct ScanThreadPermit {
    budget: Arc<ScanThreadBudget>,
    extra: usize,
}

impl ScanThreadBudget {
    /// A budget of `extra` threads beyond the scans' own.
    pub fn new(extra: usize) -> Arc<Self> {
        Arc::new(ScanThreadBudget {
            free: std::sync::atomic::AtomicUsize::new(extra),
        })
    }

    /// Up to `want` extra threads, as many as are free now.
    pub fn take(self: &Arc<Self>, want: usize) -> ScanThreadPermit {
        use std::sync::atomic::Ordering;
        let mut extra = 0;
        let _ = self
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                extra = free.min(want);
                Some(free - extra)
            });
        ScanThreadPermit {
            budget: self.clone(),
            extra,
        }
    }

    /// Threads free now.
    pub fn free(&self) -> usize {
        self.free.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl ScanThreadPermit {
    /// The threads the scan holding this permit may use: its own and the
    /// extra ones taken.
    pub fn threads(&self) -> usize {
        1 + self.extra
    }
}

impl Drop for ScanThreadPermit {
    fn drop(&mut self) {
        self.budget
            .free
            .fetch_add(self.extra, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Where a scan runs the steps that may take long: decoding many row
/// groups, walking an open partition's rows, folding many series. A scan
/// run on an async runtime's worker does its short steps there and hands
/// the others to its place (tokio's `block_in_place`, which first hands
/// the worker's other tasks to another thread); a short scan so never
/// costs a thread hand-off. Any other scan runs every step where it is
/// ([`Here`]).
pub trait ScanPlace: Sync {
    /// Runs `step` once, before returning.
    fn run_long(&self, step: &mut dyn FnMut());
}

/// Runs every step of a scan on the scan's own thread.
pub struct Here;

impl ScanPlace for Here {
    fn run_long(&self, step: &mut dyn FnMut()) {
        step()
    }
}

/// The work a scan may do before it hands its steps to
/// [`ScanPlace::run_long`], in rows read: about four full row groups, a
/// few tenths of a millisecond. The rest of a query runs on the same
/// worker between awaits for as long (DataFusion's operators do), so a
/// step this short holds up no more than they do.
pub const SHORT_SCAN_WORK: u64 = 32_768;
/// A partition walked counts as this many rows read (a snapshot and a few
/// RocksDB reads): a scan over many partitions that each answer from the
/// directory is not short.
const PARTITION_WORK: u64 = 512;

/// What is left of a scan's [`SHORT_SCAN_WORK`].
struct ShortWork(u64);

impl ShortWork {
    /// Takes `work` from what is left; false (taking nothing) when it
    /// does not fit.
    fn take(&mut self, work: u64) -> bool {
        match self.0.checked_sub(work) {
            Some(left) => {
                self.0 = left;
                true
            }
            None => false,
        }
    }
}

/// Runs `step` on `place` and returns what it returned.
fn run_long<T>(place: &dyn ScanPlace, step: impl FnOnce() -> Result<T>) -> Result<T> {
    let mut step = Some(step);
    let mut result = None;
    place.run_long(&mut || {
        if let Some(step) = step.take() {
            result = Some(step());
        }
    });
    result.unwrap_or_else(|| {
        Err(Error::Internal(
            "a scan's place did not run its step".into(),
        ))
    })
}

/// Runs `step` here when `work` fits in what is left of `short`, else on
/// `place`.
fn run_step<T>(
    short: &mut ShortWork,
    work: u64,
    place: &dyn ScanPlace,
    step: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if short.take(work) {
        step()
    } else {
        run_long(place, step)
    }
}

/// Rows of work to read `groups` row groups of `file` (at its mean rows a
/// group) and to visit each of its series once, as every path does.
fn file_work(file: &SealedFile, groups: usize) -> u64 {
    let per_group = file.summary().rows / (file.row_groups().len().max(1) as u64);
    (groups as u64).saturating_mul(per_group) + file.series().len() as u64
}

/// Row groups to read a thread must have at least before a sealed
/// partition's scan is shared out: fewer is not worth a thread.
pub const MIN_GROUPS_PER_SCAN_THREAD: usize = 2;
/// Pieces a split scan cuts its row groups into per thread, dealt out in
/// turn, so that uneven pieces even out over each thread's several.
const PIECES_PER_SCAN_THREAD: usize = 4;
const FILE_SUFFIX: &str = "slf";

/// Points at which a test can make a seal fail, as a crash there would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealFailPoint {
    /// The new file is written (not yet renamed into place).
    AfterWrite,
    /// The new file is in place but not recorded.
    AfterRename,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealOutcome {
    /// The partition had no rows.
    Empty,
    /// Sealed and nothing written since.
    AlreadySealed,
    Sealed {
        rows: u64,
        bytes: u64,
    },
    /// An existing file and late rows were folded into a new file.
    Resealed {
        rows: u64,
        bytes: u64,
    },
}

impl SealOutcome {
    /// The outcome's name as reported ("sealed", ...), rows and bytes.
    pub fn summary(&self) -> (&'static str, u64, u64) {
        match *self {
            SealOutcome::Empty => ("empty", 0, 0),
            SealOutcome::AlreadySealed => ("already_sealed", 0, 0),
            SealOutcome::Sealed { rows, bytes } => ("sealed", rows, bytes),
            SealOutcome::Resealed { rows, bytes } => ("resealed", rows, bytes),
        }
    }
}

#[derive(Clone)]
pub struct Engine {
    db: Arc<DB>,
    sealed_dir: PathBuf,
    sealed: Arc<RwLock<HashMap<u64, Arc<SealedFile>>>>,
    /// Writes and scans hold it shared; the commit of a seal holds it
    /// exclusively, for the moment it takes to swap open rows for the file.
    swap: Arc<RwLock<()>>,
    /// One seal at a time.
    sealing: Arc<Mutex<()>>,
    /// Next sequence number of the delete log.
    delete_seq: Arc<std::sync::atomic::AtomicU64>,
    /// Writes and deletes of each partition's rows since the engine opened,
    /// counted under `swap` held shared: a seal that finds the count at its
    /// commit equal to the count at its snapshot knows every row it sealed
    /// is still there unchanged, without reading them again.
    changes: Arc<Mutex<HashMap<u64, u64>>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Rows a scan of the whole partition returns.
    pub rows: u64,
    pub bytes: u64,
    pub sealed: bool,
    pub sealed_rows: u64,
    /// Rows in RocksDB for a sealed partition (written after sealing).
    pub late_rows: u64,
    /// Rows of the sealed file that deletes hide.
    pub deleted_rows: u64,
}

/// Whether `row` matches `pred`: time in range and every tag condition met
/// (a row without the tag never matches).
pub fn row_matches(pred: &DeletePredicate, row: &SortedRow, partition_id: u64) -> FResult<bool> {
    if row.time_ns < pred.start_ns || row.time_ns >= pred.end_ns {
        return Ok(false);
    }
    if pred.tags.is_empty() {
        return Ok(true);
    }
    let tags = decode_series(&row.series).ok_or_else(|| FError::Corrupt {
        partition_id,
        reason: "bad series key".into(),
    })?;
    for m in &pred.tags {
        match tags.iter().find(|(n, _)| *n == m.name) {
            Some((_, v)) if m.values.iter().any(|x| x == v) => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

fn parse_deletes(
    iter: impl Iterator<Item = std::result::Result<(Box<[u8]>, Box<[u8]>), rocksdb::Error>>,
    partition_id: u64,
) -> Result<Vec<(u64, DeletePredicate)>> {
    let prefix = partition_prefix(partition_id);
    let mut out = Vec::new();
    for item in iter {
        let (key, value) = item?;
        if key.len() != 16 || key[..8] != prefix {
            break;
        }
        let seq = u64::from_be_bytes(key[8..16].try_into().unwrap_or_default());
        let pred = DeletePredicate::decode(value.as_ref()).map_err(|e| Error::Corrupt {
            partition_id,
            reason: format!("bad delete log entry {seq}: {e}"),
        })?;
        out.push((seq, pred));
    }
    Ok(out)
}

/// The rows of `rows` that none of `deletes` matches.
fn without_deleted<'a>(
    rows: impl Iterator<Item = FResult<SortedRow>> + 'a,
    deletes: Vec<DeletePredicate>,
    partition_id: u64,
) -> impl Iterator<Item = FResult<SortedRow>> + 'a {
    rows.filter_map(move |row| match row {
        Err(e) => Some(Err(e)),
        Ok(row) => {
            for d in &deletes {
                match row_matches(d, &row, partition_id) {
                    Ok(true) => return None,
                    Ok(false) => {}
                    Err(e) => return Some(Err(e)),
                }
            }
            Some(Ok(row))
        }
    })
}

fn poisoned() -> Error {
    Error::Internal("engine lock poisoned".into())
}

fn key_order(a: &SortedRow, b: &SortedRow) -> Ordering {
    (a.series.len(), &a.series[..], a.time_ns).cmp(&(b.series.len(), &b.series[..], b.time_ns))
}

/// Merges two row streams in key order; on equal keys the row of `late`
/// wins (it was written after the other).
fn merge_rows<'a>(
    base: impl Iterator<Item = FResult<SortedRow>> + 'a,
    late: impl Iterator<Item = FResult<SortedRow>> + 'a,
) -> impl Iterator<Item = FResult<SortedRow>> + 'a {
    let mut base = base.peekable();
    let mut late = late.peekable();
    std::iter::from_fn(move || {
        let order = match (base.peek(), late.peek()) {
            (None, None) => return None,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(Err(_)), _) => Ordering::Less,
            (_, Some(Err(_))) => Ordering::Greater,
            (Some(Ok(a)), Some(Ok(b))) => key_order(a, b),
        };
        match order {
            Ordering::Less => base.next(),
            Ordering::Greater => late.next(),
            Ordering::Equal => {
                base.next();
                late.next()
            }
        }
    })
}

/// How a split scan shares out files of which it reads `lens[f]` row
/// groups on up to `threads` threads: the threads worth starting (at least
/// `MIN_GROUPS_PER_SCAN_THREAD` groups each; below 2, the scan runs on the
/// calling thread alone) and the pieces, `(file, share, shares)`: share
/// `share` of the file's groups cut into `shares` runs of contiguous groups,
/// about `PIECES_PER_SCAN_THREAD` pieces a thread of at least
/// `MIN_GROUPS_PER_SCAN_THREAD` groups each (a file with fewer is one piece).
fn share_out(lens: &[usize], threads: usize) -> (usize, Vec<(usize, usize, usize)>) {
    let total: usize = lens.iter().sum();
    let threads = threads.min(total / MIN_GROUPS_PER_SCAN_THREAD);
    if threads < 2 {
        return (threads, Vec::new());
    }
    let piece = total
        .div_ceil(threads * PIECES_PER_SCAN_THREAD)
        .max(MIN_GROUPS_PER_SCAN_THREAD);
    let mut pieces = Vec::new();
    for (f, &len) in lens.iter().enumerate() {
        // A file with no group to read is still one piece: its counters.
        let shares = (len / piece).max(1);
        pieces.extend((0..shares).map(|share| (f, share, shares)));
    }
    (threads, pieces)
}

/// Reads `files` (sealed files, each with the row groups the scan reads of
/// it) on up to `threads` threads, each thread collecting its own answer
/// and handing it to `send`: the calling thread into `out`, every other one
/// into an output of its own, whose counters come back added up (with
/// `scan_threads`, the threads it ran on, when more than one). With at
/// least `MIN_GROUPS_PER_SCAN_THREAD` groups per thread, every file's groups
/// are cut into pieces of contiguous groups (about four a thread), dealt
/// out to the threads in turn; with fewer, everything is read on the
/// calling thread. The other threads' aggregate states are handed on after
/// they are all done, in thread order, so that a repeated query gets the
/// same answer to the last bit. A thread that fails stops the
/// others, and its error is the answer. (Public for read-bench, which
/// times this very path over one file.)
pub fn read_shared_out(
    out: &mut Output<'_>,
    files: &[(Arc<SealedFile>, Vec<usize>)],
    threads: usize,
    send: &(dyn Fn(RecordBatch) -> bool + Sync),
    gone: &(dyn Fn() -> bool + Sync),
) -> Result<ScanMetrics> {
    let lens: Vec<usize> = files.iter().map(|(_, g)| g.len()).collect();
    let (threads, pieces) = share_out(&lens, threads);
    if threads < 2 {
        for (file, groups) in files {
            if out.done() {
                break;
            }
            file.run_share(out, groups, 0, 1)?;
        }
        return Ok(ScanMetrics::default());
    }
    // The threads' collectors share the node's group limits.
    out.share_limits(threads);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let stopped = || failed.load(std::sync::atomic::Ordering::Relaxed) || gone();
    // Thread `t` takes pieces t, t + threads, ... into `out`: dealt out
    // the same way every time, so a repeated query merges the same states.
    let work = |out: &mut Output<'_>, t: usize| -> FResult<()> {
        for &(f, share, shares) in pieces.iter().skip(t).step_by(threads) {
            if out.done() || stopped() {
                return Ok(());
            }
            let (file, groups) = &files[f];
            if let Err(e) = file.run_share(out, groups, share, shares) {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok(())
    };
    let query: &Query = out.query;
    // An aggregate's states are handed on once every thread is done, in
    // thread order (float sums merged in another order round differently);
    // rows go as they come.
    let hold = matches!(query.mode, Mode::Aggregate(_));
    // Another thread: an output of its own; its counters and held batches.
    let helper = |t: usize| -> FResult<(ScanMetrics, Vec<RecordBatch>)> {
        let mut held = Vec::new();
        let done = {
            let mut sink = |batch: RecordBatch| {
                if hold {
                    held.push(batch);
                    true
                } else {
                    send(batch)
                }
            };
            let mut own = Output::new(query, &mut sink).with_cancel(&stopped);
            own.share_limits(threads);
            work(&mut own, t).and_then(|()| own.finish())
        };
        if done.is_err() {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        done.map(|m| (m, held))
    };
    let (mine, others) = std::thread::scope(|scope| {
        let others: Vec<_> = (1..threads)
            .map(|t| {
                std::thread::Builder::new()
                    .name("sealion-scan".into())
                    .spawn_scoped(scope, move || helper(t))
            })
            .collect();
        let mine = work(out, 0);
        // A thread the system would not start: its share is read here,
        // after this thread's own, into an output of its own as the thread
        // would have.
        let others: Vec<FResult<(ScanMetrics, Vec<RecordBatch>)>> = others
            .into_iter()
            .enumerate()
            .map(|(i, handle)| match handle {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| Err(FError::Internal("a scan thread panicked".into()))),
                Err(e) => {
                    tracing::warn!("starting a scan thread: {e}; its share is read inline");
                    helper(i + 1)
                }
            })
            .collect();
        (mine, others)
    });
    mine?;
    let mut metrics = ScanMetrics::default();
    let mut more = true;
    for part in others {
        let (m, held) = part?;
        Metrics::add_proto(&mut metrics, &m);
        for batch in held {
            more = more && send(batch);
        }
    }
    metrics.scan_threads = threads as u64;
    Ok(metrics)
}

/// The rows of `partition_id` in `db` (a DB or a snapshot), in key order.
/// A key and value as RocksDB's iterators give them.
/// The rows of one partition's key range, read with RocksDB's raw
/// iterator so each key and value is copied once, into its row (the plain
/// iterator boxes both first, then a row copied them again). Ends at the
/// first error, which it yields.
struct RocksRows<'a> {
    it: Option<rocksdb::DBRawIteratorWithThreadMode<'a, DB>>,
    partition_id: u64,
    started: bool,
}

impl<'a> RocksRows<'a> {
    /// Rows of `partition_id` from `it`, a raw iterator made with
    /// `partition_read_options(partition_id)`.
    fn new(mut it: rocksdb::DBRawIteratorWithThreadMode<'a, DB>, partition_id: u64) -> Self {
        it.seek(partition_prefix(partition_id));
        RocksRows {
            it: Some(it),
            partition_id,
            started: false,
        }
    }

    /// No rows at all.
    fn none(partition_id: u64) -> Self {
        RocksRows {
            it: None,
            partition_id,
            started: false,
        }
    }

    /// The next key and value, borrowed from the iterator.
    fn next_raw(&mut self) -> Option<FResult<(&[u8], &[u8])>> {
        let it = self.it.as_mut()?;
        if self.started {
            it.next();
        }
        self.started = true;
        if !it.valid() {
            let status = it.status();
            self.it = None;
            return status.err().map(|e| Err(rocks_error(e)));
        }
        let it = self.it.as_ref()?;
        Some(Ok((it.key()?, it.value()?)))
    }
}

impl Iterator for RocksRows<'_> {
    type Item = FResult<SortedRow>;

    fn next(&mut self) -> Option<FResult<SortedRow>> {
        let partition_id = self.partition_id;
        let (key, value) = match self.next_raw()? {
            Ok(kv) => kv,
            Err(e) => return Some(Err(e)),
        };
        let Some((_, series, time_ns)) = decode_key(key) else {
            self.it = None;
            return Some(Err(FError::Corrupt {
                partition_id,
                reason: "bad key".into(),
            }));
        };
        Some(Ok(SortedRow {
            series: series.to_vec(),
            time_ns,
            value: value.to_vec(),
        }))
    }
}

fn batch_key(partition_id: u64, batch_id: &[u8]) -> Vec<u8> {
    let mut key = partition_prefix(partition_id).to_vec();
    key.extend_from_slice(batch_id);
    key
}

fn check_batch_id(batch_id: &[u8]) -> Result<()> {
    if batch_id.len() > MAX_BATCH_ID_BYTES {
        return Err(Error::Invalid(format!(
            "batch id of {} bytes is over the limit of {MAX_BATCH_ID_BYTES}",
            batch_id.len()
        )));
    }
    Ok(())
}

fn mark_time(key: &[u8], value: &[u8]) -> Result<u64> {
    match (key.len() > 8, <[u8; 8]>::try_from(value)) {
        (true, Ok(b)) => Ok(u64::from_be_bytes(b)),
        _ => Err(Error::Corrupt {
            partition_id: 0,
            reason: "bad batch id record".into(),
        }),
    }
}

/// Whether `snapshot` holds any RocksDB row of `partition_id` (open rows,
/// or late rows of a sealed partition).
fn has_rows_in(snapshot: &rocksdb::SnapshotWithThreadMode<'_, DB>, partition_id: u64) -> bool {
    snapshot
        .iterator_opt(
            IteratorMode::From(&partition_prefix(partition_id), Direction::Forward),
            partition_read_options(partition_id),
        )
        .next()
        .is_some()
}

/// The key range `[from, to)` of everything a partition holds in a column
/// family keyed by partition id first.
fn partition_range(partition_id: u64) -> (Vec<u8>, Vec<u8>) {
    let from = partition_prefix(partition_id).to_vec();
    let to = match partition_id.checked_add(1) {
        Some(next) => partition_prefix(next).to_vec(),
        None => vec![0xff; 9],
    };
    (from, to)
}

fn partition_read_options(partition_id: u64) -> ReadOptions {
    let mut ro = ReadOptions::default();
    if let Some(next) = partition_id.checked_add(1) {
        ro.set_iterate_upper_bound(partition_prefix(next).to_vec());
    }
    ro
}

/// Derives the late-row marks of a store made before they existed: each
/// sealed partition with any row in its open key range is marked. Runs
/// once; later opens find `LATE_MARKS_COMPLETE`.
fn mark_late_rows_once(db: &DB, sealed: impl Iterator<Item = u64>) -> Result<()> {
    let cf = db
        .cf_handle(LATE_CF)
        .ok_or_else(|| Error::Internal("no late column family".into()))?;
    if db.get_cf(&cf, LATE_MARKS_COMPLETE)?.is_some() {
        return Ok(());
    }
    let mut batch = WriteBatch::default();
    for pid in sealed {
        let prefix = partition_prefix(pid);
        let mut it = db.iterator_opt(
            IteratorMode::From(&prefix, Direction::Forward),
            partition_read_options(pid),
        );
        if it.next().transpose()?.is_some() {
            batch.put_cf(&cf, pid.to_be_bytes(), []);
        }
    }
    batch.put_cf(&cf, LATE_MARKS_COMPLETE, []);
    let mut opts = WriteOptions::default();
    opts.set_sync(true);
    db.write_opt(batch, &opts)?;
    Ok(())
}

/// A write's rows as the engine stores them, per partition (every
/// partition of the request, also one with no rows: its batch id is still
/// recorded). Encoding needs no lock, so a caller that serializes writes
/// encodes first and holds its lock only for [`Engine::write_encoded`].
#[derive(Debug, Default)]
pub struct EncodedWrite {
    parts: Vec<(u64, EncodedRows)>,
}

impl EncodedWrite {
    /// Encodes every row of `parts` (see `rows::encode_rows`): an error
    /// in any batch fails the whole write.
    pub fn encode(columns: &[Column], parts: &[(u64, Vec<RecordBatch>)]) -> Result<Self> {
        let mut out = Vec::with_capacity(parts.len());
        for (partition_id, batches) in parts {
            let mut rows = EncodedRows::default();
            for b in batches {
                let encoded = encode_rows(*partition_id, columns, b)?;
                if rows.is_empty() {
                    rows = encoded;
                } else {
                    rows.append(&encoded);
                }
            }
            out.push((*partition_id, rows));
        }
        Ok(Self { parts: out })
    }

    /// Keeps the partitions `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.parts.retain(|(pid, _)| keep(*pid));
    }

    /// The partitions, in request order.
    pub fn partition_ids(&self) -> Vec<u64> {
        self.parts.iter().map(|(pid, _)| *pid).collect()
    }

    /// Rows in all partitions.
    pub fn rows(&self) -> u64 {
        self.parts.iter().map(|(_, p)| p.len() as u64).sum()
    }
}

/// How RocksDB keeps the open rows: the knobs the ingest benchmark
/// (`bench/src/ingest.rs`) varies. [`RowStoreOptions::default`] is what a
/// storage node runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct RowStoreOptions {
    /// Bytes of one memtable of the rows' column family.
    pub write_buffer_bytes: usize,
    /// Memtables kept (the one written, plus those waiting to flush).
    pub max_write_buffers: i32,
    /// Level-0 files that start a compaction into level 1.
    pub l0_compaction_trigger: i32,
    /// Level-0 files past which writes are slowed, then stopped.
    pub l0_slowdown_files: i32,
    pub l0_stop_files: i32,
    /// Flush and compaction threads.
    pub background_jobs: i32,
    /// Bytes of level 1 (each level below holds ten times more).
    pub level1_bytes: u64,
    /// Levels (from level 0) whose table files are written uncompressed;
    /// the rest use LZ4.
    pub uncompressed_levels: usize,
}

impl Default for RowStoreOptions {
    fn default() -> Self {
        // RocksDB's own defaults but for level 0. Open rows stay in RocksDB
        // only until their partition is sealed, and the seal compacts their
        // key range away, so every compaction before that is work spent on
        // rows about to leave. Waiting for 16 level-0 files instead of 4
        // took 14% off the CPU of ingest-bench (10M rows, 4 writers: 36.8-39.8
        // CPU-seconds against 44.6-46.5, three alternated runs each), and a
        // full scan of an open partition took as long with 23 level-0 files
        // as with 11 (the row decoding is most of it).
        RowStoreOptions {
            write_buffer_bytes: 64 << 20,
            max_write_buffers: 2,
            l0_compaction_trigger: 16,
            l0_slowdown_files: 64,
            l0_stop_files: 96,
            background_jobs: 2,
            level1_bytes: 256 << 20,
            uncompressed_levels: 0,
        }
    }
}

impl Engine {
    /// Opens (or creates) the engine under `root`: RocksDB in `root/rows`,
    /// sealed files in `root/sealed`. Files that no seal recorded (left by a
    /// crash mid-seal) are deleted; a recorded file that cannot be opened is
    /// an error naming it, never silently skipped.
    pub fn open(root: &Path) -> Result<Self> {
        Self::open_with(root, &RowStoreOptions::default())
    }

    /// [`Engine::open`] with the open rows kept as `tuning` says.
    pub fn open_with(root: &Path, tuning: &RowStoreOptions) -> Result<Self> {
        let rows_dir = root.join("rows");
        let sealed_dir = root.join(SEALED_DIR);
        std::fs::create_dir_all(&rows_dir)?;
        std::fs::create_dir_all(&sealed_dir)?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_write_buffer_size(tuning.write_buffer_bytes);
        opts.set_max_write_buffer_number(tuning.max_write_buffers);
        opts.set_level_zero_file_num_compaction_trigger(tuning.l0_compaction_trigger);
        opts.set_level_zero_slowdown_writes_trigger(tuning.l0_slowdown_files);
        opts.set_level_zero_stop_writes_trigger(tuning.l0_stop_files);
        opts.set_max_background_jobs(tuning.background_jobs);
        opts.set_max_bytes_for_level_base(tuning.level1_bytes);
        // LZ4 at every level. Open rows live until their partition is
        // sealed into Sealion's own files, so RocksDB's bottom level holds
        // them briefly; zstd there (as before) made the L0 -> L1
        // compactions of a small store zstd compactions, and they took a
        // third of both cores during a long ingest run.
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        if tuning.uncompressed_levels > 0 {
            let levels: Vec<_> = (0..7)
                .map(|l| {
                    if l < tuning.uncompressed_levels {
                        rocksdb::DBCompressionType::None
                    } else {
                        rocksdb::DBCompressionType::Lz4
                    }
                })
                .collect();
            opts.set_compression_per_level(&levels);
        }
        // A write-ahead log file is freed only once every column family with
        // data in it has flushed; the small ones (sealed, deletes, batches,
        // late) rarely fill a memtable, so logs piled up (264 MB of them
        // after loading 518k rows). Past this total, RocksDB flushes them.
        opts.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES);
        let cfs = vec![
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, opts.clone()),
            ColumnFamilyDescriptor::new(SEALED_CF, Options::default()),
            ColumnFamilyDescriptor::new(DELETES_CF, Options::default()),
            ColumnFamilyDescriptor::new(BATCHES_CF, Options::default()),
            ColumnFamilyDescriptor::new(LATE_CF, Options::default()),
        ];
        let db = DB::open_cf_descriptors(&opts, &rows_dir, cfs)?;
        let mut sealed = HashMap::new();
        let mut recorded = std::collections::HashSet::new();
        {
            let cf = db
                .cf_handle(SEALED_CF)
                .ok_or_else(|| Error::Internal("no sealed column family".into()))?;
            for item in db.iterator_cf(&cf, IteratorMode::Start) {
                let (key, value) = item?;
                let pid =
                    u64::from_be_bytes(key.as_ref().try_into().map_err(|_| Error::Corrupt {
                        partition_id: 0,
                        reason: "bad sealed-partition record".into(),
                    })?);
                let name = String::from_utf8(value.to_vec()).map_err(|_| Error::Corrupt {
                    partition_id: pid,
                    reason: "bad sealed file name".into(),
                })?;
                let file = SealedFile::open(&sealed_dir.join(&name))?;
                recorded.insert(name);
                sealed.insert(pid, Arc::new(file));
            }
        }
        mark_late_rows_once(&db, sealed.keys().copied())?;
        for entry in std::fs::read_dir(&sealed_dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            if !recorded.contains(&name) {
                tracing::info!(file = %name, "removing a sealed file that no seal recorded");
                std::fs::remove_file(entry.path())?;
            }
        }
        let next_seq = {
            let cf = db
                .cf_handle(DELETES_CF)
                .ok_or_else(|| Error::Internal("no deletes column family".into()))?;
            let mut max = 0u64;
            for item in db.iterator_cf(&cf, IteratorMode::Start) {
                let (key, _) = item?;
                if key.len() == 16 {
                    max = max.max(u64::from_be_bytes(
                        key[8..16].try_into().unwrap_or_default(),
                    ));
                }
            }
            max + 1
        };
        Ok(Engine {
            delete_seq: Arc::new(std::sync::atomic::AtomicU64::new(next_seq)),
            changes: Arc::new(Mutex::new(HashMap::new())),
            db: Arc::new(db),
            sealed_dir,
            sealed: Arc::new(RwLock::new(sealed)),
            swap: Arc::new(RwLock::new(())),
            sealing: Arc::new(Mutex::new(())),
        })
    }

    /// Stores all rows of all `parts` in one atomic, synced RocksDB batch:
    /// either every row of the request is durable or none is.
    pub fn write(&self, columns: &[Column], parts: &[(u64, Vec<RecordBatch>)]) -> Result<u64> {
        self.write_batch(columns, parts, &[], 0)
    }

    /// [`Engine::write`] that also records, in the same atomic batch, that
    /// each partition of `parts` applied batch `batch_id` (none when it is
    /// empty) at `now_ms`.
    pub fn write_batch(
        &self,
        columns: &[Column],
        parts: &[(u64, Vec<RecordBatch>)],
        batch_id: &[u8],
        now_ms: u64,
    ) -> Result<u64> {
        self.write_encoded(EncodedWrite::encode(columns, parts)?, batch_id, now_ms)
    }

    /// Stores rows encoded beforehand (see [`EncodedWrite`]) as
    /// [`Engine::write_batch`] stores them. Writes may run at once, also to
    /// one partition: RocksDB then syncs them together.
    pub fn write_encoded(&self, rows: EncodedWrite, batch_id: &[u8], now_ms: u64) -> Result<u64> {
        check_batch_id(batch_id)?;
        // Room for every row at once (each entry adds a tag and two length
        // varints), rather than the batch's buffer grown and copied.
        let bytes: usize = rows
            .parts
            .iter()
            .map(|(_, p)| p.bytes() + 12 * p.len() + 64)
            .sum();
        let mut batch = WriteBatch::with_capacity_bytes(bytes + 12);
        let count = rows.rows();
        for (partition_id, pairs) in &rows.parts {
            for (k, v) in pairs.iter() {
                batch.put(k, v);
            }
            if !batch_id.is_empty() {
                batch.put_cf(
                    self.batches_cf()?,
                    batch_key(*partition_id, batch_id),
                    now_ms.to_be_bytes(),
                );
            }
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        let _shared = self.swap.read().map_err(|_| poisoned())?;
        // Rows for a sealed partition are late rows: marked in the same
        // batch. (A seal commits under the exclusive lock, so whether the
        // partition is sealed cannot change before this batch is written.)
        {
            let sealed = self.sealed.read().map_err(|_| poisoned())?;
            let cf = self.late_cf()?;
            for (partition_id, pairs) in &rows.parts {
                if sealed.contains_key(partition_id) && !pairs.is_empty() {
                    batch.put_cf(cf, partition_id.to_be_bytes(), []);
                }
            }
        }
        self.note_changes(rows.parts.iter().map(|(pid, _)| *pid))?;
        self.db.write_opt(batch, &opts)?;
        Ok(count)
    }

    /// Adds to `batch` a delete of each live row of `partition_id` that is
    /// unchanged since `snapshot` (so the new file holds it) and that no
    /// delete in `newer` hides; true when that is every live row.
    fn delete_sealed_rows(
        &self,
        partition_id: u64,
        snapshot: &rocksdb::SnapshotWithThreadMode<'_, DB>,
        prefix: &[u8],
        newer: &[DeletePredicate],
        batch: &mut WriteBatch,
    ) -> Result<bool> {
        // Live rows and the snapshot's rows, both in key order, walked
        // together: a live row the file holds has the same key and value in
        // the snapshot (no point lookup per row).
        let mut then = snapshot
            .iterator_opt(
                IteratorMode::From(prefix, Direction::Forward),
                partition_read_options(partition_id),
            )
            .peekable();
        // Whether every live row goes (the usual case: nothing was
        // written during the seal). Then one range tombstone replaces
        // the per-row ones and the partition's late-row mark goes, so
        // reads do not enter the range (RocksDB would step over every
        // covered row until a compaction drops them).
        let mut every_row_goes = true;
        for item in self.partition_iter(partition_id) {
            let (key, value) = item?;
            let mut same = false;
            while let Some(next) = then.peek() {
                let (k, v) = match next {
                    Ok(kv) => kv,
                    Err(_) => {
                        if let Some(Err(e)) = then.next() {
                            return Err(e.into());
                        }
                        continue;
                    }
                };
                match k[..].cmp(&key[..]) {
                    std::cmp::Ordering::Less => {
                        then.next();
                    }
                    std::cmp::Ordering::Equal => {
                        same = v[..] == value[..];
                        break;
                    }
                    std::cmp::Ordering::Greater => break,
                }
            }
            if !same {
                every_row_goes = false;
                continue;
            }
            if !newer.is_empty() {
                let (_, series, time_ns) = decode_key(&key).ok_or_else(|| Error::Corrupt {
                    partition_id,
                    reason: "bad key".into(),
                })?;
                let row = SortedRow {
                    series: series.to_vec(),
                    time_ns,
                    value: Vec::new(),
                };
                let mut hidden = false;
                for d in newer {
                    hidden |= row_matches(d, &row, partition_id)?;
                }
                if hidden {
                    every_row_goes = false;
                    continue;
                }
            }
            batch.delete(&key);
        }
        Ok(every_row_goes)
    }

    /// Counts a change to the rows of each of `partition_ids`; the caller
    /// holds `swap` shared and writes after this.
    fn note_changes(&self, partition_ids: impl Iterator<Item = u64>) -> Result<()> {
        let mut changes = self.changes.lock().map_err(|_| poisoned())?;
        for pid in partition_ids {
            *changes.entry(pid).or_default() += 1;
        }
        Ok(())
    }

    fn changes_of(&self, partition_id: u64) -> Result<u64> {
        let changes = self.changes.lock().map_err(|_| poisoned())?;
        Ok(changes.get(&partition_id).copied().unwrap_or(0))
    }

    fn late_cf(&self) -> Result<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(LATE_CF)
            .ok_or_else(|| Error::Internal("no late column family".into()))
    }

    /// Whether sealed partition `partition_id` may hold rows in its open
    /// key range (late rows) as `snap` saw it. False means the range holds
    /// none and need not be read.
    fn late_marked(
        &self,
        snap: &rocksdb::SnapshotWithThreadMode<'_, DB>,
        partition_id: u64,
    ) -> Result<bool> {
        Ok(snap
            .get_cf(self.late_cf()?, partition_id.to_be_bytes())?
            .is_some())
    }

    /// The rows in `partition_id`'s open key range as `snap` saw them: all
    /// its rows while it is open (`sealed` false), its late rows once it is
    /// sealed. Not read at all for a sealed partition with no late-row mark.
    fn open_range<'s>(
        &self,
        snap: &'s rocksdb::SnapshotWithThreadMode<'_, DB>,
        partition_id: u64,
        sealed: bool,
    ) -> Result<RocksRows<'s>> {
        Ok(if !sealed || self.late_marked(snap, partition_id)? {
            RocksRows::new(
                snap.raw_iterator_opt(partition_read_options(partition_id)),
                partition_id,
            )
        } else {
            RocksRows::none(partition_id)
        })
    }

    fn batches_cf(&self) -> Result<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(BATCHES_CF)
            .ok_or_else(|| Error::Internal("no batches column family".into()))
    }

    /// The partitions of `partition_ids` that have applied batch `batch_id`.
    pub fn applied_batch(&self, batch_id: &[u8], partition_ids: &[u64]) -> Result<Vec<u64>> {
        check_batch_id(batch_id)?;
        let cf = self.batches_cf()?;
        let mut out = Vec::new();
        for &pid in partition_ids {
            if self.db.get_cf(cf, batch_key(pid, batch_id))?.is_some() {
                out.push(pid);
            }
        }
        Ok(out)
    }

    /// The batch ids partition `partition_id` has applied, with when.
    pub fn batch_marks(&self, partition_id: u64) -> Result<Vec<(Vec<u8>, u64)>> {
        let cf = self.batches_cf()?;
        let prefix = partition_prefix(partition_id);
        let mut out = Vec::new();
        for item in self.db.iterator_cf_opt(
            cf,
            partition_read_options(partition_id),
            IteratorMode::From(&prefix, Direction::Forward),
        ) {
            let (key, value) = item?;
            out.push((key[8..].to_vec(), mark_time(&key, &value)?));
        }
        Ok(out)
    }

    /// Records batch ids as applied by `partition_id` (a replica taking the
    /// primary's marks with its rows).
    pub fn record_batch_marks(&self, partition_id: u64, marks: &[(Vec<u8>, u64)]) -> Result<()> {
        let cf = self.batches_cf()?;
        let mut batch = WriteBatch::default();
        for (id, at) in marks {
            check_batch_id(id)?;
            batch.put_cf(cf, batch_key(partition_id, id), at.to_be_bytes());
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db.write_opt(batch, &opts)?;
        Ok(())
    }

    /// Forgets batch ids applied before `before_ms`; returns how many.
    pub fn prune_batch_marks(&self, before_ms: u64) -> Result<u64> {
        let cf = self.batches_cf()?;
        let mut batch = WriteBatch::default();
        let mut n = 0;
        for item in self.db.iterator_cf(cf, IteratorMode::Start) {
            let (key, value) = item?;
            if mark_time(&key, &value)? < before_ms {
                batch.delete_cf(cf, key);
                n += 1;
            }
        }
        if n > 0 {
            self.db.write(batch)?;
        }
        Ok(n)
    }

    fn partition_iter(&self, partition_id: u64) -> rocksdb::DBIterator<'_> {
        let prefix = partition_prefix(partition_id);
        self.db.iterator_opt(
            IteratorMode::From(&prefix, Direction::Forward),
            partition_read_options(partition_id),
        )
    }

    /// Waits until RocksDB has no flush or compaction running or pending
    /// (what the store looks like once writes have been quiet a while), so
    /// that a benchmark of what follows is not charged for it.
    pub fn wait_for_background_work(&self) -> Result<()> {
        self.db
            .wait_for_compact(&rocksdb::WaitForCompactOptions::default())?;
        Ok(())
    }

    /// A RocksDB property of the open rows' column family (`rocksdb.stats`,
    /// `rocksdb.num-files-at-level0`...), for benchmarks and diagnostics.
    pub fn rows_property(&self, name: &str) -> Result<Option<String>> {
        Ok(self.db.property_value(name)?)
    }

    pub fn sealed_file(&self, partition_id: u64) -> Result<Option<Arc<SealedFile>>> {
        Ok(self
            .sealed
            .read()
            .map_err(|_| poisoned())?
            .get(&partition_id)
            .cloned())
    }

    fn deletes_cf(&self) -> Result<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(DELETES_CF)
            .ok_or_else(|| Error::Internal("no deletes column family".into()))
    }

    /// The delete log of `partition_id` in the live DB: (sequence,
    /// predicate), oldest first.
    fn live_deletes(&self, partition_id: u64) -> Result<Vec<(u64, DeletePredicate)>> {
        let prefix = partition_prefix(partition_id);
        let it = self.db.iterator_cf_opt(
            self.deletes_cf()?,
            partition_read_options(partition_id),
            IteratorMode::From(&prefix, Direction::Forward),
        );
        parse_deletes(it, partition_id)
    }

    /// The delete log of `partition_id` as `snap` saw it.
    fn snapshot_deletes(
        &self,
        snap: &rocksdb::SnapshotWithThreadMode<'_, DB>,
        partition_id: u64,
    ) -> Result<Vec<(u64, DeletePredicate)>> {
        let prefix = partition_prefix(partition_id);
        let it = snap.iterator_cf_opt(
            self.deletes_cf()?,
            partition_read_options(partition_id),
            IteratorMode::From(&prefix, Direction::Forward),
        );
        parse_deletes(it, partition_id)
    }

    /// Deletes the rows of `partition_id` that `pred` matches, durably
    /// (synced) before it returns: open and late rows are removed, and the
    /// predicate goes to the delete log, which hides matching rows of the
    /// sealed file until a reseal drops them. Returns how many rows a full
    /// scan no longer sees.
    pub fn delete(&self, partition_id: u64, pred: &DeletePredicate) -> Result<u64> {
        let before = self.stats(partition_id)?.rows;
        let cf = self.deletes_cf()?;
        {
            let _shared = self.swap.read().map_err(|_| poisoned())?;
            let mut batch = WriteBatch::default();
            for row in RocksRows::new(
                self.db
                    .raw_iterator_opt(partition_read_options(partition_id)),
                partition_id,
            ) {
                let row = row?;
                if row_matches(pred, &row, partition_id)? {
                    batch.delete(crate::rows::encode_key(
                        partition_id,
                        &row.series,
                        row.time_ns,
                    ));
                }
            }
            // Always logged, open partition or not: a seal may have taken its
            // snapshot before these rows were removed.
            let seq = self
                .delete_seq
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut key = partition_prefix(partition_id).to_vec();
            key.extend_from_slice(&seq.to_be_bytes());
            batch.put_cf(&cf, key, pred.encode_to_vec());
            let mut opts = WriteOptions::default();
            opts.set_sync(true);
            self.note_changes(std::iter::once(partition_id))?;
            self.db.write_opt(batch, &opts)?;
        }
        let after = self.stats(partition_id)?.rows;
        Ok(before.saturating_sub(after))
    }

    /// Runs `req` and hands its answer to `emit` in batches of at most
    /// `SCAN_BATCH_ROWS` rows, stopping early when `emit` returns false.
    /// Returns what the scan did (`ScanMetrics`).
    ///
    /// Each partition goes down one of three ways: an open partition through
    /// the row path; a sealed one with nothing pending through the sealed
    /// file's column paths; a sealed one with late rows or deletes through
    /// the row path over the file's rows merged with them (last write wins,
    /// deleted rows dropped). All three give the same answer for the same
    /// rows (`sealion_format::scan`).
    pub fn scan(
        &self,
        req: &ScanRequest,
        emit: impl FnMut(RecordBatch) -> bool + Send,
    ) -> Result<ScanMetrics> {
        self.scan_until(req, 1, &|| false, emit)
    }

    /// [`Engine::scan`] on up to `threads` threads, stopping early once
    /// `cancelled` answers true.
    ///
    /// For a query whose answer may be gathered in parts (`Query::splits`:
    /// rows without a limit, aggregates), the sealed partitions read
    /// through the column paths are read last, together, their row groups
    /// cut into runs of contiguous groups dealt out to the threads in turn
    /// (`share_out`: at least `MIN_GROUPS_PER_SCAN_THREAD` groups a thread,
    /// or it all runs on the calling thread). Each thread collects its own
    /// answer and hands it to `emit` (one call at a time). The answer is
    /// then the same rows in another order, or the same groups with a
    /// group's partial states possibly in several rows, which the asker
    /// merges as it merges partitions. Open partitions and sealed ones with
    /// late rows or deletes run on the calling thread, as with one thread.
    pub fn scan_until(
        &self,
        req: &ScanRequest,
        threads: usize,
        cancelled: &(dyn Fn() -> bool + Sync),
        emit: impl FnMut(RecordBatch) -> bool + Send,
    ) -> Result<ScanMetrics> {
        self.scan_placed(req, threads, cancelled, &Here, emit)
    }

    /// [`Engine::scan_until`] with its long steps run on `place`: the walk
    /// of each partition, the reading of each sealed file and the reading
    /// of the files shared out each run on the calling thread while the
    /// work estimated for them fits in what is left of
    /// [`SHORT_SCAN_WORK`], and on `place` otherwise. An open partition
    /// with rows, or a sealed one with late rows or deletes, always runs on
    /// `place`. A scan that stays short reads its files on one thread.
    pub fn scan_placed(
        &self,
        req: &ScanRequest,
        threads: usize,
        cancelled: &(dyn Fn() -> bool + Sync),
        place: &dyn ScanPlace,
        emit: impl FnMut(RecordBatch) -> bool + Send,
    ) -> Result<ScanMetrics> {
        let query = Query::compile(req)?;
        let threads = threads.clamp(1, MAX_SCAN_THREADS);
        let split = threads > 1 && query.splits();
        // The parts and the calling thread hand batches on one at a time;
        // once the consumer stops, every part stops.
        let emit = Mutex::new(emit);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let send = |batch: RecordBatch| -> bool {
            let Ok(mut emit) = emit.lock() else {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                return false;
            };
            // Checked and set under the lock: once `emit` has said no, a
            // thread that was waiting for the lock does not call it again.
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return false;
            }
            let more = (*emit)(batch);
            if !more {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            more
        };
        let gone = || stop.load(std::sync::atomic::Ordering::Relaxed) || cancelled();
        let mut sink = |batch: RecordBatch| send(batch);
        let mut out = Output::new(&query, &mut sink).with_cancel(&gone);
        // Sealed files on the column paths of a scan that may be split,
        // with the row groups it reads of each: read once the partitions
        // have been walked, shared out over the threads.
        let mut files: Vec<(Arc<SealedFile>, Vec<usize>)> = Vec::new();
        let mut short = ShortWork(SHORT_SCAN_WORK);
        for pid in self.walk_order(&req.partition_ids, &query)? {
            if out.done() {
                break;
            }
            let here = short.take(PARTITION_WORK);
            let mut walk =
                || self.walk_partition(pid, split, &mut out, &mut files, &mut short, place);
            if here {
                walk()?;
            } else {
                run_long(place, walk)?;
            }
        }
        let work: u64 = files.iter().map(|(f, g)| file_work(f, g.len())).sum();
        let parts = if short.take(work) {
            // Not worth a thread.
            read_shared_out(&mut out, &files, 1, &send, &gone)?
        } else {
            run_long(place, || {
                read_shared_out(&mut out, &files, threads, &send, &gone)
            })?
        };
        let mut metrics = out.finish()?;
        Metrics::add_proto(&mut metrics, &parts);
        metrics.scan_threads = metrics.scan_threads.max(1);
        Ok(metrics)
    }

    /// One partition of [`Engine::scan_placed`]: an open one read through
    /// the row path, a sealed one with late rows or deletes through the row
    /// path over its file's rows merged with them (both on `place`), a
    /// sealed one with nothing pending through its file's column paths,
    /// here while short, or kept in `files` to be read with the others when
    /// the scan is `split`.
    fn walk_partition(
        &self,
        pid: u64,
        split: bool,
        out: &mut Output<'_>,
        files: &mut Vec<(Arc<SealedFile>, Vec<usize>)>,
        short: &mut ShortWork,
        place: &dyn ScanPlace,
    ) -> Result<()> {
        Metrics::add(&out.metrics.partitions_scanned, 1);
        // The snapshot and the sealed file are taken together, so a seal
        // that commits meanwhile cannot make rows vanish or appear twice.
        let (snapshot, file) = {
            let _shared = self.swap.read().map_err(|_| poisoned())?;
            (self.db.snapshot(), self.sealed_file(pid)?)
        };
        let open = self.open_range(&snapshot, pid, file.is_some())?;
        let Some(f) = &file else {
            return run_long(place, || {
                scan_rows(out, pid, open)?;
                Ok(out.flush_rows()?)
            });
        };
        let deletes: Vec<DeletePredicate> = self
            .snapshot_deletes(&snapshot, pid)?
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        let mut late = open.peekable();
        if late.peek().is_none() && deletes.is_empty() {
            Metrics::add(&out.metrics.sealed_partitions_fast, 1);
            if split {
                // Read later, with the other sealed files.
                let groups = f.groups_to_read(out.query)?;
                files.push((f.clone(), groups));
                return Ok(());
            }
            let work = file_work(f, f.groups_may_read(out));
            return run_step(short, work, place, || Ok(f.run(out)?));
        }
        Metrics::add(&out.metrics.sealed_partitions_merged, 1);
        Metrics::add(&out.metrics.row_groups_total, f.row_groups().len() as u64);
        run_long(place, || {
            let before = sealion_format::sealed::pages_decoded();
            let rows = merge_rows(without_deleted(f.rows(), deletes, pid), late);
            scan_rows(out, pid, rows)?;
            out.flush_rows()?;
            Metrics::add(
                &out.metrics.pages_decoded,
                sealion_format::sealed::pages_decoded() - before,
            );
            Ok(())
        })
    }

    /// The partitions a scan walks, each once, in the order asked, except
    /// that a scan of each series' newest rows walks them newest first:
    /// partitions with no sealed file (open, so the newest), then sealed
    /// ones by their newest row. Their time ranges do not overlap, so a
    /// series that newer partitions gave all the rows it keeps is passed
    /// over in the older files (`Output::series_settled`). The answer is
    /// the same in any order; the order decides only how much is read.
    fn walk_order(&self, ids: &[u64], query: &Query) -> Result<Vec<u64>> {
        let mut seen = std::collections::HashSet::new();
        let mut ids: Vec<u64> = ids.iter().copied().filter(|&p| seen.insert(p)).collect();
        if matches!(query.mode, Mode::Last { .. }) && ids.len() > 1 {
            let sealed = self.sealed.read().map_err(|_| poisoned())?;
            ids.sort_by_key(|p| {
                std::cmp::Reverse(sealed.get(p).map_or(i64::MAX, |f| f.summary().max_time_ns))
            });
        }
        Ok(ids)
    }

    /// Rows of a partition in RocksDB: all its rows while it is open, its
    /// late rows once it is sealed.
    pub fn open_rows(&self, partition_id: u64) -> Result<u64> {
        let (snapshot, sealed) = {
            let _shared = self.swap.read().map_err(|_| poisoned())?;
            (
                self.db.snapshot(),
                self.sealed_file(partition_id)?.is_some(),
            )
        };
        let mut n = 0;
        let mut open = self.open_range(&snapshot, partition_id, sealed)?;
        while let Some(item) = open.next_raw() {
            item?;
            n += 1;
        }
        Ok(n)
    }

    /// The digest of the partition's rows as a scan sees them now (sealed
    /// rows under late rows, deletes applied): what replicas compare.
    /// `columns` are the table's, which name the fields of stored rows.
    pub fn digest(&self, partition_id: u64, columns: &[Column]) -> Result<RowDigest> {
        let (snapshot, file) = {
            let _shared = self.swap.read().map_err(|_| poisoned())?;
            (self.db.snapshot(), self.sealed_file(partition_id)?)
        };
        let open = self.open_range(&snapshot, partition_id, file.is_some())?;
        Ok(match file {
            None => RowDigest::of(partition_id, columns, open)?,
            Some(f) => {
                let deletes: Vec<DeletePredicate> = self
                    .snapshot_deletes(&snapshot, partition_id)?
                    .into_iter()
                    .map(|(_, d)| d)
                    .collect();
                RowDigest::of(
                    partition_id,
                    columns,
                    merge_rows(without_deleted(f.rows(), deletes, partition_id), open),
                )?
            }
        })
    }

    /// Rows, bytes and seal state of a partition.
    pub fn stats(&self, partition_id: u64) -> Result<Stats> {
        // The snapshot and the file are taken together, as a scan takes them,
        // so a seal committing meanwhile does not make rows count twice.
        let (snapshot, file) = {
            let _shared = self.swap.read().map_err(|_| poisoned())?;
            (self.db.snapshot(), self.sealed_file(partition_id)?)
        };
        let sealed = file.is_some();
        let open_iter = || self.open_range(&snapshot, partition_id, sealed);
        let mut stats = Stats::default();
        let mut open_rows = 0u64;
        let mut open = open_iter()?;
        while let Some(item) = open.next_raw() {
            let (key, value) = item?;
            open_rows += 1;
            stats.bytes += (key.len() + value.len()) as u64;
        }
        match file {
            None => stats.rows = open_rows,
            Some(f) => {
                stats.sealed = true;
                stats.sealed_rows = f.summary().rows;
                stats.late_rows = open_rows;
                stats.bytes += f.summary().bytes;
                let deletes: Vec<DeletePredicate> = self
                    .snapshot_deletes(&snapshot, partition_id)?
                    .into_iter()
                    .map(|(_, d)| d)
                    .collect();
                if !deletes.is_empty() {
                    let mut kept = 0u64;
                    for row in without_deleted(f.rows(), deletes.clone(), partition_id) {
                        row?;
                        kept += 1;
                    }
                    stats.deleted_rows = f.summary().rows - kept;
                }
                stats.rows = if open_rows == 0 && deletes.is_empty() {
                    f.summary().rows
                } else {
                    let mut n = 0u64;
                    for row in merge_rows(
                        without_deleted(f.rows(), deletes, partition_id),
                        open_iter()?,
                    ) {
                        row?;
                        n += 1;
                    }
                    n
                };
            }
        }
        Ok(stats)
    }

    /// Seals `partition_id`: writes its rows (and, when it is sealed already,
    /// the old file's rows under any late rows) into a new column file and
    /// swaps it in. `columns` are the table's columns.
    pub fn seal(&self, partition_id: u64, columns: &[Column]) -> Result<SealOutcome> {
        self.seal_with(partition_id, columns, None)
    }

    pub fn seal_with(
        &self,
        partition_id: u64,
        columns: &[Column],
        fail_at: Option<SealFailPoint>,
    ) -> Result<SealOutcome> {
        self.seal_inner(partition_id, columns, fail_at, None, &|| {})
    }

    /// Seals `partition_id` only if its rows then have the digest
    /// `expected` (a replica sealing to the same rows as its primary). The
    /// new file's rows are checked before it replaces anything; on a
    /// mismatch it is removed and the copy stays as it was. A partition with
    /// nothing new to seal is checked as it stands.
    pub fn seal_expecting(
        &self,
        partition_id: u64,
        columns: &[Column],
        expected: RowDigest,
    ) -> Result<SealOutcome> {
        let outcome = self.seal_inner(partition_id, columns, None, Some(expected), &|| {})?;
        if matches!(outcome, SealOutcome::Empty | SealOutcome::AlreadySealed) {
            let found = self.digest(partition_id, columns)?;
            if found != expected {
                return Err(Error::DigestMismatch {
                    partition_id,
                    expected: expected.to_string(),
                    found: found.to_string(),
                });
            }
        }
        Ok(outcome)
    }

    /// `expected`: the digest the new file's rows must have before it is
    /// put in place. `before_commit` runs after the new file is in place and
    /// before the swap: tests use it to write and delete in that window.
    fn seal_inner(
        &self,
        partition_id: u64,
        columns: &[Column],
        fail_at: Option<SealFailPoint>,
        expected: Option<RowDigest>,
        before_commit: &dyn Fn(),
    ) -> Result<SealOutcome> {
        let _one = self.sealing.lock().map_err(|_| poisoned())?;
        let existing = self.sealed_file(partition_id)?;
        let resealed = existing.is_some();
        // Taken with no write in flight, so the count says exactly which
        // writes the snapshot holds.
        let (snapshot, changes_then) = {
            let _exclusive = self.swap.write().map_err(|_| poisoned())?;
            (self.db.snapshot(), self.changes_of(partition_id)?)
        };
        let prefix = partition_prefix(partition_id);
        let has_open = has_rows_in(&snapshot, partition_id);
        let logged = self.snapshot_deletes(&snapshot, partition_id)?;
        // Exactly the log entries the new file reflects; a delete that commits
        // after the snapshot (even with a smaller sequence number) is not one.
        let folded: Vec<u64> = logged.iter().map(|(seq, _)| *seq).collect();
        let deletes: Vec<DeletePredicate> = logged.into_iter().map(|(_, d)| d).collect();
        match (&existing, has_open, deletes.is_empty()) {
            (None, false, _) => return Ok(SealOutcome::Empty),
            (Some(_), false, true) => return Ok(SealOutcome::AlreadySealed),
            _ => {}
        }
        // One pass over the whole partition: read ahead in large steps and
        // keep its blocks out of the block cache (they are not read again).
        let mut read = partition_read_options(partition_id);
        read.fill_cache(false);
        read.set_readahead_size(SEAL_READAHEAD_BYTES);
        let open = RocksRows::new(snapshot.raw_iterator_opt(read), partition_id);
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut attempt = 0u32;
        let (name, path) = loop {
            let name = format!("{partition_id:016x}-{unique}-{attempt}.{FILE_SUFFIX}");
            let path = self.sealed_dir.join(&name);
            if !path.exists() && !self.sealed_dir.join(format!("{name}.tmp")).exists() {
                break (name, path);
            }
            attempt += 1;
        };
        let tmp = self.sealed_dir.join(format!("{name}.tmp"));
        let summary = match &existing {
            None => write_sealed(&tmp, partition_id, columns, open)?,
            Some(f) => write_sealed(
                &tmp,
                partition_id,
                columns,
                merge_rows(without_deleted(f.rows(), deletes, partition_id), open),
            )?,
        };
        if fail_at == Some(SealFailPoint::AfterWrite) {
            return Err(Error::Internal("fail point: after write".into()));
        }
        if let Some(expected) = expected {
            let found = SealedFile::open(&tmp)
                .map_err(Error::from)
                .and_then(|f| Ok(RowDigest::of(partition_id, columns, f.rows())?));
            let mismatch = match found {
                Ok(found) if found == expected => None,
                Ok(found) => Some(Error::DigestMismatch {
                    partition_id,
                    expected: expected.to_string(),
                    found: found.to_string(),
                }),
                Err(e) => Some(e),
            };
            if let Some(e) = mismatch {
                if let Err(rm) = std::fs::remove_file(&tmp) {
                    tracing::warn!(error = %rm, "could not remove a refused sealed file");
                }
                return Err(e);
            }
        }
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&self.sealed_dir)?.sync_all()?;
        if fail_at == Some(SealFailPoint::AfterRename) {
            return Err(Error::Internal("fail point: after rename".into()));
        }
        let file = Arc::new(SealedFile::open(&path)?);
        before_commit();
        {
            let _exclusive = self.swap.write().map_err(|_| poisoned())?;
            let cf = self
                .db
                .cf_handle(SEALED_CF)
                .ok_or_else(|| Error::Internal("no sealed column family".into()))?;
            let mut batch = WriteBatch::default();
            // Delete exactly the open rows the file holds: those unchanged
            // since the snapshot. A row rewritten since stays, as a late row.
            // Deletes logged after the snapshot apply to the new file: a row
            // they match that is in RocksDB now was written after them, so it
            // must stay as a late row (it wins over the file's copy).
            let newer: Vec<DeletePredicate> = self
                .live_deletes(partition_id)?
                .into_iter()
                .filter(|(seq, _)| !folded.contains(seq))
                .map(|(_, d)| d)
                .collect();
            // No write or delete since the snapshot (the usual case: with
            // replication the partition's lock keeps them out): every row
            // the file holds is still there, unchanged, and nothing else is.
            let unchanged = newer.is_empty() && self.changes_of(partition_id)? == changes_then;
            let every_row_goes = unchanged
                || self.delete_sealed_rows(partition_id, &snapshot, &prefix, &newer, &mut batch)?;
            if every_row_goes {
                let (from, to) = partition_range(partition_id);
                batch = WriteBatch::default();
                batch.delete_range(from, to);
                batch.delete_cf(self.late_cf()?, partition_id.to_be_bytes());
            } else {
                // Rows written during the seal stay, as late rows.
                batch.put_cf(self.late_cf()?, partition_id.to_be_bytes(), []);
            }
            batch.put_cf(&cf, partition_id.to_be_bytes(), name.as_bytes());
            // Deletes the new file already reflects leave the log; later ones
            // stay and apply to it.
            if !folded.is_empty() {
                let dcf = self.deletes_cf()?;
                for seq in &folded {
                    let mut key = partition_prefix(partition_id).to_vec();
                    key.extend_from_slice(&seq.to_be_bytes());
                    batch.delete_cf(dcf, key);
                }
            }
            let mut opts = WriteOptions::default();
            opts.set_sync(true);
            self.db.write_opt(batch, &opts)?;
            self.sealed
                .write()
                .map_err(|_| poisoned())?
                .insert(partition_id, file);
        }
        if let Some(old) = existing {
            // Readers that still hold the old file keep its open handle.
            if let Err(e) = std::fs::remove_file(old.path()) {
                tracing::warn!(error = %e, "could not remove a replaced sealed file");
            }
        }
        // Compact the partition's open key range now, whichever way its rows
        // went: RocksDB keeps deleted rows on disk until a compaction drops
        // them, so without this the sealed rows would take their open-row
        // space (about ten times the file's) until later writes happened to
        // compact that range; and a commit that left one tombstone per
        // sealed row (rows were written during the seal) would make every
        // read of the partition's late rows step over all of them.
        // Compaction keeps what live snapshots still see, so the seal's own
        // goes first.
        drop(snapshot);
        let (from, to) = partition_range(partition_id);
        self.db.compact_range(Some(from), Some(to));
        tracing::debug!(partition_id, "compacted the sealed rows' key range");
        let (rows, bytes) = (summary.rows, summary.bytes);
        Ok(if resealed {
            SealOutcome::Resealed { rows, bytes }
        } else {
            SealOutcome::Sealed { rows, bytes }
        })
    }

    /// The sealed file of `partition_id` when it is all the partition holds
    /// (no late rows, no deletes pending): then the file alone is a copy of
    /// the partition.
    pub fn clean_sealed_file(&self, partition_id: u64) -> Result<Option<Arc<SealedFile>>> {
        let (snapshot, file) = {
            let _shared = self.swap.read().map_err(|_| poisoned())?;
            (self.db.snapshot(), self.sealed_file(partition_id)?)
        };
        let Some(file) = file else { return Ok(None) };
        if has_rows_in(&snapshot, partition_id)
            || !self.snapshot_deletes(&snapshot, partition_id)?.is_empty()
        {
            return Ok(None);
        }
        Ok(Some(file))
    }

    fn incoming_path(&self, partition_id: u64) -> PathBuf {
        // Not a recorded file name: a restart removes a half-received copy.
        self.sealed_dir
            .join(format!("incoming-{partition_id:016x}.part"))
    }

    /// Appends a chunk of a sealed file copied from another replica; the
    /// chunk at offset 0 starts the file over. Chunks must come in order.
    pub fn receive_sealed_chunk(&self, partition_id: u64, offset: u64, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        let path = self.incoming_path(partition_id);
        let mut f = if offset == 0 {
            std::fs::File::create(&path)?
        } else {
            let f = std::fs::OpenOptions::new().append(true).open(&path)?;
            let have = f.metadata()?.len();
            if have != offset {
                return Err(Error::Invalid(format!(
                    "chunk of partition {partition_id}'s file at offset {offset}, but {have} bytes have arrived"
                )));
            }
            f
        };
        f.write_all(bytes)?;
        Ok(())
    }

    /// Puts the sealed file received for `partition_id` in place of
    /// everything this node held of it. The file must have `len` bytes and
    /// CRC32C `crc`, and open as a sealed file of that partition (its
    /// directory checksums are checked on open, its pages on every read)
    /// before anything is replaced; otherwise it is removed and the copy
    /// stays as it was.
    pub fn install_sealed(&self, partition_id: u64, len: u64, crc: u32) -> Result<u64> {
        use std::io::Read;
        let incoming = self.incoming_path(partition_id);
        let checked = (|| -> Result<SealedFile> {
            let mut f = std::fs::File::open(&incoming)?;
            let mut buf = vec![0u8; 1 << 20];
            let (mut got_len, mut got_crc) = (0u64, 0u32);
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                got_crc = crc32c::crc32c_append(got_crc, &buf[..n]);
                got_len += n as u64;
            }
            f.sync_all()?;
            if (got_len, got_crc) != (len, crc) {
                return Err(Error::Corrupt {
                    partition_id,
                    reason: format!(
                        "copied sealed file has {got_len} bytes with CRC32C {got_crc:08x}, the primary's has {len} bytes with {crc:08x}"
                    ),
                });
            }
            let file = SealedFile::open(&incoming)?;
            if file.partition_id() != partition_id {
                return Err(Error::Corrupt {
                    partition_id,
                    reason: format!("copied sealed file is of partition {}", file.partition_id()),
                });
            }
            Ok(file)
        })();
        let file = match checked {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&incoming);
                return Err(e);
            }
        };
        let rows = file.summary().rows;
        drop(file);
        let _one = self.sealing.lock().map_err(|_| poisoned())?;
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!("{partition_id:016x}-{unique}-copy.{FILE_SUFFIX}");
        let path = self.sealed_dir.join(&name);
        std::fs::rename(&incoming, &path)?;
        std::fs::File::open(&self.sealed_dir)?.sync_all()?;
        let file = Arc::new(SealedFile::open(&path)?);
        let (from, to) = partition_range(partition_id);
        let cf = self
            .db
            .cf_handle(SEALED_CF)
            .ok_or_else(|| Error::Internal("no sealed column family".into()))?;
        let mut batch = WriteBatch::default();
        batch.delete_range(from.clone(), to.clone());
        batch.delete_range_cf(self.deletes_cf()?, from.clone(), to.clone());
        batch.delete_range_cf(self.batches_cf()?, from, to);
        batch.delete_cf(self.late_cf()?, partition_id.to_be_bytes());
        batch.put_cf(&cf, partition_id.to_be_bytes(), name.as_bytes());
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        let old = {
            let _exclusive = self.swap.write().map_err(|_| poisoned())?;
            self.db.write_opt(batch, &opts)?;
            self.sealed
                .write()
                .map_err(|_| poisoned())?
                .insert(partition_id, file)
        };
        if let Some(old) = old
            && let Err(e) = std::fs::remove_file(old.path())
        {
            tracing::warn!(error = %e, "could not remove a replaced sealed file");
        }
        Ok(rows)
    }

    /// Ids of the partitions this node holds rows of (open or sealed), in
    /// order. Seeks from one partition's prefix to the next, so it costs one
    /// seek per partition, not one step per row; the key ranges of sealed
    /// partitions (listed already) are never entered, since right after a
    /// seal a seek into one steps over every row it sealed.
    pub fn partition_ids(&self) -> Result<Vec<u64>> {
        let sealed: std::collections::BTreeSet<u64> = self
            .sealed
            .read()
            .map_err(|_| poisoned())?
            .keys()
            .copied()
            .collect();
        let mut ids = sealed.clone();
        let mut next: Option<u64> = Some(0);
        while let Some(from) = next {
            if sealed.contains(&from) {
                next = from.checked_add(1);
                continue;
            }
            // Up to the next sealed partition's range, not into it.
            let stop = sealed.range(from..).next().copied();
            let mut ro = ReadOptions::default();
            if let Some(stop) = stop {
                ro.set_iterate_upper_bound(partition_prefix(stop).to_vec());
            }
            let prefix = partition_prefix(from);
            let mut it = self
                .db
                .iterator_opt(IteratorMode::From(&prefix, Direction::Forward), ro);
            let Some(item) = it.next() else {
                next = stop;
                continue;
            };
            let (key, _) = item?;
            let Some((pid, _, _)) = decode_key(&key) else {
                return Err(Error::Corrupt {
                    partition_id: from,
                    reason: "bad key while listing partitions".into(),
                });
            };
            ids.insert(pid);
            next = pid.checked_add(1);
        }
        Ok(ids.into_iter().collect())
    }

    /// Deletes every row of the given partitions, open and sealed (synced).
    pub fn drop_partitions(&self, partition_ids: &[u64]) -> Result<()> {
        let _one = self.sealing.lock().map_err(|_| poisoned())?;
        let cf = self
            .db
            .cf_handle(SEALED_CF)
            .ok_or_else(|| Error::Internal("no sealed column family".into()))?;
        let mut batch = WriteBatch::default();
        for &pid in partition_ids {
            let (from, to) = partition_range(pid);
            batch.delete_range(from.clone(), to.clone());
            batch.delete_cf(&cf, pid.to_be_bytes());
            if let Some(dcf) = self.db.cf_handle(DELETES_CF) {
                batch.delete_range_cf(&dcf, from.clone(), to.clone());
            }
            batch.delete_range_cf(self.batches_cf()?, from, to);
            batch.delete_cf(self.late_cf()?, pid.to_be_bytes());
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        let removed: Vec<Arc<SealedFile>> = {
            let _exclusive = self.swap.write().map_err(|_| poisoned())?;
            self.db.write_opt(batch, &opts)?;
            {
                let mut changes = self.changes.lock().map_err(|_| poisoned())?;
                for pid in partition_ids {
                    changes.remove(pid);
                }
            }
            let mut sealed = self.sealed.write().map_err(|_| poisoned())?;
            partition_ids
                .iter()
                .filter_map(|p| sealed.remove(p))
                .collect()
        };
        for f in removed {
            if let Err(e) = std::fs::remove_file(f.path()) {
                tracing::warn!(error = %e, "could not remove a dropped sealed file");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::encode_batch;
    use arrow::array::{Float64Array, StringArray, TimestampNanosecondArray};
    use sealion_common::proto::{ColumnKind, DataType};

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

    fn batch(rows: &[(&str, i64, f64)]) -> RecordBatch {
        RecordBatch::try_new(
            sealion_common::catalog::arrow_schema(&columns()),
            vec![
                Arc::new(
                    TimestampNanosecondArray::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())
                        .with_timezone("UTC"),
                ),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
            ],
        )
        .unwrap()
    }

    fn req(pids: Vec<u64>) -> ScanRequest {
        ScanRequest {
            table_id: 1,
            partition_ids: pids,
            start_ns: i64::MIN,
            end_ns: i64::MAX,
            projection: columns(),
            table_columns: columns(),
            limit: 0,
            ..Default::default()
        }
    }

    /// Every row a full scan returns, as (host, time, v), sorted.
    fn all_rows(e: &Engine, pids: Vec<u64>) -> Vec<(Option<String>, i64, Option<f64>)> {
        let mut out = answer_rows(e, &req(pids)).0;
        out.sort_by(|a, b| a.partial_cmp(b).unwrap());
        out
    }

    /// The rows `r` answers, as (host, time, v) in answer order, and the
    /// scan's counters.
    fn answer_rows(
        e: &Engine,
        r: &ScanRequest,
    ) -> (Vec<(Option<String>, i64, Option<f64>)>, ScanMetrics) {
        let mut out = Vec::new();
        let m = e
            .scan(r, |b| {
                let t = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<TimestampNanosecondArray>()
                    .unwrap();
                let h = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
                let v = b.column(2).as_any().downcast_ref::<Float64Array>().unwrap();
                for i in 0..b.num_rows() {
                    use arrow::array::Array;
                    out.push((
                        (!h.is_null(i)).then(|| h.value(i).to_string()),
                        t.value(i),
                        (!v.is_null(i)).then(|| v.value(i)),
                    ));
                }
                true
            })
            .unwrap();
        (out, m)
    }

    type Model = std::collections::BTreeMap<(String, i64), f64>;

    fn model_rows(m: &Model) -> Vec<(Option<String>, i64, Option<f64>)> {
        let mut v: Vec<_> = m
            .iter()
            .map(|((h, t), x)| (Some(h.clone()), *t, Some(*x)))
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v
    }

    /// Scans take what is free of the node's extra threads, never more
    /// than they ask, and give it back when their permit goes, also when
    /// many threads take and give at once.
    #[test]
    fn scan_thread_budget_is_shared_and_given_back() {
        let budget = ScanThreadBudget::new(3);
        let a = budget.take(2);
        assert_eq!((a.threads(), budget.free()), (3, 1));
        let b = budget.take(2);
        assert_eq!((b.threads(), budget.free()), (2, 0));
        let c = budget.take(5);
        assert_eq!((c.threads(), budget.free()), (1, 0));
        drop(a);
        assert_eq!(budget.free(), 2);
        let d = budget.take(0);
        assert_eq!((d.threads(), budget.free()), (1, 2));
        drop((b, c, d));
        assert_eq!(budget.free(), 3);
        let most = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for i in 0..2_000 {
                        let p = budget.take(1 + i % 3);
                        let held = 3 - budget.free();
                        most.fetch_max(held, std::sync::atomic::Ordering::Relaxed);
                        assert!(p.threads() >= 1 && p.threads() <= 1 + 1 + i % 3);
                    }
                });
            }
        });
        assert_eq!(budget.free(), 3);
        assert!(most.into_inner() <= 3);
    }

    #[test]
    fn sealing_keeps_every_row_and_late_rows_win_until_a_reseal_folds_them_in() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path()).unwrap();
        let cols = columns();
        e.write(
            &cols,
            &[(
                1,
                vec![batch(&[("a", 1, 1.0), ("b", 2, 2.0), ("a", 3, 3.0)])],
            )],
        )
        .unwrap();
        let before = all_rows(&e, vec![1]);
        assert!(matches!(
            e.seal(1, &cols).unwrap(),
            SealOutcome::Sealed { rows: 3, .. }
        ));
        assert_eq!(all_rows(&e, vec![1]), before);
        assert_eq!(
            e.open_rows(1).unwrap(),
            0,
            "the open rows went into the file"
        );
        assert_eq!(e.seal(1, &cols).unwrap(), SealOutcome::AlreadySealed);
        // A late row replaces a sealed one, another is new.
        e.write(&cols, &[(1, vec![batch(&[("a", 1, 10.0), ("c", 0, 5.0)])])])
            .unwrap();
        let merged = all_rows(&e, vec![1]);
        assert_eq!(
            merged,
            vec![
                (Some("a".into()), 1, Some(10.0)),
                (Some("a".into()), 3, Some(3.0)),
                (Some("b".into()), 2, Some(2.0)),
                (Some("c".into()), 0, Some(5.0)),
            ]
        );
        let st = e.stats(1).unwrap();
        assert_eq!(
            (st.rows, st.sealed, st.sealed_rows, st.late_rows),
            (4, true, 3, 2)
        );
        assert!(matches!(
            e.seal(1, &cols).unwrap(),
            SealOutcome::Resealed { rows: 4, .. }
        ));
        assert_eq!(all_rows(&e, vec![1]), merged);
        assert_eq!(e.open_rows(1).unwrap(), 0);
        // It all survives a restart.
        drop(e);
        let e = Engine::open(dir.path()).unwrap();
        assert_eq!(all_rows(&e, vec![1]), merged);
        assert_eq!(
            std::fs::read_dir(dir.path().join(SEALED_DIR))
                .unwrap()
                .count(),
            1,
            "the replaced file is gone"
        );
        e.drop_partitions(&[1]).unwrap();
        assert!(all_rows(&e, vec![1]).is_empty());
        assert_eq!(
            std::fs::read_dir(dir.path().join(SEALED_DIR))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn a_checked_seal_keeps_its_file_only_when_the_rows_match_the_expected_digest() {
        let cols = columns();
        let rows = [("a", 1, 1.0), ("b", 2, 2.0), ("a", 3, 3.0)];
        // Two copies of a partition with the same rows, held differently:
        // one sealed with a late row and a delete beside the file, the other
        // written in one go.
        let d1 = tempfile::tempdir().unwrap();
        let one = Engine::open(d1.path()).unwrap();
        one.write(&cols, &[(1, vec![batch(&rows[..2])])]).unwrap();
        one.write(&cols, &[(1, vec![batch(&[("c", 9, 9.0)])])])
            .unwrap();
        one.seal(1, &cols).unwrap();
        one.write(&cols, &[(1, vec![batch(&rows[2..])])]).unwrap();
        one.delete(1, &predicate_host("c")).unwrap();
        let d2 = tempfile::tempdir().unwrap();
        let two = Engine::open(d2.path()).unwrap();
        two.write(&cols, &[(1, vec![batch(&rows)])]).unwrap();
        let expected = one.digest(1, &columns()).unwrap();
        assert_eq!(expected.rows, 3);
        assert_eq!(
            two.digest(1, &columns()).unwrap(),
            expected,
            "same rows, same digest"
        );

        // A copy that lacks a row refuses the seal and stays as it was.
        let d3 = tempfile::tempdir().unwrap();
        let short = Engine::open(d3.path()).unwrap();
        short.write(&cols, &[(1, vec![batch(&rows[..2])])]).unwrap();
        let before = all_rows(&short, vec![1]);
        let err = short.seal_expecting(1, &cols, expected).unwrap_err();
        assert!(
            matches!(
                err,
                Error::DigestMismatch {
                    partition_id: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert!(short.sealed_file(1).unwrap().is_none(), "no file was kept");
        assert_eq!(short.open_rows(1).unwrap(), 2);
        assert_eq!(all_rows(&short, vec![1]), before);
        assert_eq!(
            std::fs::read_dir(d3.path().join(SEALED_DIR))
                .unwrap()
                .count(),
            0,
            "the refused file is removed"
        );

        // The matching copy seals; checked again as it stands, it matches,
        // and a wrong value is seen even with nothing left to seal.
        assert!(matches!(
            two.seal_expecting(1, &cols, expected).unwrap(),
            SealOutcome::Sealed { rows: 3, .. }
        ));
        assert_eq!(
            two.seal_expecting(1, &cols, expected).unwrap(),
            SealOutcome::AlreadySealed
        );
        two.write(&cols, &[(1, vec![batch(&[("a", 3, 3.5)])])])
            .unwrap();
        two.seal(1, &cols).unwrap();
        assert!(matches!(
            two.seal_expecting(1, &cols, expected),
            Err(Error::DigestMismatch { .. })
        ));
    }

    #[test]
    fn batch_ids_are_recorded_with_the_rows_survive_a_restart_and_are_pruned_by_age() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path()).unwrap();
        let cols = columns();
        e.write_batch(
            &cols,
            &[(1, vec![batch(&[("a", 1, 1.0)])]), (2, vec![])],
            b"b-1",
            1_000,
        )
        .unwrap();
        e.write_batch(&cols, &[(1, vec![batch(&[("a", 2, 2.0)])])], b"b-2", 5_000)
            .unwrap();
        e.write(&cols, &[(3, vec![batch(&[("a", 3, 3.0)])])])
            .unwrap();
        assert_eq!(e.applied_batch(b"b-1", &[1, 2, 3]).unwrap(), vec![1, 2]);
        assert_eq!(e.applied_batch(b"b-2", &[1, 2, 3]).unwrap(), vec![1]);
        assert!(e.applied_batch(b"b-3", &[1, 2, 3]).unwrap().is_empty());
        assert!(
            e.applied_batch(b"", &[3]).unwrap().is_empty(),
            "no id, no mark"
        );
        let long = vec![b'x'; MAX_BATCH_ID_BYTES + 1];
        assert!(matches!(
            e.write_batch(&cols, &[(1, vec![batch(&[("z", 9, 9.0)])])], &long, 1),
            Err(Error::Invalid(_))
        ));
        assert_eq!(
            all_rows(&e, vec![1]).len(),
            2,
            "a refused write stores nothing"
        );
        drop(e);
        let e = Engine::open(dir.path()).unwrap();
        assert_eq!(
            e.batch_marks(1).unwrap(),
            vec![(b"b-1".to_vec(), 1_000), (b"b-2".to_vec(), 5_000)]
        );
        // A replica takes another node's marks; pruning goes by age.
        e.record_batch_marks(3, &[(b"b-9".to_vec(), 9_000)])
            .unwrap();
        assert_eq!(e.prune_batch_marks(5_000).unwrap(), 2);
        assert!(e.applied_batch(b"b-1", &[1, 2]).unwrap().is_empty());
        assert_eq!(e.applied_batch(b"b-2", &[1]).unwrap(), vec![1]);
        assert_eq!(e.applied_batch(b"b-9", &[3]).unwrap(), vec![3]);
        // Dropping a partition drops its marks.
        e.drop_partitions(&[1]).unwrap();
        assert!(e.batch_marks(1).unwrap().is_empty());
        assert_eq!(e.batch_marks(3).unwrap().len(), 1);
    }

    #[test]
    fn a_copied_sealed_file_replaces_the_copy_only_when_its_bytes_check_out() {
        let cols = columns();
        let d1 = tempfile::tempdir().unwrap();
        let primary = Engine::open(d1.path()).unwrap();
        primary
            .write(
                &cols,
                &[(
                    1,
                    vec![batch(&[("a", 1, 1.0), ("b", 2, 2.0), ("c", 3, 3.0)])],
                )],
            )
            .unwrap();
        primary.seal(1, &cols).unwrap();
        let file = primary
            .clean_sealed_file(1)
            .unwrap()
            .expect("only the file");
        let bytes = std::fs::read(file.path()).unwrap();
        let crc = crc32c::crc32c(&bytes);
        // Late rows or deletes beside the file: the file alone is no copy.
        primary
            .write(&cols, &[(1, vec![batch(&[("d", 4, 4.0)])])])
            .unwrap();
        assert!(primary.clean_sealed_file(1).unwrap().is_none());

        let d2 = tempfile::tempdir().unwrap();
        let replica = Engine::open(d2.path()).unwrap();
        replica
            .write(&cols, &[(1, vec![batch(&[("z", 9, 9.0)])])])
            .unwrap();
        replica
            .write(&cols, &[(2, vec![batch(&[("y", 8, 8.0)])])])
            .unwrap();
        replica
            .write_batch(&cols, &[(1, vec![])], b"old", 1)
            .unwrap();
        let before = all_rows(&replica, vec![1]);
        let send = |bytes: &[u8]| {
            for (i, chunk) in bytes.chunks(100).enumerate() {
                replica
                    .receive_sealed_chunk(1, (i * 100) as u64, chunk)
                    .unwrap();
            }
        };
        // A chunk out of order is refused.
        replica.receive_sealed_chunk(1, 0, &bytes[..100]).unwrap();
        assert!(matches!(
            replica.receive_sealed_chunk(1, 300, &bytes[100..200]),
            Err(Error::Invalid(_))
        ));
        // A damaged byte, a wrong length: refused, the copy stays.
        let mut damaged = bytes.clone();
        damaged[bytes.len() / 2] ^= 0x40;
        send(&damaged);
        let err = replica
            .install_sealed(1, bytes.len() as u64, crc)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Corrupt {
                    partition_id: 1,
                    ..
                }
            ),
            "{err}"
        );
        send(&bytes);
        assert!(
            replica
                .install_sealed(1, bytes.len() as u64 + 1, crc)
                .is_err()
        );
        assert_eq!(all_rows(&replica, vec![1]), before);
        assert!(replica.sealed_file(1).unwrap().is_none());
        // The file as sent: it replaces the open rows and batch marks of
        // partition 1, and nothing of partition 2.
        send(&bytes);
        assert_eq!(
            replica.install_sealed(1, bytes.len() as u64, crc).unwrap(),
            3
        );
        let copied = all_rows(&replica, vec![1]);
        assert_eq!(copied.len(), 3);
        assert_eq!(replica.digest(1, &columns()).unwrap(), {
            let d3 = tempfile::tempdir().unwrap();
            let model = Engine::open(d3.path()).unwrap();
            model
                .write(
                    &cols,
                    &[(
                        1,
                        vec![batch(&[("a", 1, 1.0), ("b", 2, 2.0), ("c", 3, 3.0)])],
                    )],
                )
                .unwrap();
            model.digest(1, &columns()).unwrap()
        });
        assert!(replica.batch_marks(1).unwrap().is_empty());
        assert_eq!(all_rows(&replica, vec![2]).len(), 1);
        drop(replica);
        let replica = Engine::open(d2.path()).unwrap();
        assert_eq!(all_rows(&replica, vec![1]), copied);
        assert_eq!(
            std::fs::read_dir(d2.path().join(SEALED_DIR))
                .unwrap()
                .count(),
            1,
            "no incoming file is left behind"
        );
    }

    fn predicate_host(host: &str) -> DeletePredicate {
        DeletePredicate {
            start_ns: i64::MIN,
            end_ns: i64::MAX,
            tags: vec![sealion_common::proto::TagMatch {
                name: "host".into(),
                values: vec![host.into()],
            }],
        }
    }

    #[test]
    fn a_crash_at_any_point_of_a_seal_loses_and_duplicates_nothing() {
        for fail in [SealFailPoint::AfterWrite, SealFailPoint::AfterRename] {
            for already_sealed in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let e = Engine::open(dir.path()).unwrap();
                let cols = columns();
                e.write(&cols, &[(4, vec![batch(&[("a", 1, 1.0), ("b", 2, 2.0)])])])
                    .unwrap();
                if already_sealed {
                    e.seal(4, &cols).unwrap();
                    e.write(&cols, &[(4, vec![batch(&[("a", 1, 7.0), ("d", 9, 9.0)])])])
                        .unwrap();
                }
                let want = all_rows(&e, vec![4]);
                assert!(e.seal_with(4, &cols, Some(fail)).is_err());
                assert_eq!(
                    all_rows(&e, vec![4]),
                    want,
                    "{fail:?}: reads before the restart"
                );
                drop(e);
                let e = Engine::open(dir.path()).unwrap();
                assert_eq!(
                    all_rows(&e, vec![4]),
                    want,
                    "{fail:?}: reads after the restart"
                );
                let files = std::fs::read_dir(dir.path().join(SEALED_DIR))
                    .unwrap()
                    .count();
                assert_eq!(
                    files,
                    usize::from(already_sealed),
                    "{fail:?}: unrecorded files are removed"
                );
                assert!(matches!(
                    e.seal(4, &cols).unwrap(),
                    SealOutcome::Sealed { .. } | SealOutcome::Resealed { .. }
                ));
                assert_eq!(all_rows(&e, vec![4]), want, "{fail:?}: after sealing again");
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(Vec<(u8, i64, f64)>),
        Seal,
        Reopen,
        /// Hosts to match (empty: any host), and a time range.
        Delete(Vec<u8>, i64, i64),
    }

    fn predicate(hosts: &[u8], start: i64, end: i64) -> DeletePredicate {
        DeletePredicate {
            start_ns: start,
            end_ns: end,
            tags: if hosts.is_empty() {
                vec![]
            } else {
                vec![sealion_common::proto::TagMatch {
                    name: "host".into(),
                    values: hosts.iter().map(|h| format!("h{h}")).collect(),
                }]
            },
        }
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => proptest::collection::vec((0u8..4, -5i64..20, -100.0f64..100.0), 1..30).prop_map(Op::Write),
            2 => Just(Op::Seal),
            1 => Just(Op::Reopen),
            2 => (proptest::collection::vec(0u8..4, 0..3), -5i64..20, 0i64..10).prop_map(|(h, s, w)| Op::Delete(h, s, s + w)),
        ]
    }

    /// Requests of every kind the node answers (aggregates, last points,
    /// newest rows, filtered rows), for the differential check below.
    fn answer_requests() -> Vec<ScanRequest> {
        use sealion_common::proto::{
            AggregateCall, AggregateFunction, AggregateSpec, CompareOp, FieldCompare,
            FieldPredicate, Literal, ScanOrder, TagOp, TagPredicate, field_predicate, literal,
        };
        let call = |f: AggregateFunction, c: &str| AggregateCall {
            function: f as i32,
            column: c.into(),
        };
        let aggregate = ScanRequest {
            aggregate: Some(AggregateSpec {
                bucket_width_ns: 4,
                bucket_origin_ns: 1,
                group_tags: vec!["host".into()],
                calls: vec![
                    call(AggregateFunction::AggCount, ""),
                    call(AggregateFunction::AggMin, "v"),
                    call(AggregateFunction::AggMax, "v"),
                    call(AggregateFunction::AggLast, "v"),
                    call(AggregateFunction::AggFirst, "v"),
                ],
                states_as_answers: true,
            }),
            ..req(vec![2])
        };
        let last = ScanRequest {
            last_per_series: true,
            start_ns: -2,
            end_ns: 15,
            ..req(vec![2])
        };
        let newest = ScanRequest {
            order: ScanOrder::OrderTimeDesc as i32,
            limit: 3,
            ..req(vec![2])
        };
        let filtered = ScanRequest {
            tag_predicates: vec![TagPredicate {
                column: "host".into(),
                op: TagOp::TagIn as i32,
                values: vec!["h1".into(), "h2".into()],
            }],
            field_predicate: Some(FieldPredicate {
                expr: Some(field_predicate::Expr::Compare(FieldCompare {
                    column: "v".into(),
                    op: CompareOp::CmpGt as i32,
                    value: Some(Literal {
                        value: Some(literal::Value::F64(0.0)),
                    }),
                })),
            }),
            ..req(vec![2])
        };
        let mut all = vec![aggregate, last, newest, filtered];
        let limited = ScanRequest {
            limit: 7,
            ..req(vec![2])
        };
        all.push(limited);
        // The same requests over both partitions: one answer across them.
        let both: Vec<ScanRequest> = all
            .iter()
            .map(|r| ScanRequest {
                partition_ids: vec![2, 3],
                ..r.clone()
            })
            .collect();
        all.extend(both);
        all
    }

    /// A scan's answer as text rows (binary states as bytes), in answer order
    /// except for aggregates, whose groups are sorted.
    fn answer_text(batches: &[RecordBatch], aggregate: bool) -> Vec<String> {
        use arrow::util::display::{ArrayFormatter, FormatOptions};
        let mut rows = Vec::new();
        for b in batches {
            let fmts: Vec<ArrayFormatter> = b
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &FormatOptions::default()).unwrap())
                .collect();
            for i in 0..b.num_rows() {
                rows.push(
                    fmts.iter()
                        .map(|f| f.value(i).to_string())
                        .collect::<Vec<_>>()
                        .join("|"),
                );
            }
        }
        if aggregate {
            rows.sort();
        }
        rows
    }

    fn engine_answer(e: &Engine, r: &ScanRequest) -> Vec<String> {
        let mut batches = Vec::new();
        e.scan(r, |b| {
            batches.push(b);
            true
        })
        .unwrap();
        answer_text(&batches, r.aggregate.is_some())
    }

    /// The row path over the model's rows: what the node must answer.
    fn model_answer(model: &Model, r: &ScanRequest) -> Vec<String> {
        let rows: Vec<(&str, i64, f64)> = model
            .iter()
            .map(|((h, t), v)| (h.as_str(), *t, *v))
            .collect();
        let mut sorted = Vec::new();
        if !rows.is_empty() {
            let mut kv = encode_batch(2, &columns(), &batch(&rows)).unwrap();
            kv.sort();
            for (k, v) in kv {
                let (_, series, time_ns) = decode_key(&k).unwrap();
                sorted.push(SortedRow {
                    series: series.to_vec(),
                    time_ns,
                    value: v,
                });
            }
        }
        let q = Query::compile(r).unwrap();
        let mut batches = Vec::new();
        let mut emit = |b: RecordBatch| {
            batches.push(b);
            true
        };
        let mut out = Output::new(&q, &mut emit);
        // Partitions 2 and 3 hold the same rows: each is scanned in turn.
        for &pid in &r.partition_ids {
            scan_rows(&mut out, pid, sorted.iter().cloned().map(Ok)).unwrap();
        }
        out.finish().unwrap();
        answer_text(&batches, r.aggregate.is_some())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn every_scan_equals_a_plain_model_through_writes_seals_and_restarts(ops in proptest::collection::vec(op(), 1..12)) {
            let dir = tempfile::tempdir().unwrap();
            let mut e = Engine::open(dir.path()).unwrap();
            let cols = columns();
            let mut model = Model::new();
            for op in ops {
                match op {
                    Op::Write(rows) => {
                        let names: Vec<String> = rows.iter().map(|r| format!("h{}", r.0)).collect();
                        let b: Vec<(&str, i64, f64)> = rows.iter().zip(&names).map(|(r, n)| (n.as_str(), r.1, r.2)).collect();
                        // Partition 3 takes the same rows but is never sealed,
                        // so a scan of both mixes the column and row paths.
                        e.write(&cols, &[(2, vec![batch(&b)]), (3, vec![batch(&b)])]).unwrap();
                        for (n, t, v) in b {
                            model.insert((n.to_string(), t), v);
                        }
                    }
                    Op::Seal => { e.seal(2, &cols).unwrap(); }
                    Op::Delete(hosts, start, end) => {
                        let before = model.len();
                        model.retain(|(h, t), _| {
                            let host_hit = hosts.is_empty() || hosts.iter().any(|x| format!("h{x}") == *h);
                            !(host_hit && *t >= start && *t < end)
                        });
                        let n = e.delete(2, &predicate(&hosts, start, end)).unwrap();
                        proptest::prop_assert_eq!(n as usize, before - model.len());
                        e.delete(3, &predicate(&hosts, start, end)).unwrap();
                    }
                    Op::Reopen => {
                        drop(e);
                        e = Engine::open(dir.path()).unwrap();
                    }
                }
                proptest::prop_assert_eq!(all_rows(&e, vec![2]), model_rows(&model));
                proptest::prop_assert_eq!(e.stats(2).unwrap().rows as usize, model.len());
                for r in answer_requests() {
                    proptest::prop_assert_eq!(engine_answer(&e, &r), model_answer(&model, &r), "request {:?}", r);
                }
            }
        }
    }

    #[test]
    fn deletes_hide_sealed_rows_spare_later_writes_and_are_folded_by_a_reseal() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path()).unwrap();
        let cols = columns();
        e.write(
            &cols,
            &[(
                1,
                vec![batch(&[
                    ("a", 1, 1.0),
                    ("a", 2, 2.0),
                    ("b", 1, 3.0),
                    ("b", 5, 4.0),
                ])],
            )],
        )
        .unwrap();
        e.seal(1, &cols).unwrap();
        // Delete host a at times [0, 2): one sealed row.
        assert_eq!(
            e.delete(1, &predicate(&[], 0, 0)).unwrap(),
            0,
            "an empty range deletes nothing"
        );
        let pred = DeletePredicate {
            start_ns: 0,
            end_ns: 2,
            tags: vec![sealion_common::proto::TagMatch {
                name: "host".into(),
                values: vec!["a".into()],
            }],
        };
        assert_eq!(e.delete(1, &pred).unwrap(), 1);
        assert_eq!(
            all_rows(&e, vec![1])
                .iter()
                .map(|r| (r.0.clone().unwrap(), r.1))
                .collect::<Vec<_>>(),
            vec![("a".into(), 2), ("b".into(), 1), ("b".into(), 5)]
        );
        // A row written after the delete that matches it stays.
        e.write(&cols, &[(1, vec![batch(&[("a", 1, 9.0)])])])
            .unwrap();
        assert_eq!(all_rows(&e, vec![1]).len(), 4);
        let st = e.stats(1).unwrap();
        assert_eq!((st.rows, st.deleted_rows, st.late_rows), (4, 1, 1));
        let want = all_rows(&e, vec![1]);
        assert!(matches!(
            e.seal(1, &cols).unwrap(),
            SealOutcome::Resealed { rows: 4, .. }
        ));
        assert_eq!(all_rows(&e, vec![1]), want);
        let st = e.stats(1).unwrap();
        assert_eq!(
            (st.rows, st.deleted_rows, st.late_rows),
            (4, 0, 0),
            "the reseal folded the delete in"
        );
        drop(e);
        let e = Engine::open(dir.path()).unwrap();
        assert_eq!(all_rows(&e, vec![1]), want);
    }

    #[test]
    fn writes_and_deletes_during_a_seal_are_neither_lost_nor_undone() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path()).unwrap();
        let cols = columns();
        e.write(
            &cols,
            &[(
                1,
                vec![batch(&[("a", 1, 1.0), ("b", 2, 2.0), ("c", 3, 3.0)])],
            )],
        )
        .unwrap();
        let only_a = DeletePredicate {
            start_ns: i64::MIN,
            end_ns: i64::MAX,
            tags: vec![sealion_common::proto::TagMatch {
                name: "host".into(),
                values: vec!["a".into()],
            }],
        };
        let only_b = DeletePredicate {
            tags: vec![sealion_common::proto::TagMatch {
                name: "host".into(),
                values: vec!["b".into()],
            }],
            ..only_a.clone()
        };
        // Between the snapshot and the swap: delete a, then write a again
        // with the very same bytes; delete b for good; overwrite c.
        e.seal_inner(1, &cols, None, None, &|| {
            assert_eq!(e.delete(1, &only_a).unwrap(), 1);
            e.write(&cols, &[(1, vec![batch(&[("a", 1, 1.0)])])])
                .unwrap();
            assert_eq!(e.delete(1, &only_b).unwrap(), 1);
            e.write(&cols, &[(1, vec![batch(&[("c", 3, 30.0)])])])
                .unwrap();
        })
        .unwrap();
        let want = vec![
            (Some("a".to_string()), 1, Some(1.0)),
            (Some("c".to_string()), 3, Some(30.0)),
        ];
        assert_eq!(all_rows(&e, vec![1]), want);
        e.seal(1, &cols).unwrap();
        assert_eq!(all_rows(&e, vec![1]), want, "after the reseal");
        drop(e);
        let e = Engine::open(dir.path()).unwrap();
        assert_eq!(all_rows(&e, vec![1]), want, "after a restart");
    }

    /// Steps RocksDB's iterators took through memtables on this thread
    /// while `f` ran (rows covered by a range tombstone are stepped over
    /// one by one until a flush and compaction drop them).
    fn memtable_steps(f: impl FnOnce()) -> u64 {
        use rocksdb::perf::{PerfContext, PerfMetric, PerfStatsLevel, set_perf_stats};
        set_perf_stats(PerfStatsLevel::EnableCount);
        let mut ctx = PerfContext::default();
        ctx.reset();
        f();
        let n = ctx.metric(PerfMetric::NextOnMemtableCount);
        set_perf_stats(PerfStatsLevel::Disable);
        n
    }

    /// `n` rows of seven hosts, times 0..n, value = time.
    fn seven_hosts(n: i64) -> Vec<(String, i64, f64)> {
        (0..n)
            .map(|i| (format!("h{}", i % 7), i, i as f64))
            .collect()
    }

    fn borrowed(rows: &[(String, i64, f64)]) -> Vec<(&str, i64, f64)> {
        rows.iter().map(|(h, t, v)| (h.as_str(), *t, *v)).collect()
    }

    /// Bytes of RocksDB's table files.
    fn sst_bytes(e: &Engine) -> u64 {
        e.db.property_int_value("rocksdb.total-sst-files-size")
            .unwrap()
            .unwrap()
    }

    /// The answer of `r` on `threads` threads: rows sorted, or an aggregate
    /// of count, min and max per group with the parts' rows of one group
    /// merged (as a query node merges them); and the scan's counters.
    fn threaded_answer(e: &Engine, r: &ScanRequest, threads: usize) -> (Vec<String>, ScanMetrics) {
        let mut batches = Vec::new();
        let m = e
            .scan_until(r, threads, &|| false, |b| {
                batches.push(b);
                true
            })
            .unwrap();
        let rows = answer_text(&batches, true);
        if r.aggregate.is_none() {
            return (rows, m);
        }
        // bucket|host|count|min|max
        let mut groups: std::collections::BTreeMap<String, (i64, f64, f64)> = Default::default();
        for row in rows {
            let f: Vec<&str> = row.split('|').collect();
            let (n, lo, hi): (i64, f64, f64) = (
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].parse().unwrap(),
            );
            let g = groups.entry(format!("{}|{}", f[0], f[1])).or_insert((
                0,
                f64::INFINITY,
                f64::NEG_INFINITY,
            ));
            *g = (g.0 + n, g.1.min(lo), g.2.max(hi));
        }
        let merged = groups
            .into_iter()
            .map(|(k, (n, lo, hi))| format!("{k}|{n}|{lo}|{hi}"))
            .collect();
        (merged, m)
    }

    #[test]
    fn a_split_scan_shares_out_runs_of_at_least_two_groups_and_every_file_once() {
        // Too few groups for two threads: the calling thread reads them.
        assert_eq!(share_out(&[3], 2).0, 1);
        assert_eq!(share_out(&[1, 1, 1], 4).0, 1);
        assert_eq!(share_out(&[], 4).0, 0);
        // 8 groups on 2 threads: four pieces of two.
        assert_eq!(
            share_out(&[8], 2),
            (2, vec![(0, 0, 4), (0, 1, 4), (0, 2, 4), (0, 3, 4)])
        );
        // 9 groups on 4 threads: four, each of two groups or more.
        assert_eq!(share_out(&[9], 4).1.len(), 4);
        for (lens, threads, want_threads) in [
            (vec![5, 0, 40], 8, 8),
            (vec![5, 0, 4], 8, 4),
            (vec![1, 1, 1, 1, 2], 3, 3),
            (vec![100; 30], 2, 2),
        ] {
            let (t, pieces) = share_out(&lens, threads);
            assert_eq!(t, want_threads, "{lens:?} on {threads}");
            for (f, &len) in lens.iter().enumerate() {
                // Every file in one set of shares, each share once, none
                // under two groups unless the file has fewer.
                let mine: Vec<_> = pieces.iter().filter(|p| p.0 == f).collect();
                let shares = mine[0].2;
                assert_eq!(mine.len(), shares, "{lens:?}: file {f}");
                for (i, p) in mine.iter().enumerate() {
                    assert_eq!((p.1, p.2), (i, shares));
                    let size = len * (i + 1) / shares - len * i / shares;
                    assert!(size >= MIN_GROUPS_PER_SCAN_THREAD.min(len), "{lens:?}");
                }
            }
            // About four pieces a thread, when the files allow it.
            assert!(pieces.len() <= t * PIECES_PER_SCAN_THREAD + lens.len());
        }
    }

    #[test]
    fn a_scan_split_over_threads_answers_as_one_thread_does() {
        use sealion_common::proto::{
            AggregateCall, AggregateFunction, AggregateSpec, CompareOp, FieldCompare,
            FieldPredicate, Literal, field_predicate, literal,
        };
        let dir = tempfile::tempdir().unwrap();
        let cols = columns();
        // Partition 1 sealed with 63,000 rows (eight row groups), 2 open,
        // 3 sealed with a late row (read row by row).
        let owned = seven_hosts(63_000);
        let rows = borrowed(&owned);
        let e = Engine::open(dir.path()).unwrap();
        e.write(&cols, &[(1, vec![batch(&rows)])]).unwrap();
        e.write(&cols, &[(2, vec![batch(&rows[..500])])]).unwrap();
        e.write(&cols, &[(3, vec![batch(&rows[..900])])]).unwrap();
        e.seal(1, &cols).unwrap();
        e.seal(3, &cols).unwrap();
        e.write(&cols, &[(3, vec![batch(&[("h9", 5, 1.5)])])])
            .unwrap();
        assert_eq!(e.sealed_file(1).unwrap().unwrap().row_groups().len(), 8);
        let pids = vec![1, 2, 3];
        let filtered = ScanRequest {
            field_predicate: Some(FieldPredicate {
                expr: Some(field_predicate::Expr::Compare(FieldCompare {
                    column: "v".into(),
                    op: CompareOp::CmpGt as i32,
                    value: Some(Literal {
                        value: Some(literal::Value::F64(20_000.0)),
                    }),
                })),
            }),
            ..req(pids.clone())
        };
        let call = |f: AggregateFunction| AggregateCall {
            function: f as i32,
            column: if f == AggregateFunction::AggCount {
                ""
            } else {
                "v"
            }
            .into(),
        };
        let aggregate = ScanRequest {
            aggregate: Some(AggregateSpec {
                bucket_width_ns: 10_000,
                bucket_origin_ns: 0,
                group_tags: vec!["host".into()],
                calls: vec![
                    call(AggregateFunction::AggCount),
                    call(AggregateFunction::AggMin),
                    call(AggregateFunction::AggMax),
                ],
                states_as_answers: true,
            }),
            ..req(pids.clone())
        };
        for r in [req(pids.clone()), filtered, aggregate] {
            let (one, one_m) = threaded_answer(&e, &r, 1);
            assert!(!one.is_empty());
            for threads in [2, 3, 4] {
                let (many, many_m) = threaded_answer(&e, &r, threads);
                assert_eq!(many, one, "{threads} threads");
                let mut got = many_m.clone();
                let mut want = one_m.clone();
                // Eight row groups: enough for four threads.
                assert_eq!(want.scan_threads, 1);
                assert_eq!(got.scan_threads, threads as u64);
                if r.aggregate.is_some() {
                    // A group whose rows two threads read comes back from
                    // each, and from no more than that.
                    assert!(got.rows_returned >= want.rows_returned);
                    assert!(got.rows_returned <= want.rows_returned * got.scan_threads);
                    got.rows_returned = 0;
                    want.rows_returned = 0;
                }
                got.scan_threads = 0;
                want.scan_threads = 0;
                assert_eq!(got, want, "{threads} threads");
            }
        }
        // A consumer that stops after one batch gets no other.
        let mut calls = 0;
        e.scan_until(&req(vec![1]), 4, &|| false, |_| {
            calls += 1;
            false
        })
        .unwrap();
        assert_eq!(calls, 1);
    }

    /// A place that counts the steps handed to it.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl ScanPlace for Counting {
        fn run_long(&self, step: &mut dyn FnMut()) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            step()
        }
    }

    #[test]
    fn a_scan_hands_its_place_only_the_steps_that_may_take_long() {
        use sealion_common::proto::{
            AggregateCall, AggregateFunction, AggregateSpec, TagOp, TagPredicate,
        };
        let dir = tempfile::tempdir().unwrap();
        let cols = columns();
        // Partition 1 sealed: 63,000 rows of seven hosts in eight row
        // groups, each host's rows in two or three. Partition 2 open.
        // Partitions 10..80 sealed, a few rows each.
        let owned = seven_hosts(63_000);
        let rows = borrowed(&owned);
        let e = Engine::open(dir.path()).unwrap();
        e.write(&cols, &[(1, vec![batch(&rows)])]).unwrap();
        e.write(&cols, &[(2, vec![batch(&rows[..500])])]).unwrap();
        e.seal(1, &cols).unwrap();
        let many: Vec<u64> = (10..80).collect();
        for &p in &many {
            e.write(&cols, &[(p, vec![batch(&rows[..10])])]).unwrap();
            e.seal(p, &cols).unwrap();
        }
        assert_eq!(e.sealed_file(1).unwrap().unwrap().row_groups().len(), 8);
        let one_host = || {
            vec![TagPredicate {
                column: "host".into(),
                op: TagOp::TagEq as i32,
                values: vec!["h3".into()],
            }]
        };
        let aggregate = |calls: Vec<AggregateFunction>, pids: Vec<u64>| ScanRequest {
            aggregate: Some(AggregateSpec {
                bucket_width_ns: 0,
                bucket_origin_ns: 0,
                group_tags: vec!["host".into()],
                calls: calls
                    .into_iter()
                    .map(|f| AggregateCall {
                        function: f as i32,
                        column: if f == AggregateFunction::AggCount {
                            ""
                        } else {
                            "v"
                        }
                        .into(),
                    })
                    .collect(),
                states_as_answers: true,
            }),
            ..req(pids)
        };
        let max = || vec![AggregateFunction::AggMax];
        let count = || vec![AggregateFunction::AggCount];
        let cases = [
            // One host's last row: the directory's.
            (
                ScanRequest {
                    last_per_series: true,
                    tag_predicates: one_host(),
                    ..req(vec![1])
                },
                false,
            ),
            // One host's maximum: its two or three groups.
            (
                ScanRequest {
                    tag_predicates: one_host(),
                    ..aggregate(max(), vec![1])
                },
                false,
            ),
            // Counts the directory gives.
            (aggregate(count(), vec![1]), false),
            // Every host's maximum: all eight groups.
            (aggregate(max(), vec![1]), true),
            // An open partition's rows.
            (aggregate(count(), vec![2]), true),
            // Seventy partitions, each answered by its directory.
            (aggregate(count(), many.clone()), true),
            (aggregate(count(), many[..20].to_vec()), false),
        ];
        for (r, long) in cases {
            for threads in [1, 2] {
                let place = Counting(Default::default());
                let mut batches = Vec::new();
                e.scan_placed(&r, threads, &|| false, &place, |b| {
                    batches.push(b);
                    true
                })
                .unwrap();
                let got = answer_text(&batches, r.aggregate.is_some());
                assert_eq!(got, threaded_answer_text(&e, &r, threads), "{r:?}");
                assert!(!got.is_empty(), "{r:?}");
                let steps = place.0.into_inner();
                assert_eq!(
                    steps > 0,
                    long,
                    "{threads} threads, {steps} long steps: {r:?}"
                );
            }
        }
    }

    /// The text answer of `r` on `threads` threads with every step run
    /// where the scan runs.
    fn threaded_answer_text(e: &Engine, r: &ScanRequest, threads: usize) -> Vec<String> {
        let mut batches = Vec::new();
        e.scan_until(r, threads, &|| false, |b| {
            batches.push(b);
            true
        })
        .unwrap();
        answer_text(&batches, r.aggregate.is_some())
    }

    #[test]
    fn a_seal_gives_back_the_disk_its_open_rows_took() {
        let dir = tempfile::tempdir().unwrap();
        let cols = columns();
        let owned = seven_hosts(30_000);
        let rows = borrowed(&owned);
        let e = Engine::open(dir.path()).unwrap();
        e.write(&cols, &[(1, vec![batch(&rows)])]).unwrap();
        e.write(&cols, &[(2, vec![batch(&rows[..100])])]).unwrap();
        e.db.flush().unwrap();
        let before = sst_bytes(&e);
        let sealed = all_rows(&e, vec![1]);
        let open = all_rows(&e, vec![2]);
        e.seal(1, &cols).unwrap();
        let after = sst_bytes(&e);
        assert!(
            after * 4 < before,
            "RocksDB holds {after} bytes after the seal, {before} before"
        );
        assert_eq!(all_rows(&e, vec![1]), sealed);
        assert_eq!(
            all_rows(&e, vec![2]),
            open,
            "the open partition keeps its rows"
        );
    }

    #[test]
    fn a_seal_reads_its_rows_again_only_when_the_partition_changed_since_its_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let cols = columns();
        let owned = seven_hosts(2000);
        let rows = borrowed(&owned);
        let e = Engine::open(dir.path()).unwrap();
        e.write(&cols, &[(1, vec![batch(&rows)])]).unwrap();
        let before = all_rows(&e, vec![1]);
        // A write to another partition during the seal changes nothing here:
        // the rows are read once, to write the file, and not again to commit.
        let stepped = memtable_steps(|| {
            e.seal_inner(1, &cols, None, None, &|| {
                e.write(&cols, &[(2, vec![batch(&[("z", 1, 1.0)])])])
                    .unwrap();
            })
            .unwrap();
        });
        assert!(
            (2000..3000).contains(&stepped),
            "{stepped} memtable steps to seal 2,000 rows"
        );
        assert_eq!(all_rows(&e, vec![1]), before);
        assert_eq!(e.open_rows(1).unwrap(), 0);
        assert_eq!(e.open_rows(2).unwrap(), 1);

        // 500 late rows, and one more written during their reseal: that one
        // must stay, so the commit compares row by row.
        let late: Vec<(&str, i64, f64)> = rows[..500].iter().map(|&(h, t, v)| (h, t, -v)).collect();
        e.write(&cols, &[(1, vec![batch(&late)])]).unwrap();
        let stepped = memtable_steps(|| {
            e.seal_inner(1, &cols, None, None, &|| {
                e.write(&cols, &[(1, vec![batch(&[("h0", 0, 7.0)])])])
                    .unwrap();
            })
            .unwrap();
        });
        assert!(stepped >= 1000, "{stepped} steps: the commit compared rows");
        assert_eq!(
            e.open_rows(1).unwrap(),
            1,
            "the row written during the reseal"
        );
        let after = all_rows(&e, vec![1]);
        assert_eq!(after.len(), 2000);
        assert!(after.contains(&(Some("h0".into()), 0, Some(7.0))));
        assert!(after.contains(&(Some("h1".into()), 1, Some(-1.0))));
    }

    #[test]
    fn reads_of_a_sealed_partition_step_over_its_sealed_rows_only_when_late_rows_are_marked() {
        let dir = tempfile::tempdir().unwrap();
        let cols = columns();
        let owned = seven_hosts(2000);
        let rows = borrowed(&owned);
        let e = Engine::open(dir.path()).unwrap();
        e.write(
            &cols,
            &[(1, vec![batch(&rows)]), (2, vec![batch(&rows[..10])])],
        )
        .unwrap();
        let before = all_rows(&e, vec![1]);
        assert!(matches!(
            e.seal(1, &cols).unwrap(),
            SealOutcome::Sealed { rows: 2000, .. }
        ));
        // The seal left one range tombstone over 2,000 rows still in the
        // memtable: reading them would step over each.
        let mut read = Vec::new();
        let stepped = memtable_steps(|| {
            read = all_rows(&e, vec![1]);
            assert_eq!(e.open_rows(1).unwrap(), 0);
            assert_eq!(e.stats(1).unwrap().rows, 2000);
            e.digest(1, &columns()).unwrap();
            assert_eq!(e.partition_ids().unwrap(), vec![1, 2]);
        });
        assert_eq!(read, before);
        // (A handful of steps are the other partition's and the logs'.)
        assert!(
            stepped < 20,
            "a sealed partition with no late rows is read from its file alone: {stepped} steps"
        );

        // A late row is marked with its write, read at once, and its mark
        // survives a restart.
        e.write(&cols, &[(1, vec![batch(&[("h0", 0, -1.0)])])])
            .unwrap();
        drop(e);
        let e = Engine::open(dir.path()).unwrap();
        assert_eq!(e.open_rows(1).unwrap(), 1);
        let merged = all_rows(&e, vec![1]);
        assert_eq!(merged.len(), 2000);
        assert!(merged.contains(&(Some("h0".into()), 0, Some(-1.0))));
        // A reseal folds it in and clears the mark.
        assert!(matches!(
            e.seal(1, &cols).unwrap(),
            SealOutcome::Resealed { rows: 2000, .. }
        ));
        let stepped = memtable_steps(|| {
            assert_eq!(all_rows(&e, vec![1]), merged);
        });
        assert!(stepped < 20, "{stepped} steps after the reseal");
    }

    #[test]
    fn a_store_made_before_late_row_marks_gets_them_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let cols = columns();
        {
            let e = Engine::open(dir.path()).unwrap();
            e.write(&cols, &[(1, vec![batch(&[("a", 1, 1.0)])])])
                .unwrap();
            e.seal(1, &cols).unwrap();
            e.write(&cols, &[(1, vec![batch(&[("b", 2, 2.0)])])])
                .unwrap();
            // As an older store would be: no marks, nor the key saying
            // they are complete.
            let cf = e.late_cf().unwrap();
            e.db.delete_cf(cf, 1u64.to_be_bytes()).unwrap();
            e.db.delete_cf(cf, LATE_MARKS_COMPLETE).unwrap();
        }
        let e = Engine::open(dir.path()).unwrap();
        assert_eq!(e.open_rows(1).unwrap(), 1, "the late row is found again");
        assert_eq!(all_rows(&e, vec![1]).len(), 2);
    }

    #[test]
    fn partitions_are_listed_and_dropped_whole() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path()).unwrap();
        assert_eq!(e.partition_ids().unwrap(), Vec::<u64>::new());
        let cols = columns();
        e.write(
            &cols,
            &[
                (3, vec![batch(&[("a", 1, 1.0), ("b", 2, 2.0)])]),
                (7, vec![batch(&[("a", 5, 3.0)])]),
            ],
        )
        .unwrap();
        e.write(&cols, &[(u64::MAX, vec![batch(&[("z", 9, 9.0)])])])
            .unwrap();
        assert_eq!(e.partition_ids().unwrap(), vec![3, 7, u64::MAX]);
        assert_eq!(e.stats(3).unwrap().rows, 2);
        e.drop_partitions(&[3, u64::MAX]).unwrap();
        assert_eq!(e.partition_ids().unwrap(), vec![7]);
        assert_eq!(e.stats(3).unwrap().rows, 0);
        assert_eq!(e.stats(7).unwrap().rows, 1);
    }

    /// A request for each series' `n` newest rows in `[start, end)` with
    /// `v > above` (when given), over `pids` in that order.
    fn newest_req(pids: Vec<u64>, n: u64, start: i64, end: i64, above: Option<f64>) -> ScanRequest {
        use sealion_common::proto::{
            CompareOp, FieldCompare, FieldPredicate, Literal, field_predicate, literal,
        };
        ScanRequest {
            last_per_series: true,
            rows_per_series: n,
            start_ns: start,
            end_ns: end,
            field_predicate: above.map(|a| FieldPredicate {
                expr: Some(field_predicate::Expr::Compare(FieldCompare {
                    column: "v".into(),
                    op: CompareOp::CmpGt as i32,
                    value: Some(Literal {
                        value: Some(literal::Value::F64(a)),
                    }),
                })),
            }),
            ..req(pids)
        }
    }

    /// Partition of a row at time `t` in the tests below: ten time units
    /// each, ids 10 and up, so their time ranges do not overlap.
    fn partition_of(t: i64) -> u64 {
        10 + (t / 10) as u64
    }

    /// Writes `model` into its partitions and seals those `sealed` names
    /// (by partition index); returns the partition ids written.
    fn write_partitions(e: &Engine, model: &Model, sealed: &[bool]) -> Vec<u64> {
        let cols = columns();
        let mut parts: std::collections::BTreeMap<u64, Vec<(&str, i64, f64)>> = Default::default();
        for ((h, t), v) in model {
            parts
                .entry(partition_of(*t))
                .or_default()
                .push((h.as_str(), *t, *v));
        }
        for (pid, rows) in &parts {
            e.write(&cols, &[(*pid, vec![batch(rows)])]).unwrap();
            if sealed.get((*pid - 10) as usize).copied().unwrap_or(false) {
                e.seal(*pid, &cols).unwrap();
            }
        }
        parts.keys().copied().collect()
    }

    /// `ids` in a random order.
    fn shuffled(ids: std::ops::Range<u64>) -> impl proptest::strategy::Strategy<Value = Vec<u64>> {
        use proptest::strategy::{Just, Strategy};
        Just(ids.collect::<Vec<_>>()).prop_shuffle()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Each series' newest rows over partitions of disjoint time ranges,
        /// some sealed and some open, named in any order: the answer is the
        /// plain model's (per host, the newest `n` rows in the range that
        /// pass the filter, in (host, time) order), whichever partitions
        /// the newer ones let the scan pass over.
        #[test]
        fn newest_rows_of_each_series_across_partitions_equal_a_plain_model(
            rows in proptest::collection::vec((0u8..4, 0i64..60, -100.0f64..100.0), 1..80),
            sealed in proptest::collection::vec(proptest::bool::ANY, 6),
            order in shuffled(10..16),
            n in 1u64..5,
            start in -5i64..60,
            width in 0i64..70,
            above in proptest::option::of(-100.0f64..100.0),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let e = Engine::open(dir.path()).unwrap();
            let model: Model = rows.iter().map(|&(h, t, v)| ((format!("h{h}"), t), v)).collect();
            write_partitions(&e, &model, &sealed);
            let end = start + width;
            let mut want = Vec::new();
            for h in 0..4u8 {
                let host = format!("h{h}");
                let mut mine: Vec<(Option<String>, i64, Option<f64>)> = model
                    .iter()
                    .filter(|((x, t), v)| {
                        *x == host && (start..end).contains(t) && above.is_none_or(|a| **v > a)
                    })
                    .map(|((x, t), v)| (Some(x.clone()), *t, Some(*v)))
                    .collect();
                let keep = mine.len().saturating_sub(n as usize);
                want.extend(mine.drain(keep..));
            }
            let (got, _) = answer_rows(&e, &newest_req(order.clone(), n, start, end, above));
            proptest::prop_assert_eq!(got, want, "order {:?}", order);
        }
    }

    /// Newest first, a series the newest partition gave all its rows is
    /// passed over in every older sealed file: the scan decodes no more
    /// pages than a scan of the newest partition alone, whatever order the
    /// partitions are named in.
    #[test]
    fn newest_rows_of_each_series_read_only_the_newest_partition_that_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path()).unwrap();
        // Four hosts, a row every time unit for 60 units: six partitions of
        // ten rows a host, all sealed.
        let model: Model = (0..4)
            .flat_map(|h| {
                (0..60).map(move |t| ((format!("h{h}"), t), f64::from(h * 100) + t as f64))
            })
            .collect();
        let pids = write_partitions(&e, &model, &[true; 6]);
        assert_eq!(pids, (10..16).collect::<Vec<_>>());
        let newest = answer_rows(&e, &newest_req(vec![15], 3, i64::MIN, i64::MAX, None));
        assert!(newest.1.pages_decoded > 0, "{:?}", newest.1);
        for order in [pids.clone(), pids.iter().rev().copied().collect()] {
            let (rows, m) =
                answer_rows(&e, &newest_req(order.clone(), 3, i64::MIN, i64::MAX, None));
            assert_eq!(rows, newest.0, "{order:?}");
            assert_eq!(rows.len(), 12);
            assert_eq!(m.partitions_scanned, 6);
            assert_eq!(m.series_settled_before, 4 * 5, "{order:?}: {m:?}");
            assert_eq!(m.pages_decoded, newest.1.pages_decoded, "{order:?}: {m:?}");
        }
        // A time range that ends in the third partition: the three newer
        // ones hold no row in it and settle nothing; the third settles
        // every series, so the two oldest are passed over.
        let (rows, m) = answer_rows(&e, &newest_req(pids.clone(), 3, i64::MIN, 30, None));
        assert_eq!(rows.len(), 12);
        assert!(rows.iter().all(|r| (27..30).contains(&r.1)), "{rows:?}");
        assert_eq!(m.series_settled_before, 4 * 2, "{m:?}");
    }
}
