//! How the table's columns map onto stored column chunks, and the open
//! partition's row value format written back out (for `rows()` and for each
//! series' last row).
//!
//! The value format is `rows.rs`'s: format version 1, then per non-null field
//! `name length (u16 BE) | name | type (u8) | payload (BE)`. `rows.rs` keeps
//! its encoder private, so the few lines are repeated here and a test holds
//! the two byte-identical.

use sealion_common::proto::{Column, ColumnKind, DataType};

use crate::columnar::ColumnType;
use crate::rows::{ROW_FORMAT_V1, T_BOOL, T_F64, T_I64, T_STR, T_U64, Value};

/// What one stored column chunk holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkRole {
    Time,
    Tag,
    Field,
}

#[derive(Debug, Clone)]
pub struct ChunkSpec {
    pub name: String,
    pub role: ChunkRole,
    pub ty: ColumnType,
}

/// One stored chunk per column, in `columns` order; exactly one time column,
/// names unique, tags text. `Err` explains what is wrong.
pub fn chunk_specs(columns: &[Column]) -> Result<Vec<ChunkSpec>, String> {
    let mut specs = Vec::with_capacity(columns.len());
    let mut times = 0;
    for (i, c) in columns.iter().enumerate() {
        if columns[..i].iter().any(|o| o.name == c.name) {
            return Err(format!("column {:?} appears twice", c.name));
        }
        let (role, ty) = match c.kind() {
            ColumnKind::Time => {
                times += 1;
                (ChunkRole::Time, ColumnType::Timestamp)
            }
            ColumnKind::Tag => match c.data_type() {
                DataType::String | DataType::Unspecified => (ChunkRole::Tag, ColumnType::Text),
                other => return Err(format!("tag {:?} has type {other:?}, not text", c.name)),
            },
            ColumnKind::Field | ColumnKind::Unspecified => {
                (ChunkRole::Field, field_type(c.data_type()))
            }
        };
        specs.push(ChunkSpec {
            name: c.name.clone(),
            role,
            ty,
        });
    }
    if times != 1 {
        return Err(format!("{times} time columns, expected exactly one"));
    }
    Ok(specs)
}

pub fn field_type(t: DataType) -> ColumnType {
    match t {
        DataType::Float64 => ColumnType::Float64,
        DataType::Int64 => ColumnType::Int64,
        DataType::Uint64 => ColumnType::UInt64,
        DataType::Bool => ColumnType::Bool,
        DataType::String | DataType::Unspecified => ColumnType::Text,
        DataType::Timestamp => ColumnType::Timestamp,
    }
}

/// Appends one field in the row value format.
pub fn put_field(out: &mut Vec<u8>, name: &str, v: FieldRef<'_>) {
    // Names are column names, which rows.rs limits to u16::MAX bytes.
    let n = name.len().min(usize::from(u16::MAX));
    out.extend_from_slice(&(n as u16).to_be_bytes());
    out.extend_from_slice(&name.as_bytes()[..n]);
    match v {
        FieldRef::F64(x) => {
            out.push(T_F64);
            out.extend_from_slice(&x.to_bits().to_be_bytes());
        }
        FieldRef::I64(x) => {
            out.push(T_I64);
            out.extend_from_slice(&(x as u64).to_be_bytes());
        }
        FieldRef::U64(x) => {
            out.push(T_U64);
            out.extend_from_slice(&x.to_be_bytes());
        }
        FieldRef::Bool(x) => {
            out.push(T_BOOL);
            out.push(u8::from(x));
        }
        FieldRef::Str(s) => {
            out.push(T_STR);
            out.extend_from_slice(&(s.len() as u32).to_be_bytes());
            out.extend_from_slice(s.as_bytes());
        }
    }
}

pub fn start_value(out: &mut Vec<u8>) {
    out.clear();
    out.push(ROW_FORMAT_V1);
}

/// A borrowed field value.
#[derive(Debug, Clone, Copy)]
pub enum FieldRef<'a> {
    F64(f64),
    I64(i64),
    U64(u64),
    Bool(bool),
    Str(&'a str),
}

impl<'a> From<&'a Value> for FieldRef<'a> {
    fn from(v: &'a Value) -> Self {
        match v {
            Value::F64(x) => FieldRef::F64(*x),
            Value::I64(x) => FieldRef::I64(*x),
            Value::U64(x) => FieldRef::U64(*x),
            Value::Bool(x) => FieldRef::Bool(*x),
            Value::Str(s) => FieldRef::Str(s),
        }
    }
}

/// Whether a stored value of this type can live in a chunk of `ty`.
pub fn value_fits(v: &Value, ty: ColumnType) -> bool {
    matches!(
        (v, ty),
        (Value::F64(_), ColumnType::Float64)
            | (Value::I64(_), ColumnType::Int64)
            | (Value::U64(_), ColumnType::UInt64)
            | (Value::Bool(_), ColumnType::Bool)
            | (Value::Str(_), ColumnType::Text)
    )
}
