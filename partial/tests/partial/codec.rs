//! The byte form: round trips, one encoding per state, and untrusted bytes
//! that are refused without a panic.

use proptest::prelude::*;
use sealion_partial::{AggregateKind, Error, FORMAT_VERSION, Finalize, State, Value, ValueType};

use crate::support::{build, case, modes, same_answer};

/// Every finalize mode of every kind, so that a decoded state is asked
/// everything (a mode the kind lacks is an error, never a panic).
fn every_mode() -> Vec<Finalize> {
    let mut all = modes(AggregateKind::Variance, 0.5);
    all.extend(modes(AggregateKind::Percentile, 0.3));
    all
}

/// Whatever the bytes, decode answers; what it accepts it would have written
/// itself, and that state can be finalized and merged without a panic.
fn decode_any(bytes: &[u8]) -> Result<(), TestCaseError> {
    match State::decode(bytes) {
        Err(e) => prop_assert!(e.is_decode_error(), "not a decode error: {e}"),
        Ok(state) => {
            prop_assert_eq!(&state.encode(), bytes);
            let mut twice = state.clone();
            let _ = twice.merge(&state);
            for how in every_mode() {
                let _ = state.finalize(how);
                let _ = twice.finalize(how);
            }
        }
    }
    Ok(())
}

fn many_distinct(kind: AggregateKind, n: i64) -> State {
    let mut s = State::new(kind, ValueType::I64).unwrap();
    for i in 0..n {
        s.update(i, &Value::I64(i * 7919)).unwrap();
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn encode_decode_round_trips_and_prefixes_fail(
        (kind, ty, rows) in case(100),
        extra_q in 0.0f64..=1.0,
    ) {
        let state = build(kind, ty, &rows);
        let bytes = state.encode();
        let back = State::decode(&bytes).unwrap();
        prop_assert_eq!(&back.encode(), &bytes);
        prop_assert_eq!(back.kind(), kind);
        prop_assert_eq!(back.input_type(), ty);
        for how in modes(kind, extra_q) {
            prop_assert!(same_answer(&state.finalize(how), &back.finalize(how)), "{}", how);
        }
        for len in 0..bytes.len() {
            prop_assert!(State::decode(&bytes[..len]).is_err(), "prefix of {} bytes", len);
        }
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert_eq!(State::decode(&longer).unwrap_err(), Error::TrailingBytes(1));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        decode_any(&bytes)?;
    }

    #[test]
    fn arbitrary_bodies_never_panic(
        kind in 0u8..13,
        ty in 0u8..7,
        // Small bytes often: counts and flags of 0 or 1 get past the first
        // checks and reach the deeper ones.
        body in prop::collection::vec(prop_oneof![2 => any::<u8>(), 1 => 0u8..3], 0..48),
    ) {
        let mut bytes = vec![FORMAT_VERSION, kind, ty];
        bytes.extend(body);
        decode_any(&bytes)?;
    }

    #[test]
    fn bit_flips_of_valid_states_never_panic(
        (kind, ty, rows) in case(60),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4),
    ) {
        let mut bytes = build(kind, ty, &rows).encode();
        for (at, bit) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        decode_any(&bytes)?;
    }

    #[test]
    fn bit_flips_of_large_states_never_panic(
        which in 0usize..3,
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..3),
        cut in any::<prop::sample::Index>(),
    ) {
        let kind = [
            AggregateKind::ApproxDistinct,
            AggregateKind::Percentile,
            AggregateKind::ExactDistinct,
        ][which];
        let valid = many_distinct(kind, 10_000).encode();
        let mut bytes = valid.clone();
        for (at, bit) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        decode_any(&bytes)?;
        prop_assert!(State::decode(&valid[..cut.index(valid.len())]).is_err());
    }
}

#[test]
fn large_states_round_trip() {
    for kind in [
        AggregateKind::ApproxDistinct,
        AggregateKind::Percentile,
        AggregateKind::ExactDistinct,
    ] {
        let state = many_distinct(kind, 10_000);
        let bytes = state.encode();
        let back = State::decode(&bytes).unwrap();
        assert_eq!(back.encode(), bytes, "{kind}");
        for how in modes(kind, 0.37) {
            assert!(
                same_answer(&state.finalize(how), &back.finalize(how)),
                "{kind} {how}"
            );
        }
    }
}

/// Pins the byte form: a change here breaks every stored state and every
/// peer on the old build, so it needs a new format version.
#[test]
fn byte_form_is_pinned() {
    let mut count = State::new(AggregateKind::Count, ValueType::I64).unwrap();
    for _ in 0..3 {
        count.update(0, &Value::I64(1)).unwrap();
    }
    assert_eq!(count.encode(), [1, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0]);

    let mut min = State::new(AggregateKind::Min, ValueType::Str).unwrap();
    min.update(0, &Value::from("ab")).unwrap();
    min.update(0, &Value::from("b")).unwrap();
    assert_eq!(min.encode(), [1, 3, 5, 1, 2, 0, 0, 0, b'a', b'b']);

    let mut sum = State::new(AggregateKind::Sum, ValueType::I64).unwrap();
    sum.update(0, &Value::I64(-1)).unwrap();
    let mut want = vec![1, 2, 2, 1, 0, 0, 0, 0, 0, 0, 0];
    want.extend([0xff; 16]);
    assert_eq!(sum.encode(), want);

    let mut last = State::new(AggregateKind::Last, ValueType::Bool).unwrap();
    last.update(-2, &Value::Bool(true)).unwrap();
    let mut want = vec![1, 7, 4, 1];
    want.extend((-2i64).to_le_bytes());
    want.push(1);
    assert_eq!(last.encode(), want);

    let mut distinct = State::new(AggregateKind::ExactDistinct, ValueType::U64).unwrap();
    for v in [9, 2, 9] {
        distinct.update(0, &Value::U64(v)).unwrap();
    }
    let mut want = vec![1, 11, 3, 2, 0, 0, 0];
    want.extend(2u64.to_le_bytes());
    want.extend(9u64.to_le_bytes());
    assert_eq!(distinct.encode(), want);

    let empty_hll = State::new(AggregateKind::ApproxDistinct, ValueType::Str).unwrap();
    assert_eq!(empty_hll.encode(), [1, 10, 5, 14, 0, 0, 0, 0, 0]);
}

#[test]
fn unknown_version_kind_and_type_are_refused() {
    let good = State::new(AggregateKind::Count, ValueType::F64)
        .unwrap()
        .encode();
    for version in [0u8, 2, 255] {
        let mut bytes = good.clone();
        bytes[0] = version;
        let err = State::decode(&bytes).unwrap_err();
        assert_eq!(
            err,
            Error::UnknownVersion {
                found: version,
                supported: 1
            }
        );
        assert!(
            err.to_string()
                .contains("unknown partial state format version"),
            "{err}"
        );
    }
    let mut bytes = good.clone();
    bytes[1] = 99;
    assert_eq!(State::decode(&bytes).unwrap_err(), Error::UnknownKind(99));
    let mut bytes = good.clone();
    bytes[2] = 0;
    assert_eq!(State::decode(&bytes).unwrap_err(), Error::UnknownType(0));
    assert!(matches!(
        State::decode(&[]).unwrap_err(),
        Error::Truncated { .. }
    ));
}

#[test]
fn invalid_utf8_is_refused() {
    let mut max = State::new(AggregateKind::Max, ValueType::Str).unwrap();
    max.update(0, &Value::from("ok")).unwrap();
    let mut bytes = max.encode();
    let last = bytes.len() - 1;
    bytes[last] = 0xff;
    let err = State::decode(&bytes).unwrap_err();
    assert_eq!(err, Error::InvalidUtf8);
    assert!(err.to_string().contains("UTF-8"));
}

#[test]
fn lengths_past_the_input_are_refused_before_allocating() {
    // count(DISTINCT) claiming a million strings in a few bytes.
    let mut bytes = vec![1, 11, 5];
    bytes.extend(1_000_000u32.to_le_bytes());
    assert!(matches!(
        State::decode(&bytes).unwrap_err(),
        Error::Truncated { .. }
    ));
    // A text value claiming 4 GiB.
    let mut bytes = vec![1, 3, 5, 1];
    bytes.extend(u32::MAX.to_le_bytes());
    assert!(State::decode(&bytes).unwrap_err().is_decode_error());
    // Too many distinct values for a state.
    let mut bytes = vec![1, 11, 2];
    bytes.extend(1_000_001u32.to_le_bytes());
    assert!(matches!(
        State::decode(&bytes).unwrap_err(),
        Error::Corrupt(_)
    ));
}

#[test]
fn non_canonical_forms_are_refused() {
    // A NaN with a payload in a max state.
    let mut bytes = vec![1, 4, 1, 1];
    bytes.extend(0x7ff8_0000_0000_0001u64.to_le_bytes());
    assert!(matches!(
        State::decode(&bytes).unwrap_err(),
        Error::Corrupt(_)
    ));
    // Distinct values out of order.
    let mut bytes = vec![1, 11, 2, 2, 0, 0, 0];
    bytes.extend(5i64.to_le_bytes());
    bytes.extend(3i64.to_le_bytes());
    assert!(matches!(
        State::decode(&bytes).unwrap_err(),
        Error::Corrupt(_)
    ));
    // A dense HLL holding one register.
    let mut bytes = vec![1, 10, 2, 14, 1];
    let mut registers = vec![0u8; 16_384];
    registers[7] = 3;
    bytes.extend(registers);
    assert!(matches!(
        State::decode(&bytes).unwrap_err(),
        Error::Corrupt(_)
    ));
    // An empty sum with a non-zero sum field.
    let mut bytes = vec![1, 2, 1];
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1.0f64.to_le_bytes());
    bytes.extend(0.0f64.to_le_bytes());
    bytes.push(0);
    assert!(matches!(
        State::decode(&bytes).unwrap_err(),
        Error::Corrupt(_)
    ));
    // A kind with a type it does not take (sum of text).
    assert!(
        State::decode(&[1, 2, 5, 0, 0, 0, 0, 0, 0, 0, 0])
            .unwrap_err()
            .is_decode_error()
    );
}
