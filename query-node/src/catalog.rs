//! DataFusion's view of the catalog in meta.
//!
//! Databases are DataFusion schemas of one catalog, `sealion`; tables are
//! looked up in the meta client's local copy of the cluster state at plan
//! time, so a table created through any query node is visible to all of them
//! as soon as the watch stream delivers it. The `system` schema holds tables
//! computed from the cluster state (and from storage nodes, for sizes).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow::array::{
    ArrayRef, BooleanArray, Int64Array, StringArray, TimestampNanosecondArray, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider};
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::error::{DataFusionError, Result as DfResult};
use sealion_common::catalog::{find_table, has_database, kind_name, type_name};
use sealion_common::meta_client::MetaClient;
use sealion_common::proto::{NodeState, PartitionStatsRequest};

use crate::router::{StorageClients, WriteRouter};
use crate::table::SealionTable;

pub const CATALOG: &str = "sealion";
pub const SYSTEM_SCHEMA: &str = "system";

#[derive(Clone)]
pub struct Shared {
    pub meta: Arc<MetaClient>,
    pub storage: Arc<StorageClients>,
    pub router: Arc<WriteRouter>,
}

pub struct SealionCatalog {
    shared: Shared,
    /// Schemas that DataFusion extensions register (pg_catalog).
    extra: RwLock<HashMap<String, Arc<dyn SchemaProvider>>>,
}

impl std::fmt::Debug for SealionCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealionCatalog")
    }
}

impl SealionCatalog {
    pub fn new(shared: Shared) -> Self {
        SealionCatalog {
            shared,
            extra: RwLock::new(HashMap::new()),
        }
    }
}

impl CatalogProvider for SealionCatalog {
    fn schema_names(&self) -> Vec<String> {
        let state = self.shared.meta.state();
        let mut names: Vec<String> = state.databases.iter().map(|d| d.name.clone()).collect();
        names.push(SYSTEM_SCHEMA.to_string());
        if let Ok(extra) = self.extra.read() {
            names.extend(extra.keys().cloned());
        }
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if name == SYSTEM_SCHEMA {
            return Some(Arc::new(SystemSchema {
                shared: self.shared.clone(),
            }));
        }
        if let Some(s) = self.extra.read().ok().and_then(|m| m.get(name).cloned()) {
            return Some(s);
        }
        let state = self.shared.meta.state();
        if has_database(&state, name) {
            return Some(Arc::new(DatabaseSchema {
                database: name.to_string(),
                shared: self.shared.clone(),
            }));
        }
        None
    }

    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> DfResult<Option<Arc<dyn SchemaProvider>>> {
        let mut extra = self
            .extra
            .write()
            .map_err(|_| DataFusionError::Internal("schema map poisoned".into()))?;
        Ok(extra.insert(name.to_string(), schema))
    }
}

pub struct DatabaseSchema {
    database: String,
    shared: Shared,
}

impl std::fmt::Debug for DatabaseSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseSchema({})", self.database)
    }
}

#[async_trait]
impl SchemaProvider for DatabaseSchema {
    fn table_names(&self) -> Vec<String> {
        let state = self.shared.meta.state();
        state
            .tables
            .iter()
            .filter(|t| t.database == self.database)
            .map(|t| t.name.clone())
            .collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let state = self.shared.meta.state();
        Ok(find_table(&state, &self.database, name).map(|t| {
            Arc::new(SealionTable::new(
                t.clone(),
                self.shared.meta.clone(),
                self.shared.storage.clone(),
                self.shared.router.clone(),
            )) as Arc<dyn TableProvider>
        }))
    }

    fn table_exist(&self, name: &str) -> bool {
        find_table(&self.shared.meta.state(), &self.database, name).is_some()
    }
}

pub struct SystemSchema {
    shared: Shared,
}

impl std::fmt::Debug for SystemSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SystemSchema")
    }
}

const SYSTEM_TABLES: [&str; 3] = ["nodes", "tables", "partitions"];

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
}

fn mem(fields: Vec<Field>, columns: Vec<ArrayRef>) -> DfResult<Arc<dyn TableProvider>> {
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn table_names(&self) -> Vec<String> {
        SYSTEM_TABLES.iter().map(|s| s.to_string()).collect()
    }

    fn table_exist(&self, name: &str) -> bool {
        SYSTEM_TABLES.contains(&name)
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        match name {
            "nodes" => self.nodes().await.map(Some),
            "tables" => self.tables().map(Some),
            "partitions" => self.partitions().await.map(Some),
            _ => Ok(None),
        }
    }
}

impl SystemSchema {
    async fn nodes(&self) -> DfResult<Arc<dyn TableProvider>> {
        // Liveness is known to the meta leader only.
        let reply = self
            .shared
            .meta
            .get_state(true)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let state = reply.state.unwrap_or_default();
        let mut ids = Vec::new();
        let mut addrs = Vec::new();
        let mut states = Vec::new();
        let mut beats = Vec::new();
        let mut counts = Vec::new();
        for n in &state.nodes {
            let live = reply.liveness.iter().find(|l| l.node_id == n.id);
            ids.push(n.id);
            addrs.push(n.addr.clone());
            states.push(match live.map(|l| l.state()) {
                Some(NodeState::Up) => "up",
                Some(NodeState::Down) => "down",
                _ => "unknown",
            });
            beats.push(
                live.map(|l| l.last_heartbeat_ms.saturating_mul(1_000_000))
                    .filter(|v| *v > 0),
            );
            counts.push(
                state
                    .partitions
                    .iter()
                    .filter(|p| p.replicas.contains(&n.id))
                    .count() as u64,
            );
        }
        mem(
            vec![
                Field::new("node_id", DataType::UInt64, false),
                Field::new("role", DataType::Utf8, false),
                Field::new("addr", DataType::Utf8, false),
                Field::new("state", DataType::Utf8, false),
                Field::new("last_heartbeat", ts_type(), true),
                Field::new("partitions", DataType::UInt64, false),
            ],
            vec![
                Arc::new(UInt64Array::from(ids)),
                Arc::new(StringArray::from(vec!["storage"; state.nodes.len()])),
                Arc::new(StringArray::from(addrs)),
                Arc::new(StringArray::from(states)),
                Arc::new(TimestampNanosecondArray::from(beats).with_timezone("UTC")),
                Arc::new(UInt64Array::from(counts)),
            ],
        )
    }

    fn tables(&self) -> DfResult<Arc<dyn TableProvider>> {
        let state = self.shared.meta.state();
        let t = &state.tables;
        let describe = |tb: &sealion_common::proto::Table| {
            tb.columns
                .iter()
                .map(|c| {
                    format!(
                        "{} {} {}",
                        c.name,
                        type_name(c.data_type()),
                        kind_name(c.kind())
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        mem(
            vec![
                Field::new("database", DataType::Utf8, false),
                Field::new("table_name", DataType::Utf8, false),
                Field::new("table_id", DataType::UInt64, false),
                Field::new("columns", DataType::Utf8, false),
                Field::new("partition_interval_ns", DataType::Int64, false),
                Field::new("retention_ns", DataType::Int64, false),
                Field::new("shards", DataType::UInt32, false),
                // Null: the cluster's --replication-factor.
                Field::new("replication_factor", DataType::UInt32, true),
                Field::new("partitions", DataType::UInt64, false),
            ],
            vec![
                Arc::new(StringArray::from_iter_values(
                    t.iter().map(|x| x.database.clone()),
                )),
                Arc::new(StringArray::from_iter_values(
                    t.iter().map(|x| x.name.clone()),
                )),
                Arc::new(UInt64Array::from_iter_values(t.iter().map(|x| x.id))),
                Arc::new(StringArray::from_iter_values(t.iter().map(describe))),
                Arc::new(Int64Array::from_iter_values(
                    t.iter().map(|x| x.partition_interval_ns),
                )),
                Arc::new(Int64Array::from_iter_values(
                    t.iter().map(|x| x.retention_ns),
                )),
                Arc::new(arrow::array::UInt32Array::from_iter_values(
                    t.iter().map(|x| x.shards.max(1)),
                )),
                Arc::new(arrow::array::UInt32Array::from_iter(t.iter().map(|x| {
                    (x.replication_factor > 0).then_some(x.replication_factor)
                }))),
                Arc::new(UInt64Array::from_iter_values(t.iter().map(|x| {
                    state
                        .partitions
                        .iter()
                        .filter(|p| p.table_id == x.id)
                        .count() as u64
                }))),
            ],
        )
    }

    /// One row per (partition, replica). Rows and bytes come from the
    /// storage node holding the replica; they are null when it cannot be
    /// reached.
    async fn partitions(&self) -> DfResult<Arc<dyn TableProvider>> {
        let state = self.shared.meta.state();
        // Ask every node for the stats of the partitions it holds.
        let mut wanted: HashMap<u64, Vec<u64>> = HashMap::new();
        for p in &state.partitions {
            for n in &p.replicas {
                wanted.entry(*n).or_default().push(p.id);
            }
        }
        let mut calls = Vec::new();
        for (node_id, ids) in wanted {
            let addr = sealion_common::catalog::node(&state, node_id).map(|n| n.addr.clone());
            let storage = self.shared.storage.clone();
            calls.push(async move {
                let Some(addr) = addr else {
                    return (node_id, None);
                };
                let Ok(mut client) = storage.storage(&addr) else {
                    return (node_id, None);
                };
                let mut req = tonic::Request::new(PartitionStatsRequest { partition_ids: ids });
                req.set_timeout(std::time::Duration::from_secs(5));
                (
                    node_id,
                    client.stats(req).await.ok().map(|r| r.into_inner().stats),
                )
            });
        }
        let mut stats: HashMap<(u64, u64), sealion_common::proto::PartitionStats> = HashMap::new();
        for (node_id, reply) in futures::future::join_all(calls).await {
            for s in reply.unwrap_or_default() {
                stats.insert((node_id, s.partition_id), s);
            }
        }
        let mut db = Vec::new();
        let mut table = Vec::new();
        let mut pid = Vec::new();
        let mut start = Vec::new();
        let mut end = Vec::new();
        let mut node = Vec::new();
        let mut role = Vec::new();
        let mut in_sync = Vec::new();
        let mut epoch = Vec::new();
        let mut pstate = Vec::new();
        let mut rows = Vec::new();
        let mut bytes = Vec::new();
        let mut late = Vec::new();
        let mut deleted = Vec::new();
        let mut shard = Vec::new();
        let mut filter_bytes = Vec::new();
        let mut parts: Vec<_> = state.partitions.iter().collect();
        parts.sort_by_key(|p| (p.table_id, p.start_ns, p.shard));
        for p in parts {
            let Some(t) = sealion_common::catalog::table_by_id(&state, p.table_id) else {
                continue;
            };
            for (i, n) in p.replicas.iter().enumerate() {
                db.push(t.database.clone());
                table.push(t.name.clone());
                pid.push(p.id);
                start.push(p.start_ns);
                end.push(p.end_ns);
                shard.push(i64::from(p.shard));
                node.push(*n);
                role.push(if i == 0 { "primary" } else { "backup" });
                in_sync.push(p.in_sync.contains(n));
                epoch.push(p.epoch);
                pstate.push(match p.state() {
                    sealion_common::proto::PartitionState::Sealing => "sealing",
                    sealion_common::proto::PartitionState::Sealed => "sealed",
                    _ => "open",
                });
                let s = stats.get(&(*n, p.id));
                rows.push(s.map(|s| s.rows));
                bytes.push(s.map(|s| s.bytes));
                late.push(s.map(|s| s.late_rows));
                deleted.push(s.map(|s| s.deleted_rows));
                filter_bytes.push(p.tag_filters.len() as u64);
            }
        }
        let n = db.len();
        mem(
            vec![
                Field::new("database", DataType::Utf8, false),
                Field::new("table_name", DataType::Utf8, false),
                Field::new("partition_id", DataType::UInt64, false),
                Field::new("start", ts_type(), false),
                Field::new("end", ts_type(), false),
                Field::new("shard", DataType::Int64, false),
                Field::new("node_id", DataType::UInt64, false),
                Field::new("role", DataType::Utf8, false),
                Field::new("in_sync", DataType::Boolean, false),
                Field::new("epoch", DataType::UInt64, false),
                Field::new("state", DataType::Utf8, false),
                Field::new("rows", DataType::UInt64, true),
                Field::new("bytes", DataType::UInt64, true),
                Field::new("late_rows", DataType::UInt64, true),
                Field::new("deleted_rows", DataType::UInt64, true),
                Field::new("reachable", DataType::Boolean, false),
                Field::new("tag_filter_bytes", DataType::UInt64, false),
            ],
            vec![
                Arc::new(StringArray::from(db)),
                Arc::new(StringArray::from(table)),
                Arc::new(UInt64Array::from(pid)),
                Arc::new(TimestampNanosecondArray::from(start).with_timezone("UTC")),
                Arc::new(TimestampNanosecondArray::from(end).with_timezone("UTC")),
                Arc::new(Int64Array::from(shard)),
                Arc::new(UInt64Array::from(node)),
                Arc::new(StringArray::from(role)),
                Arc::new(BooleanArray::from(in_sync)),
                Arc::new(UInt64Array::from(epoch)),
                Arc::new(StringArray::from(pstate)),
                Arc::new(UInt64Array::from(rows.clone())),
                Arc::new(UInt64Array::from(bytes)),
                Arc::new(UInt64Array::from(late)),
                Arc::new(UInt64Array::from(deleted)),
                Arc::new(BooleanArray::from(
                    (0..n).map(|i| rows[i].is_some()).collect::<Vec<_>>(),
                )),
                Arc::new(UInt64Array::from(filter_bytes)),
            ],
        )
    }
}
