//! How an aggregate answer carries its partial states, and how the asker
//! reads them back.
//!
//! A state column holds one state per group in one of two forms:
//!
//! - bytes: a Binary column of [`State::encode`] (any kind);
//! - answers: for `count`, `min` and `max`, whose states hold nothing but
//!   their answer ([`AggregateKind::state_is_answer`]), the answer itself in
//!   a column of its type (count BIGINT, never NULL; min and max the input's
//!   type, NULL when the group saw no value). An answer costs no encoding
//!   on the node and no decoding on the asker, and merges by one comparison
//!   or one addition ([`State::merge_answer`]).
//!
//! The node sends answers only when the request says the asker takes them
//! (`AggregateSpec.states_as_answers`); [`StateColumn`] reads either form,
//! so an asker also understands a node that predates answers.
//!
//! Must never: give a state that differs from the one the node held. The
//! differential tests read every path's answer through [`StateColumn`], and
//! `sealion-partial` holds `from_answer(finalize(s)) == s`.

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, BinaryArray, BooleanArray, BooleanBuilder, Float64Array,
    Int64Array, PrimitiveBuilder, StringArray, StringBuilder, UInt64Array,
};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType as ArrowType, Float64Type, Int64Type, UInt64Type};
use sealion_partial::{AggregateKind, Finalize, GroupStates, State, Value, ValueType};

use crate::{Error, Result};

/// The Arrow type of values of `t`.
pub fn arrow_type(t: ValueType) -> ArrowType {
    match t {
        ValueType::F64 => ArrowType::Float64,
        ValueType::I64 => ArrowType::Int64,
        ValueType::U64 => ArrowType::UInt64,
        ValueType::Bool => ArrowType::Boolean,
        ValueType::Str => ArrowType::Utf8,
    }
}

/// Whether states of `kind` travel as answers when the asker takes them.
pub fn travels_as_answer(kind: AggregateKind, as_answers: bool) -> bool {
    as_answers && kind.state_is_answer()
}

/// The type of the column of `kind` states over `input`, and whether it
/// may hold NULLs.
pub fn state_type(kind: AggregateKind, input: ValueType, as_answers: bool) -> (ArrowType, bool) {
    if travels_as_answer(kind, as_answers) {
        (
            arrow_type(kind.output_type(input)),
            kind != AggregateKind::Count,
        )
    } else {
        (ArrowType::Binary, false)
    }
}

/// The column of the states of `groups` in the form [`state_type`] names.
pub fn state_array(
    as_answers: bool,
    states: &GroupStates,
    groups: Range<usize>,
) -> Result<ArrayRef> {
    if travels_as_answer(states.kind(), as_answers) {
        final_array(states, groups, Finalize::Natural)
    } else {
        bytes_array(states, groups)
    }
}

/// The finalized values of `groups` (`how`), as a column of the kind's
/// output type: what a query node answers, and what a node sends for
/// states that are their answers.
pub fn final_array(states: &GroupStates, groups: Range<usize>, how: Finalize) -> Result<ArrayRef> {
    if how == Finalize::Natural
        && let Some(extremes) = states.float_extremes(groups.clone())
    {
        return Ok(Arc::new(Float64Array::from_iter(extremes)));
    }
    let (kind, input) = (states.kind(), states.input_type());
    let answers = groups.map(|g| {
        states
            .finalize(g, how)
            .map_err(|e| Error::Invalid(format!("aggregate: {e}")))
    });
    let wrong = || Error::Internal(format!("a {kind} state over {input} answered another type"));
    match kind.output_type(input) {
        ValueType::F64 => primitive::<Float64Type>(answers, |v| match v {
            Value::F64(x) => Some(x),
            _ => None,
        })
        .ok_or_else(wrong)?,
        ValueType::I64 => primitive::<Int64Type>(answers, |v| match v {
            Value::I64(x) => Some(x),
            _ => None,
        })
        .ok_or_else(wrong)?,
        ValueType::U64 => primitive::<UInt64Type>(answers, |v| match v {
            Value::U64(x) => Some(x),
            _ => None,
        })
        .ok_or_else(wrong)?,
        ValueType::Bool => {
            let mut b = BooleanBuilder::with_capacity(answers.len());
            for a in answers {
                match a? {
                    Some(Value::Bool(x)) => b.append_value(x),
                    None => b.append_null(),
                    Some(_) => return Err(wrong()),
                }
            }
            Ok(Arc::new(b.finish()))
        }
        ValueType::Str => {
            let mut b = StringBuilder::with_capacity(answers.len(), 0);
            for a in answers {
                match a? {
                    Some(Value::Str(x)) => b.append_value(x),
                    None => b.append_null(),
                    Some(_) => return Err(wrong()),
                }
            }
            Ok(Arc::new(b.finish()))
        }
    }
}

/// A primitive column of answers; `None` when one is of another type.
fn primitive<T: ArrowPrimitiveType>(
    answers: impl ExactSizeIterator<Item = Result<Option<Value>>>,
    take: impl Fn(Value) -> Option<T::Native>,
) -> Option<Result<ArrayRef>> {
    let mut b = PrimitiveBuilder::<T>::with_capacity(answers.len());
    for a in answers {
        match a {
            Ok(Some(v)) => b.append_value(take(v)?),
            Ok(None) => b.append_null(),
            Err(e) => return Some(Err(e)),
        }
    }
    Some(Ok(Arc::new(b.finish())))
}

/// Every state encoded straight into one buffer, then made an array without
/// copying.
fn bytes_array(states: &GroupStates, groups: Range<usize>) -> Result<ArrayRef> {
    // Sized for the fixed-width states (count, sum, min/max of numbers), so
    // most answers never grow it.
    let mut values = Vec::with_capacity(groups.len() * 16);
    let mut offsets = Vec::with_capacity(groups.len() + 1);
    offsets.push(0i32);
    for g in groups {
        states
            .encode_into(g, &mut values)
            .map_err(|e| Error::Internal(format!("aggregate: {e}")))?;
        offsets.push(
            i32::try_from(values.len())
                .map_err(|_| Error::Invalid("aggregate states over 2 GiB in one batch".into()))?,
        );
    }
    let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
    Ok(Arc::new(BinaryArray::try_new(
        offsets,
        Buffer::from_vec(values),
        None,
    )?))
}

/// A state column of an aggregate answer, read as states, in either form.
pub enum StateColumn<'a> {
    Bytes(&'a BinaryArray),
    Answers {
        kind: AggregateKind,
        input: ValueType,
        values: Answers<'a>,
    },
}

/// A column of answers, by type.
pub enum Answers<'a> {
    F64(&'a Float64Array),
    I64(&'a Int64Array),
    U64(&'a UInt64Array),
    Bool(&'a BooleanArray),
    Str(&'a StringArray),
}

impl<'a> StateColumn<'a> {
    /// Reads `array` as the states of a call of `kind` over `input`: bytes,
    /// or answers of the kind's output type when its states are answers. Any
    /// other column is an error (a node's answer that cannot be trusted).
    pub fn new(array: &'a dyn Array, kind: AggregateKind, input: ValueType) -> Result<Self> {
        let any = array.as_any();
        if let Some(bytes) = any.downcast_ref::<BinaryArray>() {
            return Ok(StateColumn::Bytes(bytes));
        }
        let out = kind.output_type(input);
        let values = match out {
            ValueType::F64 => any.downcast_ref().map(Answers::F64),
            ValueType::I64 => any.downcast_ref().map(Answers::I64),
            ValueType::U64 => any.downcast_ref().map(Answers::U64),
            ValueType::Bool => any.downcast_ref().map(Answers::Bool),
            ValueType::Str => any.downcast_ref().map(Answers::Str),
        };
        match values {
            Some(values) if kind.state_is_answer() => Ok(StateColumn::Answers {
                kind,
                input,
                values,
            }),
            _ => Err(Error::Invalid(format!(
                "a state column of {kind} over {input} is {}, neither bytes nor {} answers",
                array.data_type(),
                arrow_type(out)
            ))),
        }
    }

    /// The answer in row `row` (answers form).
    fn answer(values: &Answers<'_>, row: usize) -> Option<Value> {
        fn at<A: Array>(a: &A, row: usize, get: impl Fn(&A) -> Value) -> Option<Value> {
            (!a.is_null(row)).then(|| get(a))
        }
        match values {
            Answers::F64(a) => at(*a, row, |a| Value::F64(a.value(row))),
            Answers::I64(a) => at(*a, row, |a| Value::I64(a.value(row))),
            Answers::U64(a) => at(*a, row, |a| Value::U64(a.value(row))),
            Answers::Bool(a) => at(*a, row, |a| Value::Bool(a.value(row))),
            Answers::Str(a) => at(*a, row, |a| Value::Str(a.value(row).to_string())),
        }
    }

    /// About the bytes the state in row `row` takes in its byte form (for
    /// memory accounting).
    pub fn encoded_bytes(&self, row: usize) -> usize {
        match self {
            StateColumn::Bytes(b) => b.value(row).len(),
            StateColumn::Answers { values, .. } => match values {
                Answers::Str(a) => 8 + a.value(row).len(),
                _ => 12,
            },
        }
    }

    /// The state in row `row`.
    pub fn state(&self, row: usize) -> Result<State> {
        match self {
            StateColumn::Bytes(b) => State::decode(b.value(row)),
            StateColumn::Answers {
                kind,
                input,
                values,
            } => State::from_answer(*kind, *input, Self::answer(values, row).as_ref()),
        }
        .map_err(|e| Error::Invalid(format!("undecodable state: {e}")))
    }

    /// Merges the state in row `row` into group `group` of `into`.
    pub fn merge_into(&self, row: usize, into: &mut GroupStates, group: usize) -> Result<()> {
        match self {
            StateColumn::Bytes(b) => {
                let s = State::decode(b.value(row))
                    .map_err(|e| Error::Invalid(format!("undecodable state: {e}")))?;
                into.merge(group, &s)
            }
            StateColumn::Answers { values, .. } => {
                into.merge_answer(group, Self::answer(values, row).as_ref())
            }
        }
        .map_err(|e| Error::Invalid(format!("states do not merge: {e}")))
    }
}
