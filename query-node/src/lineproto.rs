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
    ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray, TimestampNanosecondBuilder,
    UInt64Array,
};
use arrow::record_batch::RecordBatch;
use influxdb_line_protocol::{EscapedStr, FieldValue, parse_lines, split_lines};
use sealion_common::catalog::{TIME_COLUMN, TIME_ZONE, arrow_field, find_table, type_name};
use sealion_common::proto::meta_command::Cmd;
use sealion_common::proto::{AddColumns, Column, ColumnKind, DataType, Table};
use sealion_common::time::{DEFAULT_PARTITION_INTERVAL_NS, partition_end, partition_start};
use serde::Serialize;

use crate::catalog::Shared;
use crate::{Error, Result};

mod plain;
use plain::Line;

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

/// A field value, text borrowed from the body where it was not escaped.
#[derive(Debug, Clone, PartialEq)]
enum Value<'a> {
    F64(f64),
    I64(i64),
    U64(u64),
    Str(EscapedStr<'a>),
    Bool(bool),
}

impl Value<'_> {
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

/// One line's row; names and text borrow from the body (no copy per line
/// unless the line escapes them).
struct Row<'a> {
    line: usize,
    tags: Vec<(EscapedStr<'a>, EscapedStr<'a>)>,
    fields: Vec<(EscapedStr<'a>, Value<'a>)>,
    time_ns: i64,
}

/// Parses one line with the general parser (the crate's), which knows
/// every form of the grammar; `None` for a line that holds nothing.
fn parse_general(text: &str) -> Option<std::result::Result<Line<'_>, String>> {
    let parsed = match parse_lines(text).next()? {
        Ok(p) => p,
        Err(e) => return Some(Err(e.to_string())),
    };
    let fields = parsed
        .field_set
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                FieldValue::F64(x) => Value::F64(x),
                FieldValue::I64(x) => Value::I64(x),
                FieldValue::U64(x) => Value::U64(x),
                FieldValue::String(s) => Value::Str(s),
                FieldValue::Boolean(b) => Value::Bool(b),
            };
            (k, v)
        })
        .collect();
    Some(Ok(Line {
        measurement: parsed.series.measurement,
        tags: parsed.series.tag_set.into_iter().flatten().collect(),
        fields,
        timestamp: parsed.timestamp,
    }))
}

/// The lines of `body` with their numbers (from 1). A body with no quote
/// and no backslash ends a line at every newline, which is what the crate's
/// rules for splitting come to then; others are split by those rules
/// (a quoted string may hold a newline), unless `fast` is false.
fn numbered_lines(body: &str, fast: bool) -> Box<dyn Iterator<Item = (usize, &str)> + '_> {
    if fast && memchr::memchr2(b'"', b'\\', body.as_bytes()).is_none() {
        return Box::new(body.split('\n').enumerate().map(|(i, l)| (i + 1, l)));
    }
    let base = body.as_ptr() as usize;
    // Line numbers are counted as the lines go by (counting from the start
    // of the body for each line would be quadratic in its size).
    let (mut seen, mut line) = (0usize, 1usize);
    Box::new(split_lines(body).map(move |text| {
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
        (line, text)
    }))
}

/// Parses `body` into rows per table; bad lines go to `rejected`.
fn parse_body<'a>(
    body: &'a str,
    precision: Precision,
    now_ns: i64,
    rejected: &mut Vec<LineError>,
) -> BTreeMap<String, Vec<Row<'a>>> {
    parse_body_with(body, precision, now_ns, rejected, true)
}

/// [`parse_body`], with the fast paths for plain bodies and lines taken
/// or not (the tests hold the two to the same answer).
fn parse_body_with<'a>(
    body: &'a str,
    precision: Precision,
    now_ns: i64,
    rejected: &mut Vec<LineError>,
    try_plain: bool,
) -> BTreeMap<String, Vec<Row<'a>>> {
    let mut tables: BTreeMap<String, Vec<Row<'a>>> = BTreeMap::new();
    // The previous line's counts, as capacities for the next.
    let (mut tag_count, mut field_count) = (0, 0);
    for (line, text) in numbered_lines(body, try_plain) {
        let trimmed = text.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let plain = match try_plain {
            true => plain::parse(text, tag_count, field_count),
            false => None,
        };
        let parsed = match plain.map(Ok).or_else(|| parse_general(text)) {
            Some(Ok(p)) => p,
            Some(Err(error)) => {
                rejected.push(LineError { line, error });
                continue;
            }
            None => continue,
        };
        (tag_count, field_count) = (parsed.tags.len(), parsed.fields.len());
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
        let Line {
            measurement,
            mut tags,
            fields,
            ..
        } = parsed;
        tags.sort();
        let table = measurement.as_str();
        // Bodies mostly hold one table: no allocation for its name per line.
        let rows = match tables.get_mut(table) {
            Some(rows) => rows,
            None => tables.entry(table.to_owned()).or_default(),
        };
        // The check depends on the names alone: a line naming what the
        // table's previous line named passes as that one did.
        let checked = rows
            .last()
            .is_some_and(|prev| same_names(&prev.tags, &tags) && same_names(&prev.fields, &fields));
        if !checked && let Some(e) = check_names(&tags, &fields) {
            rejected.push(LineError { line, error: e });
            continue;
        }
        rows.push(Row {
            line,
            tags,
            fields,
            time_ns,
        });
    }
    tables
}

/// Whether two lists name the same keys in the same order.
fn same_names<V>(a: &[(EscapedStr, V)], b: &[(EscapedStr, V)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((x, _), (y, _))| x.as_str() == y.as_str())
}

/// Whether two rows have the same shape: the same tags, and the same
/// fields with values of the same types, in the same order.
fn same_shape(a: &Row<'_>, b: &Row<'_>) -> bool {
    same_names(&a.tags, &b.tags)
        && same_names(&a.fields, &b.fields)
        && a.fields
            .iter()
            .zip(&b.fields)
            .all(|((_, x), (_, y))| x.data_type() == y.data_type())
}

fn check_names(
    tags: &[(EscapedStr, EscapedStr)],
    fields: &[(EscapedStr, Value)],
) -> Option<String> {
    for (k, _) in tags {
        if k.as_str() == TIME_COLUMN {
            return Some("a tag may not be named time".into());
        }
    }
    for w in tags.windows(2) {
        if w[0].0 == w[1].0 {
            return Some(format!("tag {} appears twice", w[0].0));
        }
    }
    for (i, (k, _)) in fields.iter().enumerate() {
        if k.as_str() == TIME_COLUMN {
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

/// A table's columns by name (with those a body adds), for the checks of
/// each line.
struct Known {
    table: String,
    columns: rustc_hash::FxHashMap<String, (ColumnKind, DataType)>,
}

impl Known {
    fn new(table: Option<&Table>) -> Self {
        Known {
            table: table.map(|t| t.name.clone()).unwrap_or_default(),
            columns: table
                .into_iter()
                .flat_map(|t| &t.columns)
                .map(|c| (c.name.clone(), (c.kind(), c.data_type())))
                .collect(),
        }
    }

    /// Why `row` cannot go into the table as it stands, if it cannot.
    fn conflict(&self, row: &Row<'_>) -> Option<String> {
        for (k, _) in &row.tags {
            if let Some(&(kind, _)) = self.columns.get(k.as_str())
                && kind != ColumnKind::Tag
            {
                return Some(format!(
                    "{k} is a {} column of {}, not a tag",
                    sealion_common::catalog::kind_name(kind),
                    self.table
                ));
            }
        }
        for (k, v) in &row.fields {
            if let Some(&(kind, ty)) = self.columns.get(k.as_str()) {
                if kind != ColumnKind::Field {
                    return Some(format!(
                        "{k} is a {} column of {}, not a field",
                        sealion_common::catalog::kind_name(kind),
                        self.table
                    ));
                }
                if ty != v.data_type() {
                    return Some(format!(
                        "field {k} is {} in table {}, got {}",
                        type_name(ty),
                        self.table,
                        type_name(v.data_type())
                    ));
                }
            }
        }
        None
    }
}

/// Columns `rows` need that `table` (if any) lacks; types are those of the
/// first row that names each column. Rows that disagree with an earlier row
/// are rejected.
fn new_columns(
    table: Option<&Table>,
    rows: &mut Vec<Row<'_>>,
    rejected: &mut Vec<LineError>,
) -> Vec<Column> {
    let mut added: Vec<Column> = Vec::new();
    let mut known = Known::new(table);
    let mut keep: Vec<Row<'_>> = Vec::with_capacity(rows.len());
    for row in rows.drain(..) {
        // Conflicts and new columns depend on the shape alone: a row shaped
        // like the previous row kept is kept and adds nothing.
        if keep.last().is_some_and(|prev| same_shape(prev, &row)) {
            keep.push(row);
            continue;
        }
        if let Some(e) = known.conflict(&row) {
            rejected.push(LineError {
                line: row.line,
                error: e,
            });
            continue;
        }
        for (k, _) in &row.tags {
            if !known.columns.contains_key(k.as_str()) {
                known
                    .columns
                    .insert(k.to_string(), (ColumnKind::Tag, DataType::String));
                added.push(Column {
                    name: k.to_string(),
                    kind: ColumnKind::Tag as i32,
                    data_type: DataType::String as i32,
                });
            }
        }
        for (k, v) in &row.fields {
            if !known.columns.contains_key(k.as_str()) {
                known
                    .columns
                    .insert(k.to_string(), (ColumnKind::Field, v.data_type()));
                added.push(Column {
                    name: k.to_string(),
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

/// The column index of each name of one row's list (tags or fields), by
/// `index`; rows mostly list the same names in the same order, so the
/// previous row's answer is tried before hashing.
struct ColumnOf<'a> {
    index: &'a rustc_hash::FxHashMap<&'a str, usize>,
    columns: &'a [Column],
    last: Vec<usize>,
}

impl<'a> ColumnOf<'a> {
    fn new(index: &'a rustc_hash::FxHashMap<&'a str, usize>, columns: &'a [Column]) -> Self {
        ColumnOf {
            index,
            columns,
            last: Vec::new(),
        }
    }

    fn get(&mut self, j: usize, name: &str) -> Option<usize> {
        if let Some(&c) = self.last.get(j)
            && self.columns[c].name == name
        {
            return Some(c);
        }
        let c = *self.index.get(name)?;
        self.last.truncate(j);
        if self.last.len() == j {
            self.last.push(c);
        }
        Some(c)
    }
}

/// Builds one batch of `rows` with the time column and every column any row
/// names, in the table's column order.
fn build_batch(table: &Table, rows: &[Row<'_>]) -> Result<RecordBatch> {
    let n = rows.len();
    let index: rustc_hash::FxHashMap<&str, usize> = table
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    // Per column, each row's tag or field (None where the row names none);
    // made when a row first names the column.
    let mut tags: Vec<Option<Vec<Option<&str>>>> = vec![None; table.columns.len()];
    let mut fields: Vec<Option<Vec<Option<&Value<'_>>>>> = vec![None; table.columns.len()];
    let (mut tag_of, mut field_of) = (
        ColumnOf::new(&index, &table.columns),
        ColumnOf::new(&index, &table.columns),
    );
    for (i, r) in rows.iter().enumerate() {
        for (j, (k, v)) in r.tags.iter().enumerate() {
            if let Some(c) = tag_of.get(j, k) {
                tags[c].get_or_insert_with(|| vec![None; n])[i] = Some(v.as_str());
            }
        }
        for (j, (k, v)) in r.fields.iter().enumerate() {
            if let Some(c) = field_of.get(j, k) {
                fields[c].get_or_insert_with(|| vec![None; n])[i] = Some(v);
            }
        }
    }
    let mut used: Vec<&Column> = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    for (c, column) in table.columns.iter().enumerate() {
        let array: ArrayRef = match (column.kind(), column.data_type()) {
            (ColumnKind::Time, _) => {
                let mut b = TimestampNanosecondBuilder::with_capacity(n);
                rows.iter().for_each(|r| b.append_value(r.time_ns));
                Arc::new(b.finish().with_timezone(TIME_ZONE))
            }
            (ColumnKind::Tag, _) => {
                let Some(values) = &tags[c] else { continue };
                Arc::new(values.iter().copied().collect::<StringArray>())
            }
            (_, t) => {
                let Some(values) = &fields[c] else { continue };
                // The rows' values of one variant; null where a row has none.
                macro_rules! field_array {
                    ($variant:ident, $array:ty, $x:ident => $out:expr) => {
                        Arc::new(
                            values
                                .iter()
                                .map(|v| match v {
                                    Some(Value::$variant($x)) => Some($out),
                                    _ => None,
                                })
                                .collect::<$array>(),
                        )
                    };
                }
                match t {
                    DataType::Float64 => field_array!(F64, Float64Array, x => *x),
                    DataType::Int64 => field_array!(I64, Int64Array, x => *x),
                    DataType::Uint64 => field_array!(U64, UInt64Array, x => *x),
                    DataType::Bool => field_array!(Bool, BooleanArray, x => *x),
                    _ => field_array!(Str, StringArray, x => x.as_str()),
                }
            }
        };
        used.push(column);
        arrays.push(array);
    }
    let schema = Arc::new(arrow::datatypes::Schema::new(
        used.iter().map(|c| arrow_field(c)).collect::<Vec<_>>(),
    ));
    Ok(RecordBatch::try_new(schema, arrays)?)
}

/// Most times one write asks meta for tables or columns its rows need
/// before giving up: each round adds what the body names, so a second
/// round finds everything unless the tables changed under it.
const MAX_SCHEMA_ROUNDS: usize = 3;

/// What the CPU-bound part of a write made of a body (see [`prepare`]).
#[derive(Default)]
struct Prepared {
    /// Per table that needs nothing from meta: the table and its rows.
    batches: Vec<(Table, RecordBatch)>,
    rejected: Vec<LineError>,
    /// Tables to create or extend before the body's rows can be built.
    needs: Vec<AddColumns>,
}

/// Parses `text` and builds a batch per table it names, against the tables
/// of `db` in `state` (or in `tables`, which meta answered since and which
/// take precedence). A table that is missing or lacks a column its rows
/// name goes to `needs` instead; every row of a table in `refused` is
/// rejected with meta's reason.
fn prepare(
    state: &sealion_common::proto::ClusterState,
    tables: &std::collections::HashMap<String, Table>,
    refused: &std::collections::HashMap<String, String>,
    db: &str,
    text: &str,
    precision: Precision,
    now_ns: i64,
) -> Result<Prepared> {
    let mut out = Prepared::default();
    for (name, mut rows) in parse_body(text, precision, now_ns, &mut out.rejected) {
        if let Some(message) = refused.get(&name) {
            // Another writer added a column of another type first.
            out.rejected.extend(rows.iter().map(|r| LineError {
                line: r.line,
                error: message.clone(),
            }));
            continue;
        }
        let existing = tables
            .get(&name)
            .or_else(|| find_table(state, db, &name))
            .cloned();
        let added = new_columns(existing.as_ref(), &mut rows, &mut out.rejected);
        let table = match existing {
            Some(table) if added.is_empty() => table,
            _ => {
                out.needs.push(AddColumns {
                    database: db.to_string(),
                    table: name,
                    columns: added,
                    create_table: true,
                    partition_interval_ns: DEFAULT_PARTITION_INTERVAL_NS,
                });
                continue;
            }
        };
        // Times whose partition start is not representable are refused, and
        // so are rows that the table's retention would drop at once.
        let cutoff = crate::router::retention_cutoff_ns(&table, now_ns);
        rows.retain(|r| {
            let Some(start) = partition_start(r.time_ns, table.partition_interval_ns) else {
                out.rejected.push(LineError {
                    line: r.line,
                    error: format!("timestamp {} ns is out of range", r.time_ns),
                });
                return false;
            };
            if partition_end(start, table.partition_interval_ns) <= cutoff {
                out.rejected.push(LineError {
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
        out.batches.push((table, batch));
    }
    Ok(out)
}

/// Stores the lines of `body` in database `db`. `batch_id` (empty for none)
/// names the body: a retry of it with the same id is applied once.
///
/// Parsing a body and building its batches is CPU work in proportion to its
/// size (tens of milliseconds for a body of a few MiB), so it runs on the
/// blocking pool ([`prepare`]): an async worker that did it would answer no
/// query and no other connection meanwhile. Tables and columns the body
/// needs are asked of meta first (then the body is parsed again, against
/// them); the rows go to the router once every table's batch is built.
pub async fn write(
    shared: &Shared,
    db: &str,
    body: bytes::Bytes,
    precision: Precision,
    batch_id: &[u8],
) -> Result<WriteOutcome> {
    let now_ns = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0);
    let mut tables: std::collections::HashMap<String, Table> = Default::default();
    let mut refused: std::collections::HashMap<String, String> = Default::default();
    for _ in 0..MAX_SCHEMA_ROUNDS {
        let state = shared.meta.state();
        let (db_owned, body, known, no) = (
            db.to_string(),
            body.clone(),
            tables.clone(),
            refused.clone(),
        );
        let prepared = tokio::task::spawn_blocking(move || {
            let text = std::str::from_utf8(&body)
                .map_err(|_| Error::Invalid("body is not UTF-8".into()))?;
            prepare(&state, &known, &no, &db_owned, text, precision, now_ns)
        })
        .await
        .map_err(|e| Error::Internal(format!("line protocol task failed: {e}")))??;
        if prepared.needs.is_empty() {
            let mut outcome = WriteOutcome {
                rows_written: 0,
                rejected: prepared.rejected,
            };
            for (table, batch) in prepared.batches {
                outcome.rows_written += shared.router.write_batch(&table, batch, batch_id).await?;
            }
            outcome.rejected.sort_by_key(|e| e.line);
            return Ok(outcome);
        }
        for add in prepared.needs {
            let name = add.table.clone();
            match shared.meta.propose(Cmd::AddColumns(add)).await {
                Ok(r) => {
                    let table = r
                        .table
                        .ok_or_else(|| Error::Internal("meta returned no table".into()))?;
                    tables.insert(name, table);
                }
                Err(sealion_common::Error::Rejected { message, .. }) => {
                    refused.insert(name, message);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Err(Error::Unavailable(format!(
        "the tables of this write changed {MAX_SCHEMA_ROUNDS} times while it was made ready; retry it"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Array;

    /// Column `name` of `batch` as text per row ("-" for null).
    fn column_text(batch: &RecordBatch, name: &str) -> Vec<String> {
        let a = batch.column_by_name(name).unwrap();
        (0..a.len())
            .map(|i| {
                if a.is_null(i) {
                    "-".to_string()
                } else {
                    arrow::util::display::array_value_to_string(a, i).unwrap()
                }
            })
            .collect()
    }

    #[test]
    fn rows_that_name_columns_in_any_order_or_subset_fill_the_right_columns() {
        let body = "m,b=y,a=x f=1,g=\"s\" 10\n\
                    m,a=x\\ z g=\"t\",f=2 20\n\
                    m,c=w h=true,k=-3i 30\n\
                    m f=4 40";
        let mut rejected = Vec::new();
        let mut tables = parse_body(body, Precision::S, 0, &mut rejected);
        assert!(rejected.is_empty(), "{rejected:?}");
        let mut rows = tables.remove("m").unwrap();
        let added = new_columns(None, &mut rows, &mut rejected);
        let names: Vec<&str> = added.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "f", "g", "c", "h", "k"]);
        let mut columns = vec![Column {
            name: TIME_COLUMN.into(),
            kind: ColumnKind::Time as i32,
            data_type: DataType::Timestamp as i32,
        }];
        // The table's order differs from the rows'.
        columns.extend(added.into_iter().rev());
        let table = Table {
            name: "m".into(),
            columns,
            ..Default::default()
        };
        let batch = build_batch(&table, &rows).unwrap();
        let got: Vec<Vec<String>> = ["a", "b", "c", "f", "g", "h", "k"]
            .iter()
            .map(|c| column_text(&batch, c))
            .collect();
        let want = [
            vec!["x", "x z", "-", "-"],
            vec!["y", "-", "-", "-"],
            vec!["-", "-", "w", "-"],
            vec!["1.0", "2.0", "-", "4.0"],
            vec!["s", "t", "-", "-"],
            vec!["-", "-", "true", "-"],
            vec!["-", "-", "-3", "-"],
        ];
        assert_eq!(got, want);
        let names: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["time", "k", "h", "c", "g", "f", "b", "a"]);
    }

    #[test]
    fn prepare_asks_meta_for_what_a_body_lacks_and_builds_the_rest() {
        let column = |name: &str, kind: ColumnKind, data_type: DataType| Column {
            name: name.into(),
            kind: kind as i32,
            data_type: data_type as i32,
        };
        let cpu = Table {
            database: "db".into(),
            name: "cpu".into(),
            partition_interval_ns: DEFAULT_PARTITION_INTERVAL_NS,
            columns: vec![
                column(TIME_COLUMN, ColumnKind::Time, DataType::Timestamp),
                column("host", ColumnKind::Tag, DataType::String),
                column("usage", ColumnKind::Field, DataType::Float64),
            ],
            ..Default::default()
        };
        let state = sealion_common::proto::ClusterState {
            tables: vec![cpu.clone()],
            ..Default::default()
        };
        let body = "cpu,host=a usage=1.5 10\n\
                    mem,host=a free=7i 11\n\
                    cpu,host=b usage=2i 12\n\
                    not line protocol\n\
                    cpu,host=c usage=3 13\n\
                    disk,host=a used=5i 14\n";
        let (answered, refused) = (Default::default(), Default::default());
        let p = prepare(&state, &answered, &refused, "db", body, Precision::S, 0).unwrap();
        // cpu has every column: built, its integer usage rejected.
        assert_eq!(p.batches.len(), 1);
        assert_eq!(p.batches[0].0.name, "cpu");
        assert_eq!(column_text(&p.batches[0].1, "host"), ["a", "c"]);
        let mut lines: Vec<usize> = p.rejected.iter().map(|e| e.line).collect();
        lines.sort_unstable();
        assert_eq!(lines, [3, 4], "{:?}", p.rejected);
        // mem and disk do not exist: asked for, in name order, with their columns.
        let asked: Vec<(&str, Vec<&str>)> = p
            .needs
            .iter()
            .map(|a| {
                assert!(a.create_table);
                assert_eq!(a.database, "db");
                (
                    a.table.as_str(),
                    a.columns.iter().map(|c| c.name.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(
            asked,
            [
                ("disk", vec!["host", "used"]),
                ("mem", vec!["host", "free"])
            ]
        );

        // Meta's answers take precedence over the state; a refused table's
        // rows are rejected with meta's reason.
        let mut mem = Table {
            database: "db".into(),
            name: "mem".into(),
            partition_interval_ns: DEFAULT_PARTITION_INTERVAL_NS,
            ..Default::default()
        };
        mem.columns = vec![
            column(TIME_COLUMN, ColumnKind::Time, DataType::Timestamp),
            column("host", ColumnKind::Tag, DataType::String),
            column("free", ColumnKind::Field, DataType::Int64),
        ];
        let answered = [("mem".to_string(), mem)].into_iter().collect();
        let refused = [("disk".to_string(), "no disks today".to_string())]
            .into_iter()
            .collect();
        let p = prepare(&state, &answered, &refused, "db", body, Precision::S, 0).unwrap();
        assert!(p.needs.is_empty());
        let built: Vec<&str> = p.batches.iter().map(|(t, _)| t.name.as_str()).collect();
        assert_eq!(built, ["cpu", "mem"]);
        assert_eq!(column_text(&p.batches[1].1, "free"), ["7"]);
        let disk: Vec<(usize, &str)> = p
            .rejected
            .iter()
            .filter(|e| e.line == 6)
            .map(|e| (e.line, e.error.as_str()))
            .collect();
        assert_eq!(disk, [(6, "no disks today")]);
    }

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
    fn a_line_is_checked_whatever_the_line_before_it_was() {
        let mut rejected = Vec::new();
        let tables = parse_body(
            "m,h=a f=1 1\nm,h=a,h=b f=2 2\nm,h=a f=1,h=3 3\nm,h=a f=1 4\nm,h=a f=1,f=2 5\nm,h=b f=3 6\n",
            Precision::Ns,
            0,
            &mut rejected,
        );
        let lines: Vec<usize> = rejected.iter().map(|e| e.line).collect();
        assert_eq!(lines, [2, 3, 5], "{rejected:?}");
        let kept: Vec<usize> = tables["m"].iter().map(|r| r.line).collect();
        assert_eq!(kept, [1, 4, 6]);
        // A row shaped like the one before it is kept without new columns;
        // one whose field type differs is not.
        let mut rejected = Vec::new();
        let mut tables = parse_body(
            "m,h=a f=1 1\nm,h=a f=2 2\nm,h=a f=\"x\" 3\nm,h=a f=4 4\n",
            Precision::Ns,
            0,
            &mut rejected,
        );
        let rows = tables.get_mut("m").unwrap();
        let added = new_columns(None, rows, &mut rejected);
        let lines: Vec<usize> = rejected.iter().map(|e| e.line).collect();
        assert_eq!(lines, [3]);
        assert_eq!(rows.iter().map(|r| r.line).collect::<Vec<_>>(), [1, 2, 4]);
        assert_eq!(added.len(), 2);
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
