//! Writes in InfluxDB line protocol.
//!
//! Each line is checked on its own: a line that does not parse, whose
//! timestamp is out of range, or whose field type differs from the table's
//! is rejected with its line number and the reason, and every other line is
//! stored. Tables, and columns that a line names for the first time, are
//! created through meta before the rows are written.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
    TimestampNanosecondBuilder, UInt64Builder,
};
use arrow::record_batch::RecordBatch;
use influxdb_line_protocol::{FieldValue, parse_lines, split_lines};
use sealion_common::catalog::{TIME_COLUMN, TIME_ZONE, arrow_field, find_table, type_name};
use sealion_common::proto::meta_command::Cmd;
use sealion_common::proto::{AddColumns, Column, ColumnKind, DataType, Table};
use sealion_common::time::{DEFAULT_PARTITION_INTERVAL_NS, partition_end, partition_start};
use serde::Serialize;

use crate::catalog::Shared;
use crate::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Ns,
    Us,
    Ms,
    S,
}

impl Precision {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "ns" | "n" => Precision::Ns,
            "us" | "u" => Precision::Us,
            "ms" => Precision::Ms,
            "s" => Precision::S,
            other => {
                return Err(Error::Invalid(format!(
                    "precision {other:?}: use ns, us, ms or s"
                )));
            }
        })
    }

    fn nanos(self) -> i64 {
        match self {
            Precision::Ns => 1,
            Precision::Us => 1_000,
            Precision::Ms => 1_000_000,
            Precision::S => 1_000_000_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LineError {
    pub line: usize,
    pub error: String,
}

#[derive(Debug, Default, Serialize)]
pub struct WriteOutcome {
    pub rows_written: u64,
    pub rejected: Vec<LineError>,
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    F64(f64),
    I64(i64),
    U64(u64),
    Str(String),
    Bool(bool),
}

impl Value {
    fn data_type(&self) -> DataType {
        match self {
            Value::F64(_) => DataType::Float64,
            Value::I64(_) => DataType::Int64,
            Value::U64(_) => DataType::Uint64,
            Value::Str(_) => DataType::String,
            Value::Bool(_) => DataType::Bool,
        }
    }
}

struct Row {
    line: usize,
    tags: Vec<(String, String)>,
    fields: Vec<(String, Value)>,
    time_ns: i64,
}

/// Parses `body` into rows per table; bad lines go to `rejected`.
fn parse_body(
    body: &str,
    precision: Precision,
    now_ns: i64,
    rejected: &mut Vec<LineError>,
) -> BTreeMap<String, Vec<Row>> {
    let mut tables: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    let base = body.as_ptr() as usize;
    // Line numbers are counted as the lines go by (counting from the start
    // of the body for each line would be quadratic in its size).
    let (mut seen, mut line) = (0usize, 1usize);
    for text in split_lines(body) {
        let offset = (text.as_ptr() as usize)
            .saturating_sub(base)
            .min(body.len());
        if offset > seen {
            line += body.as_bytes()[seen..offset]
                .iter()
                .filter(|b| **b == b'\n')
                .count();
            seen = offset;
        }
        let trimmed = text.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let parsed = match parse_lines(text).next() {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                rejected.push(LineError {
                    line,
                    error: e.to_string(),
                });
                continue;
            }
            None => continue,
        };
        let time_ns = match parsed.timestamp {
            None => now_ns,
            Some(t) => match t.checked_mul(precision.nanos()) {
                Some(ns) => ns,
                None => {
                    rejected.push(LineError {
                        line,
                        error: format!("timestamp {t} is out of range for precision {precision:?}"),
                    });
                    continue;
                }
            },
        };
        let mut tags: Vec<(String, String)> = parsed
            .series
            .tag_set
            .iter()
            .flatten()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        tags.sort();
        let fields: Vec<(String, Value)> = parsed
            .field_set
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    FieldValue::F64(x) => Value::F64(*x),
                    FieldValue::I64(x) => Value::I64(*x),
                    FieldValue::U64(x) => Value::U64(*x),
                    FieldValue::String(s) => Value::Str(s.to_string()),
                    FieldValue::Boolean(b) => Value::Bool(*b),
                };
                (k.to_string(), v)
            })
            .collect();
        if let Some(e) = check_names(&tags, &fields) {
            rejected.push(LineError { line, error: e });
            continue;
        }
        tables
            .entry(parsed.series.measurement.to_string())
            .or_default()
            .push(Row {
                line,
                tags,
                fields,
                time_ns,
            });
    }
    tables
}

fn check_names(tags: &[(String, String)], fields: &[(String, Value)]) -> Option<String> {
    for (k, _) in tags {
        if k == TIME_COLUMN {
            return Some("a tag may not be named time".into());
        }
    }
    for w in tags.windows(2) {
        if w[0].0 == w[1].0 {
            return Some(format!("tag {} appears twice", w[0].0));
        }
    }
    for (i, (k, _)) in fields.iter().enumerate() {
        if k == TIME_COLUMN {
            return Some("a field may not be named time".into());
        }
        if tags.iter().any(|(t, _)| t == k) {
            return Some(format!("{k} is both a tag and a field"));
        }
        if fields[..i].iter().any(|(f, _)| f == k) {
            return Some(format!("field {k} appears twice"));
        }
    }
    None
}

/// Why `row` cannot go into `table` as it stands, if it cannot.
fn conflict(table: &Table, row: &Row) -> Option<String> {
    for (k, _) in &row.tags {
        if let Some(c) = table.columns.iter().find(|c| &c.name == k) {
            if c.kind() != ColumnKind::Tag {
                return Some(format!(
                    "{k} is a {} column of {}, not a tag",
                    sealion_common::catalog::kind_name(c.kind()),
                    table.name
                ));
            }
        }
    }
    for (k, v) in &row.fields {
        if let Some(c) = table.columns.iter().find(|c| &c.name == k) {
            if c.kind() != ColumnKind::Field {
                return Some(format!(
                    "{k} is a {} column of {}, not a field",
                    sealion_common::catalog::kind_name(c.kind()),
                    table.name
                ));
            }
            if c.data_type() != v.data_type() {
                return Some(format!(
                    "field {k} is {} in table {}, got {}",
                    type_name(c.data_type()),
                    table.name,
                    type_name(v.data_type())
                ));
            }
        }
    }
    None
}

/// Columns `rows` need that `table` (if any) lacks; types are those of the
/// first row that names each column. Rows that disagree with an earlier row
/// are rejected.
fn new_columns(
    table: Option<&Table>,
    rows: &mut Vec<Row>,
    rejected: &mut Vec<LineError>,
) -> Vec<Column> {
    let mut added: Vec<Column> = Vec::new();
    let mut keep = Vec::with_capacity(rows.len());
    for row in rows.drain(..) {
        let scratch = Table {
            name: table.map(|t| t.name.clone()).unwrap_or_default(),
            columns: table
                .map(|t| t.columns.clone())
                .unwrap_or_default()
                .into_iter()
                .chain(added.iter().cloned())
                .collect(),
            ..Default::default()
        };
        if let Some(e) = conflict(&scratch, &row) {
            rejected.push(LineError {
                line: row.line,
                error: e,
            });
            continue;
        }
        for (k, _) in &row.tags {
            if !scratch.columns.iter().any(|c| &c.name == k) {
                added.push(Column {
                    name: k.clone(),
                    kind: ColumnKind::Tag as i32,
                    data_type: DataType::String as i32,
                });
            }
        }
        for (k, v) in &row.fields {
            if !scratch.columns.iter().any(|c| &c.name == k) {
                added.push(Column {
                    name: k.clone(),
                    kind: ColumnKind::Field as i32,
                    data_type: v.data_type() as i32,
                });
            }
        }
        keep.push(row);
    }
    *rows = keep;
    added
}

/// Builds one batch of `rows` with the time column and every column any row
/// names, in the table's column order.
fn build_batch(table: &Table, rows: &[Row]) -> Result<RecordBatch> {
    let used: Vec<&Column> = table
        .columns
        .iter()
        .filter(|c| {
            c.kind() == ColumnKind::Time
                || rows.iter().any(|r| {
                    r.tags.iter().any(|(k, _)| k == &c.name)
                        || r.fields.iter().any(|(k, _)| k == &c.name)
                })
        })
        .collect();
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(used.len());
    for c in &used {
        let array: ArrayRef = match (c.kind(), c.data_type()) {
            (ColumnKind::Time, _) => {
                let mut b = TimestampNanosecondBuilder::with_capacity(rows.len());
                rows.iter().for_each(|r| b.append_value(r.time_ns));
                Arc::new(b.finish().with_timezone(TIME_ZONE))
            }
            (ColumnKind::Tag, _) => {
                let mut b = StringBuilder::new();
                for r in rows {
                    b.append_option(
                        r.tags
                            .iter()
                            .find(|(k, _)| k == &c.name)
                            .map(|(_, v)| v.as_str()),
                    );
                }
                Arc::new(b.finish())
            }
            (_, t) => {
                let get = |r: &Row| {
                    r.fields
                        .iter()
                        .find(|(k, _)| k == &c.name)
                        .map(|(_, v)| v.clone())
                };
                match t {
                    DataType::Float64 => {
                        let mut b = Float64Builder::new();
                        rows.iter().for_each(|r| {
                            b.append_option(match get(r) {
                                Some(Value::F64(x)) => Some(x),
                                _ => None,
                            })
                        });
                        Arc::new(b.finish())
                    }
                    DataType::Int64 => {
                        let mut b = Int64Builder::new();
                        rows.iter().for_each(|r| {
                            b.append_option(match get(r) {
                                Some(Value::I64(x)) => Some(x),
                                _ => None,
                            })
                        });
                        Arc::new(b.finish())
                    }
                    DataType::Uint64 => {
                        let mut b = UInt64Builder::new();
                        rows.iter().for_each(|r| {
                            b.append_option(match get(r) {
                                Some(Value::U64(x)) => Some(x),
                                _ => None,
                            })
                        });
                        Arc::new(b.finish())
                    }
                    DataType::Bool => {
                        let mut b = BooleanBuilder::new();
                        rows.iter().for_each(|r| {
                            b.append_option(match get(r) {
                                Some(Value::Bool(x)) => Some(x),
                                _ => None,
                            })
                        });
                        Arc::new(b.finish())
                    }
                    _ => {
                        let mut b = StringBuilder::new();
                        for r in rows {
                            b.append_option(match get(r) {
                                Some(Value::Str(x)) => Some(x),
                                _ => None,
                            });
                        }
                        Arc::new(b.finish())
                    }
                }
            }
        };
        arrays.push(array);
    }
    let schema = Arc::new(arrow::datatypes::Schema::new(
        used.iter().map(|c| arrow_field(c)).collect::<Vec<_>>(),
    ));
    Ok(RecordBatch::try_new(schema, arrays)?)
}

/// Stores the lines of `body` in database `db`. `batch_id` (empty for none)
/// names the body: a retry of it with the same id is applied once.
pub async fn write(
    shared: &Shared,
    db: &str,
    body: &str,
    precision: Precision,
    batch_id: &[u8],
) -> Result<WriteOutcome> {
    let now_ns = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0);
    let mut outcome = WriteOutcome::default();
    let tables = parse_body(body, precision, now_ns, &mut outcome.rejected);
    for (name, mut rows) in tables {
        let state = shared.meta.state();
        let existing = find_table(&state, db, &name).cloned();
        let added = new_columns(existing.as_ref(), &mut rows, &mut outcome.rejected);
        let table = if existing.is_none() || !added.is_empty() {
            let reply = shared
                .meta
                .propose(Cmd::AddColumns(AddColumns {
                    database: db.to_string(),
                    table: name.clone(),
                    columns: added,
                    create_table: true,
                    partition_interval_ns: DEFAULT_PARTITION_INTERVAL_NS,
                }))
                .await;
            match reply {
                Ok(r) => r
                    .table
                    .ok_or_else(|| Error::Internal("meta returned no table".into()))?,
                Err(sealion_common::Error::Rejected { message, .. }) => {
                    // Another writer added a column of another type first.
                    for r in rows {
                        outcome.rejected.push(LineError {
                            line: r.line,
                            error: message.clone(),
                        });
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            existing.unwrap_or_default()
        };
        // Times whose partition start is not representable are refused, and
        // so are rows that the table's retention would drop at once.
        let cutoff = crate::router::retention_cutoff_ns(&table, now_ns);
        rows.retain(|r| {
            let Some(start) = partition_start(r.time_ns, table.partition_interval_ns) else {
                outcome.rejected.push(LineError {
                    line: r.line,
                    error: format!("timestamp {} ns is out of range", r.time_ns),
                });
                return false;
            };
            if partition_end(start, table.partition_interval_ns) <= cutoff {
                outcome.rejected.push(LineError {
                    line: r.line,
                    error: format!(
                        "timestamp {} ns is older than the retention of table {}",
                        r.time_ns, table.name
                    ),
                });
                return false;
            }
            true
        });
        if rows.is_empty() {
            continue;
        }
        let batch = build_batch(&table, &rows)?;
        outcome.rows_written += shared.router.write_batch(&table, batch, batch_id).await?;
    }
    outcome.rejected.sort_by_key(|e| e.line);
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_named_and_good_lines_kept() {
        let body = "cpu,host=a usage=1.5 10\n\
                    this is not line protocol\n\
                    \n\
                    cpu,host=b usage=2 20\n\
                    cpu,host=c time=3 30\n\
                    mem,host=a free=7i 9223372036854775807\n";
        let mut rejected = Vec::new();
        let tables = parse_body(body, Precision::Ns, 0, &mut rejected);
        assert_eq!(tables["cpu"].len(), 2);
        assert_eq!(tables["mem"].len(), 1);
        assert_eq!(
            rejected.iter().map(|e| e.line).collect::<Vec<_>>(),
            vec![2, 5]
        );
        let mut rejected = Vec::new();
        let tables = parse_body(
            "m f=1 9223372036854775807\nm f=2 5\n",
            Precision::S,
            0,
            &mut rejected,
        );
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].line, 1);
        assert!(rejected[0].error.contains("out of range"));
        assert_eq!(tables["m"][0].time_ns, 5_000_000_000);
    }

    #[test]
    fn line_numbers_hold_across_a_long_body() {
        let mut body = String::new();
        let mut bad = Vec::new();
        for i in 0..2_000 {
            if i % 7 == 3 {
                body.push_str("not line protocol\n");
                bad.push(i + 1);
            } else if i % 11 == 0 {
                body.push('\n');
            } else {
                body.push_str(&format!("cpu,host=h{i} usage={i} {i}\n"));
            }
        }
        let mut rejected = Vec::new();
        parse_body(&body, Precision::Ns, 0, &mut rejected);
        assert_eq!(rejected.iter().map(|e| e.line).collect::<Vec<_>>(), bad);
    }

    #[test]
    fn a_field_that_changes_type_is_rejected_per_line() {
        let mut rejected = Vec::new();
        let mut tables = parse_body(
            "m,h=a f=1.0 1\nm,h=a f=2i 2\nm,h=b f=3.0 3\n",
            Precision::Ns,
            0,
            &mut rejected,
        );
        let rows = tables.get_mut("m").unwrap();
        let added = new_columns(None, rows, &mut rejected);
        assert_eq!(rows.len(), 2);
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].line, 2);
        assert!(
            rejected[0].error.contains("DOUBLE"),
            "{}",
            rejected[0].error
        );
        assert_eq!(added.len(), 2);
    }
}
