//! The replicated state machine's logic: how one `MetaCommand` changes a
//! `ClusterState`.
//!
//! This module exists so the rules of the catalog, node membership and the
//! partition map can be read and tested without Raft, RocksDB or a network.
//! Every replica runs `apply` on the same commands in the same order, so it
//! must be deterministic: it must never read the clock, the environment or
//! anything but its arguments (placement and timestamps are chosen by the
//! leader *before* proposing and carried in the command). A command that is
//! refused leaves the state exactly as it was, apart from `version`.

use std::collections::{BTreeMap, BTreeSet};

use sealion_common::catalog::{
    DEFAULT_DATABASE, TIME_COLUMN, find_table, kind_name, type_name, validate_name,
};
use sealion_common::time::{DEFAULT_PARTITION_INTERVAL_NS, partition_end};
use sealion_proto::{
    AddColumns, ClusterState, Column, ColumnKind, CreateDatabase, CreateTable, DataType, Database,
    DropDatabase, DropTable, EnsurePartitions, ExpirePartitions, MetaCommand, MetaResponse,
    Partition, PartitionState, RegisterNode, SetPartitionState, StorageNode, Table, UpdateReplicas,
    meta_command::Cmd,
};

/// Error kinds carried in `MetaResponse.error_kind`; clients match on them.
pub mod kind {
    pub const NOT_FOUND: &str = "not_found";
    pub const ALREADY_EXISTS: &str = "already_exists";
    pub const CONFLICT: &str = "conflict";
    pub const INVALID: &str = "invalid";
    /// No storage node can take a new partition (set by the leader, before
    /// proposing; never by `apply`).
    pub const UNAVAILABLE: &str = "unavailable";
}

/// The state of a cluster that has applied nothing: the default database
/// exists and every id counter starts at 1 (0 means "unassigned").
pub fn initial_state() -> ClusterState {
    ClusterState {
        version: 0,
        databases: vec![Database {
            name: DEFAULT_DATABASE.to_string(),
        }],
        tables: vec![],
        nodes: vec![],
        partitions: vec![],
        next_table_id: 1,
        next_partition_id: 1,
        next_node_id: 1,
    }
}

/// A refused command: what `MetaResponse.error` and `error_kind` carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            kind,
            message: message.into(),
        }
    }

    /// The response that reports this refusal at log index `version`.
    pub fn into_response(self, version: u64) -> MetaResponse {
        MetaResponse {
            error: self.message,
            error_kind: self.kind.to_string(),
            version,
            ..Default::default()
        }
    }
}

type Outcome = std::result::Result<MetaResponse, Refusal>;

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::new(kind::INVALID, message)
}

fn check_name(what: &str, name: &str) -> Result<(), Refusal> {
    validate_name(what, name).map_err(|e| match e {
        sealion_common::Error::Invalid(m) => invalid(m),
        other => invalid(other.to_string()),
    })
}

/// Applies `cmd`, the entry at log `index`, to `state` and says what came of
/// it. `state.version` becomes `index` whether or not the command succeeds.
pub fn apply(state: &mut ClusterState, cmd: &MetaCommand, index: u64) -> MetaResponse {
    let outcome = match &cmd.cmd {
        None => Err(invalid("empty command")),
        Some(Cmd::CreateDatabase(c)) => create_database(state, c),
        Some(Cmd::CreateTable(c)) => create_table(state, c),
        Some(Cmd::AddColumns(c)) => add_columns(state, c),
        Some(Cmd::DropTable(c)) => drop_table(state, c),
        Some(Cmd::DropDatabase(c)) => drop_database(state, c),
        Some(Cmd::RegisterNode(c)) => register_node(state, c),
        Some(Cmd::EnsurePartitions(c)) => ensure_partitions(state, c),
        Some(Cmd::ExpirePartitions(c)) => expire_partitions(state, c),
        Some(Cmd::SetPartitionState(c)) => set_partition_state(state, c),
        Some(Cmd::UpdateReplicas(c)) => update_replicas(state, c),
    };
    state.version = index;
    match outcome {
        Ok(mut response) => {
            response.version = index;
            response
        }
        Err(refusal) => refusal.into_response(index),
    }
}

fn has_database(state: &ClusterState, name: &str) -> bool {
    state.databases.iter().any(|d| d.name == name)
}

fn create_database(state: &mut ClusterState, c: &CreateDatabase) -> Outcome {
    check_name("database", &c.name)?;
    if has_database(state, &c.name) {
        if c.if_not_exists {
            return Ok(MetaResponse::default());
        }
        return Err(Refusal::new(
            kind::ALREADY_EXISTS,
            format!("database \"{}\" already exists", c.name),
        ));
    }
    state.databases.push(Database {
        name: c.name.clone(),
    });
    Ok(MetaResponse::default())
}

/// Kind and type of a column, refusing values this version does not know.
fn column_shape(c: &Column) -> Result<(ColumnKind, DataType), Refusal> {
    let kind = ColumnKind::try_from(c.kind)
        .ok()
        .filter(|k| *k != ColumnKind::Unspecified)
        .ok_or_else(|| invalid(format!("column \"{}\" has no valid kind", c.name)))?;
    let data_type = DataType::try_from(c.data_type)
        .ok()
        .filter(|t| *t != DataType::Unspecified)
        .ok_or_else(|| invalid(format!("column \"{}\" has no valid data type", c.name)))?;
    match kind {
        ColumnKind::Time if data_type != DataType::Timestamp => Err(invalid(format!(
            "time column \"{}\" must be TIMESTAMP, not {}",
            c.name,
            type_name(data_type)
        ))),
        ColumnKind::Tag if data_type != DataType::String => Err(invalid(format!(
            "tag column \"{}\" must be TEXT, not {}",
            c.name,
            type_name(data_type)
        ))),
        ColumnKind::Field if data_type == DataType::Timestamp => Err(invalid(format!(
            "field column \"{}\" cannot be TIMESTAMP: only the time column is",
            c.name
        ))),
        _ => Ok((kind, data_type)),
    }
}

pub use sealion_common::catalog::{MAX_REPLICATION_FACTOR, MAX_SHARDS, table_shards};

fn interval_or_default(interval_ns: i64) -> Result<i64, Refusal> {
    match interval_ns {
        0 => Ok(DEFAULT_PARTITION_INTERVAL_NS),
        i if i < 0 => Err(invalid(format!(
            "partition interval must be positive, got {i} ns"
        ))),
        i => Ok(i),
    }
}

/// The canonical form of a column as stored: name, kind and type only.
fn canonical(c: &Column, kind: ColumnKind, data_type: DataType) -> Column {
    Column {
        name: c.name.clone(),
        kind: kind as i32,
        data_type: data_type as i32,
    }
}

fn create_table(state: &mut ClusterState, c: &CreateTable) -> Outcome {
    let Some(t) = &c.table else {
        return Err(invalid("CreateTable without a table"));
    };
    check_name("database", &t.database)?;
    check_name("table", &t.name)?;
    if !has_database(state, &t.database) {
        return Err(Refusal::new(
            kind::NOT_FOUND,
            format!("database \"{}\" does not exist", t.database),
        ));
    }
    if let Some(existing) = find_table(state, &t.database, &t.name) {
        if c.if_not_exists {
            return Ok(MetaResponse {
                table: Some(existing.clone()),
                ..Default::default()
            });
        }
        return Err(Refusal::new(
            kind::ALREADY_EXISTS,
            format!("table \"{}\".\"{}\" already exists", t.database, t.name),
        ));
    }
    let mut names = BTreeSet::new();
    let mut columns = Vec::with_capacity(t.columns.len());
    let mut time_columns = 0usize;
    for col in &t.columns {
        check_name("column", &col.name)?;
        if !names.insert(col.name.as_str()) {
            return Err(invalid(format!(
                "column \"{}\" is declared twice",
                col.name
            )));
        }
        let (kind, data_type) = column_shape(col)?;
        if kind == ColumnKind::Time {
            time_columns += 1;
        }
        columns.push(canonical(col, kind, data_type));
    }
    if time_columns != 1 {
        return Err(invalid(format!(
            "table \"{}\" must have exactly one TIMESTAMP time column, found {time_columns}",
            t.name
        )));
    }
    let interval_ns = interval_or_default(t.partition_interval_ns)?;
    if t.shards > MAX_SHARDS {
        return Err(invalid(format!(
            "a table has at most {MAX_SHARDS} shards, {} were asked",
            t.shards
        )));
    }
    if t.replication_factor > MAX_REPLICATION_FACTOR {
        return Err(invalid(format!(
            "a table has at most {MAX_REPLICATION_FACTOR} replicas, {} were asked",
            t.replication_factor
        )));
    }
    if t.retention_ns < 0 {
        return Err(invalid(format!(
            "retention must not be negative, got {} ns",
            t.retention_ns
        )));
    }
    let table = Table {
        id: state.next_table_id,
        database: t.database.clone(),
        name: t.name.clone(),
        columns,
        partition_interval_ns: interval_ns,
        retention_ns: t.retention_ns,
        schema_version: 1,
        shards: t.shards.max(1),
        replication_factor: t.replication_factor,
    };
    state.next_table_id += 1;
    state.tables.push(table.clone());
    Ok(MetaResponse {
        table: Some(table),
        ..Default::default()
    })
}

fn conflict(existing: &Column, new_kind: ColumnKind, new_type: DataType) -> Refusal {
    let old_kind = existing.kind();
    let old_type = existing.data_type();
    let message = if old_kind == new_kind {
        format!(
            "column \"{}\" is {}, cannot write {}",
            existing.name,
            type_name(old_type),
            type_name(new_type)
        )
    } else {
        format!(
            "column \"{}\" is a {} of type {}, cannot write it as a {} of type {}",
            existing.name,
            kind_name(old_kind),
            type_name(old_type),
            kind_name(new_kind),
            type_name(new_type)
        )
    };
    Refusal::new(kind::CONFLICT, message)
}

fn add_columns(state: &mut ClusterState, c: &AddColumns) -> Outcome {
    check_name("database", &c.database)?;
    check_name("table", &c.table)?;
    // Validate every requested column before anything changes, so a refused
    // command leaves no trace.
    let mut requested: Vec<Column> = Vec::with_capacity(c.columns.len());
    for col in &c.columns {
        check_name("column", &col.name)?;
        let (kind, data_type) = column_shape(col)?;
        match requested.iter().find(|r| r.name == col.name) {
            Some(r) if r.kind() == kind && r.data_type() == data_type => {}
            Some(r) => return Err(conflict(r, kind, data_type)),
            None => requested.push(canonical(col, kind, data_type)),
        }
    }

    let table_index = state
        .tables
        .iter()
        .position(|t| t.database == c.database && t.name == c.table);
    let Some(index) = table_index else {
        if !c.create_table {
            return Err(Refusal::new(
                kind::NOT_FOUND,
                format!("table \"{}\".\"{}\" does not exist", c.database, c.table),
            ));
        }
        return create_table_for_write(state, c, requested);
    };

    let table = &state.tables[index];
    let mut added = Vec::new();
    for col in requested {
        match table.columns.iter().find(|e| e.name == col.name) {
            Some(existing) if existing.kind == col.kind && existing.data_type == col.data_type => {}
            Some(existing) => return Err(conflict(existing, col.kind(), col.data_type())),
            None if col.kind() == ColumnKind::Time => {
                return Err(invalid(format!(
                    "table \"{}\" already has a time column; cannot add \"{}\"",
                    table.name, col.name
                )));
            }
            None => added.push(col),
        }
    }
    let table = &mut state.tables[index];
    if !added.is_empty() {
        table.columns.extend(added);
        table.schema_version += 1;
    }
    Ok(MetaResponse {
        table: Some(table.clone()),
        ..Default::default()
    })
}

/// Line protocol's first write to a table: creates the database if needed and
/// the table with its time column first. `requested` is already validated.
fn create_table_for_write(
    state: &mut ClusterState,
    c: &AddColumns,
    requested: Vec<Column>,
) -> Outcome {
    let interval_ns = interval_or_default(c.partition_interval_ns)?;
    let (time, rest): (Vec<Column>, Vec<Column>) = requested
        .into_iter()
        .partition(|col| col.kind() == ColumnKind::Time);
    let time_column = match time.len() {
        0 => Column {
            name: TIME_COLUMN.to_string(),
            kind: ColumnKind::Time as i32,
            data_type: DataType::Timestamp as i32,
        },
        1 => time[0].clone(),
        n => {
            return Err(invalid(format!(
                "a table has one time column, {n} were given"
            )));
        }
    };
    if let Some(clash) = rest.iter().find(|col| col.name == time_column.name) {
        return Err(conflict(&time_column, clash.kind(), clash.data_type()));
    }
    if !has_database(state, &c.database) {
        state.databases.push(Database {
            name: c.database.clone(),
        });
    }
    let mut columns = Vec::with_capacity(rest.len() + 1);
    columns.push(time_column);
    columns.extend(rest);
    let table = Table {
        id: state.next_table_id,
        database: c.database.clone(),
        name: c.table.clone(),
        columns,
        partition_interval_ns: interval_ns,
        retention_ns: 0,
        schema_version: 1,
        shards: 1,
        replication_factor: 0,
    };
    state.next_table_id += 1;
    state.tables.push(table.clone());
    Ok(MetaResponse {
        table: Some(table),
        ..Default::default()
    })
}

fn drop_table(state: &mut ClusterState, c: &DropTable) -> Outcome {
    let Some(index) = state
        .tables
        .iter()
        .position(|t| t.database == c.database && t.name == c.table)
    else {
        if c.if_exists {
            return Ok(MetaResponse::default());
        }
        return Err(Refusal::new(
            kind::NOT_FOUND,
            format!("table \"{}\".\"{}\" does not exist", c.database, c.table),
        ));
    };
    let table = state.tables.remove(index);
    state.partitions.retain(|p| p.table_id != table.id);
    Ok(MetaResponse {
        table: Some(table),
        ..Default::default()
    })
}

/// Removes the named partitions from the map; ids it does not have are
/// ignored, so applying the same expiry twice is harmless.
fn expire_partitions(state: &mut ClusterState, c: &ExpirePartitions) -> Outcome {
    let (gone, kept): (Vec<Partition>, Vec<Partition>) = std::mem::take(&mut state.partitions)
        .into_iter()
        .partition(|p| c.partition_ids.contains(&p.id));
    state.partitions = kept;
    Ok(MetaResponse {
        partitions: gone,
        ..Default::default()
    })
}

/// Largest tag filter a partition may publish (a bound on the size of the
/// cluster state every node watches).
pub const MAX_TAG_FILTER_BYTES: usize = 64 << 10;

fn set_partition_state(state: &mut ClusterState, c: &SetPartitionState) -> Outcome {
    let Some(p) = state.partitions.iter_mut().find(|p| p.id == c.partition_id) else {
        return Err(Refusal::new(
            kind::NOT_FOUND,
            format!("partition {} does not exist", c.partition_id),
        ));
    };
    if c.state == PartitionState::Unspecified as i32 || PartitionState::try_from(c.state).is_err() {
        return Err(invalid(format!(
            "partition state {} is not a state",
            c.state
        )));
    }
    if c.tag_filters.len() > MAX_TAG_FILTER_BYTES {
        return Err(invalid(format!(
            "tag filters of partition {} are {} bytes; the limit is {MAX_TAG_FILTER_BYTES}",
            c.partition_id,
            c.tag_filters.len()
        )));
    }
    p.state = c.state;
    // Filters describe a sealed file; any other state has none to describe.
    p.tag_filters = if c.state == PartitionState::Sealed as i32 {
        c.tag_filters.clone()
    } else {
        Default::default()
    };
    Ok(MetaResponse {
        partitions: vec![p.clone()],
        ..Default::default()
    })
}

/// Applies each change whose partition still has the expected epoch, and
/// bumps that epoch. Changes that lost the race are skipped; when none
/// applies, the command is refused as a conflict. The response lists the
/// partitions changed, as they now are.
fn update_replicas(state: &mut ClusterState, c: &UpdateReplicas) -> Outcome {
    // Check every change first, so a malformed one changes nothing.
    for ch in &c.changes {
        let distinct: BTreeSet<u64> = ch.replicas.iter().copied().collect();
        if distinct.len() != ch.replicas.len() {
            return Err(invalid(format!(
                "replicas of partition {} name a node twice",
                ch.partition_id
            )));
        }
        if let Some(unknown) = ch
            .replicas
            .iter()
            .find(|id| !state.nodes.iter().any(|n| n.id == **id))
        {
            return Err(invalid(format!(
                "replicas of partition {} name unknown storage node {unknown}",
                ch.partition_id
            )));
        }
        match ch.replicas.first() {
            Some(primary) if ch.in_sync.contains(primary) => {}
            _ => {
                return Err(invalid(format!(
                    "partition {}: the primary must be in the in-sync set",
                    ch.partition_id
                )));
            }
        }
        if let Some(stray) = ch.in_sync.iter().find(|id| !distinct.contains(id)) {
            return Err(invalid(format!(
                "partition {}: in-sync node {stray} is not a replica",
                ch.partition_id
            )));
        }
    }
    let mut changed = Vec::new();
    let mut stale = Vec::new();
    for ch in &c.changes {
        let Some(p) = state
            .partitions
            .iter_mut()
            .find(|p| p.id == ch.partition_id)
        else {
            stale.push(format!("partition {} does not exist", ch.partition_id));
            continue;
        };
        if p.epoch != ch.expected_epoch {
            stale.push(format!(
                "partition {} is at epoch {}, not {}",
                p.id, p.epoch, ch.expected_epoch
            ));
            continue;
        }
        p.replicas = ch.replicas.clone();
        let mut in_sync: Vec<u64> = ch
            .replicas
            .iter()
            .copied()
            .filter(|id| ch.in_sync.contains(id))
            .collect();
        in_sync.dedup();
        p.in_sync = in_sync;
        p.epoch += 1;
        changed.push(p.clone());
    }
    if changed.is_empty() && !stale.is_empty() {
        return Err(Refusal::new(kind::CONFLICT, stale.join("; ")));
    }
    Ok(MetaResponse {
        partitions: changed,
        ..Default::default()
    })
}

/// Partitions whose end is at or before `now_ns - retention` of their table.
pub fn expired_partitions(state: &ClusterState, now_ns: i64) -> Vec<u64> {
    state
        .partitions
        .iter()
        .filter(|p| {
            state.tables.iter().any(|t| {
                t.id == p.table_id
                    && t.retention_ns > 0
                    && p.end_ns <= now_ns.saturating_sub(t.retention_ns)
            })
        })
        .map(|p| p.id)
        .collect()
}

fn drop_database(state: &mut ClusterState, c: &DropDatabase) -> Outcome {
    if c.name == DEFAULT_DATABASE {
        return Err(invalid(format!(
            "database \"{DEFAULT_DATABASE}\" cannot be dropped"
        )));
    }
    if !has_database(state, &c.name) {
        if c.if_exists {
            return Ok(MetaResponse::default());
        }
        return Err(Refusal::new(
            kind::NOT_FOUND,
            format!("database \"{}\" does not exist", c.name),
        ));
    }
    let dropped: BTreeSet<u64> = state
        .tables
        .iter()
        .filter(|t| t.database == c.name)
        .map(|t| t.id)
        .collect();
    state.databases.retain(|d| d.name != c.name);
    state.tables.retain(|t| t.database != c.name);
    state.partitions.retain(|p| !dropped.contains(&p.table_id));
    Ok(MetaResponse::default())
}

fn register_node(state: &mut ClusterState, c: &RegisterNode) -> Outcome {
    if c.addr.trim().is_empty() {
        return Err(invalid("a storage node must register with an address"));
    }
    if c.id != 0 {
        if let Some(node) = state.nodes.iter_mut().find(|n| n.id == c.id) {
            node.addr = c.addr.clone();
            return Ok(MetaResponse {
                node: Some(node.clone()),
                ..Default::default()
            });
        }
        let node = StorageNode {
            id: c.id,
            addr: c.addr.clone(),
            registered_at_ms: c.now_ms,
        };
        state.next_node_id = state.next_node_id.max(c.id.saturating_add(1));
        state.nodes.push(node.clone());
        return Ok(MetaResponse {
            node: Some(node),
            ..Default::default()
        });
    }
    if let Some(node) = state.nodes.iter().find(|n| n.addr == c.addr) {
        return Ok(MetaResponse {
            node: Some(node.clone()),
            ..Default::default()
        });
    }
    let node = StorageNode {
        id: state.next_node_id,
        addr: c.addr.clone(),
        registered_at_ms: c.now_ms,
    };
    state.next_node_id += 1;
    state.nodes.push(node.clone());
    Ok(MetaResponse {
        node: Some(node),
        ..Default::default()
    })
}

/// The interval of `table`, defensively positive.
pub fn table_interval_ns(table: &Table) -> i64 {
    if table.partition_interval_ns > 0 {
        table.partition_interval_ns
    } else {
        DEFAULT_PARTITION_INTERVAL_NS
    }
}

fn ensure_partitions(state: &mut ClusterState, c: &EnsurePartitions) -> Outcome {
    let Some(table) = state.tables.iter().find(|t| t.id == c.table_id) else {
        return Err(Refusal::new(
            kind::NOT_FOUND,
            format!("table with id {} does not exist", c.table_id),
        ));
    };
    let interval_ns = table_interval_ns(table);
    let starts: BTreeSet<i64> = c.starts_ns.iter().copied().collect();
    if let Some(bad) = starts.iter().find(|s| s.rem_euclid(interval_ns) != 0) {
        return Err(invalid(format!(
            "partition start {bad} is not a multiple of the table's interval {interval_ns} ns"
        )));
    }
    let existing: BTreeMap<i64, usize> = state
        .partitions
        .iter()
        .enumerate()
        .filter(|(_, p)| p.table_id == c.table_id && starts.contains(&p.start_ns))
        .map(|(i, p)| (p.start_ns, i))
        .collect();
    let shards = table_shards(table);
    // Check every placement before creating anything.
    let mut to_create = Vec::new();
    for (start, shard) in starts
        .iter()
        .filter(|s| !existing.contains_key(s))
        .flat_map(|s| (0..shards).map(move |shard| (*s, shard)))
    {
        let replicas = c
            .placements
            .iter()
            .find(|p| p.start_ns == start && p.shard == shard)
            .map(|p| p.replicas.clone())
            .unwrap_or_default();
        if replicas.is_empty() {
            return Err(invalid(format!(
                "no placement given for new partition at {start}, shard {shard}"
            )));
        }
        if let Some(unknown) = replicas
            .iter()
            .find(|id| !state.nodes.iter().any(|n| n.id == **id))
        {
            return Err(invalid(format!(
                "placement names unknown storage node {unknown}"
            )));
        }
        let distinct: BTreeSet<u64> = replicas.iter().copied().collect();
        if distinct.len() != replicas.len() {
            return Err(invalid(format!("placement for {start} names a node twice")));
        }
        to_create.push((start, shard, replicas));
    }
    for (start, shard, replicas) in to_create {
        state.partitions.push(Partition {
            id: state.next_partition_id,
            table_id: c.table_id,
            start_ns: start,
            end_ns: partition_end(start, interval_ns),
            in_sync: replicas.clone(),
            replicas,
            state: PartitionState::Open as i32,
            epoch: 1,
            tag_filters: Vec::new(),
            shard,
        });
        state.next_partition_id += 1;
    }
    let mut partitions: Vec<Partition> = state
        .partitions
        .iter()
        .filter(|p| p.table_id == c.table_id && starts.contains(&p.start_ns))
        .cloned()
        .collect();
    partitions.sort_by_key(|p| (p.start_ns, p.shard));
    Ok(MetaResponse {
        partitions,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use sealion_proto::{PartitionPlacement, ReplicaChange};

    use super::*;

    fn col(name: &str, kind: ColumnKind, t: DataType) -> Column {
        Column {
            name: name.into(),
            kind: kind as i32,
            data_type: t as i32,
        }
    }

    fn time() -> Column {
        col("time", ColumnKind::Time, DataType::Timestamp)
    }

    fn cmd(c: Cmd) -> MetaCommand {
        MetaCommand { cmd: Some(c) }
    }

    /// Applies at the next version, as Raft would.
    fn run(state: &mut ClusterState, c: Cmd) -> MetaResponse {
        let index = state.version + 1;
        apply(state, &cmd(c), index)
    }

    fn create_table_cmd(db: &str, name: &str, columns: Vec<Column>, if_not_exists: bool) -> Cmd {
        Cmd::CreateTable(CreateTable {
            table: Some(Table {
                database: db.into(),
                name: name.into(),
                columns,
                ..Default::default()
            }),
            if_not_exists,
        })
    }

    fn cpu_table(state: &mut ClusterState) -> Table {
        let r = run(
            state,
            create_table_cmd(
                "public",
                "cpu",
                vec![
                    time(),
                    col("host", ColumnKind::Tag, DataType::String),
                    col("usage", ColumnKind::Field, DataType::Float64),
                ],
                false,
            ),
        );
        assert_eq!(r.error, "", "{r:?}");
        r.table.unwrap()
    }

    fn register(state: &mut ClusterState, id: u64, addr: &str) -> StorageNode {
        let r = run(
            state,
            Cmd::RegisterNode(RegisterNode {
                id,
                addr: addr.into(),
                now_ms: 42,
            }),
        );
        assert_eq!(r.error, "", "{r:?}");
        r.node.unwrap()
    }

    fn ensure(
        state: &mut ClusterState,
        table_id: u64,
        starts: Vec<i64>,
        replicas: Vec<u64>,
    ) -> MetaResponse {
        let placements = starts
            .iter()
            .map(|s| PartitionPlacement {
                start_ns: *s,
                replicas: replicas.clone(),
                shard: 0,
            })
            .collect();
        run(
            state,
            Cmd::EnsurePartitions(EnsurePartitions {
                table_id,
                starts_ns: starts,
                placements,
            }),
        )
    }

    #[test]
    fn initial_state_has_public_and_ids_from_one() {
        let s = initial_state();
        assert_eq!(s.databases.len(), 1);
        assert_eq!(s.databases[0].name, "public");
        assert_eq!(
            (s.next_table_id, s.next_partition_id, s.next_node_id),
            (1, 1, 1)
        );
        assert_eq!(s.version, 0);
    }

    #[test]
    fn version_is_the_log_index_even_for_refused_commands() {
        let mut s = initial_state();
        let r = apply(
            &mut s,
            &cmd(Cmd::CreateDatabase(CreateDatabase {
                name: "public".into(),
                if_not_exists: false,
            })),
            7,
        );
        assert_eq!(r.error_kind, kind::ALREADY_EXISTS);
        assert_eq!(r.version, 7);
        assert_eq!(s.version, 7);
    }

    #[test]
    fn create_database_refuses_duplicates_unless_if_not_exists() {
        let mut s = initial_state();
        let c = |ine| {
            Cmd::CreateDatabase(CreateDatabase {
                name: "metrics".into(),
                if_not_exists: ine,
            })
        };
        assert_eq!(run(&mut s, c(false)).error, "");
        assert_eq!(run(&mut s, c(false)).error_kind, kind::ALREADY_EXISTS);
        assert_eq!(run(&mut s, c(true)).error, "");
        assert_eq!(s.databases.len(), 2);
        let bad = run(
            &mut s,
            Cmd::CreateDatabase(CreateDatabase {
                name: String::new(),
                if_not_exists: false,
            }),
        );
        assert_eq!(bad.error_kind, kind::INVALID);
    }

    #[test]
    fn create_table_assigns_id_and_defaults() {
        let mut s = initial_state();
        let t = cpu_table(&mut s);
        assert_eq!(t.id, 1);
        assert_eq!(t.schema_version, 1);
        assert_eq!(t.partition_interval_ns, DEFAULT_PARTITION_INTERVAL_NS);
        assert_eq!(s.next_table_id, 2);

        let again = run(
            &mut s,
            create_table_cmd("public", "cpu", vec![time()], false),
        );
        assert_eq!(again.error_kind, kind::ALREADY_EXISTS);
        let ine = run(
            &mut s,
            create_table_cmd("public", "cpu", vec![time()], true),
        );
        assert_eq!(ine.error, "");
        assert_eq!(
            ine.table.unwrap(),
            t,
            "if_not_exists returns the existing table"
        );
    }

    #[test]
    fn create_table_validates_columns_and_database() {
        let mut s = initial_state();
        let missing_db = run(&mut s, create_table_cmd("nope", "cpu", vec![time()], false));
        assert_eq!(missing_db.error_kind, kind::NOT_FOUND);

        let cases = vec![
            vec![],
            vec![time(), col("t2", ColumnKind::Time, DataType::Timestamp)],
            vec![col("time", ColumnKind::Time, DataType::Int64)],
            vec![time(), col("host", ColumnKind::Tag, DataType::Int64)],
            vec![
                time(),
                col("x", ColumnKind::Field, DataType::Float64),
                col("x", ColumnKind::Field, DataType::Float64),
            ],
            vec![time(), col("x", ColumnKind::Unspecified, DataType::Float64)],
            vec![time(), col("x", ColumnKind::Field, DataType::Unspecified)],
            vec![time(), col("", ColumnKind::Field, DataType::Float64)],
        ];
        for columns in cases {
            let r = run(
                &mut s,
                create_table_cmd("public", "t", columns.clone(), false),
            );
            assert_eq!(r.error_kind, kind::INVALID, "{columns:?}: {r:?}");
        }
        let negative = run(
            &mut s,
            Cmd::CreateTable(CreateTable {
                table: Some(Table {
                    database: "public".into(),
                    name: "t".into(),
                    columns: vec![time()],
                    partition_interval_ns: -5,
                    ..Default::default()
                }),
                if_not_exists: false,
            }),
        );
        assert_eq!(negative.error_kind, kind::INVALID);
        let retention = run(
            &mut s,
            Cmd::CreateTable(CreateTable {
                table: Some(Table {
                    database: "public".into(),
                    name: "t".into(),
                    columns: vec![time()],
                    retention_ns: -1,
                    ..Default::default()
                }),
                if_not_exists: false,
            }),
        );
        assert_eq!(retention.error_kind, kind::INVALID);
        assert!(s.tables.is_empty());
        assert_eq!(s.next_table_id, 1, "refused commands assign no id");
    }

    #[test]
    fn add_columns_appends_and_bumps_schema_version() {
        let mut s = initial_state();
        let t = cpu_table(&mut s);
        let r = run(
            &mut s,
            Cmd::AddColumns(AddColumns {
                database: "public".into(),
                table: "cpu".into(),
                columns: vec![
                    col("usage", ColumnKind::Field, DataType::Float64),
                    col("region", ColumnKind::Tag, DataType::String),
                ],
                ..Default::default()
            }),
        );
        assert_eq!(r.error, "");
        let t2 = r.table.unwrap();
        assert_eq!(t2.schema_version, t.schema_version + 1);
        assert_eq!(t2.columns.last().unwrap().name, "region");

        let same = run(
            &mut s,
            Cmd::AddColumns(AddColumns {
                database: "public".into(),
                table: "cpu".into(),
                columns: vec![col("usage", ColumnKind::Field, DataType::Float64)],
                ..Default::default()
            }),
        );
        assert_eq!(
            same.table.unwrap().schema_version,
            t2.schema_version,
            "no change, no bump"
        );
    }

    #[test]
    fn add_columns_type_conflict_names_the_column_and_both_types() {
        let mut s = initial_state();
        cpu_table(&mut s);
        let before = s.tables.clone();
        let r = run(
            &mut s,
            Cmd::AddColumns(AddColumns {
                database: "public".into(),
                table: "cpu".into(),
                columns: vec![
                    col("new_one", ColumnKind::Field, DataType::Bool),
                    col("usage", ColumnKind::Field, DataType::Int64),
                ],
                ..Default::default()
            }),
        );
        assert_eq!(r.error_kind, kind::CONFLICT);
        assert_eq!(r.error, "column \"usage\" is DOUBLE, cannot write BIGINT");
        assert_eq!(s.tables, before, "a refused command adds no column");

        let kind_clash = run(
            &mut s,
            Cmd::AddColumns(AddColumns {
                database: "public".into(),
                table: "cpu".into(),
                columns: vec![col("host", ColumnKind::Field, DataType::String)],
                ..Default::default()
            }),
        );
        assert_eq!(kind_clash.error_kind, kind::CONFLICT);
        assert!(
            kind_clash.error.contains("\"host\""),
            "{}",
            kind_clash.error
        );
        assert!(kind_clash.error.contains("tag"), "{}", kind_clash.error);
    }

    #[test]
    fn add_columns_creates_database_and_table_for_line_protocol() {
        let mut s = initial_state();
        let missing = run(
            &mut s,
            Cmd::AddColumns(AddColumns {
                database: "iot".into(),
                table: "temp".into(),
                columns: vec![col("v", ColumnKind::Field, DataType::Float64)],
                create_table: false,
                ..Default::default()
            }),
        );
        assert_eq!(missing.error_kind, kind::NOT_FOUND);

        let r = run(
            &mut s,
            Cmd::AddColumns(AddColumns {
                database: "iot".into(),
                table: "temp".into(),
                columns: vec![
                    col("sensor", ColumnKind::Tag, DataType::String),
                    col("v", ColumnKind::Field, DataType::Float64),
                ],
                create_table: true,
                partition_interval_ns: 3_600_000_000_000,
            }),
        );
        assert_eq!(r.error, "");
        let t = r.table.unwrap();
        assert!(s.databases.iter().any(|d| d.name == "iot"));
        let names: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["time", "sensor", "v"]);
        assert_eq!(t.columns[0].kind(), ColumnKind::Time);
        assert_eq!(t.partition_interval_ns, 3_600_000_000_000);
        assert_eq!(t.schema_version, 1);
    }

    #[test]
    fn retention_expires_only_partitions_past_it_and_expiry_is_idempotent() {
        let mut s = initial_state();
        let t = cpu_table(&mut s);
        register(&mut s, 0, "n1:1");
        let day = DEFAULT_PARTITION_INTERVAL_NS;
        assert_eq!(
            ensure(&mut s, t.id, vec![0, day, 2 * day], vec![1]).error,
            ""
        );
        // No retention: nothing expires, however old.
        assert!(expired_partitions(&s, 100 * day).is_empty());
        s.tables.iter_mut().for_each(|x| x.retention_ns = day);
        // now = 2.5 days: the partition ending at day 1 is 1.5 days old, the one
        // ending at day 2 only 0.5 days.
        let expired = expired_partitions(&s, 2 * day + day / 2);
        assert_eq!(expired.len(), 1);
        let first = s.partitions.iter().find(|p| p.start_ns == 0).unwrap().id;
        assert_eq!(expired, vec![first]);
        let r = run(
            &mut s,
            Cmd::ExpirePartitions(ExpirePartitions {
                partition_ids: expired.clone(),
            }),
        );
        assert_eq!(r.error, "");
        assert_eq!(r.partitions.len(), 1);
        assert_eq!(s.partitions.len(), 2);
        let again = run(
            &mut s,
            Cmd::ExpirePartitions(ExpirePartitions {
                partition_ids: expired,
            }),
        );
        assert_eq!(again.error, "");
        assert!(again.partitions.is_empty());
        assert_eq!(s.partitions.len(), 2);
    }

    #[test]
    fn partition_state_changes_are_recorded_and_checked() {
        let mut s = initial_state();
        let t = cpu_table(&mut s);
        register(&mut s, 0, "n1:1");
        assert_eq!(ensure(&mut s, t.id, vec![0], vec![1]).error, "");
        let pid = s.partitions[0].id;
        assert_eq!(s.partitions[0].state(), PartitionState::Open);
        let r = run(
            &mut s,
            Cmd::SetPartitionState(SetPartitionState {
                partition_id: pid,
                state: PartitionState::Sealed as i32,
                tag_filters: vec![1, 2, 3],
            }),
        );
        assert_eq!(r.error, "");
        assert_eq!(s.partitions[0].state(), PartitionState::Sealed);
        let r = run(
            &mut s,
            Cmd::SetPartitionState(SetPartitionState {
                partition_id: pid + 99,
                state: PartitionState::Sealed as i32,
                ..Default::default()
            }),
        );
        assert_eq!(r.error_kind, kind::NOT_FOUND);
        let r = run(
            &mut s,
            Cmd::SetPartitionState(SetPartitionState {
                partition_id: pid,
                state: 42,
                ..Default::default()
            }),
        );
        assert!(!r.error.is_empty());
        assert_eq!(s.partitions[0].state(), PartitionState::Sealed);
        assert_eq!(s.partitions[0].tag_filters, vec![1, 2, 3]);

        // Filters over the limit are refused and change nothing.
        let r = run(
            &mut s,
            Cmd::SetPartitionState(SetPartitionState {
                partition_id: pid,
                state: PartitionState::Sealed as i32,
                tag_filters: vec![0; MAX_TAG_FILTER_BYTES + 1],
            }),
        );
        assert_eq!(r.error_kind, kind::INVALID);
        assert_eq!(s.partitions[0].tag_filters, vec![1, 2, 3]);

        // Leaving the sealed state clears them: they described a file.
        let r = run(
            &mut s,
            Cmd::SetPartitionState(SetPartitionState {
                partition_id: pid,
                state: PartitionState::Open as i32,
                tag_filters: vec![9],
            }),
        );
        assert_eq!(r.error, "");
        assert!(s.partitions[0].tag_filters.is_empty());
    }

    #[test]
    fn drop_table_removes_its_partitions() {
        let mut s = initial_state();
        let t = cpu_table(&mut s);
        register(&mut s, 0, "n1:1");
        let day = DEFAULT_PARTITION_INTERVAL_NS;
        assert_eq!(ensure(&mut s, t.id, vec![0, day], vec![1]).error, "");
        assert_eq!(s.partitions.len(), 2);
        let r = run(
            &mut s,
            Cmd::DropTable(DropTable {
                database: "public".into(),
                table: "cpu".into(),
                if_exists: false,
            }),
        );
        assert_eq!(r.error, "");
        assert!(s.tables.is_empty());
        assert!(s.partitions.is_empty());
        let again = Cmd::DropTable(DropTable {
            database: "public".into(),
            table: "cpu".into(),
            if_exists: false,
        });
        assert_eq!(run(&mut s, again).error_kind, kind::NOT_FOUND);
        let ie = Cmd::DropTable(DropTable {
            database: "public".into(),
            table: "cpu".into(),
            if_exists: true,
        });
        assert_eq!(run(&mut s, ie).error, "");
    }

    #[test]
    fn drop_database_removes_tables_and_partitions_but_never_public() {
        let mut s = initial_state();
        register(&mut s, 0, "n1:1");
        let r = run(
            &mut s,
            Cmd::CreateDatabase(CreateDatabase {
                name: "db".into(),
                if_not_exists: false,
            }),
        );
        assert_eq!(r.error, "");
        let t = run(&mut s, create_table_cmd("db", "x", vec![time()], false))
            .table
            .unwrap();
        let keep = cpu_table(&mut s);
        assert_eq!(ensure(&mut s, t.id, vec![0], vec![1]).error, "");
        assert_eq!(ensure(&mut s, keep.id, vec![0], vec![1]).error, "");
        let r = run(
            &mut s,
            Cmd::DropDatabase(DropDatabase {
                name: "db".into(),
                if_exists: false,
            }),
        );
        assert_eq!(r.error, "");
        assert!(!s.databases.iter().any(|d| d.name == "db"));
        assert_eq!(s.tables.len(), 1);
        assert_eq!(s.partitions.len(), 1);
        assert_eq!(s.partitions[0].table_id, keep.id);

        let public = run(
            &mut s,
            Cmd::DropDatabase(DropDatabase {
                name: "public".into(),
                if_exists: true,
            }),
        );
        assert_eq!(public.error_kind, kind::INVALID);
        let missing = run(
            &mut s,
            Cmd::DropDatabase(DropDatabase {
                name: "db".into(),
                if_exists: false,
            }),
        );
        assert_eq!(missing.error_kind, kind::NOT_FOUND);
    }

    #[test]
    fn register_node_is_idempotent_by_address_and_keeps_ids() {
        let mut s = initial_state();
        let a = register(&mut s, 0, "a:1");
        assert_eq!(a.id, 1);
        assert_eq!(a.registered_at_ms, 42);
        let again = register(&mut s, 0, "a:1");
        assert_eq!(again, a, "re-registering by address returns the same node");
        let moved = register(&mut s, 1, "a:2");
        assert_eq!(moved.id, 1);
        assert_eq!(moved.addr, "a:2");
        let explicit = register(&mut s, 10, "c:1");
        assert_eq!(explicit.id, 10);
        let next = register(&mut s, 0, "d:1");
        assert_eq!(next.id, 11, "assigned ids stay above explicit ones");
        assert_eq!(s.nodes.len(), 3);
        let bad = run(
            &mut s,
            Cmd::RegisterNode(RegisterNode {
                id: 0,
                addr: String::new(),
                now_ms: 0,
            }),
        );
        assert_eq!(bad.error_kind, kind::INVALID);
    }

    #[test]
    fn replica_changes_are_compare_and_set_on_the_epoch() {
        let mut s = initial_state();
        let t = cpu_table(&mut s);
        for a in ["a:1", "b:1", "c:1"] {
            register(&mut s, 0, a);
        }
        let r = ensure(&mut s, t.id, vec![0], vec![1, 2, 3]);
        let p = r.partitions[0].clone();
        assert_eq!(
            p.in_sync,
            vec![1, 2, 3],
            "a new partition is in sync everywhere"
        );
        let change = |epoch: u64, replicas: Vec<u64>, in_sync: Vec<u64>| {
            Cmd::UpdateReplicas(UpdateReplicas {
                changes: vec![ReplicaChange {
                    partition_id: p.id,
                    expected_epoch: epoch,
                    replicas,
                    in_sync,
                    reason: "test".into(),
                }],
            })
        };
        // Node 1 fails: 2 is promoted, the epoch moves on.
        let ok = run(&mut s, change(1, vec![2, 1, 3], vec![3, 2]));
        assert_eq!(ok.error, "");
        assert_eq!(ok.partitions[0].replicas, vec![2, 1, 3]);
        assert_eq!(
            ok.partitions[0].in_sync,
            vec![2, 3],
            "kept in replica order"
        );
        assert_eq!(ok.partitions[0].epoch, 2);
        // A change made against the old epoch loses.
        let late = run(&mut s, change(1, vec![1, 2, 3], vec![1, 2, 3]));
        assert_eq!(late.error_kind, kind::CONFLICT);
        assert_eq!(s.partitions[0].epoch, 2);
        // Malformed changes are refused whatever the epoch.
        for (replicas, in_sync) in [
            (vec![2, 1, 3], vec![1, 3]), // primary not in sync
            (vec![2, 2, 3], vec![2]),    // a node twice
            (vec![2, 9], vec![2]),       // unknown node
            (vec![2, 1], vec![2, 3]),    // in sync but not a replica
            (vec![], vec![]),            // no primary
        ] {
            let bad = run(&mut s, change(2, replicas.clone(), in_sync.clone()));
            assert_eq!(bad.error_kind, kind::INVALID, "{replicas:?} {in_sync:?}");
        }
        assert_eq!(s.partitions[0].epoch, 2);
        assert_eq!(s.partitions[0].in_sync, vec![2, 3]);
    }

    #[test]
    fn ensure_partitions_is_idempotent_and_checks_starts() {
        let mut s = initial_state();
        let t = cpu_table(&mut s);
        register(&mut s, 0, "a:1");
        register(&mut s, 0, "b:1");
        let day = DEFAULT_PARTITION_INTERVAL_NS;
        let r = ensure(&mut s, t.id, vec![day, 0, day], vec![2]);
        assert_eq!(r.error, "");
        assert_eq!(r.partitions.len(), 2);
        assert_eq!(r.partitions[0].start_ns, 0);
        assert_eq!(r.partitions[0].end_ns, day);
        assert_eq!(r.partitions[0].replicas, vec![2]);
        assert_eq!(r.partitions[0].state(), PartitionState::Open);
        assert_eq!(r.partitions[0].epoch, 1);

        // Asking again keeps the existing partitions, even with another placement.
        let again = ensure(&mut s, t.id, vec![0, -day], vec![1]);
        assert_eq!(again.error, "");
        assert_eq!(again.partitions.len(), 2);
        assert_eq!(again.partitions[0].start_ns, -day);
        assert_eq!(again.partitions[0].replicas, vec![1]);
        assert_eq!(again.partitions[1], r.partitions[0]);
        assert_eq!(s.partitions.len(), 3);

        let misaligned = ensure(&mut s, t.id, vec![day + 1], vec![1]);
        assert_eq!(misaligned.error_kind, kind::INVALID);
        let no_table = ensure(&mut s, 99, vec![0], vec![1]);
        assert_eq!(no_table.error_kind, kind::NOT_FOUND);
        let unknown_node = ensure(&mut s, t.id, vec![5 * day], vec![7]);
        assert_eq!(unknown_node.error_kind, kind::INVALID);
        let no_placement = run(
            &mut s,
            Cmd::EnsurePartitions(EnsurePartitions {
                table_id: t.id,
                starts_ns: vec![6 * day],
                placements: vec![],
            }),
        );
        assert_eq!(no_placement.error_kind, kind::INVALID);
        assert_eq!(s.partitions.len(), 3);
    }

    #[test]
    fn a_sharded_table_gets_one_partition_per_shard_and_start() {
        let mut s = initial_state();
        register(&mut s, 0, "a:1");
        register(&mut s, 0, "b:1");
        let mut c = create_table_cmd("public", "m", vec![time()], false);
        if let Cmd::CreateTable(ct) = &mut c {
            ct.table.as_mut().unwrap().shards = MAX_SHARDS + 1;
        }
        assert_eq!(run(&mut s, c.clone()).error_kind, kind::INVALID);
        if let Cmd::CreateTable(ct) = &mut c {
            ct.table.as_mut().unwrap().shards = 3;
        }
        let t = run(&mut s, c).table.unwrap();
        assert_eq!(t.shards, 3);
        let placement = |start: i64, shard: u32, node: u64| PartitionPlacement {
            start_ns: start,
            replicas: vec![node],
            shard,
        };
        // A placement missing for one shard refuses the whole command.
        let partial = run(
            &mut s,
            Cmd::EnsurePartitions(EnsurePartitions {
                table_id: t.id,
                starts_ns: vec![0],
                placements: vec![placement(0, 0, 1), placement(0, 2, 1)],
            }),
        );
        assert_eq!(partial.error_kind, kind::INVALID, "{partial:?}");
        assert!(s.partitions.is_empty());
        let r = run(
            &mut s,
            Cmd::EnsurePartitions(EnsurePartitions {
                table_id: t.id,
                starts_ns: vec![0],
                placements: vec![placement(0, 2, 2), placement(0, 0, 1), placement(0, 1, 2)],
            }),
        );
        assert_eq!(r.error, "");
        let got: Vec<(i64, u32, Vec<u64>)> = r
            .partitions
            .iter()
            .map(|p| (p.start_ns, p.shard, p.replicas.clone()))
            .collect();
        assert_eq!(got, vec![(0, 0, vec![1]), (0, 1, vec![2]), (0, 2, vec![2])]);
        // Asking again creates nothing.
        let again = run(
            &mut s,
            Cmd::EnsurePartitions(EnsurePartitions {
                table_id: t.id,
                starts_ns: vec![0],
                placements: vec![],
            }),
        );
        assert_eq!(again.partitions, r.partitions);
        assert_eq!(s.partitions.len(), 3);
    }
}
