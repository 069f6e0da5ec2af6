//! Lookups over the replicated cluster state, and the Arrow form of a table.

use std::sync::Arc;

use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef, TimeUnit};

use crate::proto::{ClusterState, Column, ColumnKind, DataType, Partition, StorageNode, Table};

/// The default database, used when a request names none.
pub const DEFAULT_DATABASE: &str = "public";
/// Name of the time column of tables that line protocol creates.
pub const TIME_COLUMN: &str = "time";
/// Time zone of the time column's Arrow type.
pub const TIME_ZONE: &str = "UTC";

/// Most shards a table may have per time partition.
pub const MAX_SHARDS: u32 = 256;
/// Most replicas a table may ask for.
pub const MAX_REPLICATION_FACTOR: u32 = 7;

/// A table's shards per time partition (0 is read as 1).
pub fn table_shards(table: &Table) -> u32 {
    table.shards.max(1)
}

/// Arrow type of a Sealion column type.
pub fn arrow_type(t: DataType) -> ArrowType {
    match t {
        DataType::Timestamp => ArrowType::Timestamp(TimeUnit::Nanosecond, Some(TIME_ZONE.into())),
        DataType::String | DataType::Unspecified => ArrowType::Utf8,
        DataType::Float64 => ArrowType::Float64,
        DataType::Int64 => ArrowType::Int64,
        DataType::Uint64 => ArrowType::UInt64,
        DataType::Bool => ArrowType::Boolean,
    }
}

/// SQL name of a column type, as `SHOW COLUMNS` and errors print it.
pub fn type_name(t: DataType) -> &'static str {
    match t {
        DataType::Timestamp => "TIMESTAMP",
        DataType::String | DataType::Unspecified => "TEXT",
        DataType::Float64 => "DOUBLE",
        DataType::Int64 => "BIGINT",
        DataType::Uint64 => "BIGINT UNSIGNED",
        DataType::Bool => "BOOLEAN",
    }
}

pub fn kind_name(k: ColumnKind) -> &'static str {
    match k {
        ColumnKind::Time => "time",
        ColumnKind::Tag => "tag",
        ColumnKind::Field | ColumnKind::Unspecified => "field",
    }
}

pub fn arrow_field(c: &Column) -> Field {
    let nullable = c.kind() != ColumnKind::Time;
    Field::new(&c.name, arrow_type(c.data_type()), nullable)
}

/// Arrow schema of `columns`, in their order.
pub fn arrow_schema(columns: &[Column]) -> SchemaRef {
    Arc::new(Schema::new(
        columns.iter().map(arrow_field).collect::<Vec<_>>(),
    ))
}

pub fn time_column(table: &Table) -> Option<&Column> {
    table.columns.iter().find(|c| c.kind() == ColumnKind::Time)
}

pub fn column<'a>(table: &'a Table, name: &str) -> Option<&'a Column> {
    table.columns.iter().find(|c| c.name == name)
}

pub fn find_table<'a>(state: &'a ClusterState, database: &str, name: &str) -> Option<&'a Table> {
    state
        .tables
        .iter()
        .find(|t| t.database == database && t.name == name)
}

pub fn table_by_id(state: &ClusterState, id: u64) -> Option<&Table> {
    state.tables.iter().find(|t| t.id == id)
}

pub fn has_database(state: &ClusterState, name: &str) -> bool {
    state.databases.iter().any(|d| d.name == name)
}

pub fn node(state: &ClusterState, id: u64) -> Option<&StorageNode> {
    state.nodes.iter().find(|n| n.id == id)
}

/// Partitions of `table_id` that overlap `[start_ns, end_ns)`, by start time.
pub fn partitions_overlapping(
    state: &ClusterState,
    table_id: u64,
    start_ns: i64,
    end_ns: i64,
) -> Vec<&Partition> {
    let mut parts: Vec<&Partition> = state
        .partitions
        .iter()
        .filter(|p| p.table_id == table_id && p.start_ns < end_ns && p.end_ns > start_ns)
        .collect();
    parts.sort_by_key(|p| p.start_ns);
    parts
}

/// A name is a valid database, table or column name when it is 1..=128
/// characters and has no control characters. Quoted SQL identifiers allow
/// anything else, as line protocol does.
pub fn validate_name(what: &str, name: &str) -> crate::Result<()> {
    if name.is_empty() || name.chars().count() > 128 {
        return Err(crate::Error::Invalid(format!(
            "{what} name must be 1 to 128 characters, got {}",
            name.chars().count()
        )));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(crate::Error::Invalid(format!(
            "{what} name {name:?} contains a control character"
        )));
    }
    Ok(())
}
