//! Primary–backup replication of partitions, with epochs kept in meta.
//!
//! Meta names each partition's replicas (the first is the primary), the
//! in-sync subset and an epoch that every change of either bumps. Writes and
//! deletes go to the primary. It takes the partition's lock (so the writes of
//! one partition reach every replica in the same order), applies the write
//! locally and forwards it to every other in-sync replica, in parallel. It
//! acknowledges only when each in-sync replica has the write durably; a
//! replica that fails is first taken out of the in-sync set in meta (a
//! compare-and-set on the epoch), so the set never names a replica that
//! lacks an acknowledged write. When that change loses its race, the write
//! fails with `Unavailable` and the client retries (rows are unique by
//! series and time, so a retry does not duplicate anything).
//!
//! A backup refuses a forwarded write whose epoch is older than the one it
//! knows: a primary that meta has replaced cannot get an acknowledgement.
//!
//! A replica outside the in-sync set asks the primary to resync it: under
//! the partition's lock the primary sends it the partition, as its sealed
//! file when that is all the partition holds (length and CRC32C checked
//! before the file replaces anything) and otherwise as rows (sealed, late
//! and open, deletes applied); the replica replaces its copy, its rows are
//! checked against the primary's digest, and the primary records it as in
//! sync before writes resume.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use sealion_common::proto::meta_command::Cmd;
use sealion_common::proto::storage_client::StorageClient;
use sealion_common::proto::{
    BatchMark, ClusterState, Column, DeleteRequest, InstallRequest, Partition, ReplicaChange,
    ResyncRequest, ScanRequest, SealCheck, SealRequest, SealResult, UpdateReplicas, WriteRequest,
};
use sealion_format::digest::RowDigest;
use tonic::transport::Channel;

use crate::engine::SealOutcome;
use crate::service::NodeContext;
use crate::{Error, Result};

/// Longest a forwarded write or delete may take before the backup counts as
/// failed (and leaves the in-sync set).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Rows per `Install` message of a resync.
const INSTALL_CHUNK_ROWS: usize = 32_768;
/// Longest one `Install` message may take.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest gRPC message between storage nodes.
const MAX_MESSAGE_BYTES: usize = crate::service::MAX_WRITE_BYTES + (1 << 20);

/// gRPC clients of the other storage nodes, over one channel per address.
#[derive(Default)]
pub struct Peers {
    channels: sealion_common::channels::Channels,
}

impl Peers {
    pub fn client(&self, addr: &str) -> Result<StorageClient<Channel>> {
        let channel = self
            .channels
            .channel(addr)
            .map_err(|e| Error::Internal(e.to_string()))?;
        Ok(StorageClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }
}

impl Peers {
    /// The client of storage node `node` at its address in `state`.
    pub fn node(&self, state: &ClusterState, node: u64) -> Result<StorageClient<Channel>> {
        let addr = sealion_common::catalog::node(state, node)
            .map(|n| n.addr.clone())
            .ok_or_else(|| Error::Internal(format!("storage node {node} is unknown")))?;
        self.client(&addr)
    }
}

/// One async lock per partition on its primary. Held exclusively from a
/// write's local apply until every backup has answered (so the backups
/// apply writes in the primary's order), and for the whole of a delete, a
/// seal, a settle and a resync. A write with no backup to forward to holds
/// it shared: with one copy the order of concurrent writes is nobody's to
/// keep, and writes that run at once are synced together by RocksDB.
///
/// Also the lowest epoch this node may act on per partition: after it
/// changed a partition's replicas itself, a local view of meta older than
/// that change must not route a write (it could leave out a replica that
/// just became in sync).
#[derive(Default)]
pub struct PartitionLocks {
    map: std::sync::Mutex<HashMap<u64, Arc<tokio::sync::RwLock<()>>>>,
    floors: std::sync::Mutex<HashMap<u64, u64>>,
    /// Per partition this node leads: the epoch at which it last confirmed
    /// that its in-sync backups hold exactly its rows.
    settled: std::sync::Mutex<HashMap<u64, u64>>,
}

impl PartitionLocks {
    fn settled_at(&self, pid: u64) -> Option<u64> {
        self.settled.lock().ok().and_then(|m| m.get(&pid).copied())
    }

    fn set_settled(&self, pid: u64, epoch: u64) {
        if let Ok(mut m) = self.settled.lock() {
            m.insert(pid, epoch);
        }
    }

    fn raise_floor(&self, changed: &[Partition]) {
        if let Ok(mut f) = self.floors.lock() {
            for p in changed {
                let e = f.entry(p.id).or_default();
                *e = (*e).max(p.epoch);
            }
        }
    }

    fn floor(&self, pid: u64) -> u64 {
        self.floors
            .lock()
            .ok()
            .and_then(|f| f.get(&pid).copied())
            .unwrap_or(0)
    }

    /// Locks every partition of `ids` exclusively, in id order (so two
    /// requests never wait on each other crosswise).
    pub async fn lock_all(
        &self,
        ids: &[u64],
    ) -> Result<Vec<tokio::sync::OwnedRwLockWriteGuard<()>>> {
        let mut guards = Vec::with_capacity(ids.len());
        for l in self.locks_of(ids)? {
            guards.push(l.write_owned().await);
        }
        Ok(guards)
    }

    /// Locks every partition of `ids` shared, in id order.
    pub async fn share_all(
        &self,
        ids: &[u64],
    ) -> Result<Vec<tokio::sync::OwnedRwLockReadGuard<()>>> {
        let mut guards = Vec::with_capacity(ids.len());
        for l in self.locks_of(ids)? {
            guards.push(l.read_owned().await);
        }
        Ok(guards)
    }

    /// The locks of `ids`, once each, in id order.
    fn locks_of(&self, ids: &[u64]) -> Result<Vec<Arc<tokio::sync::RwLock<()>>>> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let mut map = self
            .map
            .lock()
            .map_err(|_| Error::Internal("partition lock map poisoned".into()))?;
        Ok(ids
            .iter()
            .map(|id| map.entry(*id).or_default().clone())
            .collect())
    }
}

fn partition(state: &ClusterState, pid: u64) -> Option<&Partition> {
    state.partitions.iter().find(|p| p.id == pid)
}

/// The first partition of `ids` that `me` does not lead in `state`, with
/// the error that says so.
fn not_led(state: &ClusterState, me: u64, ids: &[u64]) -> Option<Error> {
    let partition_id = ids
        .iter()
        .copied()
        .find(|pid| partition(state, *pid).and_then(|p| p.replicas.first()) != Some(&me))?;
    Some(
        if partition(state, partition_id).is_some_and(|p| p.replicas.contains(&me)) {
            Error::NotPrimary {
                partition_id,
                node_id: me,
            }
        } else {
            Error::NotHeld {
                partition_id,
                node_id: me,
            }
        },
    )
}

/// The state in which this node is the primary of every partition of
/// `ids`: the local copy when it says so (and is not older than a replica
/// change this node made itself), else meta's latest.
pub(crate) async fn primary_view(ctx: &NodeContext, ids: &[u64]) -> Result<Arc<ClusterState>> {
    let state = ctx.meta.state();
    let current = ids
        .iter()
        .all(|pid| partition(&state, *pid).is_some_and(|p| p.epoch >= ctx.locks.floor(*pid)));
    if current && not_led(&state, ctx.node_id(), ids).is_none() {
        return Ok(state);
    }
    primary_view_fresh(ctx, ids).await
}

/// As `primary_view`, after settling the partitions' current epochs
/// (`settle`); from meta's latest state when settling changed a set.
async fn settled_primary_view(ctx: &NodeContext, ids: &[u64]) -> Result<Arc<ClusterState>> {
    let state = primary_view(ctx, ids).await?;
    if settle(ctx, &state, ids).await? {
        return primary_view_fresh(ctx, ids).await;
    }
    Ok(state)
}

/// As `primary_view`, always from meta's latest state.
async fn primary_view_fresh(ctx: &NodeContext, ids: &[u64]) -> Result<Arc<ClusterState>> {
    let fresh = Arc::new(ctx.meta.get_state(true).await?.state.unwrap_or_default());
    match not_led(&fresh, ctx.node_id(), ids) {
        None => Ok(fresh),
        Some(e) => Err(e),
    }
}

/// Checks a forwarded request: this node is a replica of each partition at
/// exactly the epoch the primary sent. An older epoch is refused (the
/// sender was replaced); a newer one makes this node catch up with meta.
pub async fn check_backup(ctx: &NodeContext, epochs: &[(u64, u64)]) -> Result<()> {
    let me = ctx.node_id();
    let check = |s: &ClusterState| -> Result<()> {
        for &(pid, epoch) in epochs {
            let Some(p) = partition(s, pid) else {
                return Err(Error::NotHeld {
                    partition_id: pid,
                    node_id: me,
                });
            };
            if !p.replicas.contains(&me) {
                return Err(Error::NotHeld {
                    partition_id: pid,
                    node_id: me,
                });
            }
            if p.epoch != epoch {
                return Err(Error::StaleEpoch {
                    partition_id: pid,
                    request: epoch,
                    known: p.epoch,
                });
            }
        }
        Ok(())
    };
    match check(&ctx.meta.state()) {
        Ok(()) => return Ok(()),
        // This node is ahead of the sender: refuse without asking meta.
        Err(e @ Error::StaleEpoch { .. }) if e.is_older_epoch() => return Err(e),
        Err(_) => {}
    }
    let fresh = ctx.meta.get_state(true).await?.state.unwrap_or_default();
    check(&fresh)
}

/// What a primary forwards: the request with `replicated` set, per backup,
/// holding only the partitions that backup is in sync for.
fn forwards<T>(
    state: &ClusterState,
    me: u64,
    ids: &[u64],
    mut make: impl FnMut(&[(u64, u64)]) -> T,
) -> Vec<(u64, T)> {
    let mut by_node: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for pid in ids {
        if let Some(p) = partition(state, *pid) {
            for n in p.in_sync.iter().filter(|n| **n != me) {
                by_node.entry(*n).or_default().push((p.id, p.epoch));
            }
        }
    }
    by_node
        .into_iter()
        .map(|(node, parts)| (node, make(&parts)))
        .collect()
}

/// How a forward ended.
enum Forwarded {
    Ok,
    /// The backup knows a newer epoch: the primary's view is old.
    Stale,
    Failed(String),
}

fn forward_outcome<T>(r: std::result::Result<tonic::Response<T>, tonic::Status>) -> Forwarded {
    match r {
        Ok(_) => Forwarded::Ok,
        Err(s) if s.code() == tonic::Code::Aborted => Forwarded::Stale,
        Err(s) => Forwarded::Failed(format!("{:?}: {}", s.code(), s.message())),
    }
}

/// Takes `failed` nodes out of the in-sync sets of the partitions of `ids`
/// (as they are in `state`), so that an acknowledgement without them keeps
/// the promise that every in-sync replica holds it.
async fn shrink_in_sync(
    ctx: &NodeContext,
    state: &ClusterState,
    ids: &[u64],
    failed: &BTreeMap<u64, String>,
) -> Result<()> {
    let mut changes = Vec::new();
    for pid in ids {
        let Some(p) = partition(state, *pid) else {
            continue;
        };
        if !p.in_sync.iter().any(|n| failed.contains_key(n)) {
            continue;
        }
        let in_sync: Vec<u64> = p
            .in_sync
            .iter()
            .copied()
            .filter(|n| !failed.contains_key(n))
            .collect();
        changes.push(ReplicaChange {
            partition_id: p.id,
            expected_epoch: p.epoch,
            replicas: p.replicas.clone(),
            in_sync,
            reason: format!("a write failed on {failed:?}"),
        });
    }
    if changes.is_empty() {
        return Ok(());
    }
    let wanted = changes.len();
    for (node, why) in failed {
        tracing::warn!(node, reason = %why, "backup failed a write; taking it out of the in-sync set");
    }
    let reply = ctx
        .meta
        .propose(Cmd::UpdateReplicas(UpdateReplicas { changes }))
        .await
        .map_err(|e| {
            Error::Unavailable(format!("could not record a failed backup in meta: {e}"))
        })?;
    ctx.locks.raise_floor(&reply.partitions);
    if reply.partitions.len() != wanted {
        return Err(Error::Unavailable(format!(
            "a backup failed ({failed:?}) and the replica set changed meanwhile; retry the write"
        )));
    }
    Ok(())
}

/// Sends `make(parts)` to each in-sync backup of `ids` with `send`, and
/// deals with the answers: a backup that failed leaves the in-sync set; a
/// backup that knows a newer epoch makes the primary look again (it may no
/// longer be the primary, or the set may have changed), up to a few times.
async fn replicate<T, Fut>(
    ctx: &NodeContext,
    mut state: Arc<ClusterState>,
    ids: &[u64],
    mut make: impl FnMut(&[(u64, u64)]) -> T,
    send: impl Fn(StorageClient<Channel>, T) -> Fut,
) -> Result<()>
where
    Fut: std::future::Future<Output = Forwarded>,
{
    let me = ctx.node_id();
    for _attempt in 0..3 {
        let mut calls = Vec::new();
        let mut failed: BTreeMap<u64, String> = BTreeMap::new();
        for (node, req) in forwards(&state, me, ids, &mut make) {
            match ctx.peers.node(&state, node) {
                Ok(client) => {
                    let fut = send(client, req);
                    calls.push(async move { (node, fut.await) });
                }
                Err(e) => {
                    failed.insert(node, e.to_string());
                }
            }
        }
        let mut stale = false;
        for (node, outcome) in futures::future::join_all(calls).await {
            match outcome {
                Forwarded::Ok => {}
                Forwarded::Stale => stale = true,
                Forwarded::Failed(why) => {
                    failed.insert(node, why);
                }
            }
        }
        if stale {
            // Forwarding again is harmless: a write or delete applied twice
            // leaves the same rows.
            state = primary_view_fresh(ctx, ids).await?;
            continue;
        }
        return shrink_in_sync(ctx, &state, ids, &failed).await;
    }
    Err(Error::Unavailable(
        "the replica set kept changing during the write; retry it".into(),
    ))
}

/// Holding the locks of `ids`, as their primary in `state`: makes sure that,
/// at each partition's current epoch, every in-sync backup holds exactly
/// this node's rows. A write that reached some replicas and not others (its
/// primary died or was paused mid-write, and was never acknowledged) can
/// leave an in-sync backup with rows the new primary lacks; nothing else
/// would ever remove them. So the first time this node acts as primary at an
/// epoch, it compares digests with each in-sync backup, and a backup that
/// differs leaves the in-sync set (it then resyncs from this copy).
///
/// Returns whether it changed an in-sync set (the caller's view is then
/// old).
async fn settle(ctx: &NodeContext, state: &ClusterState, ids: &[u64]) -> Result<bool> {
    let me = ctx.node_id();
    let due: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|pid| {
            partition(state, *pid).is_some_and(|p| ctx.locks.settled_at(p.id) != Some(p.epoch))
        })
        .collect();
    let mut changed = false;
    for pid in due {
        let Some(p) = partition(state, pid) else {
            continue;
        };
        if p.in_sync.iter().any(|n| *n != me) {
            let digest = digest(ctx, pid).await?;
            let failed = check_backups(ctx, state, pid, digest, false).await;
            if !failed.is_empty() {
                tracing::warn!(partition_id = pid, backups = ?failed, "in-sync backups differ from the new primary; they resync");
                shrink_in_sync(ctx, state, &[pid], &failed).await?;
                // Settled again at the epoch the shrink set, on next use.
                changed = true;
                continue;
            }
        }
        ctx.locks.set_settled(pid, p.epoch);
    }
    Ok(changed)
}

/// Asks every in-sync backup of `pid` in `state` to check its copy against
/// `digest` (sealing first when `seal`); returns the backups that differ or
/// did not answer, with why. A backup that knows a newer epoch is left out:
/// meta has moved on, and whoever leads now settles it.
async fn check_backups(
    ctx: &NodeContext,
    state: &ClusterState,
    pid: u64,
    digest: RowDigest,
    seal: bool,
) -> BTreeMap<u64, String> {
    let calls = forwards(state, ctx.node_id(), &[pid], |parts| SealRequest {
        checks: parts
            .iter()
            .map(|(p, e)| SealCheck {
                partition_id: *p,
                epoch: *e,
                rows: digest.rows,
                digest: digest.sum,
                seal,
            })
            .collect(),
        ..Default::default()
    })
    .into_iter()
    .map(|(node, req)| {
        let client = ctx.peers.node(state, node);
        async move {
            let outcome = match client {
                Ok(mut c) => {
                    let mut r = tonic::Request::new(req);
                    r.set_timeout(INSTALL_TIMEOUT);
                    forward_outcome(c.seal(r).await)
                }
                Err(e) => Forwarded::Failed(e.to_string()),
            };
            (node, outcome)
        }
    });
    let mut failed = BTreeMap::new();
    for (node, outcome) in futures::future::join_all(calls).await {
        if let Forwarded::Failed(why) = outcome {
            failed.insert(node, why);
        }
    }
    failed
}

/// Settles every partition this node leads whose epoch it has not settled
/// yet (a promotion with no write since would otherwise wait for one).
pub async fn settle_once(ctx: &Arc<NodeContext>) {
    let me = ctx.node_id();
    let state = ctx.meta.state();
    let due: Vec<u64> = state
        .partitions
        .iter()
        .filter(|p| p.replicas.first() == Some(&me))
        .filter(|p| ctx.locks.settled_at(p.id) != Some(p.epoch))
        .map(|p| p.id)
        .collect();
    for pid in due {
        let r = async {
            let _lock = ctx.locks.lock_all(&[pid]).await?;
            let state = primary_view(ctx, &[pid]).await?;
            settle(ctx, &state, &[pid]).await.map(|_| ())
        }
        .await;
        if let Err(e) = r {
            tracing::debug!(partition_id = pid, error = %e, "could not settle; will look again");
        }
    }
}

/// A write from a router: apply it here and on every in-sync backup. With a
/// batch id, partitions that have applied that batch already skip it (their
/// backups have it too: they applied it with the primary, or took the
/// primary's marks in a resync).
pub async fn primary_write(ctx: &Arc<NodeContext>, req: WriteRequest) -> Result<u64> {
    // Encoded before any lock: writes to one partition wait on each other
    // only for what must be ordered.
    let (mut req, mut rows) = crate::service::encode_write(req).await?;
    let ids: Vec<u64> = req.partitions.iter().map(|p| p.partition_id).collect();
    let me = ctx.node_id();
    // Shared when this node's view has no backup to forward to; the view
    // after the lock decides, and a write that finds backups there takes
    // the lock again, exclusively.
    let mut alone = forwards(&ctx.meta.state(), me, &ids, |_| ()).is_empty();
    let (_locks, state) = loop {
        let locks = match alone {
            true => Held::Shared {
                _guards: ctx.locks.share_all(&ids).await?,
            },
            false => Held::Sole {
                _guards: ctx.locks.lock_all(&ids).await?,
            },
        };
        let state = primary_view(ctx, &ids).await?;
        if alone && !forwards(&state, me, &ids, |_| ()).is_empty() {
            alone = false;
            continue;
        }
        break (locks, state);
    };
    let ids = if req.batch_id.is_empty() {
        ids
    } else {
        let engine = ctx.engine.clone();
        let batch_id = req.batch_id.clone();
        let done = tokio::task::spawn_blocking(move || engine.applied_batch(&batch_id, &ids))
            .await
            .map_err(|e| Error::Internal(format!("batch check task failed: {e}")))??;
        if !done.is_empty() {
            tracing::debug!(partitions = ?done, "a retried batch was applied already");
            req.partitions.retain(|p| !done.contains(&p.partition_id));
            rows.retain(|pid| !done.contains(&pid));
        }
        req.partitions.iter().map(|p| p.partition_id).collect()
    };
    if ids.is_empty() {
        return Ok(0);
    }
    // Settling compares digests with backups (none when `alone`); it can
    // only take backups out of an in-sync set, so a shared lock stays
    // enough.
    let state = match settle(ctx, &state, &ids).await? {
        true => primary_view_fresh(ctx, &ids).await?,
        false => state,
    };
    let local = crate::service::apply_write(ctx, rows, &req.batch_id, true);
    let forwarded = replicate(
        ctx,
        state,
        &ids,
        |parts| {
            let epochs: HashMap<u64, u64> = parts.iter().copied().collect();
            WriteRequest {
                table_id: req.table_id,
                columns: req.columns.clone(),
                partitions: req
                    .partitions
                    .iter()
                    .filter_map(|p| {
                        epochs.get(&p.partition_id).map(|e| {
                            let mut p = p.clone();
                            p.epoch = *e;
                            p
                        })
                    })
                    .collect(),
                replicated: true,
                batch_id: req.batch_id.clone(),
            }
        },
        |mut client, r| async move {
            let mut r = tonic::Request::new(r);
            r.set_timeout(FORWARD_TIMEOUT);
            forward_outcome(client.write(r).await)
        },
    );
    let (rows, forwarded) = futures::join!(local, forwarded);
    let rows = rows?;
    forwarded?;
    Ok(rows)
}

/// A write's partition locks, as it took them.
enum Held {
    /// No backup to forward to: concurrent writes may run.
    Shared {
        _guards: Vec<tokio::sync::OwnedRwLockReadGuard<()>>,
    },
    /// Backups apply in this node's order: one write at a time.
    Sole {
        _guards: Vec<tokio::sync::OwnedRwLockWriteGuard<()>>,
    },
}

/// A delete from a router: apply it here and on every in-sync backup.
pub async fn primary_delete(ctx: &Arc<NodeContext>, req: DeleteRequest) -> Result<u64> {
    let ids = req.partition_ids.clone();
    let _locks = ctx.locks.lock_all(&ids).await?;
    let state = settled_primary_view(ctx, &ids).await?;
    let local = crate::service::apply_delete(ctx, &req);
    let forwarded = replicate(
        ctx,
        state,
        &ids,
        |parts| DeleteRequest {
            table_id: req.table_id,
            partition_ids: parts.iter().map(|(p, _)| *p).collect(),
            predicate: req.predicate.clone(),
            replicated: true,
            epochs: parts.iter().map(|(_, e)| *e).collect(),
        },
        |mut client, r| async move {
            let mut r = tonic::Request::new(r);
            r.set_timeout(FORWARD_TIMEOUT);
            forward_outcome(client.delete(r).await)
        },
    );
    let (deleted, forwarded) = futures::join!(local, forwarded);
    let deleted = deleted?;
    forwarded?;
    Ok(deleted)
}

/// As the primary of `pid`, holding its lock, just after sealing it: has
/// every in-sync backup seal its copy to the same rows. The backups check
/// the digest of their new file before it replaces anything; one that
/// differs, or fails, leaves the in-sync set, so it resyncs from this copy.
pub async fn seal_backups(ctx: &NodeContext, state: &ClusterState, pid: u64) -> Result<()> {
    let me = ctx.node_id();
    if partition(state, pid).is_none_or(|p| p.in_sync.iter().all(|n| *n == me)) {
        return Ok(());
    }
    let digest = digest(ctx, pid).await?;
    let failed = check_backups(ctx, state, pid, digest, true).await;
    shrink_in_sync(ctx, state, &[pid], &failed).await
}

/// The columns of the table partition `pid` belongs to, by `state`.
fn table_columns(state: &ClusterState, pid: u64) -> Result<Vec<Column>> {
    partition(state, pid)
        .and_then(|p| sealion_common::catalog::table_by_id(state, p.table_id))
        .map(|t| t.columns.clone())
        .ok_or_else(|| Error::Invalid(format!("table of partition {pid} is not in the catalog")))
}

/// The digest of this node's copy of `pid`.
async fn digest(ctx: &NodeContext, pid: u64) -> Result<RowDigest> {
    let engine = ctx.engine.clone();
    let columns = table_columns(&ctx.meta.state(), pid)?;
    tokio::task::spawn_blocking(move || engine.digest(pid, &columns))
        .await
        .map_err(|e| Error::Internal(format!("digest task failed: {e}")))?
}

/// On a replica, from its primary: seals each partition of `checks` (or
/// only compares it), keeping a new file only when its rows have the
/// primary's digest. A mismatch is an error; the copy stays as it was and
/// the primary takes this node out of the in-sync set.
pub async fn seal_as_backup(ctx: &NodeContext, checks: &[SealCheck]) -> Result<Vec<SealResult>> {
    let epochs: Vec<(u64, u64)> = checks.iter().map(|c| (c.partition_id, c.epoch)).collect();
    check_backup(ctx, &epochs).await?;
    let state = ctx.meta.state();
    let mut results = Vec::with_capacity(checks.len());
    for c in checks {
        let pid = c.partition_id;
        let expected = RowDigest {
            rows: c.rows,
            sum: c.digest,
        };
        let columns = table_columns(&state, pid)?;
        let engine = ctx.engine.clone();
        let seal = c.seal;
        let outcome = tokio::task::spawn_blocking(move || -> Result<Option<SealOutcome>> {
            if seal {
                return engine.seal_expecting(pid, &columns, expected).map(Some);
            }
            let found = engine.digest(pid, &columns)?;
            if found != expected {
                return Err(Error::DigestMismatch {
                    partition_id: pid,
                    expected: expected.to_string(),
                    found: found.to_string(),
                });
            }
            Ok(None)
        })
        .await
        .map_err(|e| Error::Internal(format!("seal task failed: {e}")))?;
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(partition_id = pid, error = %e, "this copy differs from the primary's");
                return Err(e);
            }
        };
        let (name, rows, bytes) = match outcome {
            Some(o) => o.summary(),
            None => ("checked", expected.rows, 0),
        };
        tracing::info!(
            partition_id = pid,
            outcome = name,
            rows,
            "copy matches the primary's"
        );
        results.push(SealResult {
            partition_id: pid,
            outcome: name.to_string(),
            rows,
            bytes,
        });
    }
    Ok(results)
}

fn encode_ipc(batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    if let Some(first) = batches.first() {
        let mut w = StreamWriter::try_new(&mut buf, &first.schema())?;
        for b in batches {
            w.write(b)?;
        }
        w.finish()?;
    }
    Ok(buf)
}

/// On the primary: copies partition `pid` to replica `node`, which is not in
/// sync, and records it as in sync. Writes to the partition wait until the
/// copy is installed and meta has the new in-sync set.
pub async fn resync(ctx: &Arc<NodeContext>, pid: u64, node: u64) -> Result<u64> {
    let me = ctx.node_id();
    let _lock = ctx.locks.lock_all(&[pid]).await?;
    let state = primary_view_fresh(ctx, &[pid]).await?;
    let p = partition(&state, pid)
        .cloned()
        .ok_or_else(|| Error::Invalid(format!("partition {pid} is not in the partition map")))?;
    if !p.replicas.contains(&node) {
        return Err(Error::Invalid(format!(
            "storage node {node} is not a replica of partition {pid}"
        )));
    }
    if p.in_sync.contains(&node) {
        return Ok(0);
    }
    let table = sealion_common::catalog::table_by_id(&state, p.table_id)
        .ok_or_else(|| Error::Invalid(format!("table of partition {pid} is not in the catalog")))?;
    let columns: Vec<Column> = table.columns.clone();
    let mut client = ctx.peers.node(&state, node)?;

    let marks = {
        let engine = ctx.engine.clone();
        tokio::task::spawn_blocking(move || engine.batch_marks(pid))
            .await
            .map_err(|e| Error::Internal(format!("resync read task failed: {e}")))??
    };
    let marks: Vec<BatchMark> = marks
        .into_iter()
        .map(|(batch_id, applied_ms)| BatchMark {
            batch_id,
            applied_ms,
        })
        .collect();
    let clean = {
        let engine = ctx.engine.clone();
        tokio::task::spawn_blocking(move || engine.clean_sealed_file(pid))
            .await
            .map_err(|e| Error::Internal(format!("resync read task failed: {e}")))??
    };
    let copied = match clean {
        // Sealed with nothing beside the file: the file is the copy.
        Some(file) => {
            copy_file(&mut client, &p, node, file.path(), marks).await?;
            file.summary().rows
        }
        None => copy_rows(ctx, &mut client, &p, node, columns, marks).await?,
    };
    // The copy must hold this node's rows (sealed when they are sealed
    // here) before it counts as in sync.
    let expected = digest(ctx, pid).await?;
    let sealed_here = {
        let engine = ctx.engine.clone();
        tokio::task::spawn_blocking(move || engine.sealed_file(pid))
            .await
            .map_err(|e| Error::Internal(format!("resync check task failed: {e}")))??
            .is_some()
    };
    let mut r = tonic::Request::new(SealRequest {
        checks: vec![SealCheck {
            partition_id: pid,
            epoch: p.epoch,
            rows: expected.rows,
            digest: expected.sum,
            seal: sealed_here,
        }],
        ..Default::default()
    });
    r.set_timeout(INSTALL_TIMEOUT);
    client.seal(r).await.map_err(|s| {
        Error::Unavailable(format!(
            "partition {pid} on node {node} after the copy: {}",
            s.message()
        ))
    })?;
    drop(client);
    let in_sync: Vec<u64> = p
        .replicas
        .iter()
        .copied()
        .filter(|n| *n == node || p.in_sync.contains(n))
        .collect();
    let reply = ctx
        .meta
        .propose(Cmd::UpdateReplicas(UpdateReplicas {
            changes: vec![ReplicaChange {
                partition_id: pid,
                expected_epoch: p.epoch,
                replicas: p.replicas.clone(),
                in_sync,
                reason: format!("node {node} caught up from {me}"),
            }],
        }))
        .await?;
    ctx.locks.raise_floor(&reply.partitions);
    if reply.partitions.is_empty() {
        return Err(Error::Unavailable(format!(
            "partition {pid} changed while node {node} caught up; it will try again"
        )));
    }
    tracing::info!(
        partition_id = pid,
        node,
        rows = copied,
        "replica caught up and is in sync"
    );
    Ok(copied)
}

/// Copies partition `p` to `node` as rows (sealed, late and open, deletes
/// applied), in chunks read while the chunks before go out. The first chunk
/// clears the replica's copy. Returns the rows sent.
async fn copy_rows(
    ctx: &NodeContext,
    client: &mut StorageClient<Channel>,
    p: &Partition,
    node: u64,
    columns: Vec<Column>,
    mut marks: Vec<BatchMark>,
) -> Result<u64> {
    let pid = p.id;
    let scan = ScanRequest {
        table_id: p.table_id,
        partition_ids: vec![pid],
        start_ns: i64::MIN,
        end_ns: i64::MAX,
        projection: columns.clone(),
        table_columns: columns.clone(),
        ..Default::default()
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<RecordBatch>>(2);
    let engine = ctx.engine.clone();
    let reader = tokio::task::spawn_blocking(move || -> Result<()> {
        let mut chunk: Vec<RecordBatch> = Vec::new();
        let mut rows = 0;
        engine.scan(&scan, |batch| {
            rows += batch.num_rows();
            chunk.push(batch);
            if rows >= INSTALL_CHUNK_ROWS {
                rows = 0;
                return tx.blocking_send(std::mem::take(&mut chunk)).is_ok();
            }
            true
        })?;
        if !chunk.is_empty() {
            let _ = tx.blocking_send(chunk);
        }
        Ok(())
    });
    let mut copied = 0u64;
    let mut first = true;
    loop {
        let batches = match rx.recv().await {
            Some(b) => b,
            // An empty partition still makes the replica drop what it had.
            None if first => Vec::new(),
            None => break,
        };
        copied += batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
        let mut r = tonic::Request::new(InstallRequest {
            table_id: p.table_id,
            partition_id: pid,
            columns: columns.clone(),
            reset: first,
            arrow_ipc: encode_ipc(&batches)?,
            epoch: p.epoch,
            batch_marks: std::mem::take(&mut marks),
            ..Default::default()
        });
        r.set_timeout(INSTALL_TIMEOUT);
        client.install(r).await.map_err(|s| {
            Error::Unavailable(format!(
                "installing partition {pid} on node {node}: {}",
                s.message()
            ))
        })?;
        first = false;
    }
    reader
        .await
        .map_err(|e| Error::Internal(format!("resync read task failed: {e}")))??;
    Ok(copied)
}

/// Bytes of a sealed file per `Install` message.
const FILE_CHUNK_BYTES: usize = 4 << 20;

/// Copies partition `p` to `node` as its sealed file at `path`: the bytes
/// in order, then the length and CRC32C, which the replica checks before
/// the file replaces its copy. Returns the rows the file holds.
async fn copy_file(
    client: &mut StorageClient<Channel>,
    p: &Partition,
    node: u64,
    path: &std::path::Path,
    marks: Vec<BatchMark>,
) -> Result<()> {
    let pid = p.id;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(2);
    let path = path.to_path_buf();
    let reader = tokio::task::spawn_blocking(move || -> Result<(u64, u32)> {
        use std::io::Read;
        let mut f = std::fs::File::open(&path)?;
        let (mut len, mut crc) = (0u64, 0u32);
        loop {
            let mut buf = vec![0u8; FILE_CHUNK_BYTES];
            let mut filled = 0;
            while filled < buf.len() {
                let n = f.read(&mut buf[filled..])?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            if filled == 0 {
                break;
            }
            buf.truncate(filled);
            crc = crc32c::crc32c_append(crc, &buf);
            len += filled as u64;
            if tx.blocking_send(buf).is_err() {
                break;
            }
        }
        Ok((len, crc))
    });
    let mut offset = 0u64;
    let send = |client: &mut StorageClient<Channel>, req: InstallRequest| {
        let mut r = tonic::Request::new(req);
        r.set_timeout(INSTALL_TIMEOUT);
        let mut client = client.clone();
        async move {
            client.install(r).await.map_err(|s| {
                Error::Unavailable(format!(
                    "installing the sealed file of partition {pid} on node {node}: {}",
                    s.message()
                ))
            })
        }
    };
    while let Some(chunk) = rx.recv().await {
        let n = chunk.len() as u64;
        send(
            client,
            InstallRequest {
                table_id: p.table_id,
                partition_id: pid,
                reset: offset == 0,
                epoch: p.epoch,
                sealed_file: chunk,
                file_offset: offset,
                ..Default::default()
            },
        )
        .await?;
        offset += n;
    }
    let (len, crc) = reader
        .await
        .map_err(|e| Error::Internal(format!("resync read task failed: {e}")))??;
    if len != offset {
        return Err(Error::Internal(format!(
            "read {len} bytes of partition {pid}'s file but sent {offset}"
        )));
    }
    send(
        client,
        InstallRequest {
            table_id: p.table_id,
            partition_id: pid,
            epoch: p.epoch,
            batch_marks: marks,
            file_done: true,
            file_len: len,
            file_crc32c: crc,
            file_offset: offset,
            ..Default::default()
        },
    )
    .await?;
    Ok(())
}

/// On a replica that is not in sync: replaces its copy of the partition with
/// the rows the primary sends. Refused on an in-sync replica, whose copy is
/// authoritative, and for an epoch other than the current one.
pub async fn install(ctx: &Arc<NodeContext>, req: InstallRequest) -> Result<()> {
    let me = ctx.node_id();
    let pid = req.partition_id;
    check_backup(ctx, &[(pid, req.epoch)]).await?;
    // Meta's own view: the local one may still show this node in sync from
    // before it went away.
    let state = ctx.meta.get_state(true).await?.state.unwrap_or_default();
    if partition(&state, pid).is_some_and(|p| p.in_sync.contains(&me)) {
        return Err(Error::Invalid(format!(
            "node {me} is in sync for partition {pid}; its copy is not replaced"
        )));
    }
    if !req.sealed_file.is_empty() || req.file_done {
        return install_file(ctx, req).await;
    }
    // An empty partition comes as one chunk with no IPC stream at all.
    let batches = if req.arrow_ipc.is_empty() {
        Vec::new()
    } else {
        crate::service::decode_ipc(&req.arrow_ipc)?
    };
    crate::service::check_columns(&ctx.meta.state(), req.table_id, &req.columns)?;
    let engine = ctx.engine.clone();
    let columns = req.columns;
    let reset = req.reset;
    let marks: Vec<(Vec<u8>, u64)> = req
        .batch_marks
        .into_iter()
        .map(|m| (m.batch_id, m.applied_ms))
        .collect();
    tokio::task::spawn_blocking(move || -> Result<()> {
        if reset {
            engine.drop_partitions(&[pid])?;
        }
        engine.record_batch_marks(pid, &marks)?;
        if !batches.is_empty() {
            engine.write(&columns, &[(pid, batches)])?;
        }
        Ok(())
    })
    .await
    .map_err(|e| Error::Internal(format!("install task failed: {e}")))??;
    if reset {
        ctx.forget_published(pid);
    }
    Ok(())
}

/// The file part of `install`: stores a chunk, or, on the last message,
/// checks the file and puts it in place of this node's copy.
async fn install_file(ctx: &Arc<NodeContext>, req: InstallRequest) -> Result<()> {
    let pid = req.partition_id;
    let engine = ctx.engine.clone();
    let marks: Vec<(Vec<u8>, u64)> = req
        .batch_marks
        .into_iter()
        .map(|m| (m.batch_id, m.applied_ms))
        .collect();
    let done = req.file_done;
    let rows = tokio::task::spawn_blocking(move || -> Result<Option<u64>> {
        if !req.sealed_file.is_empty() {
            engine.receive_sealed_chunk(pid, req.file_offset, &req.sealed_file)?;
        }
        if !done {
            return Ok(None);
        }
        let rows = engine.install_sealed(pid, req.file_len, req.file_crc32c)?;
        engine.record_batch_marks(pid, &marks)?;
        Ok(Some(rows))
    })
    .await
    .map_err(|e| Error::Internal(format!("install task failed: {e}")))??;
    if let Some(rows) = rows {
        ctx.forget_published(pid);
        tracing::info!(
            partition_id = pid,
            rows,
            "installed a sealed file copied from the primary"
        );
    }
    Ok(())
}

/// Asks the primary of every partition this node holds out of sync to
/// resync it, one partition at a time.
pub async fn catch_up_once(ctx: &Arc<NodeContext>) -> usize {
    let me = ctx.node_id();
    let state = ctx.meta.state();
    let lagging: Vec<(u64, u64)> = state
        .partitions
        .iter()
        .filter(|p| p.replicas.contains(&me) && !p.in_sync.contains(&me))
        .filter_map(|p| p.replicas.first().map(|primary| (p.id, *primary)))
        .collect();
    let mut done = 0;
    for (pid, primary) in lagging {
        let Ok(mut client) = ctx.peers.node(&state, primary) else {
            continue;
        };
        match client
            .resync(ResyncRequest {
                partition_id: pid,
                node_id: me,
            })
            .await
        {
            Ok(r) => {
                done += 1;
                tracing::info!(
                    partition_id = pid,
                    primary,
                    rows = r.into_inner().rows_copied,
                    "caught up"
                );
            }
            Err(s) => {
                tracing::info!(partition_id = pid, primary, error = %s.message(), "catch-up failed; will retry");
            }
        }
    }
    done
}
