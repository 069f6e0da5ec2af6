//! The crate's one error enum. Two families: what a query asked that cannot be
//! answered (a kind that does not take a type, a sum that overflows, a set over
//! its limit) and bytes that [`crate::State::decode`] refused
//! ([`Error::is_decode_error`]); the second is a peer's bug or corruption,
//! never a user's mistake.

use crate::kind::{AggregateKind, Finalize};
use crate::value::ValueType;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// `State::new` (or decode) with a kind that makes no sense for the type,
    /// such as `sum` over text.
    #[error("{kind} does not take {input} input")]
    UnsupportedInput {
        kind: AggregateKind,
        input: ValueType,
    },
    /// `update` with a value of another type than the state was made for.
    #[error("{kind} state over {expected} was fed a {found} value")]
    TypeMismatch {
        kind: AggregateKind,
        expected: ValueType,
        found: ValueType,
    },
    /// [`crate::Value::total_cmp`] across two types.
    #[error("cannot order a {left} value against a {right} value")]
    MixedTypes { left: ValueType, right: ValueType },
    /// `merge` of two states of different kinds or input types.
    #[error(
        "cannot merge a {other_kind} state over {other_input} into a {kind} state over {input}"
    )]
    MergeMismatch {
        kind: AggregateKind,
        input: ValueType,
        other_kind: AggregateKind,
        other_input: ValueType,
    },
    /// A finalize mode the kind does not have (a quantile of a sum).
    #[error("{how} does not apply to {kind}")]
    BadFinalize { kind: AggregateKind, how: Finalize },
    #[error("quantile {0} is outside [0, 1]")]
    QuantileOutOfRange(f64),
    /// The exact sum does not fit the output type (`BIGINT` or
    /// `BIGINT UNSIGNED`).
    #[error("sum overflows {0}")]
    SumOverflow(ValueType),
    #[error("count overflows BIGINT")]
    CountOverflow,
    /// A merge whose row counters would pass `u64::MAX`: only reachable with
    /// states that no real input produced.
    #[error("{0} counter of a partial state overflows u64")]
    CounterOverflow(&'static str),
    /// `count(DISTINCT)` keeps every value; past this many it gives up.
    #[error("count(DISTINCT) state over {0} values")]
    TooManyDistinct(usize),
    /// `count(DISTINCT)` over text keeps every string; past this many bytes it
    /// gives up.
    #[error("count(DISTINCT) state over {0} bytes")]
    DistinctTooLarge(usize),
    /// One text value longer than a state keeps.
    #[error("text value of {len} bytes is over the {limit}-byte limit of a partial state")]
    StringTooLong { len: usize, limit: usize },

    #[error("unknown partial state format version {found} (this build reads version {supported})")]
    UnknownVersion { found: u8, supported: u8 },
    #[error("unknown aggregate kind code {0} in a partial state")]
    UnknownKind(u8),
    #[error("unknown input type code {0} in a partial state")]
    UnknownType(u8),
    #[error("partial state truncated: {what} needs {needed} bytes, {remaining} left")]
    Truncated {
        what: &'static str,
        needed: usize,
        remaining: usize,
    },
    #[error("partial state has {0} trailing bytes")]
    TrailingBytes(usize),
    #[error("invalid UTF-8 in a text value of a partial state")]
    InvalidUtf8,
    /// A run of values given by its summary (`State::update_summary`) that
    /// the state cannot take: the kind needs the values, or the summary
    /// lacks the part the kind needs, or the sum cannot be of `count` values.
    #[error("a summary of values cannot feed {kind}: it needs {what}")]
    Summary {
        kind: AggregateKind,
        what: &'static str,
    },
    /// `State::from_answer` or `merge_answer` for a kind whose state keeps
    /// more than its answer (see `AggregateKind::state_is_answer`).
    #[error("a {0} state is more than its answer")]
    NotAnAnswer(AggregateKind),
    /// A group number past the groups of a `GroupStates` (the caller's bug).
    #[error("no group {group} among {groups} groups of states")]
    NoGroup { group: usize, groups: usize },
    /// Bytes that parse but break an invariant of the state; the reason names
    /// which.
    #[error("corrupt partial state: {0}")]
    Corrupt(&'static str),
}

impl Error {
    /// Whether [`crate::State::decode`] refused the bytes. Such an error means
    /// a peer sent (or a file holds) something this build cannot trust; it is
    /// an internal error for the query, not the user's.
    pub fn is_decode_error(&self) -> bool {
        matches!(
            self,
            Error::UnknownVersion { .. }
                | Error::UnknownKind(_)
                | Error::UnknownType(_)
                | Error::Truncated { .. }
                | Error::TrailingBytes(_)
                | Error::InvalidUtf8
                | Error::Corrupt(_)
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
