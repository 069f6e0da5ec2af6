//! The `count(DISTINCT)` state: every distinct value, in a sorted set per
//! type (so that the byte form is sorted and unique without extra work),
//! bounded by [`MAX_DISTINCT_VALUES`] values and, for text,
//! [`MAX_DISTINCT_BYTES`] bytes. Equality is SQL's: `-0.0` is `0.0`, and all
//! NaNs are one value.

use std::collections::BTreeSet;

use crate::error::{Error, Result};
use crate::value::{Value, ValueType, distinct_f64_bits};

/// The most distinct values one state keeps.
pub const MAX_DISTINCT_VALUES: usize = 1_000_000;
/// The most text bytes one `count(DISTINCT)` state keeps.
pub const MAX_DISTINCT_BYTES: usize = 128 << 20;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Distinct {
    /// Floats by the bits of their distinct form (see
    /// [`distinct_f64_bits`]).
    F64(BTreeSet<u64>),
    I64(BTreeSet<i64>),
    U64(BTreeSet<u64>),
    Bool(BTreeSet<bool>),
    Str {
        set: BTreeSet<String>,
        bytes: usize,
    },
}

impl Distinct {
    pub(crate) fn new(input: ValueType) -> Distinct {
        match input {
            ValueType::F64 => Distinct::F64(BTreeSet::new()),
            ValueType::I64 => Distinct::I64(BTreeSet::new()),
            ValueType::U64 => Distinct::U64(BTreeSet::new()),
            ValueType::Bool => Distinct::Bool(BTreeSet::new()),
            ValueType::Str => Distinct::Str {
                set: BTreeSet::new(),
                bytes: 0,
            },
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Distinct::F64(s) => s.len(),
            Distinct::I64(s) => s.len(),
            Distinct::U64(s) => s.len(),
            Distinct::Bool(s) => s.len(),
            Distinct::Str { set, .. } => set.len(),
        }
    }

    /// Adds a value of the set's type (the state checked it); a value of
    /// another type is ignored rather than trusted.
    pub(crate) fn insert(&mut self, value: &Value) -> Result<()> {
        let len = self.len();
        match (self, value) {
            (Distinct::F64(s), Value::F64(f)) => insert_bounded(s, len, distinct_f64_bits(*f)),
            (Distinct::I64(s), Value::I64(i)) => insert_bounded(s, len, *i),
            (Distinct::U64(s), Value::U64(u)) => insert_bounded(s, len, *u),
            (Distinct::Bool(s), Value::Bool(b)) => insert_bounded(s, len, *b),
            (Distinct::Str { set, bytes }, Value::Str(v)) => {
                if set.contains(v) {
                    return Ok(());
                }
                let new_bytes = bytes.saturating_add(v.len());
                if new_bytes > MAX_DISTINCT_BYTES {
                    return Err(Error::DistinctTooLarge(MAX_DISTINCT_BYTES));
                }
                insert_bounded(set, len, v.clone())?;
                *bytes = new_bytes;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn merge(&mut self, other: &Distinct) -> Result<()> {
        match (self, other) {
            (Distinct::F64(a), Distinct::F64(b)) => union_bounded(a, b),
            (Distinct::I64(a), Distinct::I64(b)) => union_bounded(a, b),
            (Distinct::U64(a), Distinct::U64(b)) => union_bounded(a, b),
            (Distinct::Bool(a), Distinct::Bool(b)) => union_bounded(a, b),
            (Distinct::Str { set: a, bytes }, Distinct::Str { set: b, .. }) => {
                // Check both limits before touching `a`, so a failed merge
                // leaves the state as it was.
                let new: Vec<&String> = b.iter().filter(|v| !a.contains(*v)).collect();
                if a.len().saturating_add(new.len()) > MAX_DISTINCT_VALUES {
                    return Err(Error::TooManyDistinct(MAX_DISTINCT_VALUES));
                }
                let added: usize = new.iter().map(|v| v.len()).sum();
                let new_bytes = bytes.saturating_add(added);
                if new_bytes > MAX_DISTINCT_BYTES {
                    return Err(Error::DistinctTooLarge(MAX_DISTINCT_BYTES));
                }
                a.extend(new.into_iter().cloned());
                *bytes = new_bytes;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

fn insert_bounded<T: Ord>(set: &mut BTreeSet<T>, len: usize, v: T) -> Result<()> {
    if len >= MAX_DISTINCT_VALUES && !set.contains(&v) {
        return Err(Error::TooManyDistinct(MAX_DISTINCT_VALUES));
    }
    set.insert(v);
    Ok(())
}

fn union_bounded<T: Ord + Copy>(a: &mut BTreeSet<T>, b: &BTreeSet<T>) -> Result<()> {
    let new = b.iter().filter(|v| !a.contains(v)).count();
    if a.len().saturating_add(new) > MAX_DISTINCT_VALUES {
        return Err(Error::TooManyDistinct(MAX_DISTINCT_VALUES));
    }
    a.extend(b.iter().copied());
    Ok(())
}
