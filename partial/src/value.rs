//! The scalar a state is fed and the scalar it finalizes to, with the one total
//! order that `min`, `max`, `first` and `last` break ties with.
//!
//! Floats: every NaN, whatever its sign or payload, is made the one canonical
//! quiet NaN ([`CANONICAL_NAN_BITS`]) when it enters a state, and that NaN
//! sorts above `+inf` (as in PostgreSQL). Other floats are ordered by
//! [`f64::total_cmp`], so `-0.0 < +0.0`: `min(-0.0, 0.0)` is `-0.0` whatever
//! the input order. Distinct counting is different: there `-0.0` and `0.0` are
//! one value (they are equal in SQL) and so are all NaNs.
//!
//! Text is ordered by its UTF-8 bytes (code point order), not by a collation.

use std::cmp::Ordering;
use std::fmt;

use crate::error::{Error, Result};

/// The bits of the one NaN a state ever holds (the positive quiet NaN with no
/// payload).
pub const CANONICAL_NAN_BITS: u64 = 0x7ff8_0000_0000_0000;

/// An input value (nulls never reach a state: the caller skips them) or a
/// finalized result.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    F64(f64),
    I64(i64),
    U64(u64),
    Bool(bool),
    Str(String),
}

/// Which [`Value`] variant a state is fed (and the type of a result).
/// Displayed with Sealion's SQL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    F64,
    I64,
    U64,
    Bool,
    Str,
}

impl ValueType {
    pub const ALL: [ValueType; 5] = [
        ValueType::F64,
        ValueType::I64,
        ValueType::U64,
        ValueType::Bool,
        ValueType::Str,
    ];

    /// The code in the binary form; 0 is never used, so zeroed bytes fail.
    pub(crate) const fn code(self) -> u8 {
        match self {
            ValueType::F64 => 1,
            ValueType::I64 => 2,
            ValueType::U64 => 3,
            ValueType::Bool => 4,
            ValueType::Str => 5,
        }
    }

    pub(crate) fn from_code(code: u8) -> Result<ValueType> {
        Ok(match code {
            1 => ValueType::F64,
            2 => ValueType::I64,
            3 => ValueType::U64,
            4 => ValueType::Bool,
            5 => ValueType::Str,
            other => return Err(Error::UnknownType(other)),
        })
    }

    pub fn is_numeric(self) -> bool {
        matches!(self, ValueType::F64 | ValueType::I64 | ValueType::U64)
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ValueType::F64 => "DOUBLE",
            ValueType::I64 => "BIGINT",
            ValueType::U64 => "BIGINT UNSIGNED",
            ValueType::Bool => "BOOLEAN",
            ValueType::Str => "TEXT",
        })
    }
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::F64(_) => ValueType::F64,
            Value::I64(_) => ValueType::I64,
            Value::U64(_) => ValueType::U64,
            Value::Bool(_) => ValueType::Bool,
            Value::Str(_) => ValueType::Str,
        }
    }

    /// The total order of values of one type (see the module doc for floats
    /// and text). Values of two types are an error, never a guess.
    pub fn total_cmp(&self, other: &Value) -> Result<Ordering> {
        if self.value_type() != other.value_type() {
            return Err(Error::MixedTypes {
                left: self.value_type(),
                right: other.value_type(),
            });
        }
        Ok(self.order(other))
    }

    /// The total order, without the type check: states check types before
    /// they compare, and across types this falls back to the type code so
    /// that it can never panic.
    pub(crate) fn order(&self, other: &Value) -> Ordering {
        match (self, other) {
            (Value::F64(a), Value::F64(b)) => canonical_f64(*a).total_cmp(&canonical_f64(*b)),
            (Value::I64(a), Value::I64(b)) => a.cmp(b),
            (Value::U64(a), Value::U64(b)) => a.cmp(b),
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            (Value::Str(a), Value::Str(b)) => a.as_bytes().cmp(b.as_bytes()),
            (a, b) => a.value_type().code().cmp(&b.value_type().code()),
        }
    }

    /// The value as a state keeps it: NaN made canonical.
    pub(crate) fn canonical(&self) -> Value {
        match self {
            Value::F64(f) => Value::F64(canonical_f64(*f)),
            other => other.clone(),
        }
    }

    /// The value as `f64`, for the kinds that compute in floats (variance,
    /// percentile). Integers past 2^53 round to the nearest float.
    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            Value::F64(f) => Some(*f),
            Value::I64(i) => Some(*i as f64),
            Value::U64(u) => Some(*u as f64),
            Value::Bool(_) | Value::Str(_) => None,
        }
    }
}

/// Every NaN becomes the canonical one; other floats are kept bit for bit.
pub(crate) fn canonical_f64(f: f64) -> f64 {
    if f.is_nan() {
        f64::from_bits(CANONICAL_NAN_BITS)
    } else {
        f
    }
}

/// The float as distinct counting sees it: one NaN and one zero.
pub(crate) fn distinct_f64_bits(f: f64) -> u64 {
    if f.is_nan() {
        CANONICAL_NAN_BITS
    } else if f == 0.0 {
        0
    } else {
        f.to_bits()
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::F64(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::I64(v)
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::U64(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_owned())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn nan_of_any_payload_sorts_above_infinity_and_equal_to_nan() {
        let odd_nan = Value::F64(f64::from_bits(0xfff0_0000_0000_0001));
        let inf = Value::F64(f64::INFINITY);
        assert_eq!(odd_nan.total_cmp(&inf), Ok(Ordering::Greater));
        assert_eq!(
            odd_nan.total_cmp(&Value::F64(f64::NAN)),
            Ok(Ordering::Equal)
        );
    }

    #[test]
    fn negative_zero_sorts_below_zero() {
        let neg = Value::F64(-0.0);
        assert_eq!(neg.total_cmp(&Value::F64(0.0)), Ok(Ordering::Less));
    }

    #[test]
    fn mixed_types_do_not_compare() {
        let err = Value::I64(1).total_cmp(&Value::U64(1)).unwrap_err();
        assert!(matches!(err, Error::MixedTypes { .. }), "{err}");
    }

    #[test]
    fn distinct_bits_fold_zeros_and_nans() {
        assert_eq!(distinct_f64_bits(-0.0), distinct_f64_bits(0.0));
        assert_eq!(
            distinct_f64_bits(f64::from_bits(0xfff8_0000_0000_0003)),
            distinct_f64_bits(f64::NAN)
        );
        assert_ne!(distinct_f64_bits(1.0), distinct_f64_bits(-1.0));
    }
}
