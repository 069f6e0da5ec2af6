//! Routing rows to the storage nodes that hold their partitions.
//!
//! A batch is split by time partition; partitions that do not exist yet are
//! created through meta (which places them); rows then go, per node, in one
//! request each, all nodes in parallel. The call returns only when every
//! node has acknowledged, and each node acknowledges only after its write is
//! synced. A node that cannot be reached fails the call with `Unavailable`:
//! rows are never dropped silently. Writing the same rows again is safe
//! (a row is unique by series and time), so a client may retry the call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, TimestampNanosecondArray, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use arrow_flight::flight_service_client::FlightServiceClient;
use futures::FutureExt;
use sealion_common::catalog::time_column;
use sealion_common::local::LocalStorage;
use sealion_common::meta_client::MetaClient;
use sealion_common::proto::meta_command::Cmd;
use sealion_common::proto::storage_client::StorageClient;
use sealion_common::proto::{
    ColumnKind, EnsurePartitions, Partition, PartitionRows, Table, WriteRequest,
};
use sealion_common::time::{partition_end, partition_start};
use tonic::transport::Channel;

use crate::{Error, Result};

/// Largest gRPC message exchanged with storage nodes.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Rounds of routing a write again after a node said it is not the primary.
const WRITE_ROUTE_ATTEMPTS: u32 = 4;

/// gRPC clients of storage nodes, over one channel per address; and the
/// storage node in this process, if any, whose scans are called directly.
#[derive(Default)]
pub struct StorageClients {
    channels: sealion_common::channels::Channels,
    local: Option<LocalStorage>,
}

impl StorageClients {
    /// Clients that reach the storage node advertised as `local.addr`
    /// by a call for scans.
    pub fn with_local(local: Option<LocalStorage>) -> Self {
        StorageClients {
            channels: Default::default(),
            local,
        }
    }

    /// The storage node in this process, when it is the one at `addr`.
    pub fn local(&self, addr: &str) -> Option<&LocalStorage> {
        self.local.as_ref().filter(|l| l.addr == addr)
    }

    fn channel(&self, addr: &str) -> Result<Channel> {
        self.channels
            .channel(addr)
            .map_err(|e| Error::Internal(e.to_string()))
    }

    pub fn storage(&self, addr: &str) -> Result<StorageClient<Channel>> {
        Ok(StorageClient::new(self.channel(addr)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    pub fn flight(&self, addr: &str) -> Result<FlightServiceClient<Channel>> {
        Ok(FlightServiceClient::new(self.channel(addr)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }
}

pub struct WriteRouter {
    pub meta: Arc<MetaClient>,
    pub storage: Arc<StorageClients>,
}

fn encode_ipc(batch: &RecordBatch) -> Result<Vec<u8>> {
    // About the batch's size at once, rather than grown (and copied) by
    // doubling.
    let mut buf = Vec::with_capacity(batch.get_array_memory_size() + 1024);
    {
        let mut w = StreamWriter::try_new(&mut buf, &batch.schema())?;
        w.write(batch)?;
        w.finish()?;
    }
    Ok(buf)
}

/// Partitions that end at or before this time are past `table`'s retention
/// (`i64::MIN` when the table keeps everything).
pub fn retention_cutoff_ns(table: &Table, now_ns: i64) -> i64 {
    if table.retention_ns > 0 {
        now_ns.saturating_sub(table.retention_ns)
    } else {
        i64::MIN
    }
}

/// Which shard each row of a batch belongs to: a hash of its series key
/// (its non-null tags), as `sealion_format::rows::series_shard` defines it.
struct ShardOf<'a> {
    shards: u32,
    /// The batch's tag columns as text, with their names.
    tags: Vec<(&'a str, arrow::array::StringArray)>,
}

impl<'a> ShardOf<'a> {
    fn new(table: &'a Table, batch: &RecordBatch) -> Result<Self> {
        let shards = sealion_common::catalog::table_shards(table);
        let mut tags = Vec::new();
        if shards > 1 {
            for c in table.columns.iter().filter(|c| c.kind() == ColumnKind::Tag) {
                if let Some(array) = batch.column_by_name(&c.name) {
                    let text = arrow::compute::cast(array, &arrow::datatypes::DataType::Utf8)?;
                    let text = text
                        .as_any()
                        .downcast_ref::<arrow::array::StringArray>()
                        .ok_or_else(|| {
                            Error::Internal(format!("tag column {} is not text", c.name))
                        })?
                        .clone();
                    tags.push((c.name.as_str(), text));
                }
            }
        }
        Ok(ShardOf { shards, tags })
    }

    fn row(&self, i: usize) -> Result<u32> {
        if self.shards <= 1 {
            return Ok(0);
        }
        let tags: Vec<(&str, &str)> = self
            .tags
            .iter()
            .filter(|(_, strings)| !strings.is_null(i))
            .map(|(name, strings)| (*name, strings.value(i)))
            .collect();
        let series = sealion_format::rows::encode_series(&tags)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        Ok(sealion_format::rows::series_shard(&series, self.shards))
    }
}

impl WriteRouter {
    /// Writes `batch`, whose columns are named after `table`'s columns and
    /// include its time column. Returns the number of rows written.
    pub async fn write(&self, table: &Table, batch: RecordBatch) -> Result<u64> {
        self.write_batch(table, batch, &[]).await
    }

    /// [`WriteRouter::write`] of a batch the client named `batch_id` (empty
    /// for none): a partition that has applied a batch of that id skips it,
    /// so a client retrying an unanswered write gets it applied once.
    pub async fn write_batch(
        &self,
        table: &Table,
        batch: RecordBatch,
        batch_id: &[u8],
    ) -> Result<u64> {
        if batch.num_rows() == 0 {
            return Ok(0);
        }
        let time_name = time_column(table)
            .map(|c| c.name.clone())
            .ok_or_else(|| Error::Internal(format!("table {} has no time column", table.name)))?;
        let times = batch
            .column_by_name(&time_name)
            .and_then(|a| a.as_any().downcast_ref::<TimestampNanosecondArray>())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "rows for {} have no {time_name} column",
                    table.name
                ))
            })?;
        let interval = table.partition_interval_ns;
        let cutoff = retention_cutoff_ns(
            table,
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX),
        );
        let shard_of = ShardOf::new(table, &batch)?;
        let mut rows_by_key: BTreeMap<(i64, u32), Vec<u32>> = BTreeMap::new();
        for i in 0..times.len() {
            if times.is_null(i) {
                return Err(Error::Invalid(format!(
                    "row {} has no value for {time_name}",
                    i + 1
                )));
            }
            let t = times.value(i);
            let start = partition_start(t, interval)
                .ok_or_else(|| Error::Invalid(format!("timestamp {t} is out of range")))?;
            if partition_end(start, interval) <= cutoff {
                return Err(Error::Invalid(format!(
                    "row {} has time {t} ns, older than the retention of table {}",
                    i + 1,
                    table.name
                )));
            }
            rows_by_key
                .entry((start, shard_of.row(i)?))
                .or_default()
                .push(i as u32);
        }
        let mut starts: Vec<i64> = rows_by_key.keys().map(|(s, _)| *s).collect();
        starts.dedup();
        let partitions = self.partitions_for(table, starts).await?;

        let mut pending: Vec<PartitionRows> = Vec::with_capacity(rows_by_key.len());
        for ((start, shard), rows) in rows_by_key {
            let p = partitions
                .iter()
                .find(|p| p.start_ns == start && p.shard == shard)
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "meta returned no partition for start {start}, shard {shard}"
                    ))
                })?;
            // A batch that lies in one partition (the usual case) goes as
            // it is.
            let part = if rows.len() == batch.num_rows() {
                batch.clone()
            } else {
                take_record_batch(&batch, &UInt32Array::from(rows))?
            };
            pending.push(PartitionRows {
                partition_id: p.id,
                arrow_ipc: encode_ipc(&part)?,
                epoch: 0,
            });
        }
        // Each partition's rows go to its primary, which replicates them. A
        // node that is no longer the primary (meta moved it since this
        // node's view) refuses; those rows are routed again by meta's latest
        // state, a few times at most.
        let mut state = self.meta.state();
        let mut written = 0;
        for attempt in 0..WRITE_ROUTE_ATTEMPTS {
            let (w, refused) = self
                .send_to_primaries(&state, table, pending, batch_id)
                .await?;
            written += w;
            if refused.is_empty() {
                metrics::counter!("sealion_query_rows_routed_total").increment(written);
                return Ok(written);
            }
            pending = refused;
            if attempt + 1 < WRITE_ROUTE_ATTEMPTS {
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                state = Arc::new(self.meta.get_state(true).await?.state.unwrap_or_default());
            }
        }
        Err(Error::Unavailable(format!(
            "partitions {:?} of table {} have no primary that takes writes; retry later",
            pending.iter().map(|p| p.partition_id).collect::<Vec<_>>(),
            table.name
        )))
    }

    /// Sends each partition's rows to its primary in `state`, all nodes in
    /// parallel. Returns the rows written and the partitions a node refused
    /// because it is not (or no longer) their primary.
    async fn send_to_primaries(
        &self,
        state: &sealion_common::proto::ClusterState,
        table: &Table,
        parts: Vec<PartitionRows>,
        batch_id: &[u8],
    ) -> Result<(u64, Vec<PartitionRows>)> {
        let mut by_node: BTreeMap<u64, Vec<PartitionRows>> = BTreeMap::new();
        for part in parts {
            let p = state
                .partitions
                .iter()
                .find(|p| p.id == part.partition_id)
                .ok_or_else(|| {
                    Error::Unavailable(format!(
                        "partition {} is not in the partition map",
                        part.partition_id
                    ))
                })?;
            let primary = *p
                .replicas
                .first()
                .ok_or_else(|| Error::Unavailable(format!("partition {} has no replica", p.id)))?;
            by_node.entry(primary).or_default().push(part);
        }
        let columns = table.columns.clone();
        let mut calls = Vec::with_capacity(by_node.len());
        for (node_id, parts) in by_node {
            let addr = sealion_common::catalog::node(state, node_id)
                .map(|n| n.addr.clone())
                .ok_or_else(|| Error::Unavailable(format!("storage node {node_id} is unknown")))?;
            let req = WriteRequest {
                table_id: table.id,
                columns: columns.clone(),
                partitions: parts.clone(),
                replicated: false,
                batch_id: batch_id.to_vec(),
            };
            let sent = match self.storage.local(&addr) {
                // The storage node of this process: the same call, without
                // its transport. Spawned, so that the write runs to its end
                // (and holds its partitions' locks that long) even when the
                // client that asked for it goes away.
                Some(local) => {
                    let write = tokio::spawn(local.writes.write(req));
                    async move {
                        match tokio::time::timeout(WRITE_TIMEOUT, write).await {
                            Ok(Ok(r)) => r,
                            Ok(Err(e)) => Err(tonic::Status::internal(format!(
                                "the write task failed: {e}"
                            ))),
                            Err(_) => Err(tonic::Status::deadline_exceeded(
                                "the write took longer than its timeout",
                            )),
                        }
                    }
                    .boxed()
                }
                None => {
                    let mut client = self.storage.storage(&addr)?;
                    let mut req = tonic::Request::new(req);
                    req.set_timeout(WRITE_TIMEOUT);
                    async move { client.write(req).await.map(|r| r.into_inner().rows_written) }
                        .boxed()
                }
            };
            calls.push(async move {
                match sent.await {
                    Ok(rows) => Ok((rows, Vec::new())),
                    Err(status) => match status.code() {
                        tonic::Code::InvalidArgument => {
                            Err(Error::Invalid(status.message().to_string()))
                        }
                        tonic::Code::FailedPrecondition => Ok((0, parts)),
                        _ => Err(Error::Unavailable(format!(
                            "storage node {node_id} at {addr} did not store the write: {}",
                            status.message()
                        ))),
                    },
                }
            });
        }
        let mut written = 0;
        let mut refused = Vec::new();
        let mut first_error = None;
        for r in futures::future::join_all(calls).await {
            match r {
                Ok((w, mut back)) => {
                    written += w;
                    refused.append(&mut back);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok((written, refused)),
        }
    }

    /// The partitions of `table` that start at `starts`, created if missing.
    /// When one of them holds the present, the one after it is created too,
    /// ahead of the data: writes crossing into the next interval find it
    /// placed. (Only a write does this, so a table nobody writes stops
    /// growing partitions.)
    async fn partitions_for(&self, table: &Table, starts: Vec<i64>) -> Result<Vec<Partition>> {
        let now_ns = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX);
        let mut wanted = starts.clone();
        for s in &starts {
            let end = partition_end(*s, table.partition_interval_ns);
            if *s <= now_ns && now_ns < end && end < i64::MAX && !wanted.contains(&end) {
                wanted.push(end);
            }
        }
        let state = self.meta.state();
        let present = |p: &Partition| p.table_id == table.id && wanted.contains(&p.start_ns);
        let shards = sealion_common::catalog::table_shards(table) as usize;
        if state.partitions.iter().filter(|p| present(p)).count() == wanted.len() * shards {
            return Ok(state
                .partitions
                .iter()
                .filter(|p| p.table_id == table.id && starts.contains(&p.start_ns))
                .cloned()
                .collect());
        }
        let reply = self
            .meta
            .propose(Cmd::EnsurePartitions(EnsurePartitions {
                table_id: table.id,
                starts_ns: wanted,
                placements: vec![],
            }))
            .await?;
        Ok(reply
            .partitions
            .into_iter()
            .filter(|p| starts.contains(&p.start_ns))
            .collect())
    }
}
