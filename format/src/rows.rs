//! The open partition's row format in RocksDB.
//!
//! Key:   partition id (u64 BE) | series key length (u32 BE) | series key | time
//! Value: format version (u8) | fields
//!
//! The series key is the row's non-null tags sorted by name, each as
//! `name length (u16) | name | value length (u32) | value`. Time is stored as
//! a big-endian i64 with its sign bit flipped, so keys of one series sort by
//! time. A row is unique by (series key, time): writing it again replaces it,
//! which is Sealion's last-write-wins rule.
//!
//! Fields are `name length (u16) | name | type (u8) | payload`, null fields
//! omitted. The format is self-describing so a row can be decoded without the
//! table's schema; the column store (sealed partitions) replaces it for data
//! whose time has passed.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, BooleanBuilder, Float64Array, Float64Builder, Int64Array,
    Int64Builder, StringArray, StringBuilder, TimestampNanosecondArray, TimestampNanosecondBuilder,
    UInt64Array, UInt64Builder,
};
use arrow::record_batch::RecordBatch;
use sealion_common::catalog::{TIME_ZONE, arrow_schema};
use sealion_common::proto::{Column, ColumnKind, DataType};

use crate::{Error, Result};

// The row value format, shared with the sealed file's writer and reader
// (which re-encode rows in it).
pub(crate) const ROW_FORMAT_V1: u8 = 1;

pub(crate) const T_F64: u8 = 1;
pub(crate) const T_I64: u8 = 2;
pub(crate) const T_U64: u8 = 3;
pub(crate) const T_BOOL: u8 = 4;
pub(crate) const T_STR: u8 = 5;

/// Largest tag or field name, and largest text value, a row may hold.
pub const MAX_NAME_BYTES: usize = u16::MAX as usize;
pub const MAX_VALUE_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    F64(f64),
    I64(i64),
    U64(u64),
    Bool(bool),
    Str(String),
}

pub fn partition_prefix(partition_id: u64) -> [u8; 8] {
    partition_id.to_be_bytes()
}

fn time_bytes(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1u64 << 63)).to_be_bytes()
}

fn time_from_bytes(b: [u8; 8]) -> i64 {
    (u64::from_be_bytes(b) ^ (1u64 << 63)) as i64
}

pub fn encode_key(partition_id: u64, series: &[u8], time_ns: i64) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + 4 + series.len() + 8);
    key.extend_from_slice(&partition_prefix(partition_id));
    key.extend_from_slice(&(series.len() as u32).to_be_bytes());
    key.extend_from_slice(series);
    key.extend_from_slice(&time_bytes(time_ns));
    key
}

/// Splits a key into (partition id, series key, time).
pub fn decode_key(key: &[u8]) -> Option<(u64, &[u8], i64)> {
    if key.len() < 20 {
        return None;
    }
    let pid = u64::from_be_bytes(key[0..8].try_into().ok()?);
    let len = u32::from_be_bytes(key[8..12].try_into().ok()?) as usize;
    if key.len() != 12 + len + 8 {
        return None;
    }
    let series = &key[12..12 + len];
    let t = time_from_bytes(key[12 + len..].try_into().ok()?);
    Some((pid, series, t))
}

fn put_name(out: &mut Vec<u8>, name: &str) -> Result<()> {
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::Invalid(format!(
            "column name of {} bytes is too long",
            name.len()
        )));
    }
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) -> Result<()> {
    if s.len() > MAX_VALUE_BYTES {
        return Err(Error::Invalid(format!(
            "text value of {} bytes is over the limit of {MAX_VALUE_BYTES}",
            s.len()
        )));
    }
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

/// A little reader over a byte slice that fails instead of panicking.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    fn u32(&mut self) -> Option<usize> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
    }
    fn str16(&mut self) -> Option<&'a str> {
        let n = self.u16()?;
        std::str::from_utf8(self.take(n)?).ok()
    }
    fn str32(&mut self) -> Option<&'a str> {
        let n = self.u32()?;
        std::str::from_utf8(self.take(n)?).ok()
    }
}

/// The series key of a row whose non-null tags are `tags` (any order).
pub fn encode_series(tags: &[(&str, &str)]) -> Result<Vec<u8>> {
    let mut sorted = tags.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = Vec::new();
    for (name, value) in sorted {
        put_name(&mut out, name)?;
        put_str(&mut out, value)?;
    }
    Ok(out)
}

/// The shard (of `shards`) that series `series` (a key from
/// [`encode_series`]) belongs to. Stored data depends on it: it never
/// changes for a given key and shard count.
pub fn series_shard(series: &[u8], shards: u32) -> u32 {
    if shards <= 1 {
        return 0;
    }
    let h = twox_hash::XxHash64::oneshot(0x5ea1_10d1_5a4d_0001, series);
    (h % u64::from(shards)) as u32
}

/// Decodes a series key into (tag name, tag value) pairs.
pub fn decode_series(series: &[u8]) -> Option<Vec<(&str, &str)>> {
    let mut r = Reader { buf: series };
    let mut out = Vec::new();
    while !r.buf.is_empty() {
        let name = r.str16()?;
        let value = r.str32()?;
        out.push((name, value));
    }
    Some(out)
}

/// Decodes a row value into (field name, value) pairs.
pub fn decode_fields(value: &[u8]) -> Option<Vec<(&str, Value)>> {
    let mut out = Vec::new();
    let mut names_ok = true;
    let well_formed = for_each_field_value(value, |name, v| match std::str::from_utf8(name) {
        Ok(name) => {
            out.push((name, v));
            true
        }
        Err(_) => {
            names_ok = false;
            false
        }
    });
    (well_formed && names_ok).then_some(out)
}

/// Calls `f(name, value)` for each field of a row value, in the order
/// stored, until `f` returns false; the name as bytes, not checked as UTF-8
/// (callers compare it with names they know and check it only when it is
/// new to them). False when the value is malformed (text values must be
/// UTF-8); `f` has then seen the fields before the fault.
pub fn for_each_field_value<'a>(
    value: &'a [u8],
    mut f: impl FnMut(&'a [u8], Value) -> bool,
) -> bool {
    let mut r = Reader { buf: value };
    if r.u8() != Some(ROW_FORMAT_V1) {
        return false;
    }
    while !r.buf.is_empty() {
        let Some(name) = r.u16().and_then(|n| r.take(n)) else {
            return false;
        };
        let v = match r.u8() {
            Some(T_F64) => r.u64().map(|x| Value::F64(f64::from_bits(x))),
            Some(T_I64) => r.u64().map(|x| Value::I64(x as i64)),
            Some(T_U64) => r.u64().map(Value::U64),
            Some(T_BOOL) => r.u8().map(|x| Value::Bool(x != 0)),
            Some(T_STR) => r.str32().map(|x| Value::Str(x.to_string())),
            _ => None,
        };
        let Some(v) = v else { return false };
        if !f(name, v) {
            return true;
        }
    }
    true
}

/// Calls `f(name, type, payload)` for each field of a row value, in the
/// order stored; false when the value is malformed.
pub fn for_each_field(value: &[u8], mut f: impl FnMut(&str, u8, &[u8])) -> bool {
    let mut r = Reader { buf: value };
    if r.u8() != Some(ROW_FORMAT_V1) {
        return false;
    }
    while !r.buf.is_empty() {
        let Some(name) = r.str16() else { return false };
        let Some(ty) = r.u8() else { return false };
        let payload = match ty {
            T_F64 | T_I64 | T_U64 => r.take(8),
            T_BOOL => r.take(1),
            T_STR => r.u32().and_then(|n| r.take(n)),
            _ => None,
        };
        let Some(payload) = payload else { return false };
        f(name, ty, payload);
    }
    true
}

/// How one batch column maps onto the table.
struct Source<'a> {
    column: &'a Column,
    array: &'a ArrayRef,
}

/// Encodes every row of `batch` (columns named after `columns`) into RocksDB
/// key/value pairs for `partition_id`. A batch column that the table lacks,
/// or whose Arrow type differs from the column's, is an error; nothing of
/// the batch is written then.
pub fn encode_batch(
    partition_id: u64,
    columns: &[Column],
    batch: &RecordBatch,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let schema = batch.schema();
    let mut time: Option<&TimestampNanosecondArray> = None;
    let mut tags: Vec<(&Column, &StringArray)> = Vec::new();
    let mut fields: Vec<Source> = Vec::new();
    for (i, f) in schema.fields().iter().enumerate() {
        let column = columns
            .iter()
            .find(|c| &c.name == f.name())
            .ok_or_else(|| Error::Invalid(format!("column {:?} is not in the table", f.name())))?;
        let array = batch.column(i);
        let want = sealion_common::catalog::arrow_type(column.data_type());
        let matches = match (&want, array.data_type()) {
            (
                arrow::datatypes::DataType::Timestamp(u1, _),
                arrow::datatypes::DataType::Timestamp(u2, _),
            ) => u1 == u2,
            (a, b) => a == b,
        };
        if !matches {
            return Err(Error::Invalid(format!(
                "column {:?} is {:?} in the table, got {:?}",
                f.name(),
                want,
                array.data_type()
            )));
        }
        match column.kind() {
            ColumnKind::Time => {
                time = array.as_any().downcast_ref::<TimestampNanosecondArray>();
            }
            ColumnKind::Tag => {
                let text = array
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .ok_or_else(|| Error::Invalid(format!("tag {:?} is not text", column.name)))?;
                tags.push((column, text));
            }
            ColumnKind::Field | ColumnKind::Unspecified => fields.push(Source { column, array }),
        }
    }
    let time = time.ok_or_else(|| Error::Invalid("batch has no time column".into()))?;
    tags.sort_by(|a, b| a.0.name.cmp(&b.0.name));

    let mut out = Vec::with_capacity(batch.num_rows());
    let mut series = Vec::new();
    // The previous row's value length: rows of a batch are mostly alike, so
    // the next value is made that large at once.
    let mut value_len = 1;
    for row in 0..batch.num_rows() {
        if time.is_null(row) {
            return Err(Error::Invalid(format!("row {row} has a null time")));
        }
        series.clear();
        for (column, a) in &tags {
            if a.is_null(row) {
                continue;
            }
            put_name(&mut series, &column.name)?;
            put_str(&mut series, a.value(row))?;
        }
        let mut value = Vec::with_capacity(value_len);
        value.push(ROW_FORMAT_V1);
        for field in &fields {
            if field.array.is_null(row) {
                continue;
            }
            put_name(&mut value, &field.column.name)?;
            encode_field(&mut value, field, row)?;
        }
        value_len = value.len();
        out.push((encode_key(partition_id, &series, time.value(row)), value));
    }
    Ok(out)
}

fn encode_field(out: &mut Vec<u8>, field: &Source, row: usize) -> Result<()> {
    let any = field.array.as_any();
    let bad = || {
        Error::Invalid(format!(
            "field {:?} has an unexpected type",
            field.column.name
        ))
    };
    match field.column.data_type() {
        DataType::Float64 => {
            out.push(T_F64);
            let v = any
                .downcast_ref::<Float64Array>()
                .ok_or_else(bad)?
                .value(row);
            out.extend_from_slice(&v.to_bits().to_be_bytes());
        }
        DataType::Int64 => {
            out.push(T_I64);
            let v = any.downcast_ref::<Int64Array>().ok_or_else(bad)?.value(row);
            out.extend_from_slice(&(v as u64).to_be_bytes());
        }
        DataType::Uint64 => {
            out.push(T_U64);
            let v = any
                .downcast_ref::<UInt64Array>()
                .ok_or_else(bad)?
                .value(row);
            out.extend_from_slice(&v.to_be_bytes());
        }
        DataType::Bool => {
            out.push(T_BOOL);
            let v = any
                .downcast_ref::<BooleanArray>()
                .ok_or_else(bad)?
                .value(row);
            out.push(v as u8);
        }
        DataType::String | DataType::Unspecified => {
            out.push(T_STR);
            let v = any
                .downcast_ref::<StringArray>()
                .ok_or_else(bad)?
                .value(row);
            put_str(out, v)?;
        }
        DataType::Timestamp => return Err(bad()),
    }
    Ok(())
}

/// The rows a builder has room for when the caller does not say: Arrow's
/// own default.
const DEFAULT_BUILDER_ROWS: usize = 1024;

/// An Arrow builder for one column of Sealion's types; shared by the open
/// partition's scans and the sealed file's reader.
pub(crate) enum ColumnBuilder {
    Time(TimestampNanosecondBuilder),
    Str(StringBuilder),
    F64(Float64Builder),
    I64(Int64Builder),
    U64(UInt64Builder),
    Bool(BooleanBuilder),
}

impl ColumnBuilder {
    pub(crate) fn for_column(c: &Column) -> ColumnBuilder {
        Self::with_capacity(c, DEFAULT_BUILDER_ROWS)
    }

    /// A builder with room for `rows` values before it grows: a scan that
    /// knows it hands on a handful of rows (a latest row, a top ten) does
    /// not allocate a thousand slots for each of its columns.
    pub(crate) fn with_capacity(c: &Column, rows: usize) -> ColumnBuilder {
        match (c.kind(), c.data_type()) {
            (ColumnKind::Time, _) | (_, DataType::Timestamp) => {
                ColumnBuilder::Time(TimestampNanosecondBuilder::with_capacity(rows))
            }
            (_, DataType::Float64) => ColumnBuilder::F64(Float64Builder::with_capacity(rows)),
            (_, DataType::Int64) => ColumnBuilder::I64(Int64Builder::with_capacity(rows)),
            (_, DataType::Uint64) => ColumnBuilder::U64(UInt64Builder::with_capacity(rows)),
            (_, DataType::Bool) => ColumnBuilder::Bool(BooleanBuilder::with_capacity(rows)),
            (_, DataType::String | DataType::Unspecified) => {
                // Tag values are short: sixteen bytes a value to start.
                ColumnBuilder::Str(StringBuilder::with_capacity(rows, rows * 16))
            }
        }
    }

    pub(crate) fn append_nulls(&mut self, n: usize) {
        match self {
            ColumnBuilder::Time(b) => b.append_nulls(n),
            ColumnBuilder::Str(b) => (0..n).for_each(|_| b.append_null()),
            ColumnBuilder::F64(b) => b.append_nulls(n),
            ColumnBuilder::I64(b) => b.append_nulls(n),
            ColumnBuilder::U64(b) => b.append_nulls(n),
            ColumnBuilder::Bool(b) => b.append_nulls(n),
        }
    }

    /// The values built so far, leaving the builder empty.
    pub(crate) fn finish(&mut self) -> ArrayRef {
        match self {
            ColumnBuilder::Time(b) => Arc::new(b.finish().with_timezone(TIME_ZONE)),
            ColumnBuilder::Str(b) => Arc::new(b.finish()),
            ColumnBuilder::F64(b) => Arc::new(b.finish()),
            ColumnBuilder::I64(b) => Arc::new(b.finish()),
            ColumnBuilder::U64(b) => Arc::new(b.finish()),
            ColumnBuilder::Bool(b) => Arc::new(b.finish()),
        }
    }
}

/// Builds Arrow batches of the projected columns from decoded rows.
pub struct BatchBuilder {
    columns: Vec<Column>,
    builders: Vec<ColumnBuilder>,
    rows: usize,
}

impl BatchBuilder {
    pub fn new(columns: Vec<Column>) -> Self {
        Self::with_capacity(columns, DEFAULT_BUILDER_ROWS)
    }

    /// A builder with room for `rows` rows per column before it grows.
    pub fn with_capacity(columns: Vec<Column>, rows: usize) -> Self {
        let builders = columns
            .iter()
            .map(|c| ColumnBuilder::with_capacity(c, rows))
            .collect();
        BatchBuilder {
            columns,
            builders,
            rows: 0,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends the row whose key parts and value are given.
    pub fn push(
        &mut self,
        partition_id: u64,
        series: &[u8],
        time_ns: i64,
        value: &[u8],
    ) -> Result<()> {
        let corrupt = |reason: &str| Error::Corrupt {
            partition_id,
            reason: reason.to_string(),
        };
        let tags = decode_series(series).ok_or_else(|| corrupt("bad series key"))?;
        let needs_fields = self
            .columns
            .iter()
            .any(|c| matches!(c.kind(), ColumnKind::Field | ColumnKind::Unspecified));
        let fields = if needs_fields {
            decode_fields(value).ok_or_else(|| corrupt("bad row value"))?
        } else {
            Vec::new()
        };
        for (column, builder) in self.columns.iter().zip(self.builders.iter_mut()) {
            match (column.kind(), builder) {
                (ColumnKind::Time, ColumnBuilder::Time(b)) => b.append_value(time_ns),
                (ColumnKind::Tag, ColumnBuilder::Str(b)) => {
                    match tags.iter().find(|(n, _)| *n == column.name) {
                        Some((_, v)) => b.append_value(v),
                        None => b.append_null(),
                    }
                }
                (_, builder) => {
                    let v = fields
                        .iter()
                        .find(|(n, _)| *n == column.name)
                        .map(|(_, v)| v);
                    append_field(builder, v, &column.name, partition_id)?;
                }
            }
        }
        self.rows += 1;
        Ok(())
    }

    /// Takes the rows built so far as a batch, leaving the builder empty.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let schema = arrow_schema(&self.columns);
        let arrays: Vec<ArrayRef> = self
            .builders
            .iter_mut()
            .map(ColumnBuilder::finish)
            .collect();
        let options =
            arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(self.rows));
        self.rows = 0;
        Ok(RecordBatch::try_new_with_options(schema, arrays, &options)?)
    }
}

fn append_field(
    builder: &mut ColumnBuilder,
    v: Option<&Value>,
    name: &str,
    partition_id: u64,
) -> Result<()> {
    let mismatch = || Error::Corrupt {
        partition_id,
        reason: format!("stored value of {name:?} does not match the column type"),
    };
    match (builder, v) {
        (ColumnBuilder::F64(b), Some(Value::F64(x))) => b.append_value(*x),
        (ColumnBuilder::F64(b), None) => b.append_null(),
        (ColumnBuilder::I64(b), Some(Value::I64(x))) => b.append_value(*x),
        (ColumnBuilder::I64(b), None) => b.append_null(),
        (ColumnBuilder::U64(b), Some(Value::U64(x))) => b.append_value(*x),
        (ColumnBuilder::U64(b), None) => b.append_null(),
        (ColumnBuilder::Bool(b), Some(Value::Bool(x))) => b.append_value(*x),
        (ColumnBuilder::Bool(b), None) => b.append_null(),
        (ColumnBuilder::Str(b), Some(Value::Str(x))) => b.append_value(x),
        (ColumnBuilder::Str(b), None) => b.append_null(),
        (ColumnBuilder::Time(b), None) => b.append_null(),
        _ => return Err(mismatch()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_of_one_series_sort_by_time_including_negative_times() {
        let times = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        let keys: Vec<Vec<u8>> = times.iter().map(|t| encode_key(3, b"s", *t)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        for (k, t) in keys.iter().zip(times) {
            assert_eq!(decode_key(k), Some((3, &b"s"[..], t)));
        }
    }

    #[test]
    fn a_series_shard_depends_on_its_tags_alone_and_spreads_series() {
        let a = encode_series(&[("host", "a"), ("dc", "x")]).unwrap();
        let same = encode_series(&[("dc", "x"), ("host", "a")]).unwrap();
        assert_eq!(series_shard(&a, 7), series_shard(&same, 7));
        assert_eq!(series_shard(&a, 1), 0);
        assert_eq!(series_shard(&a, 0), 0);
        // Pinned: stored rows depend on it, so it must never change.
        assert_eq!(
            series_shard(&encode_series(&[("host", "h0")]).unwrap(), 1 << 20),
            (twox_hash::XxHash64::oneshot(
                0x5ea1_10d1_5a4d_0001,
                &[0, 4, b'h', b'o', b's', b't', 0, 0, 0, 2, b'h', b'0']
            ) % (1 << 20)) as u32
        );
        let mut per_shard = [0usize; 4];
        for h in 0..400 {
            let key = encode_series(&[("host", &format!("h{h}"))]).unwrap();
            per_shard[series_shard(&key, 4) as usize] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (60..140).contains(n)),
            "{per_shard:?}"
        );
    }

    #[test]
    fn truncated_values_are_errors_not_garbage() {
        let mut v = vec![ROW_FORMAT_V1];
        put_name(&mut v, "x").unwrap();
        v.push(T_F64);
        v.extend_from_slice(&1.5f64.to_bits().to_be_bytes());
        assert_eq!(decode_fields(&v), Some(vec![("x", Value::F64(1.5))]));
        for cut in 2..v.len() {
            assert_eq!(decode_fields(&v[..cut]), None, "cut at {cut}");
        }
        assert_eq!(
            decode_fields(&[ROW_FORMAT_V1]),
            Some(vec![]),
            "a row with no fields"
        );
        assert_eq!(decode_fields(&[9]), None, "unknown version");
    }

    proptest! {
        #[test]
        fn series_keys_round_trip(tags in proptest::collection::btree_map("[a-z]{1,8}", ".{0,12}", 0..5)) {
            let mut s = Vec::new();
            for (k, v) in &tags {
                put_name(&mut s, k).unwrap();
                put_str(&mut s, v).unwrap();
            }
            let decoded = decode_series(&s).unwrap();
            let want: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            prop_assert_eq!(decoded, want);
        }
    }
}
