//! Folding a run of values known only by their summary (count, exact sum,
//! min, max), as a column page's header statistics give them, into a state
//! without the values themselves.

use crate::float::FloatSum;
use crate::state::{Body, State};
use crate::{AggregateKind, Error, Result, Value};

/// The exact sum of a run of values, of the run's type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SumOf {
    Int(i128),
    UInt(u128),
    /// A finite float sum (a run holding a non-finite value is fed value by
    /// value instead).
    Float(f64),
}

impl State {
    /// Folds `count` non-null values whose sum is `sum` and whose extremes
    /// are `min` and `max`, as if each had been fed to [`State::update`].
    /// Only `count`, `sum`, `avg`, `min` and `max` can use a summary, and
    /// each needs its part of it (`sum` for sum and avg, `min` or `max`).
    pub fn update_summary(
        &mut self,
        count: u64,
        sum: Option<SumOf>,
        min: Option<&Value>,
        max: Option<&Value>,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let missing = |what: &'static str| Error::Summary {
            kind: self.kind,
            what,
        };
        let body = match (self.kind, sum) {
            (AggregateKind::Count, _) => Body::Count(count),
            // A sum no `count` values of the type can reach would make a state
            // that its own decoder refuses.
            (AggregateKind::Sum | AggregateKind::Avg, Some(SumOf::Int(s))) => {
                if s.unsigned_abs() > u128::from(count) << 63 {
                    return Err(missing("a sum that count values can reach"));
                }
                Body::IntSum { count, sum: s }
            }
            (AggregateKind::Sum | AggregateKind::Avg, Some(SumOf::UInt(s))) => {
                if s > u128::from(count) * u128::from(u64::MAX) {
                    return Err(missing("a sum that count values can reach"));
                }
                Body::UintSum { count, sum: s }
            }
            (AggregateKind::Sum | AggregateKind::Avg, Some(SumOf::Float(s))) if s.is_finite() => {
                let mut f = FloatSum::default();
                f.add(s);
                Body::FloatSum { count, sum: f }
            }
            (AggregateKind::Sum | AggregateKind::Avg, _) => return Err(missing("a finite sum")),
            (AggregateKind::Min, _) => {
                return self.update(0, min.ok_or_else(|| missing("the minimum"))?);
            }
            (AggregateKind::Max, _) => {
                return self.update(0, max.ok_or_else(|| missing("the maximum"))?);
            }
            _ => return Err(missing("the values themselves")),
        };
        let run = State {
            kind: self.kind,
            input: self.input,
            body,
        };
        // Merge checks that the summary's type is the state's.
        self.merge(&run)
    }
}
