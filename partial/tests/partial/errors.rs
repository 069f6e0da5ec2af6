//! What a state refuses, and the words it refuses with.

use sealion_partial::{
    AggregateKind, Error, Finalize, MAX_DISTINCT_VALUES, MAX_STRING_BYTES, State, Value, ValueType,
};

fn state(kind: AggregateKind, ty: ValueType) -> State {
    State::new(kind, ty).unwrap()
}

#[test]
fn kinds_refuse_types_that_make_no_sense() {
    for (kind, ty) in [
        (AggregateKind::Sum, ValueType::Str),
        (AggregateKind::Sum, ValueType::Bool),
        (AggregateKind::Avg, ValueType::Str),
        (AggregateKind::Variance, ValueType::Bool),
        (AggregateKind::Percentile, ValueType::Str),
    ] {
        let err = State::new(kind, ty).unwrap_err();
        assert_eq!(err, Error::UnsupportedInput { kind, input: ty });
        assert!(!err.is_decode_error());
    }
    let err = State::new(AggregateKind::Sum, ValueType::Str).unwrap_err();
    assert_eq!(err.to_string(), "sum does not take TEXT input");
    for kind in [
        AggregateKind::Min,
        AggregateKind::Max,
        AggregateKind::ExactDistinct,
    ] {
        assert!(State::new(kind, ValueType::Bool).is_ok());
        assert!(State::new(kind, ValueType::Str).is_ok());
    }
}

#[test]
fn update_with_another_type_is_refused_and_changes_nothing() {
    let mut s = state(AggregateKind::Sum, ValueType::I64);
    s.update(0, &Value::I64(2)).unwrap();
    let before = s.encode();
    let err = s.update(0, &Value::F64(1.0)).unwrap_err();
    assert_eq!(
        err,
        Error::TypeMismatch {
            kind: AggregateKind::Sum,
            expected: ValueType::I64,
            found: ValueType::F64,
        }
    );
    assert_eq!(s.encode(), before);
}

#[test]
fn mismatched_merges_are_refused() {
    let mut sum = state(AggregateKind::Sum, ValueType::I64);
    let err = sum
        .merge(&state(AggregateKind::Avg, ValueType::I64))
        .unwrap_err();
    assert!(matches!(err, Error::MergeMismatch { .. }), "{err}");
    let err = sum
        .merge(&state(AggregateKind::Sum, ValueType::U64))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot merge a sum state over BIGINT UNSIGNED into a sum state over BIGINT"
    );
}

#[test]
fn bad_finalize_modes_are_refused() {
    let sum = state(AggregateKind::Sum, ValueType::F64);
    for how in [
        Finalize::Quantile(0.5),
        Finalize::VarPop,
        Finalize::StddevSamp,
    ] {
        assert_eq!(
            sum.finalize(how).unwrap_err(),
            Error::BadFinalize {
                kind: AggregateKind::Sum,
                how
            }
        );
    }
    let p = state(AggregateKind::Percentile, ValueType::F64);
    assert!(matches!(
        p.finalize(Finalize::Natural).unwrap_err(),
        Error::BadFinalize { .. }
    ));
    for q in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            p.finalize(Finalize::Quantile(q)).unwrap_err(),
            Error::QuantileOutOfRange(_)
        ));
    }
    let v = state(AggregateKind::Variance, ValueType::F64);
    assert!(matches!(
        v.finalize(Finalize::Quantile(0.5)).unwrap_err(),
        Error::BadFinalize { .. }
    ));
}

#[test]
fn sum_overflow_is_an_error_not_a_wrap() {
    let mut s = state(AggregateKind::Sum, ValueType::I64);
    s.update(0, &Value::I64(i64::MAX)).unwrap();
    s.update(0, &Value::I64(1)).unwrap();
    let err = s.finalize(Finalize::Natural).unwrap_err();
    assert_eq!(err, Error::SumOverflow(ValueType::I64));
    assert_eq!(err.to_string(), "sum overflows BIGINT");
    // The average of the same rows is fine: it never leaves the exact sum.
    let mut avg = state(AggregateKind::Avg, ValueType::I64);
    avg.update(0, &Value::I64(i64::MAX)).unwrap();
    avg.update(0, &Value::I64(i64::MAX)).unwrap();
    assert_eq!(
        avg.finalize(Finalize::Natural).unwrap(),
        Some(Value::F64(i64::MAX as f64))
    );

    let mut u = state(AggregateKind::Sum, ValueType::U64);
    u.update(0, &Value::U64(u64::MAX)).unwrap();
    u.update(0, &Value::U64(1)).unwrap();
    assert_eq!(
        u.finalize(Finalize::Natural).unwrap_err().to_string(),
        "sum overflows BIGINT UNSIGNED"
    );
}

#[test]
fn exact_distinct_stops_at_its_limit() {
    let mut big = state(AggregateKind::ExactDistinct, ValueType::I64);
    for i in 0..MAX_DISTINCT_VALUES as i64 {
        big.update(0, &Value::I64(i)).unwrap();
    }
    // A value it already holds is fine; a new one is not.
    big.update(0, &Value::I64(0)).unwrap();
    let err = big.update(0, &Value::I64(-1)).unwrap_err();
    assert_eq!(err, Error::TooManyDistinct(MAX_DISTINCT_VALUES));
    assert_eq!(err.to_string(), "count(DISTINCT) state over 1000000 values");
    assert_eq!(
        big.finalize(Finalize::Natural).unwrap(),
        Some(Value::U64(MAX_DISTINCT_VALUES as u64))
    );

    let mut one = state(AggregateKind::ExactDistinct, ValueType::I64);
    one.update(0, &Value::I64(-1)).unwrap();
    assert_eq!(
        big.merge(&one).unwrap_err(),
        Error::TooManyDistinct(MAX_DISTINCT_VALUES)
    );
    assert_eq!(
        one.merge(&big).unwrap_err(),
        Error::TooManyDistinct(MAX_DISTINCT_VALUES)
    );
    // The failed merge left `one` as it was.
    assert_eq!(
        one.finalize(Finalize::Natural).unwrap(),
        Some(Value::U64(1))
    );
}

#[test]
fn text_longer_than_the_limit_is_refused() {
    let mut s = state(AggregateKind::Max, ValueType::Str);
    let long = Value::Str("x".repeat(MAX_STRING_BYTES + 1));
    assert!(matches!(
        s.update(0, &long).unwrap_err(),
        Error::StringTooLong { .. }
    ));
    assert!(s.is_empty());
}

#[test]
fn mixed_types_do_not_order() {
    let err = Value::I64(1)
        .total_cmp(&Value::Str("1".into()))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot order a BIGINT value against a TEXT value"
    );
}
