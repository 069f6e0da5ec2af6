//! Page statistics: computed while encoding, stored in the page header.
//!
//! Why this module exists: a reader answering `max(x)` or skipping pages by a
//! predicate should not decode values it does not need. The header carries
//! count, null count, min, max and (for numbers) sum, behind the header's own
//! checksum, so [`super::page_stats`] can be trusted without the payload.
//!
//! Orders: integers by value; floats by [`f64::total_cmp`], the order Arrow's
//! comparison kernels use (`-0.0 < +0.0`; a NaN with the sign bit clear sorts
//! above `+inf`, one with it set below `-inf`); text by bytes (which for UTF-8
//! is code point order); `false < true`. Nulls are not counted in min, max
//! or sum; when every row is null, all three are `None`.

use std::cmp::Ordering;

use super::bits::ByteReader;
use super::error::{Result, corrupt};
use super::{ColumnType, MAX_PAGE_PAYLOAD_BYTES};

/// A typed statistic value.
#[derive(Debug, Clone, PartialEq)]
pub enum StatValue {
    Timestamp(i64),
    Int64(i64),
    UInt64(u64),
    Float64(f64),
    Bool(bool),
    Text(String),
}

/// The exact sum of a page's non-null values, wide enough not to overflow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sum {
    /// Int64 columns.
    Int(i128),
    /// UInt64 columns; for Bool columns, the number of `true` values.
    UInt(u128),
    /// Float64 columns: the left-to-right sum in row order, as a plain loop
    /// computes it (NaN if any value is NaN or both infinities occur).
    Float(f64),
}

/// Statistics of one page. Timestamp and Text pages have no sum.
#[derive(Debug, Clone, PartialEq)]
pub struct PageStats {
    /// Rows, nulls included.
    pub count: usize,
    pub null_count: usize,
    pub min: Option<StatValue>,
    pub max: Option<StatValue>,
    pub sum: Option<Sum>,
}

fn min_max_by<T: Clone>(values: &[T], cmp: impl Fn(&T, &T) -> Ordering) -> Option<(T, T)> {
    let first = values.first()?;
    let (mut lo, mut hi) = (first, first);
    for v in values {
        if cmp(v, lo) == Ordering::Less {
            lo = v;
        }
        if cmp(v, hi) == Ordering::Greater {
            hi = v;
        }
    }
    Some((lo.clone(), hi.clone()))
}

/// Typed non-null values of a page, borrowed from the caller.
pub(crate) enum NonNull<'a> {
    Timestamp(&'a [i64]),
    Int64(&'a [i64]),
    UInt64(&'a [u64]),
    Float64(&'a [f64]),
    Bool(&'a [bool]),
    Text(&'a [String]),
}

pub(crate) fn compute(values: NonNull<'_>, count: usize, null_count: usize) -> PageStats {
    let pair = |p: Option<(StatValue, StatValue)>| match p {
        Some((lo, hi)) => (Some(lo), Some(hi)),
        None => (None, None),
    };
    let ((min, max), sum) = match values {
        NonNull::Timestamp(v) => (
            pair(
                min_max_by(v, Ord::cmp)
                    .map(|(a, b)| (StatValue::Timestamp(a), StatValue::Timestamp(b))),
            ),
            None,
        ),
        NonNull::Int64(v) => (
            pair(min_max_by(v, Ord::cmp).map(|(a, b)| (StatValue::Int64(a), StatValue::Int64(b)))),
            (!v.is_empty()).then(|| Sum::Int(v.iter().map(|&x| i128::from(x)).sum())),
        ),
        NonNull::UInt64(v) => (
            pair(
                min_max_by(v, Ord::cmp).map(|(a, b)| (StatValue::UInt64(a), StatValue::UInt64(b))),
            ),
            (!v.is_empty()).then(|| Sum::UInt(v.iter().map(|&x| u128::from(x)).sum())),
        ),
        NonNull::Float64(v) => (
            pair(
                min_max_by(v, f64::total_cmp)
                    .map(|(a, b)| (StatValue::Float64(a), StatValue::Float64(b))),
            ),
            (!v.is_empty()).then(|| Sum::Float(v.iter().fold(0.0, |acc, &x| acc + x))),
        ),
        NonNull::Bool(v) => (
            pair(min_max_by(v, Ord::cmp).map(|(a, b)| (StatValue::Bool(a), StatValue::Bool(b)))),
            (!v.is_empty()).then(|| Sum::UInt(v.iter().filter(|&&b| b).count() as u128)),
        ),
        NonNull::Text(v) => (
            pair(min_max_by(v, Ord::cmp).map(|(a, b)| (StatValue::Text(a), StatValue::Text(b)))),
            None,
        ),
    };
    PageStats {
        count,
        null_count,
        min,
        max,
        sum,
    }
}

/// Serializes min, max and sum (count and null count are fixed header fields).
pub(crate) fn write(stats: &PageStats, out: &mut Vec<u8>) {
    for v in [&stats.min, &stats.max].into_iter().flatten() {
        match v {
            StatValue::Timestamp(x) | StatValue::Int64(x) => {
                out.extend_from_slice(&x.to_le_bytes())
            }
            StatValue::UInt64(x) => out.extend_from_slice(&x.to_le_bytes()),
            StatValue::Float64(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
            StatValue::Bool(x) => out.push(u8::from(*x)),
            StatValue::Text(s) => {
                // Bounded by MAX_PAGE_PAYLOAD_BYTES: the string is in the payload too.
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
    }
    match stats.sum {
        Some(Sum::Int(x)) => out.extend_from_slice(&x.to_le_bytes()),
        Some(Sum::UInt(x)) => out.extend_from_slice(&x.to_le_bytes()),
        Some(Sum::Float(x)) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
        None => {}
    }
}

fn read_value(ty: ColumnType, r: &mut ByteReader<'_>) -> Result<StatValue> {
    Ok(match ty {
        ColumnType::Timestamp => StatValue::Timestamp(r.u64()? as i64),
        ColumnType::Int64 => StatValue::Int64(r.u64()? as i64),
        ColumnType::UInt64 => StatValue::UInt64(r.u64()?),
        ColumnType::Float64 => StatValue::Float64(f64::from_bits(r.u64()?)),
        ColumnType::Bool => match r.u8()? {
            0 => StatValue::Bool(false),
            1 => StatValue::Bool(true),
            _ => return Err(corrupt("boolean statistic is not 0 or 1")),
        },
        ColumnType::Text => {
            let len = r.u32()? as usize;
            if len > MAX_PAGE_PAYLOAD_BYTES {
                return Err(corrupt("text statistic longer than a page"));
            }
            let bytes = r.take(len)?;
            let s =
                std::str::from_utf8(bytes).map_err(|_| corrupt("text statistic is not UTF-8"))?;
            StatValue::Text(s.to_owned())
        }
    })
}

/// Reads what [`write`] wrote, given the fixed header fields.
pub(crate) fn read(
    ty: ColumnType,
    count: usize,
    null_count: usize,
    r: &mut ByteReader<'_>,
) -> Result<PageStats> {
    let mut stats = PageStats {
        count,
        null_count,
        min: None,
        max: None,
        sum: None,
    };
    if count > null_count {
        stats.min = Some(read_value(ty, r)?);
        stats.max = Some(read_value(ty, r)?);
        stats.sum = match ty {
            ColumnType::Int64 => Some(Sum::Int(r.u128()? as i128)),
            ColumnType::UInt64 | ColumnType::Bool => Some(Sum::UInt(r.u128()?)),
            ColumnType::Float64 => Some(Sum::Float(f64::from_bits(r.u64()?))),
            ColumnType::Timestamp | ColumnType::Text => None,
        };
    }
    Ok(stats)
}
