//! SQL functions Sealion adds to DataFusion's.
//!
//! - `first(value, time)` and `last(value, time)`: the value at the
//!   smallest (largest) time among the rows where the value is not NULL;
//!   ties on time go to the smallest (largest) value, so the answer does
//!   not depend on row order. They are the same states the storage nodes
//!   keep (`sealion_partial`), so a pushed-down `first`/`last` and this
//!   accumulator agree.
//! - `time_bucket` is `date_bin` (see [`crate::aggregate::date_bin_udf`]).

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, TimeUnit};
use datafusion::common::{ScalarValue, plan_err};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Signature, Volatility,
};

/// `first(value, time)` or `last(value, time)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FirstLast {
    last: bool,
    signature: Signature,
}

impl FirstLast {
    pub fn new(last: bool) -> FirstLast {
        FirstLast {
            last,
            signature: Signature::any(2, Volatility::Immutable),
        }
    }

    pub fn is_last(&self) -> bool {
        self.last
    }
}

/// Both functions, to register with a session.
pub fn first_last() -> [AggregateUDF; 2] {
    [
        AggregateUDF::from(FirstLast::new(false)),
        AggregateUDF::from(FirstLast::new(true)),
    ]
}

impl AggregateUDFImpl for FirstLast {
    fn name(&self) -> &str {
        if self.last { "last" } else { "first" }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        match arg_types {
            [value, DataType::Timestamp(_, _)] => Ok(value.clone()),
            [_, other] => plan_err!(
                "{}(value, time): the second argument must be a timestamp, not {other}",
                self.name()
            ),
            _ => plan_err!("{}(value, time) takes two arguments", self.name()),
        }
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        Ok(Box::new(FirstLastAccumulator {
            last: self.last,
            data_type: args.return_field.data_type().clone(),
            best: None,
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        let value = args.return_field.data_type().clone();
        Ok(vec![
            Arc::new(Field::new(format!("{}[value]", args.name), value, true)),
            Arc::new(Field::new(
                format!("{}[time]", args.name),
                DataType::Int64,
                true,
            )),
        ])
    }
}

#[derive(Debug)]
struct FirstLastAccumulator {
    last: bool,
    data_type: DataType,
    /// Time (ns) and value of the row kept so far.
    best: Option<(i64, ScalarValue)>,
}

/// The order ties are broken by: floats by their total order with every
/// NaN equal and above +inf, as the partial states order them.
fn value_order(a: &ScalarValue, b: &ScalarValue) -> Ordering {
    match (a, b) {
        (ScalarValue::Float64(Some(x)), ScalarValue::Float64(Some(y))) => {
            match (x.is_nan(), y.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => x.total_cmp(y),
            }
        }
        _ => a.partial_cmp(b).unwrap_or(Ordering::Equal),
    }
}

impl FirstLastAccumulator {
    fn offer(&mut self, time: i64, value: ScalarValue) {
        let better = match &self.best {
            None => true,
            Some((t, v)) => {
                let by_time = time.cmp(t);
                let order = by_time.then_with(|| value_order(&value, v));
                if self.last {
                    order == Ordering::Greater
                } else {
                    order == Ordering::Less
                }
            }
        };
        if better {
            self.best = Some((time, value));
        }
    }

    /// Offers every row of `values` and `times` (nanoseconds as Int64)
    /// where both are present.
    fn offer_all(&mut self, values: &ArrayRef, times: &ArrayRef) -> DfResult<()> {
        let times = arrow::compute::cast(times, &DataType::Int64)?;
        let times = times.as_primitive::<Int64Type>();
        for i in 0..values.len() {
            if values.is_valid(i) && times.is_valid(i) {
                self.offer(times.value(i), ScalarValue::try_from_array(values, i)?);
            }
        }
        Ok(())
    }
}

impl Accumulator for FirstLastAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        // Times in any unit are compared in nanoseconds.
        let times =
            arrow::compute::cast(&values[1], &DataType::Timestamp(TimeUnit::Nanosecond, None))?;
        self.offer_all(&values[0], &times)
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        self.offer_all(&states[0], &states[1])
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(match &self.best {
            Some((t, v)) => vec![v.clone(), ScalarValue::Int64(Some(*t))],
            None => vec![
                ScalarValue::try_from(&self.data_type)?,
                ScalarValue::Int64(None),
            ],
        })
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        match &self.best {
            Some((_, v)) => Ok(v.clone()),
            None => ScalarValue::try_from(&self.data_type),
        }
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.best.as_ref().map_or(0, |(_, v)| v.size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, TimestampNanosecondArray};

    fn acc(last: bool) -> FirstLastAccumulator {
        FirstLastAccumulator {
            last,
            data_type: DataType::Float64,
            best: None,
        }
    }

    fn batch(values: &[Option<f64>], times: &[i64]) -> Vec<ArrayRef> {
        vec![
            Arc::new(Float64Array::from(values.to_vec())),
            Arc::new(TimestampNanosecondArray::from(times.to_vec())),
        ]
    }

    #[test]
    fn nulls_are_skipped_and_ties_on_time_go_by_value() {
        let rows = batch(
            &[None, Some(5.0), Some(2.0), Some(9.0), Some(1.0), None],
            &[1, 2, 2, 7, 7, 8],
        );
        let mut first = acc(false);
        first.update_batch(&rows).unwrap();
        assert_eq!(first.evaluate().unwrap(), ScalarValue::Float64(Some(2.0)));
        let mut last = acc(true);
        last.update_batch(&rows).unwrap();
        assert_eq!(last.evaluate().unwrap(), ScalarValue::Float64(Some(9.0)));
        // No value at all: NULL.
        let mut none = acc(true);
        none.update_batch(&batch(&[None], &[3])).unwrap();
        assert_eq!(none.evaluate().unwrap(), ScalarValue::Float64(None));
    }

    #[test]
    fn merged_states_answer_as_one_pass_in_any_split() {
        let values: Vec<Option<f64>> = (0..40)
            .map(|i| (i % 7 != 0).then_some(((i * 37) % 11) as f64))
            .collect();
        let times: Vec<i64> = (0..40).map(|i| (i * 13) % 9).collect();
        for last in [false, true] {
            let mut whole = acc(last);
            whole.update_batch(&batch(&values, &times)).unwrap();
            for split in [1, 5, 17, 39] {
                let mut a = acc(last);
                a.update_batch(&batch(&values[..split], &times[..split]))
                    .unwrap();
                let mut b = acc(last);
                b.update_batch(&batch(&values[split..], &times[split..]))
                    .unwrap();
                let state: Vec<ArrayRef> = b
                    .state()
                    .unwrap()
                    .into_iter()
                    .map(|s| s.to_array().unwrap())
                    .collect();
                a.merge_batch(&state).unwrap();
                assert_eq!(
                    a.evaluate().unwrap(),
                    whole.evaluate().unwrap(),
                    "split {split}"
                );
            }
        }
    }
}
