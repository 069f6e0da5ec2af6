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
//! Fields are stored with null fields omitted, each as `field | type (u8) |
//! payload`. Format 2 (what writes store) names a field by the index of its
//! column in the table's column list (an unsigned LEB128 varint): columns
//! are only ever appended to that list, in one order that meta's log fixes,
//! so an index means one column forever, and a row of ten fields takes 101
//! bytes instead of format 1's 221 for TSBS's names (the write-ahead log,
//! memtables, flushes and compactions all carried the names). Format 1
//! (`name length (u16) | name`) is still read: stores written before
//! format 2, and the rows a sealed file hands back (`sealed/value.rs`),
//! which carry their names. Decoding therefore takes the table's columns;
//! a format-2 index past the reader's columns is a column the reader does
//! not know yet (its view of the catalog is older than the writer's).

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

// The row value format by names, shared with the sealed file's writer and
// reader (which re-encode rows in it).
pub(crate) const ROW_FORMAT_V1: u8 = 1;
/// The row value format by column index, which writes store.
pub(crate) const ROW_FORMAT_V2: u8 = 2;

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
    /// An unsigned LEB128 varint of at most ten bytes.
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
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

/// A series key whose layout is checked but not the UTF-8 of its names and
/// values: what a scan needs of a series is one or two tags, and checking
/// (and collecting) all of them cost more than the rest of working out
/// what the series contributes. [`SeriesTags::get`] checks the value it
/// returns.
pub struct SeriesTags<'a> {
    key: &'a [u8],
}

/// A value of a series key that is not UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadTag;

impl<'a> SeriesTags<'a> {
    /// The key; None when its layout is broken.
    pub fn of(series: &'a [u8]) -> Option<Self> {
        let mut r = Reader { buf: series };
        while !r.buf.is_empty() {
            Self::pair(&mut r)?;
        }
        Some(SeriesTags { key: series })
    }

    /// The next (name, value) of a key.
    fn pair(r: &mut Reader<'a>) -> Option<(&'a [u8], &'a [u8])> {
        let n = r.u16()?;
        let name = r.take(n)?;
        let n = r.u32()?;
        Some((name, r.take(n)?))
    }

    /// The value of tag `name` (the first of that name, as
    /// [`decode_series`] finds it); None when the series lacks it.
    pub fn get(&self, name: &str) -> std::result::Result<Option<&'a str>, BadTag> {
        let mut r = Reader { buf: self.key };
        while let Some((n, v)) = Self::pair(&mut r) {
            if n == name.as_bytes() {
                return std::str::from_utf8(v).map(Some).map_err(|_| BadTag);
            }
        }
        Ok(None)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// How a stored field is named.
#[derive(Debug, Clone, Copy)]
enum FieldKey<'a> {
    /// Format 1: the name itself.
    Name(&'a [u8]),
    /// Format 2: the index of its column in the table's column list.
    Index(u64),
}

/// Calls `f(key, type, payload)` for each field of a row value, in the
/// order stored, until `f` returns false; false when the value is
/// malformed (then `f` has seen the fields before the fault).
fn raw_fields<'a>(value: &'a [u8], mut f: impl FnMut(FieldKey<'a>, u8, &'a [u8]) -> bool) -> bool {
    let mut r = Reader { buf: value };
    let by_index = match r.u8() {
        Some(ROW_FORMAT_V1) => false,
        Some(ROW_FORMAT_V2) => true,
        _ => return false,
    };
    while !r.buf.is_empty() {
        let key = if by_index {
            r.varint().map(FieldKey::Index)
        } else {
            r.u16().and_then(|n| r.take(n)).map(FieldKey::Name)
        };
        let Some(key) = key else { return false };
        let Some(ty) = r.u8() else { return false };
        let payload = match ty {
            T_F64 | T_I64 | T_U64 => r.take(8),
            T_BOOL => r.take(1),
            T_STR => r.u32().and_then(|n| r.take(n)),
            _ => None,
        };
        let Some(payload) = payload else { return false };
        if !f(key, ty, payload) {
            return true;
        }
    }
    true
}

/// The value of a field of type `ty` stored as `payload` (text must be
/// UTF-8).
fn value_of(ty: u8, payload: &[u8]) -> Option<Value> {
    let word = || payload.try_into().ok().map(u64::from_be_bytes);
    match ty {
        T_F64 => word().map(|x| Value::F64(f64::from_bits(x))),
        T_I64 => word().map(|x| Value::I64(x as i64)),
        T_U64 => word().map(Value::U64),
        T_BOOL => payload.first().map(|x| Value::Bool(*x != 0)),
        T_STR => std::str::from_utf8(payload)
            .ok()
            .map(|x| Value::Str(x.to_string())),
        _ => None,
    }
}

/// The name of a stored field: its own (format 1), or that of the field
/// column at its index in `columns` (format 2); `None` when `columns` has
/// no such column.
fn name_of<'a>(key: FieldKey<'a>, columns: &'a [Column]) -> Option<&'a [u8]> {
    match key {
        FieldKey::Name(n) => Some(n),
        FieldKey::Index(i) => usize::try_from(i)
            .ok()
            .and_then(|i| columns.get(i))
            .filter(|c| matches!(c.kind(), ColumnKind::Field | ColumnKind::Unspecified))
            .map(|c| c.name.as_bytes()),
    }
}

/// Decodes a row value of a table with columns `columns` into (field name,
/// value) pairs. A field whose column `columns` does not have (format 2) is
/// left out: the reader does not know that column yet.
pub fn decode_fields<'a>(value: &'a [u8], columns: &'a [Column]) -> Option<Vec<(&'a str, Value)>> {
    let mut out = Vec::new();
    let mut ok = true;
    let well_formed = raw_fields(value, |key, ty, payload| {
        let Some(name) = name_of(key, columns) else {
            return true;
        };
        match (std::str::from_utf8(name), value_of(ty, payload)) {
            (Ok(name), Some(v)) => {
                out.push((name, v));
                true
            }
            _ => {
                ok = false;
                false
            }
        }
    });
    (well_formed && ok).then_some(out)
}

/// Calls `f(name, value)` for each field of a row value of a table with
/// columns `columns`, in the order stored, until `f` returns false; the
/// name as bytes, not checked as UTF-8 (callers compare it with names they
/// know and check it only when it is new to them), `None` for a field
/// whose column `columns` does not have. False when the value is malformed
/// (text values must be UTF-8); `f` has then seen the fields before the
/// fault.
pub fn for_each_field_value<'a>(
    value: &'a [u8],
    columns: &'a [Column],
    mut f: impl FnMut(Option<&'a [u8]>, Value) -> bool,
) -> bool {
    let mut ok = true;
    let well_formed = raw_fields(value, |key, ty, payload| match value_of(ty, payload) {
        Some(v) => f(name_of(key, columns), v),
        None => {
            ok = false;
            false
        }
    });
    well_formed && ok
}

/// Calls `f(name, type, payload)` for each field of a row value of a table
/// with columns `columns`, in the order stored; false when the value is
/// malformed or names a column `columns` does not have.
pub fn for_each_field(
    value: &[u8],
    columns: &[Column],
    mut f: impl FnMut(&str, u8, &[u8]),
) -> bool {
    let mut ok = true;
    let well_formed = raw_fields(value, |key, ty, payload| {
        match name_of(key, columns).and_then(|n| std::str::from_utf8(n).ok()) {
            Some(name) => {
                f(name, ty, payload);
                true
            }
            None => {
                ok = false;
                false
            }
        }
    });
    well_formed && ok
}

/// One field column of a batch, as the array of its type.
enum FieldArray<'a> {
    F64(&'a Float64Array),
    I64(&'a Int64Array),
    U64(&'a UInt64Array),
    Bool(&'a BooleanArray),
    Str(&'a StringArray),
}

/// How one batch field column maps onto the table.
struct Source<'a> {
    /// The column's index in the table's column list.
    index: usize,
    array: &'a ArrayRef,
    values: FieldArray<'a>,
}

impl<'a> Source<'a> {
    fn new(column: &'a Column, index: usize, array: &'a ArrayRef) -> Result<Self> {
        let any = array.as_any();
        let values = match column.data_type() {
            DataType::Float64 => any.downcast_ref().map(FieldArray::F64),
            DataType::Int64 => any.downcast_ref().map(FieldArray::I64),
            DataType::Uint64 => any.downcast_ref().map(FieldArray::U64),
            DataType::Bool => any.downcast_ref().map(FieldArray::Bool),
            DataType::String | DataType::Unspecified => any.downcast_ref().map(FieldArray::Str),
            DataType::Timestamp => None,
        }
        .ok_or_else(|| Error::Invalid(format!("field {:?} has an unexpected type", column.name)))?;
        Ok(Source {
            index,
            array,
            values,
        })
    }

    /// Appends the field's value in `row` (which is not null).
    fn put(&self, out: &mut Vec<u8>, row: usize) -> Result<()> {
        match self.values {
            FieldArray::F64(a) => {
                out.push(T_F64);
                out.extend_from_slice(&a.value(row).to_bits().to_be_bytes());
            }
            FieldArray::I64(a) => {
                out.push(T_I64);
                out.extend_from_slice(&(a.value(row) as u64).to_be_bytes());
            }
            FieldArray::U64(a) => {
                out.push(T_U64);
                out.extend_from_slice(&a.value(row).to_be_bytes());
            }
            FieldArray::Bool(a) => {
                out.push(T_BOOL);
                out.push(a.value(row) as u8);
            }
            FieldArray::Str(a) => {
                out.push(T_STR);
                put_str(out, a.value(row))?;
            }
        }
        Ok(())
    }
}

/// Rows encoded as RocksDB keys and values, all in one buffer (no
/// allocation per row), in the order they are to be written.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EncodedRows {
    buf: Vec<u8>,
    /// Per row, where its key ends and where its value ends in `buf`; the
    /// key starts where the row before ended.
    ends: Vec<(usize, usize)>,
}

impl EncodedRows {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of every key and value.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// Each row's (key, value), in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&(key_end, value_end)| {
            let row = (&self.buf[start..key_end], &self.buf[key_end..value_end]);
            start = value_end;
            row
        })
    }

    /// Appends `other`'s rows after these.
    pub fn append(&mut self, other: &EncodedRows) {
        let base = self.buf.len();
        self.buf.extend_from_slice(&other.buf);
        self.ends
            .extend(other.ends.iter().map(|&(k, v)| (base + k, base + v)));
    }

    fn push_key(&mut self, partition_id: u64, series: &[u8], time_ns: i64) {
        self.buf.extend_from_slice(&partition_prefix(partition_id));
        self.buf
            .extend_from_slice(&(series.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(series);
        self.buf.extend_from_slice(&time_bytes(time_ns));
        self.ends.push((self.buf.len(), self.buf.len()));
    }

    /// Ends the row whose key was pushed last at the buffer's end.
    fn end_value(&mut self) {
        if let Some(last) = self.ends.last_mut() {
            last.1 = self.buf.len();
        }
    }
}

/// Encodes every row of `batch` (columns named after `columns`, which are
/// the table's whole column list in the table's order: a field is stored by
/// its index there) into RocksDB key/value pairs for `partition_id`. A
/// batch column that the table lacks, or whose Arrow type differs from the
/// column's, is an error; nothing of the batch is written then.
///
/// The pairs come in key order, except that rows with the same key keep
/// their order in the batch (so the last of them is the one that stays,
/// written in this order). RocksDB inserts a batch's keys into its
/// memtable one by one; in key order each insert starts where the one
/// before it ended instead of searching the skip list from the top, which
/// was most of a write's memtable cost with keys that share a long series
/// prefix.
pub fn encode_rows(
    partition_id: u64,
    columns: &[Column],
    batch: &RecordBatch,
) -> Result<EncodedRows> {
    let schema = batch.schema();
    let mut time: Option<&TimestampNanosecondArray> = None;
    let mut tags: Vec<(&Column, &StringArray)> = Vec::new();
    let mut fields: Vec<Source> = Vec::new();
    for (i, f) in schema.fields().iter().enumerate() {
        let index = columns
            .iter()
            .position(|c| &c.name == f.name())
            .ok_or_else(|| Error::Invalid(format!("column {:?} is not in the table", f.name())))?;
        let column = &columns[index];
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
            ColumnKind::Field | ColumnKind::Unspecified => {
                fields.push(Source::new(column, index, array)?)
            }
        }
    }
    let time = time.ok_or_else(|| Error::Invalid("batch has no time column".into()))?;
    tags.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    let n = batch.num_rows();
    if let Some(row) = (0..n).find(|&row| time.is_null(row)) {
        return Err(Error::Invalid(format!("row {row} has a null time")));
    }

    // Every row's series key, one after another in `series`.
    let mut series: Vec<u8> = Vec::new();
    let mut series_ends: Vec<usize> = Vec::with_capacity(n);
    for row in 0..n {
        for (column, a) in &tags {
            if a.is_null(row) {
                continue;
            }
            put_name(&mut series, &column.name)?;
            put_str(&mut series, a.value(row))?;
        }
        series_ends.push(series.len());
    }
    let series_of = |row: usize| {
        let start = if row == 0 { 0 } else { series_ends[row - 1] };
        &series[start..series_ends[row]]
    };
    let order = key_order(n, series_of, |row| time.value(row));

    let mut out = EncodedRows {
        buf: Vec::with_capacity(series.len() + n * (20 + 1 + 10 * fields.len())),
        ends: Vec::with_capacity(n),
    };
    for row in order {
        out.push_key(partition_id, series_of(row), time.value(row));
        out.buf.push(ROW_FORMAT_V2);
        for field in &fields {
            if field.array.is_null(row) {
                continue;
            }
            put_varint(&mut out.buf, field.index as u64);
            field.put(&mut out.buf, row)?;
        }
        out.end_value();
    }
    Ok(out)
}

/// The rows `0..n` in the order of their keys (series key as the key holds
/// it, its length first; then time), rows with equal keys in their own
/// order. Rows are grouped by series first, so the sort compares each
/// distinct series once rather than every row's key.
fn key_order<'s>(
    n: usize,
    series_of: impl Fn(usize) -> &'s [u8],
    time_of: impl Fn(usize) -> i64,
) -> Vec<usize> {
    // Each row's series, numbered in order of first appearance.
    let mut number: rustc_hash::FxHashMap<&[u8], usize> = Default::default();
    let mut first_rows: Vec<usize> = Vec::new();
    let mut group_of: Vec<usize> = Vec::with_capacity(n);
    for row in 0..n {
        let next = first_rows.len();
        let g = *number.entry(series_of(row)).or_insert(next);
        if g == next {
            first_rows.push(row);
        }
        group_of.push(g);
    }
    // The series in key order: by length, then by bytes.
    let mut groups: Vec<usize> = (0..first_rows.len()).collect();
    groups.sort_unstable_by(|&a, &b| {
        let (a, b) = (series_of(first_rows[a]), series_of(first_rows[b]));
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    });
    // Where each series' rows start in the answer (a counting sort: rows
    // of one series keep their order).
    let mut counts = vec![0usize; groups.len()];
    for &g in &group_of {
        counts[g] += 1;
    }
    let mut starts = vec![0usize; groups.len()];
    let mut at = 0;
    for &g in &groups {
        starts[g] = at;
        at += counts[g];
    }
    let mut order = vec![0usize; n];
    let mut next = starts.clone();
    for (row, &g) in group_of.iter().enumerate() {
        order[next[g]] = row;
        next[g] += 1;
    }
    // Within a series, by time; rows mostly come in time order already.
    for &g in &groups {
        let rows = &mut order[starts[g]..starts[g] + counts[g]];
        if rows.windows(2).any(|w| time_of(w[0]) > time_of(w[1])) {
            rows.sort_by_key(|&row| time_of(row));
        }
    }
    order
}

/// [`encode_rows`] as one (key, value) pair of vectors per row.
pub fn encode_batch(
    partition_id: u64,
    columns: &[Column],
    batch: &RecordBatch,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    Ok(encode_rows(partition_id, columns, batch)?
        .iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect())
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
    /// The table's columns, which name the fields of a stored row.
    table: Arc<[Column]>,
    builders: Vec<ColumnBuilder>,
    rows: usize,
}

impl BatchBuilder {
    /// A builder of `columns` (a projection) from rows of a table whose
    /// columns are `table`.
    pub fn new(columns: Vec<Column>, table: Arc<[Column]>) -> Self {
        Self::with_capacity(columns, table, DEFAULT_BUILDER_ROWS)
    }

    /// A builder with room for `rows` rows per column before it grows.
    pub fn with_capacity(columns: Vec<Column>, table: Arc<[Column]>, rows: usize) -> Self {
        let builders = columns
            .iter()
            .map(|c| ColumnBuilder::with_capacity(c, rows))
            .collect();
        BatchBuilder {
            columns,
            table,
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
            decode_fields(value, &self.table).ok_or_else(|| corrupt("bad row value"))?
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
        assert_eq!(decode_fields(&v, &[]), Some(vec![("x", Value::F64(1.5))]));
        for cut in 2..v.len() {
            assert_eq!(decode_fields(&v[..cut], &[]), None, "cut at {cut}");
        }
        assert_eq!(
            decode_fields(&[ROW_FORMAT_V1], &[]),
            Some(vec![]),
            "a row with no fields"
        );
        assert_eq!(decode_fields(&[9], &[]), None, "unknown version");
    }

    fn col(name: &str, kind: ColumnKind, data_type: DataType) -> Column {
        Column {
            name: name.into(),
            kind: kind as i32,
            data_type: data_type as i32,
        }
    }

    /// A table of every field type, its columns in an order that puts a
    /// field past index 127 (a two-byte varint).
    fn wide_table() -> Vec<Column> {
        let mut c = vec![
            col("time", ColumnKind::Time, DataType::Timestamp),
            col("host", ColumnKind::Tag, DataType::String),
        ];
        c.extend((0..130).map(|i| col(&format!("pad{i}"), ColumnKind::Field, DataType::Bool)));
        c.extend([
            col("f", ColumnKind::Field, DataType::Float64),
            col("i", ColumnKind::Field, DataType::Int64),
            col("u", ColumnKind::Field, DataType::Uint64),
            col("b", ColumnKind::Field, DataType::Bool),
            col("s", ColumnKind::Field, DataType::String),
        ]);
        c
    }

    type Fields = (
        Option<f64>,
        Option<i64>,
        Option<u64>,
        Option<bool>,
        Option<String>,
    );

    /// One row of `wide_table` (only its last five fields set) as a batch
    /// with the batch's columns `time, host, f, i, u, b, s`.
    fn wide_row(fields: &Fields) -> RecordBatch {
        let t = wide_table();
        let cols: Vec<Column> = [0, 1, 132, 133, 134, 135, 136]
            .iter()
            .map(|&i| t[i].clone())
            .collect();
        RecordBatch::try_new(
            arrow_schema(&cols),
            vec![
                Arc::new(TimestampNanosecondArray::from(vec![7]).with_timezone("UTC")),
                Arc::new(StringArray::from(vec!["h"])),
                Arc::new(Float64Array::from(vec![fields.0])),
                Arc::new(Int64Array::from(vec![fields.1])),
                Arc::new(UInt64Array::from(vec![fields.2])),
                Arc::new(BooleanArray::from(vec![fields.3])),
                Arc::new(StringArray::from(vec![fields.4.clone()])),
            ],
        )
        .unwrap()
    }

    /// The same fields by name (format 1), as a sealed file writes them.
    fn by_names(fields: &Fields) -> Vec<u8> {
        let mut v = vec![ROW_FORMAT_V1];
        let mut put = |name: &str, ty: u8, payload: &[u8]| {
            put_name(&mut v, name).unwrap();
            v.push(ty);
            v.extend_from_slice(payload);
        };
        if let Some(x) = fields.0 {
            put("f", T_F64, &x.to_bits().to_be_bytes());
        }
        if let Some(x) = fields.1 {
            put("i", T_I64, &(x as u64).to_be_bytes());
        }
        if let Some(x) = fields.2 {
            put("u", T_U64, &x.to_be_bytes());
        }
        if let Some(x) = fields.3 {
            put("b", T_BOOL, &[u8::from(x)]);
        }
        if let Some(x) = &fields.4 {
            let mut p = (x.len() as u32).to_be_bytes().to_vec();
            p.extend_from_slice(x.as_bytes());
            put("s", T_STR, &p);
        }
        v
    }

    #[test]
    fn rows_are_stored_by_column_index_in_fewer_bytes() {
        let table = wide_table();
        let fields: Fields = (Some(1.5), Some(-3), Some(4), Some(true), Some("x".into()));
        let (_, value) = encode_batch(1, &table, &wide_row(&fields))
            .unwrap()
            .remove(0);
        assert_eq!(value[0], ROW_FORMAT_V2);
        // Index 132 takes two bytes, the others' too (all past 127): five
        // fields of 2 + 1 + payload bytes, against 2 + name + 1 + payload.
        assert_eq!(value.len(), 1 + 5 * 3 + 8 * 3 + 1 + 5);
        assert_eq!(
            decode_fields(&value, &table),
            decode_fields(&by_names(&fields), &table)
        );
    }

    #[test]
    fn a_field_index_the_reader_does_not_know_is_skipped_by_scans_and_refused_by_digests() {
        let table = wide_table();
        let fields: Fields = (Some(1.5), None, None, None, Some("x".into()));
        let (_, value) = encode_batch(1, &table, &wide_row(&fields))
            .unwrap()
            .remove(0);
        // A reader whose columns end before "s" (an older catalog view).
        let older = &table[..136];
        assert_eq!(
            decode_fields(&value, older),
            Some(vec![("f", Value::F64(1.5))])
        );
        assert!(!for_each_field(&value, older, |_, _, _| {}));
        let mut names = Vec::new();
        assert!(for_each_field_value(&value, older, |n, _| {
            names.push(n.map(|n| n.to_vec()));
            true
        }));
        assert_eq!(names, vec![Some(b"f".to_vec()), None]);
        // An index naming a tag or the time column is no field either.
        for index in [0u8, 1] {
            let v = [ROW_FORMAT_V2, index, T_BOOL, 1];
            assert_eq!(decode_fields(&v, &table), Some(vec![]));
            assert!(!for_each_field(&v, &table, |_, _, _| {}));
        }
    }

    #[test]
    fn truncated_indexed_values_are_errors_not_garbage() {
        let table = wide_table();
        let fields: Fields = (Some(1.5), Some(2), None, Some(false), Some("yz".into()));
        let (_, value) = encode_batch(1, &table, &wide_row(&fields))
            .unwrap()
            .remove(0);
        // Cut at a field's end, a value is a shorter row; anywhere else, it
        // is refused. Never a value the row did not hold.
        let full = decode_fields(&value, &table).unwrap();
        let mut refused = 0;
        for cut in 1..value.len() {
            match decode_fields(&value[..cut], &table) {
                None => refused += 1,
                Some(part) => assert_eq!(part, full[..part.len()], "cut at {cut}"),
            }
        }
        // Valid cuts: after the version byte (no fields), and after each of
        // the first three of the four fields.
        assert_eq!(refused, value.len() - 1 - 4);
        // A varint that never ends.
        let endless = [
            ROW_FORMAT_V2,
            0x80,
            0x80,
            0x80,
            0x80,
            0x80,
            0x80,
            0x80,
            0x80,
            0x80,
            0x80,
            0x01,
        ];
        assert_eq!(decode_fields(&endless, &table), None);
    }

    proptest! {
        #[test]
        fn both_row_formats_decode_to_the_batch_values(
            f in proptest::option::of(proptest::num::f64::ANY),
            i in proptest::option::of(proptest::num::i64::ANY),
            u in proptest::option::of(proptest::num::u64::ANY),
            b in proptest::option::of(proptest::bool::ANY),
            s in proptest::option::of(".{0,20}"),
        ) {
            let table = wide_table();
            let fields: Fields = (f, i, u, b, s);
            let (_, value) = encode_batch(1, &table, &wide_row(&fields)).unwrap().remove(0);
            let mut want = Vec::new();
            if let Some(x) = fields.0 { want.push(("f", Value::F64(x))); }
            if let Some(x) = fields.1 { want.push(("i", Value::I64(x))); }
            if let Some(x) = fields.2 { want.push(("u", Value::U64(x))); }
            if let Some(x) = fields.3 { want.push(("b", Value::Bool(x))); }
            if let Some(x) = fields.4.clone() { want.push(("s", Value::Str(x))); }
            let bits = |v: Vec<(&str, Value)>| -> Vec<String> {
                v.into_iter().map(|(n, v)| match v {
                    Value::F64(x) => format!("{n}={:x}", x.to_bits()),
                    other => format!("{n}={other:?}"),
                }).collect()
            };
            prop_assert_eq!(bits(decode_fields(&value, &table).unwrap()), bits(want.clone()));
            prop_assert_eq!(bits(decode_fields(&by_names(&fields), &table).unwrap()), bits(want));
        }

        /// A batch's rows come out as each row encoded alone would, in key
        /// order, rows with equal keys (same series and time) in batch order.
        #[test]
        fn a_batch_is_encoded_in_key_order_with_equal_keys_in_batch_order(
            rows in proptest::collection::vec(
                (
                    proptest::option::of("[xy]{0,3}"),
                    proptest::option::of("[xy]{0,2}"),
                    -3i64..3,
                    proptest::option::of(-5i64..5),
                ),
                0..60,
            )
        ) {
            let columns: Vec<Column> = [
                ("time", ColumnKind::Time, DataType::Timestamp),
                ("a", ColumnKind::Tag, DataType::String),
                ("b", ColumnKind::Tag, DataType::String),
                ("v", ColumnKind::Field, DataType::Int64),
            ]
            .iter()
            .map(|(name, kind, ty)| Column {
                name: name.to_string(),
                kind: *kind as i32,
                data_type: *ty as i32,
            })
            .collect();
            let batch = RecordBatch::try_new(
                arrow_schema(&columns),
                vec![
                    Arc::new(
                        TimestampNanosecondArray::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())
                            .with_timezone("UTC"),
                    ),
                    Arc::new(rows.iter().map(|r| r.0.clone()).collect::<StringArray>()),
                    Arc::new(rows.iter().map(|r| r.1.clone()).collect::<StringArray>()),
                    Arc::new(rows.iter().map(|r| r.3).collect::<Int64Array>()),
                ],
            )
            .unwrap();
            let mut model: Vec<(Vec<u8>, Vec<u8>)> = (0..rows.len())
                .map(|i| encode_batch(9, &columns, &batch.slice(i, 1)).unwrap().remove(0))
                .collect();
            model.sort_by(|x, y| x.0.cmp(&y.0));
            let encoded = encode_rows(9, &columns, &batch).unwrap();
            prop_assert_eq!(encoded.len(), rows.len());
            let got: Vec<(Vec<u8>, Vec<u8>)> =
                encoded.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
            prop_assert_eq!(&got, &model);
            // The pairs are those of the key and value codecs.
            for (k, v) in &got {
                let (pid, series, _) = decode_key(k).unwrap();
                prop_assert_eq!(pid, 9);
                prop_assert!(decode_series(series).is_some());
                prop_assert!(decode_fields(v, &columns).is_some());
            }
            // Split in two and appended, the halves keep their own orders.
            let half = rows.len() / 2;
            let mut appended = encode_rows(9, &columns, &batch.slice(0, half)).unwrap();
            appended.append(&encode_rows(9, &columns, &batch.slice(half, rows.len() - half)).unwrap());
            prop_assert_eq!(appended.len(), rows.len());
            prop_assert_eq!(appended.bytes(), encoded.bytes());
        }

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

        /// SeriesTags finds what decode_series finds, by name, in any key
        /// (broken ones too: both refuse a broken layout, and a value that
        /// is not UTF-8 is refused when it is asked for).
        #[test]
        fn series_tags_find_what_decode_series_finds(
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..6), 0..6),
            cut in any::<proptest::sample::Index>(),
        ) {
            // Tags a, b, c, ... with values of any bytes, the key sometimes
            // cut short.
            const NAMES: [&str; 7] = ["a", "b", "c", "d", "e", "f", "zz"];
            let mut s = Vec::new();
            for (name, v) in NAMES.iter().zip(&values) {
                put_name(&mut s, name).unwrap();
                s.extend_from_slice(&(v.len() as u32).to_be_bytes());
                s.extend_from_slice(v);
            }
            let s = if values.len() % 2 == 1 { &s[..cut.index(s.len() + 1)] } else { &s[..] };
            let tags = SeriesTags::of(s);
            match decode_series(s) {
                Some(all) => {
                    let tags = tags.expect("a key decode_series reads has a layout");
                    for name in NAMES {
                        let want = all.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
                        prop_assert_eq!(tags.get(name), Ok(want));
                    }
                }
                // A broken layout, or a value that is not UTF-8, which is
                // refused when asked for.
                None => {
                    if let Some(tags) = tags {
                        prop_assert!(NAMES.iter().any(|n| tags.get(n).is_err()));
                    }
                }
            }
        }
    }
}
