//! Raft's durable storage in RocksDB: the log store and the state machine.
//!
//! One RocksDB instance per replica, three column families:
//!
//! - `logs`: log entries, keyed by big-endian index, JSON values;
//! - `raft`: the vote, the committed log id and the last purged log id;
//! - `snapshot`: the latest snapshot, its metadata and its data (the JSON of a
//!   `ClusterState`).
//!
//! The state machine itself lives in memory: the whole cluster state is small
//! (a catalog and a partition map), and it is rebuilt at open from the last
//! snapshot plus the committed entries after it, which openraft re-applies on
//! startup because `save_committed` persists the commit point
//! (`StorageHelper::get_initial_state` in openraft 0.9). Every write that
//! Raft's safety depends on (entries, vote, truncation, purge, snapshots) is
//! synced before it is acknowledged. RocksDB calls run on the blocking pool,
//! never on the async runtime's workers.

// openraft's trait methods return its `StorageError` (over 200 bytes); the
// helpers here return the same type so `?` needs no conversion.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, EntryPayload, ErrorSubject, ErrorVerb, LogState, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, StorageIOError,
};
use rocksdb::{
    ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions,
};
use sealion_proto::{ClusterState, MetaResponse};
use tokio::sync::{oneshot, watch};

use crate::machine;
use crate::types::{
    Entry, LogId, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig, Vote,
};

const CF_LOGS: &str = "logs";
const CF_RAFT: &str = "raft";
const CF_SNAPSHOT: &str = "snapshot";

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";
const KEY_SNAPSHOT_META: &[u8] = b"meta";
const KEY_SNAPSHOT_DATA: &[u8] = b"data";

/// The RocksDB instance of one replica. It says when it is closed: the
/// last `Arc` may be dropped by a Raft task, and the database must be closed
/// for the same directory to be opened again (RocksDB's lock is per process).
pub struct Db {
    /// `None` only while being dropped.
    db: Option<DB>,
    closed: Option<oneshot::Sender<()>>,
}

impl std::ops::Deref for Db {
    type Target = DB;

    fn deref(&self) -> &DB {
        match &self.db {
            Some(db) => db,
            None => unreachable!("the database is only taken out in Drop"),
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        drop(self.db.take());
        if let Some(closed) = self.closed.take() {
            let _ = closed.send(());
        }
    }
}

/// Memtable size of meta's RocksDB (its default, 64 MiB, is sized for
/// bulk data, and each log file is preallocated to about that).
const META_WRITE_BUFFER_BYTES: usize = 4 << 20;

/// Opens (creating if needed) the RocksDB instance of one meta replica. The
/// receiver completes once the database is closed.
pub fn open_db(path: &Path) -> crate::Result<(Arc<Db>, oneshot::Receiver<()>)> {
    std::fs::create_dir_all(path)?;
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // Meta holds little: small memtables, so each write-ahead log file
    // (preallocated at about 1.1 memtables) stays small on disk.
    opts.set_write_buffer_size(META_WRITE_BUFFER_BYTES);
    // Logs are freed only once every column family holding data in them
    // has flushed: past this, RocksDB flushes the laggards.
    opts.set_max_total_wal_size(4 * META_WRITE_BUFFER_BYTES as u64);
    let mut cf_opts = Options::default();
    cf_opts.set_write_buffer_size(META_WRITE_BUFFER_BYTES);
    let cfs = [CF_LOGS, CF_RAFT, CF_SNAPSHOT]
        .map(|name| ColumnFamilyDescriptor::new(name, cf_opts.clone()));
    let db = DB::open_cf_descriptors(&opts, path, cfs)?;
    let (tx, rx) = oneshot::channel();
    Ok((
        Arc::new(Db {
            db: Some(db),
            closed: Some(tx),
        }),
        rx,
    ))
}

fn io_error(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    e: impl std::error::Error + 'static,
) -> StorageError {
    StorageError::IO {
        source: StorageIOError::new(subject, verb, AnyError::new(&e)),
    }
}

fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily, StorageError> {
    db.cf_handle(name).ok_or_else(|| StorageError::IO {
        source: StorageIOError::new(
            ErrorSubject::Store,
            ErrorVerb::Read,
            AnyError::error(format!("column family {name} is missing")),
        ),
    })
}

fn synced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(true);
    opts
}

/// Runs RocksDB work on the blocking pool.
async fn blocking<T, F>(subject: ErrorSubject<NodeId>, f: F) -> Result<T, StorageError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StorageError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(join) => Err(io_error(subject, ErrorVerb::Write, join)),
    }
}

fn get_json<T: serde::de::DeserializeOwned>(
    db: &DB,
    cf_name: &str,
    key: &[u8],
    subject: ErrorSubject<NodeId>,
) -> Result<Option<T>, StorageError> {
    let handle = cf(db, cf_name)?;
    let Some(bytes) = db
        .get_cf(handle, key)
        .map_err(|e| io_error(subject.clone(), ErrorVerb::Read, e))?
    else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io_error(subject, ErrorVerb::Read, e))
}

fn put_json<T: serde::Serialize>(
    db: &DB,
    cf_name: &str,
    key: &[u8],
    value: &T,
    sync: bool,
    subject: ErrorSubject<NodeId>,
) -> Result<(), StorageError> {
    let handle = cf(db, cf_name)?;
    let bytes =
        serde_json::to_vec(value).map_err(|e| io_error(subject.clone(), ErrorVerb::Write, e))?;
    let opts = if sync {
        synced()
    } else {
        WriteOptions::default()
    };
    db.put_cf_opt(handle, key, bytes, &opts)
        .map_err(|e| io_error(subject, ErrorVerb::Write, e))
}

fn index_of(key: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = key.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

/// The Raft log and vote. Cheap to clone: clones share the database, and a
/// clone is also the log reader that replication tasks use.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Db>,
}

impl LogStore {
    pub fn new(db: Arc<Db>) -> Self {
        LogStore { db }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => Some(i.saturating_add(1)),
            Bound::Excluded(i) => Some(*i),
            Bound::Unbounded => None,
        };
        let db = self.db.clone();
        blocking(ErrorSubject::Logs, move || {
            let handle = cf(&db, CF_LOGS)?;
            let from = start.to_be_bytes();
            let mut entries = Vec::new();
            for item in db.iterator_cf(handle, IteratorMode::From(&from, Direction::Forward)) {
                let (key, value) =
                    item.map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
                let Some(index) = index_of(&key) else { break };
                if end.is_some_and(|end| index >= end) {
                    break;
                }
                let entry: Entry = serde_json::from_slice(&value)
                    .map_err(|e| io_error(ErrorSubject::LogIndex(index), ErrorVerb::Read, e))?;
                entries.push(entry);
            }
            Ok(entries)
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let db = self.db.clone();
        blocking(ErrorSubject::Logs, move || {
            let last_purged: Option<LogId> =
                get_json(&db, CF_RAFT, KEY_LAST_PURGED, ErrorSubject::Store)?;
            let handle = cf(&db, CF_LOGS)?;
            let last = match db.iterator_cf(handle, IteratorMode::End).next() {
                Some(item) => {
                    let (_, value) =
                        item.map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
                    let entry: Entry = serde_json::from_slice(&value)
                        .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
                    Some(entry.log_id)
                }
                None => None,
            };
            Ok(LogState {
                last_log_id: last.or(last_purged),
                last_purged_log_id: last_purged,
            })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let db = self.db.clone();
        let vote = *vote;
        blocking(ErrorSubject::Vote, move || {
            put_json(&db, CF_RAFT, KEY_VOTE, &vote, true, ErrorSubject::Vote)
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let db = self.db.clone();
        blocking(ErrorSubject::Vote, move || {
            get_json(&db, CF_RAFT, KEY_VOTE, ErrorSubject::Vote)
        })
        .await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let db = self.db.clone();
        // Not synced: the entries it points at are, and losing the last few
        // commit points in a machine crash only means re-applying less at
        // restart; the leader re-sends the commit index anyway.
        blocking(ErrorSubject::Store, move || {
            put_json(
                &db,
                CF_RAFT,
                KEY_COMMITTED,
                &committed,
                false,
                ErrorSubject::Store,
            )
        })
        .await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let db = self.db.clone();
        blocking(ErrorSubject::Store, move || {
            Ok(
                get_json::<Option<LogId>>(&db, CF_RAFT, KEY_COMMITTED, ErrorSubject::Store)?
                    .flatten(),
            )
        })
        .await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let db = self.db.clone();
        let result = blocking(ErrorSubject::Logs, move || {
            let handle = cf(&db, CF_LOGS)?;
            let mut batch = WriteBatch::default();
            for entry in &entries {
                let value = serde_json::to_vec(entry)
                    .map_err(|e| io_error(ErrorSubject::Log(entry.log_id), ErrorVerb::Write, e))?;
                batch.put_cf(handle, entry.log_id.index.to_be_bytes(), value);
            }
            db.write_opt(batch, &synced())
                .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Write, e))
        })
        .await;
        match &result {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        result
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = self.db.clone();
        blocking(ErrorSubject::Logs, move || {
            let handle = cf(&db, CF_LOGS)?;
            let mut batch = WriteBatch::default();
            batch.delete_range_cf(handle, log_id.index.to_be_bytes(), u64::MAX.to_be_bytes());
            batch.delete_cf(handle, u64::MAX.to_be_bytes());
            db.write_opt(batch, &synced())
                .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Delete, e))
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = self.db.clone();
        blocking(ErrorSubject::Logs, move || {
            let handle = cf(&db, CF_LOGS)?;
            let raft = cf(&db, CF_RAFT)?;
            let purged = serde_json::to_vec(&log_id)
                .map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Write, e))?;
            // The purge point is written with the deletion, in one batch, so
            // no restart can see a hole before the first entry.
            let mut batch = WriteBatch::default();
            batch.put_cf(raft, KEY_LAST_PURGED, purged);
            batch.delete_range_cf(
                handle,
                0u64.to_be_bytes(),
                log_id.index.saturating_add(1).to_be_bytes(),
            );
            db.write_opt(batch, &synced())
                .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Delete, e))
        })
        .await
    }
}

/// Serializes snapshot writes, so an older snapshot that finished building
/// late never overwrites a newer one (built or installed).
type SnapshotLock = Arc<Mutex<()>>;

fn persist_snapshot(
    db: &DB,
    lock: &SnapshotLock,
    meta: &SnapshotMeta,
    data: &[u8],
) -> Result<(), StorageError> {
    let subject = ErrorSubject::Snapshot(Some(meta.signature()));
    let _guard = lock.lock().map_err(|_| {
        io_error(
            subject.clone(),
            ErrorVerb::Write,
            std::io::Error::other("snapshot lock poisoned"),
        )
    })?;
    let stored: Option<SnapshotMeta> =
        get_json(db, CF_SNAPSHOT, KEY_SNAPSHOT_META, subject.clone())?;
    if stored.is_some_and(|s| s.last_log_id > meta.last_log_id) {
        return Ok(());
    }
    let handle = cf(db, CF_SNAPSHOT)?;
    let meta_bytes =
        serde_json::to_vec(meta).map_err(|e| io_error(subject.clone(), ErrorVerb::Write, e))?;
    let mut batch = WriteBatch::default();
    batch.put_cf(handle, KEY_SNAPSHOT_META, meta_bytes);
    batch.put_cf(handle, KEY_SNAPSHOT_DATA, data);
    db.write_opt(batch, &synced())
        .map_err(|e| io_error(subject, ErrorVerb::Write, e))
}

fn load_snapshot(db: &DB) -> Result<Option<(SnapshotMeta, Vec<u8>)>, StorageError> {
    let subject = ErrorSubject::Snapshot(None);
    let Some(meta) = get_json::<SnapshotMeta>(db, CF_SNAPSHOT, KEY_SNAPSHOT_META, subject.clone())?
    else {
        return Ok(None);
    };
    let handle = cf(db, CF_SNAPSHOT)?;
    let data = db
        .get_cf(handle, KEY_SNAPSHOT_DATA)
        .map_err(|e| io_error(subject.clone(), ErrorVerb::Read, e))?
        .ok_or_else(|| {
            io_error(
                subject,
                ErrorVerb::Read,
                std::io::Error::other("snapshot metadata without data"),
            )
        })?;
    Ok(Some((meta, data)))
}

/// The cluster state as Raft applies it, with the last applied log id and
/// membership. Each change is published on a watch channel, which is how the
/// gRPC service reads the state without ever waiting on Raft.
pub struct StateMachine {
    db: Arc<Db>,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    state: ClusterState,
    published: watch::Sender<Arc<ClusterState>>,
    snapshot_lock: SnapshotLock,
}

impl StateMachine {
    /// Restores the state machine from the last snapshot in `db` (or the
    /// initial state), and returns the receiver of its published states.
    pub async fn open(db: Arc<Db>) -> crate::Result<(Self, watch::Receiver<Arc<ClusterState>>)> {
        let loaded = {
            let db = db.clone();
            blocking(ErrorSubject::Snapshot(None), move || load_snapshot(&db))
                .await
                .map_err(|e| crate::Error::Raft(e.to_string()))?
        };
        let (last_applied, last_membership, state) = match loaded {
            Some((meta, data)) => {
                let mut state: ClusterState = serde_json::from_slice(&data)?;
                state.version = meta.last_log_id.map_or(0, |l| l.index);
                (meta.last_log_id, meta.last_membership, state)
            }
            None => (None, StoredMembership::default(), machine::initial_state()),
        };
        let (published, rx) = watch::channel(Arc::new(state.clone()));
        Ok((
            StateMachine {
                db,
                last_applied,
                last_membership,
                state,
                published,
                snapshot_lock: Arc::new(Mutex::new(())),
            },
            rx,
        ))
    }

    fn publish(&self) {
        self.published.send_replace(Arc::new(self.state.clone()));
    }
}

/// A frozen copy of the state machine, turned into a snapshot off the Raft
/// core's path.
pub struct SnapshotBuilder {
    db: Arc<Db>,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    state: ClusterState,
    snapshot_lock: SnapshotLock,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let data = serde_json::to_vec(&self.state)
            .map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.last_membership.clone(),
            snapshot_id: format!("{}-{nanos}", self.last_applied.map_or(0, |l| l.index)),
        };
        let (db, lock, meta_w, data_w) = (
            self.db.clone(),
            self.snapshot_lock.clone(),
            meta.clone(),
            data.clone(),
        );
        blocking(ErrorSubject::Snapshot(Some(meta.signature())), move || {
            persist_snapshot(&db, &lock, &meta_w, &data_w)
        })
        .await?;
        tracing::info!(snapshot = %meta.snapshot_id, "built meta snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied, self.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<MetaResponse>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            self.last_applied = Some(entry.log_id);
            let response = match entry.payload {
                EntryPayload::Blank => {
                    self.state.version = index;
                    MetaResponse {
                        version: index,
                        ..Default::default()
                    }
                }
                EntryPayload::Normal(cmd) => machine::apply(&mut self.state, &cmd, index),
                EntryPayload::Membership(membership) => {
                    self.last_membership = StoredMembership::new(Some(entry.log_id), membership);
                    self.state.version = index;
                    MetaResponse {
                        version: index,
                        ..Default::default()
                    }
                }
            };
            responses.push(response);
        }
        self.publish();
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            last_applied: self.last_applied,
            last_membership: self.last_membership.clone(),
            state: self.state.clone(),
            snapshot_lock: self.snapshot_lock.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let subject = ErrorSubject::Snapshot(Some(meta.signature()));
        let mut state: ClusterState = serde_json::from_slice(&data)
            .map_err(|e| io_error(subject.clone(), ErrorVerb::Read, e))?;
        state.version = meta.last_log_id.map_or(0, |l| l.index);
        let (db, lock, meta_w) = (self.db.clone(), self.snapshot_lock.clone(), meta.clone());
        blocking(subject, move || {
            persist_snapshot(&db, &lock, &meta_w, &data)
        })
        .await?;
        self.state = state;
        self.last_applied = meta.last_log_id;
        self.last_membership = meta.last_membership.clone();
        self.publish();
        tracing::info!(snapshot = %meta.snapshot_id, "installed meta snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let db = self.db.clone();
        let loaded = blocking(ErrorSubject::Snapshot(None), move || load_snapshot(&db)).await?;
        Ok(loaded.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}
