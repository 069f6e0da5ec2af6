//! States that are their own answer (`count`, `min`, `max`) travel as that
//! answer: rebuilt from it they are the same state, and merged in through it
//! they give the same state as merged in as states. Every other kind refuses.

use proptest::prelude::*;
use sealion_partial::{AggregateKind, Error, Finalize, State, Value, ValueType};

use crate::support::{Row, build, combos, merged, time_strategy, value_strategy};

/// A kind whose state is its answer, a type it takes, and two row sets.
fn answer_case() -> impl Strategy<Value = (AggregateKind, ValueType, Vec<Row>, Vec<Row>)> {
    let answer_combos: Vec<_> = combos()
        .into_iter()
        .filter(|(k, _)| k.state_is_answer())
        .collect();
    prop::sample::select(answer_combos).prop_flat_map(|(kind, ty)| {
        let rows = || prop::collection::vec((time_strategy(), value_strategy(kind, ty)), 0..40);
        (Just(kind), Just(ty), rows(), rows())
    })
}

/// A value of another type than `ty`'s states answer with.
fn wrong_answer(kind: AggregateKind, ty: ValueType) -> Value {
    match kind.output_type(ty) {
        ValueType::Str => Value::I64(1),
        _ => Value::Str("x".into()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_state_rebuilt_from_its_answer_is_the_same_state(
        (kind, ty, a_rows, b_rows) in answer_case(),
    ) {
        let a = build(kind, ty, &a_rows);
        let b = build(kind, ty, &b_rows);
        let b_answer = b.finalize(Finalize::Natural).unwrap();
        let rebuilt = State::from_answer(kind, ty, b_answer.as_ref()).unwrap();
        prop_assert_eq!(rebuilt.encode(), b.encode());

        // Merging the answer in is merging the state in.
        let mut through_answer = a.clone();
        through_answer.merge_answer(b_answer.as_ref()).unwrap();
        prop_assert_eq!(through_answer.encode(), merged(&a, &b).encode());
    }

    #[test]
    fn a_wrong_answer_is_refused_and_changes_nothing(
        (kind, ty, rows, _) in answer_case(),
    ) {
        let state = build(kind, ty, &rows);
        let mut copy = state.clone();
        let wrong = wrong_answer(kind, ty);
        prop_assert!(
            matches!(copy.merge_answer(Some(&wrong)), Err(Error::TypeMismatch { .. })),
            "{kind} over {ty} took {wrong:?}"
        );
        prop_assert_eq!(copy.encode(), state.encode());
    }
}

#[test]
fn only_count_min_and_max_are_their_answers() {
    for (kind, ty) in combos() {
        let made = State::from_answer(kind, ty, None);
        if kind.state_is_answer() {
            continue;
        }
        assert_eq!(
            made.unwrap_err(),
            Error::NotAnAnswer(kind),
            "{kind} over {ty}"
        );
    }
}

#[test]
fn a_count_answer_is_never_null_nor_negative() {
    for ty in ValueType::ALL {
        let mut count = State::new(AggregateKind::Count, ty).unwrap();
        count.update(0, &build_value(ty)).unwrap();
        let before = count.encode();
        assert!(count.merge_answer(None).unwrap_err().is_decode_error());
        assert!(
            count
                .merge_answer(Some(&Value::I64(-1)))
                .unwrap_err()
                .is_decode_error()
        );
        assert_eq!(count.encode(), before);
        count.merge_answer(Some(&Value::I64(4))).unwrap();
        assert_eq!(
            count.finalize(Finalize::Natural).unwrap(),
            Some(Value::I64(5))
        );
    }
}

fn build_value(ty: ValueType) -> Value {
    match ty {
        ValueType::F64 => Value::F64(1.5),
        ValueType::I64 => Value::I64(-3),
        ValueType::U64 => Value::U64(3),
        ValueType::Bool => Value::Bool(true),
        ValueType::Str => Value::Str("a".into()),
    }
}
