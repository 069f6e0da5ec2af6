//! [`State`]: one partial aggregate, fed rows with [`State::update`], combined
//! with [`State::merge`], answered with [`State::finalize`].
//!
//! Merges are commutative bit for bit (`a ⊕ b` and `b ⊕ a` encode to the same
//! bytes) and associative, so the answer does not depend on how rows were
//! split among nodes, partitions and batches, nor on the order or tree shape
//! of the merges. That holds bit for bit for every kind but the ones that do
//! float arithmetic (`sum` and `avg` over `F64`, `variance`, `percentile`),
//! whose answers differ by rounding only (for `percentile`, within the
//! digest's error). A state never panics on what it is fed or merged with: a
//! wrong type, an overflow or a limit is an [`Error`], and a failed
//! `update` or `merge` leaves the state as it was.

use std::cmp::Ordering;

use crate::distinct::Distinct;
use crate::error::{Error, Result};
use crate::float::{FloatSum, Moments};
use crate::hll::{Hll, hash_value};
use crate::kind::{AggregateKind, Finalize};
use crate::percentile::Percentile;
use crate::value::{Value, ValueType, canonical_f64};

/// The longest text value a state keeps (for `min`, `max`, `first`, `last`
/// and `count(DISTINCT)`); the byte form's length prefixes are sized by it.
pub const MAX_STRING_BYTES: usize = 16 << 20;

/// A partial aggregate of one kind over one input type.
#[derive(Debug, Clone)]
pub struct State {
    pub(crate) kind: AggregateKind,
    pub(crate) input: ValueType,
    pub(crate) body: Body,
}

/// What each kind keeps. Sum and Avg keep the same thing.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    Count(u64),
    /// Sum/Avg over `I64`: the exact sum. With `count` checked, `|sum| <=
    /// count * 2^63 < 2^127`, so the `i128` itself never overflows.
    IntSum {
        count: u64,
        sum: i128,
    },
    /// Sum/Avg over `U64`; `sum <= count * (2^64 - 1) < 2^128`.
    UintSum {
        count: u64,
        sum: u128,
    },
    /// Sum/Avg over `F64`; `count` includes the non-finite values.
    FloatSum {
        count: u64,
        sum: FloatSum,
    },
    /// Min/Max: the extreme value so far (NaN canonical).
    Extreme(Option<Value>),
    /// First/Last: the (time, value) pair that is smallest (first) or
    /// largest (last) in (time, value) order.
    Timed(Option<(i64, Value)>),
    Moments(Moments),
    Percentile(Box<Percentile>),
    Hll(Hll),
    Distinct(Distinct),
}

impl State {
    /// An empty state of `kind` over values of `input`; an error when the
    /// kind does not take that type (see [`AggregateKind::accepts`]).
    pub fn new(kind: AggregateKind, input: ValueType) -> Result<State> {
        let unsupported = Error::UnsupportedInput { kind, input };
        if !kind.accepts(input) {
            return Err(unsupported);
        }
        let body = match kind {
            AggregateKind::Count => Body::Count(0),
            AggregateKind::Sum | AggregateKind::Avg => match input {
                ValueType::I64 => Body::IntSum { count: 0, sum: 0 },
                ValueType::U64 => Body::UintSum { count: 0, sum: 0 },
                ValueType::F64 => Body::FloatSum {
                    count: 0,
                    sum: FloatSum::default(),
                },
                ValueType::Bool | ValueType::Str => return Err(unsupported),
            },
            AggregateKind::Min | AggregateKind::Max => Body::Extreme(None),
            AggregateKind::First | AggregateKind::Last => Body::Timed(None),
            AggregateKind::Variance => Body::Moments(Moments::default()),
            AggregateKind::Percentile => Body::Percentile(Box::default()),
            AggregateKind::ApproxDistinct => Body::Hll(Hll::default()),
            AggregateKind::ExactDistinct => Body::Distinct(Distinct::new(input)),
        };
        Ok(State { kind, input, body })
    }

    pub fn kind(&self) -> AggregateKind {
        self.kind
    }

    pub fn input_type(&self) -> ValueType {
        self.input
    }

    /// Whether the state has seen no value (through updates or merges).
    pub fn is_empty(&self) -> bool {
        match &self.body {
            Body::Count(n) => *n == 0,
            Body::IntSum { count, .. }
            | Body::UintSum { count, .. }
            | Body::FloatSum { count, .. } => *count == 0,
            Body::Extreme(v) => v.is_none(),
            Body::Timed(v) => v.is_none(),
            Body::Moments(m) => m.count == 0 && m.non_finite == 0,
            Body::Percentile(p) => p.is_empty(),
            Body::Hll(h) => h.is_empty(),
            Body::Distinct(d) => d.len() == 0,
        }
    }

    /// Feeds one non-null value. `time_ns` only matters to `first` and
    /// `last`. The value must be of the state's input type.
    pub fn update(&mut self, time_ns: i64, value: &Value) -> Result<()> {
        let found = value.value_type();
        if found != self.input {
            return Err(Error::TypeMismatch {
                kind: self.kind,
                expected: self.input,
                found,
            });
        }
        if let Value::Str(s) = value
            && s.len() > MAX_STRING_BYTES
        {
            return Err(Error::StringTooLong {
                len: s.len(),
                limit: MAX_STRING_BYTES,
            });
        }
        let want = self.wanted_order();
        let mismatch = self.mismatch(found);
        match (&mut self.body, value) {
            (Body::Count(n), _) => *n = count_add(*n, 1)?,
            (Body::IntSum { count, sum }, Value::I64(v)) => {
                *count = count_add(*count, 1)?;
                // Cannot overflow: see `Body::IntSum`.
                *sum += i128::from(*v);
            }
            (Body::UintSum { count, sum }, Value::U64(v)) => {
                *count = count_add(*count, 1)?;
                *sum += u128::from(*v);
            }
            (Body::FloatSum { count, sum }, Value::F64(v)) => {
                *count = count_add(*count, 1)?;
                sum.add(*v);
            }
            (Body::Extreme(current), v) => offer_extreme(current, v, want),
            (Body::Timed(current), v) => offer_timed(current, time_ns, v, want),
            (Body::Moments(m), v) => m.add(v.as_f64().ok_or(mismatch)?)?,
            (Body::Percentile(p), v) => p.add(v.as_f64().ok_or(mismatch)?)?,
            (Body::Hll(h), v) => h.add_hash(hash_value(v)),
            (Body::Distinct(d), v) => d.insert(v)?,
            (Body::IntSum { .. } | Body::UintSum { .. } | Body::FloatSum { .. }, _) => {
                return Err(mismatch);
            }
        }
        Ok(())
    }

    /// Feeds a run of non-null `F64` values: the same state, bit for bit, as
    /// feeding each to [`State::update`] in order (time 0), without the
    /// per-value checks and dispatch. On an error the state is as it was.
    pub fn update_f64s(&mut self, values: &[f64]) -> Result<()> {
        if self.input != ValueType::F64 {
            return Err(self.mismatch(ValueType::F64));
        }
        let n = values.len() as u64;
        let want = self.wanted_order();
        match &mut self.body {
            Body::Count(c) => *c = count_add(*c, n)?,
            Body::FloatSum { count, sum } => {
                *count = count_add(*count, n)?;
                sum.add_all(values);
            }
            Body::Moments(m) => {
                let mut copy = *m;
                for &x in values {
                    copy.add(x)?;
                }
                *m = copy;
            }
            Body::Extreme(current) => {
                // The run's own extreme first (in the states' order: one
                // canonical NaN, then total order), offered once.
                // Compared as `total_cmp` does, through an integer key, so the
                // loop is a plain integer max or min without branches.
                let keys = values.iter().map(|&x| f64_order_key(canonical_f64(x)));
                let best = match want {
                    Ordering::Greater => keys.max(),
                    _ => keys.min(),
                };
                let Some(best) = best else {
                    return Ok(());
                };
                let best = f64_from_order_key(best);
                match current {
                    // In place: the common case, no Value built or dropped.
                    Some(Value::F64(c)) => {
                        if best.total_cmp(c) == want {
                            *c = best;
                        }
                    }
                    _ => offer_extreme(current, &Value::F64(best), want),
                }
            }
            // Kinds that keep more than a summary.
            _ => self.update_each(values.iter().map(|&x| Value::F64(x)))?,
        }
        Ok(())
    }

    /// Feeds a run of non-null `I64` values, as [`State::update_f64s`] does
    /// `F64` ones: the same state as value by value, on error unchanged.
    pub fn update_i64s(&mut self, values: &[i64]) -> Result<()> {
        if self.input != ValueType::I64 {
            return Err(self.mismatch(ValueType::I64));
        }
        let n = values.len() as u64;
        let want = self.wanted_order();
        match &mut self.body {
            Body::Count(c) => *c = count_add(*c, n)?,
            Body::IntSum { count, sum } => {
                *count = count_add(*count, n)?;
                // Cannot overflow: see `Body::IntSum`.
                *sum += values.iter().map(|&x| i128::from(x)).sum::<i128>();
            }
            Body::Extreme(current) => {
                let best = match want {
                    Ordering::Greater => values.iter().max(),
                    _ => values.iter().min(),
                };
                if let Some(&best) = best {
                    offer_extreme(current, &Value::I64(best), want);
                }
            }
            _ => self.update_each(values.iter().map(|&x| Value::I64(x)))?,
        }
        Ok(())
    }

    /// Feeds `values` one by one (time 0) to a copy, so that an error leaves
    /// the state untouched.
    fn update_each(&mut self, values: impl Iterator<Item = Value>) -> Result<()> {
        let mut copy = self.clone();
        for v in values {
            copy.update(0, &v)?;
        }
        *self = copy;
        Ok(())
    }

    /// Folds `other` into `self`: afterwards `self` is the state of both
    /// inputs together. Both must be of the same kind and input type.
    pub fn merge(&mut self, other: &State) -> Result<()> {
        let mismatch = Error::MergeMismatch {
            kind: self.kind,
            input: self.input,
            other_kind: other.kind,
            other_input: other.input,
        };
        if self.kind != other.kind || self.input != other.input {
            return Err(mismatch);
        }
        let want = self.wanted_order();
        match (&mut self.body, &other.body) {
            (Body::Count(a), Body::Count(b)) => *a = count_add(*a, *b)?,
            (Body::IntSum { count, sum }, Body::IntSum { count: c, sum: s }) => {
                let new_count = count_add(*count, *c)?;
                // Decoded states are checked to keep |sum| <= count * 2^63, so
                // this only fails for a state that no input produced.
                *sum = sum.checked_add(*s).ok_or(Error::CounterOverflow("sum"))?;
                *count = new_count;
            }
            (Body::UintSum { count, sum }, Body::UintSum { count: c, sum: s }) => {
                let new_count = count_add(*count, *c)?;
                *sum = sum.checked_add(*s).ok_or(Error::CounterOverflow("sum"))?;
                *count = new_count;
            }
            (Body::FloatSum { count, sum }, Body::FloatSum { count: c, sum: s }) => {
                *count = count_add(*count, *c)?;
                sum.merge(s);
            }
            (Body::Extreme(current), Body::Extreme(theirs)) => {
                if let Some(v) = theirs {
                    offer_extreme(current, v, want);
                }
            }
            (Body::Timed(current), Body::Timed(theirs)) => {
                if let Some((t, v)) = theirs {
                    offer_timed(current, *t, v, want);
                }
            }
            (Body::Moments(a), Body::Moments(b)) => a.merge(b)?,
            (Body::Percentile(a), Body::Percentile(b)) => a.merge(b)?,
            (Body::Hll(a), Body::Hll(b)) => a.merge(b),
            (Body::Distinct(a), Body::Distinct(b)) => a.merge(b)?,
            _ => return Err(mismatch),
        }
        Ok(())
    }

    /// The answer: None when the state saw no value, except for the counts
    /// (`count`, `approx_distinct`, `count(DISTINCT)`), which answer 0 as SQL
    /// does.
    pub fn finalize(&self, how: Finalize) -> Result<Option<Value>> {
        let bad = Error::BadFinalize {
            kind: self.kind,
            how,
        };
        let mut ddof = 1;
        let mut sqrt = false;
        let mut quantile = 0.0;
        match (self.kind, how) {
            (AggregateKind::Variance, Finalize::Natural | Finalize::VarSamp) => {}
            (AggregateKind::Variance, Finalize::VarPop) => ddof = 0,
            (AggregateKind::Variance, Finalize::StddevSamp) => sqrt = true,
            (AggregateKind::Variance, Finalize::StddevPop) => (ddof, sqrt) = (0, true),
            (AggregateKind::Percentile, Finalize::Quantile(q)) => {
                if !(0.0..=1.0).contains(&q) {
                    return Err(Error::QuantileOutOfRange(q));
                }
                quantile = q;
            }
            (AggregateKind::Variance | AggregateKind::Percentile, _) => return Err(bad),
            (_, Finalize::Natural) => {}
            (_, _) => return Err(bad),
        }
        let is_avg = self.kind == AggregateKind::Avg;
        Ok(match &self.body {
            Body::Count(n) => Some(Value::I64(
                i64::try_from(*n).map_err(|_| Error::CountOverflow)?,
            )),
            Body::IntSum { count: 0, .. }
            | Body::UintSum { count: 0, .. }
            | Body::FloatSum { count: 0, .. } => None,
            Body::IntSum { count, sum } if is_avg => Some(Value::F64(exact_mean(*sum, *count))),
            Body::IntSum { sum, .. } => Some(Value::I64(
                i64::try_from(*sum).map_err(|_| Error::SumOverflow(ValueType::I64))?,
            )),
            Body::UintSum { count, sum } if is_avg => {
                let n = u128::from(*count);
                let mean = (sum / n) as f64 + (sum % n) as f64 / *count as f64;
                Some(Value::F64(mean))
            }
            Body::UintSum { sum, .. } => Some(Value::U64(
                u64::try_from(*sum).map_err(|_| Error::SumOverflow(ValueType::U64))?,
            )),
            Body::FloatSum { count, sum } if is_avg => {
                Some(Value::F64(sum.value() / *count as f64))
            }
            Body::FloatSum { sum, .. } => Some(Value::F64(sum.value())),
            Body::Extreme(v) => v.clone(),
            Body::Timed(v) => v.as_ref().map(|(_, v)| v.clone()),
            Body::Moments(m) => m
                .variance(ddof)
                .map(|v| Value::F64(if sqrt { v.sqrt() } else { v })),
            Body::Percentile(p) => p.quantile(quantile).map(Value::F64),
            Body::Hll(h) => Some(Value::U64(h.estimate().round() as u64)),
            Body::Distinct(d) => Some(Value::U64(d.len() as u64)),
        })
    }

    /// The state of a kind whose state is its answer
    /// ([`AggregateKind::state_is_answer`]) that finalizes to `answer`:
    /// for every such state `s`, `from_answer(kind, input,
    /// s.finalize(Natural)?.as_ref())` is `s`, byte for byte. An error for
    /// the other kinds, for a negative count and for an answer that is not
    /// of the kind's output type.
    pub fn from_answer(
        kind: AggregateKind,
        input: ValueType,
        answer: Option<&Value>,
    ) -> Result<State> {
        let mut state = State::new(kind, input)?;
        state.merge_answer(answer)?;
        Ok(state)
    }

    /// Folds in the state [`State::from_answer`] would build from `answer`,
    /// without building it: what [`State::merge`] with that state does. On
    /// an error the state is as it was.
    pub fn merge_answer(&mut self, answer: Option<&Value>) -> Result<()> {
        let not_an_answer = |found: Option<ValueType>| match found {
            Some(found) => Error::TypeMismatch {
                kind: self.kind,
                expected: self.kind.output_type(self.input),
                found,
            },
            None => Error::Corrupt("a count answer is never null"),
        };
        match (&mut self.body, answer) {
            (Body::Count(n), Some(Value::I64(more))) => {
                let more = u64::try_from(*more).map_err(|_| Error::Corrupt("a negative count"))?;
                *n = count_add(*n, more)?;
                Ok(())
            }
            (Body::Count(_), other) => Err(not_an_answer(other.map(Value::value_type))),
            (Body::Extreme(_), None) => Ok(()),
            // `update` checks the type and keeps the wanted extreme.
            (Body::Extreme(_), Some(v)) => self.update(0, v),
            _ => Err(Error::NotAnAnswer(self.kind)),
        }
    }

    /// `Less` for the kinds that keep the smallest (min, first), `Greater`
    /// for those that keep the largest.
    fn wanted_order(&self) -> Ordering {
        match self.kind {
            AggregateKind::Max | AggregateKind::Last => Ordering::Greater,
            _ => Ordering::Less,
        }
    }

    fn mismatch(&self, found: ValueType) -> Error {
        Error::TypeMismatch {
            kind: self.kind,
            expected: self.input,
            found,
        }
    }
}

pub(crate) fn count_add(a: u64, b: u64) -> Result<u64> {
    a.checked_add(b).ok_or(Error::CounterOverflow("row"))
}

/// The integer whose order is `f64::total_cmp`'s order of the floats (the
/// same transform `total_cmp` applies): negative floats have their magnitude
/// bits flipped so that they sort below the positive ones and in reverse.
pub(crate) fn f64_order_key(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// The float of an [`f64_order_key`] (the transform is its own inverse).
pub(crate) fn f64_from_order_key(key: i64) -> f64 {
    f64::from_bits((key ^ (((key >> 63) as u64) >> 1) as i64) as u64)
}

/// `sum / count` without losing the exactness of the sum to one early
/// rounding: the integer quotient plus the remainder's fraction.
fn exact_mean(sum: i128, count: u64) -> f64 {
    let n = i128::from(count);
    (sum / n) as f64 + (sum % n) as f64 / count as f64
}

fn offer_extreme(current: &mut Option<Value>, candidate: &Value, want: Ordering) {
    let replace = match current {
        None => true,
        Some(c) => candidate.order(c) == want,
    };
    if replace {
        *current = Some(candidate.canonical());
    }
}

fn offer_timed(current: &mut Option<(i64, Value)>, time: i64, candidate: &Value, want: Ordering) {
    let replace = match current {
        None => true,
        Some((t, c)) => time.cmp(t).then_with(|| candidate.order(c)) == want,
    };
    if replace {
        *current = Some((time, candidate.canonical()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::CANONICAL_NAN_BITS;

    #[test]
    fn order_keys_sort_floats_as_total_cmp_and_give_them_back() {
        let floats = [
            f64::NEG_INFINITY,
            -1e300,
            -2.5,
            -f64::MIN_POSITIVE,
            -0.0,
            0.0,
            f64::MIN_POSITIVE,
            1.0,
            1e300,
            f64::INFINITY,
            f64::from_bits(CANONICAL_NAN_BITS),
            -f64::from_bits(CANONICAL_NAN_BITS),
        ];
        for a in floats {
            assert_eq!(f64_from_order_key(f64_order_key(a)).to_bits(), a.to_bits());
            for b in floats {
                assert_eq!(
                    f64_order_key(a).cmp(&f64_order_key(b)),
                    a.total_cmp(&b),
                    "{a} vs {b}"
                );
            }
        }
    }
}
