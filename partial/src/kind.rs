//! Which aggregate a state computes, which inputs each takes, what it
//! finalizes to, and the finalize modes.

use std::fmt;

use crate::error::{Error, Result};
use crate::value::ValueType;

/// The aggregates that split into a partial state and a final step.
///
/// `Count` counts the non-null values it is fed. `count(*)` is `Count` fed
/// one non-null value per row (any type; `Value::Bool(true)` is the cheapest),
/// since the caller skips nulls before a state sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggregateKind {
    /// Any input; finalizes to `I64` (SQL `BIGINT`), 0 when there was no input.
    Count,
    /// `F64`, `I64`, `U64`; finalizes to the input type. Integer sums are kept
    /// exact (`i128`/`u128`) through every merge and only the final value must
    /// fit the input type.
    Sum,
    /// Any input; finalizes to the input type.
    Min,
    /// Any input; finalizes to the input type.
    Max,
    /// `F64`, `I64`, `U64`; finalizes to `F64`.
    Avg,
    /// Any input: the value of the smallest time, ties broken by the smallest
    /// value.
    First,
    /// Any input: the value of the largest time, ties broken by the largest
    /// value.
    Last,
    /// `F64`, `I64`, `U64`; finalizes to `F64` (sample or population variance
    /// or standard deviation, see [`Finalize`]).
    Variance,
    /// `F64`, `I64`, `U64`; an approximate quantile as `F64`.
    Percentile,
    /// Any input; an estimate of the number of distinct values as `U64`.
    ApproxDistinct,
    /// Any input; the exact number of distinct values as `U64`, up to
    /// [`crate::MAX_DISTINCT_VALUES`].
    ExactDistinct,
}

impl AggregateKind {
    pub const ALL: [AggregateKind; 11] = [
        AggregateKind::Count,
        AggregateKind::Sum,
        AggregateKind::Min,
        AggregateKind::Max,
        AggregateKind::Avg,
        AggregateKind::First,
        AggregateKind::Last,
        AggregateKind::Variance,
        AggregateKind::Percentile,
        AggregateKind::ApproxDistinct,
        AggregateKind::ExactDistinct,
    ];

    /// Whether a state of this kind can be fed values of `input`.
    pub fn accepts(self, input: ValueType) -> bool {
        match self {
            AggregateKind::Count
            | AggregateKind::Min
            | AggregateKind::Max
            | AggregateKind::First
            | AggregateKind::Last
            | AggregateKind::ApproxDistinct
            | AggregateKind::ExactDistinct => true,
            AggregateKind::Sum
            | AggregateKind::Avg
            | AggregateKind::Variance
            | AggregateKind::Percentile => input.is_numeric(),
        }
    }

    /// The type of the finalized value for `input` (for any finalize mode the
    /// kind has).
    pub fn output_type(self, input: ValueType) -> ValueType {
        match self {
            AggregateKind::Count => ValueType::I64,
            AggregateKind::Sum
            | AggregateKind::Min
            | AggregateKind::Max
            | AggregateKind::First
            | AggregateKind::Last => input,
            AggregateKind::Avg | AggregateKind::Variance | AggregateKind::Percentile => {
                ValueType::F64
            }
            AggregateKind::ApproxDistinct | AggregateKind::ExactDistinct => ValueType::U64,
        }
    }

    /// Whether a state of this kind holds nothing but its answer: `count`
    /// keeps the count it answers, `min` and `max` the value (or none).
    /// [`crate::State::from_answer`] rebuilds such a state from what
    /// [`crate::State::finalize`] gives, so these states can travel as
    /// their answers (a column of [`AggregateKind::output_type`], NULL for
    /// none) instead of as bytes. Every other kind keeps more than its
    /// answer (a sum its count, `first` its time, a sketch its sketch).
    pub fn state_is_answer(self) -> bool {
        matches!(
            self,
            AggregateKind::Count | AggregateKind::Min | AggregateKind::Max
        )
    }

    /// The code in the binary form; 0 is never used, so zeroed bytes fail.
    pub(crate) const fn code(self) -> u8 {
        match self {
            AggregateKind::Count => 1,
            AggregateKind::Sum => 2,
            AggregateKind::Min => 3,
            AggregateKind::Max => 4,
            AggregateKind::Avg => 5,
            AggregateKind::First => 6,
            AggregateKind::Last => 7,
            AggregateKind::Variance => 8,
            AggregateKind::Percentile => 9,
            AggregateKind::ApproxDistinct => 10,
            AggregateKind::ExactDistinct => 11,
        }
    }

    pub(crate) fn from_code(code: u8) -> Result<AggregateKind> {
        AggregateKind::ALL
            .into_iter()
            .find(|kind| kind.code() == code)
            .ok_or(Error::UnknownKind(code))
    }
}

impl fmt::Display for AggregateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AggregateKind::Count => "count",
            AggregateKind::Sum => "sum",
            AggregateKind::Min => "min",
            AggregateKind::Max => "max",
            AggregateKind::Avg => "avg",
            AggregateKind::First => "first",
            AggregateKind::Last => "last",
            AggregateKind::Variance => "variance",
            AggregateKind::Percentile => "percentile",
            AggregateKind::ApproxDistinct => "approx_distinct",
            AggregateKind::ExactDistinct => "count(DISTINCT)",
        })
    }
}

/// How to turn a state into its answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Finalize {
    /// The kind's own answer. For `Variance` that is [`Finalize::VarSamp`] (SQL
    /// `variance`); `Percentile` has none and needs [`Finalize::Quantile`].
    Natural,
    /// Sample variance (`n - 1` denominator); null below two values.
    VarSamp,
    /// Population variance (`n` denominator).
    VarPop,
    /// Square root of the sample variance; null below two values.
    StddevSamp,
    /// Square root of the population variance.
    StddevPop,
    /// For `Percentile`: the quantile in `[0, 1]` (0.5 is the median).
    Quantile(f64),
}

impl fmt::Display for Finalize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finalize::Natural => f.write_str("the natural result"),
            Finalize::VarSamp => f.write_str("var_samp"),
            Finalize::VarPop => f.write_str("var_pop"),
            Finalize::StddevSamp => f.write_str("stddev_samp"),
            Finalize::StddevPop => f.write_str("stddev_pop"),
            Finalize::Quantile(q) => write!(f, "quantile {q}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_codes_round_trip_and_zero_is_unknown() {
        for kind in AggregateKind::ALL {
            assert_eq!(AggregateKind::from_code(kind.code()), Ok(kind));
        }
        assert_eq!(AggregateKind::from_code(0), Err(Error::UnknownKind(0)));
        assert_eq!(AggregateKind::from_code(12), Err(Error::UnknownKind(12)));
    }

    #[test]
    fn type_codes_round_trip_and_zero_is_unknown() {
        for ty in ValueType::ALL {
            assert_eq!(ValueType::from_code(ty.code()), Ok(ty));
        }
        assert_eq!(ValueType::from_code(0), Err(Error::UnknownType(0)));
    }
}
