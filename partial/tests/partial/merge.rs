//! Splitting rows among states and merging them in any order and tree shape
//! answers what one state over all rows answers, and what the model says.

use proptest::prelude::*;
use sealion_partial::{AggregateKind, Finalize, State, Value, ValueType};

use crate::support::{
    Row, build, case, case_parts, check, exact_kind, merged, model, modes, same_answer,
};

/// Merges `states` down to one. Each step of `plan` picks two of the states
/// left (so any tree shape can come out, not only a left fold), and may send
/// the merged-in state through its bytes first, as a query node receives it.
fn merge_by_plan(mut states: Vec<State>, plan: &[(u16, u16, bool)]) -> State {
    let mut steps = plan.iter().cycle();
    while states.len() > 1 {
        let &(a, b, via_bytes) = steps.next().unwrap();
        let mut into = usize::from(a) % states.len();
        let mut from = usize::from(b) % (states.len() - 1);
        if from >= into {
            from += 1;
        }
        let source = states.remove(from);
        if from < into {
            into -= 1;
        }
        let source = if via_bytes {
            State::decode(&source.encode()).unwrap()
        } else {
            source
        };
        states[into].merge(&source).unwrap();
    }
    states.pop().unwrap()
}

fn check_all(
    kind: AggregateKind,
    ty: ValueType,
    rows: &[Row],
    extra_q: f64,
    states: &[&State],
) -> Result<(), TestCaseError> {
    for how in modes(kind, extra_q) {
        let expect = model(kind, ty, how, rows);
        for state in states {
            check(&expect, &state.finalize(how))
                .map_err(|e| TestCaseError::fail(format!("{kind} over {ty}, {how}: {e}")))?;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn merged_parts_answer_as_one_pass_and_as_the_model(
        (kind, ty, rows) in case(150),
        parts in 1usize..8,
        assignment in prop::collection::vec(any::<u8>(), 150),
        plan in prop::collection::vec((any::<u16>(), any::<u16>(), any::<bool>()), 1..8),
        extra_q in 0.0f64..=1.0,
    ) {
        let mut split: Vec<Vec<Row>> = vec![Vec::new(); parts];
        for (row, part) in rows.iter().zip(&assignment) {
            split[usize::from(*part) % parts].push(row.clone());
        }
        let states: Vec<State> = split.iter().map(|part| build(kind, ty, part)).collect();
        let merged = merge_by_plan(states, &plan);
        let one_pass = build(kind, ty, &rows);

        check_all(kind, ty, &rows, extra_q, &[&one_pass, &merged])?;
        if exact_kind(kind, ty) {
            for how in modes(kind, extra_q) {
                prop_assert!(same_answer(&merged.finalize(how), &one_pass.finalize(how)));
            }
            prop_assert_eq!(merged.encode(), one_pass.encode());
        }
    }

    #[test]
    fn merge_commutes_and_associates(
        (kind, ty, sets) in case_parts(3, 80),
        extra_q in 0.0f64..=1.0,
    ) {
        let [a, b, c] = [0, 1, 2].map(|i| build(kind, ty, &sets[i]));
        let ab = merged(&a, &b);
        let ba = merged(&b, &a);
        // Commutative bit for bit, for every kind.
        prop_assert_eq!(ab.encode(), ba.encode());

        let ab_c = merged(&ab, &c);
        let a_bc = merged(&a, &merged(&b, &c));
        let all: Vec<Row> = sets.concat();
        check_all(kind, ty, &all, extra_q, &[&ab_c, &a_bc])?;
        if exact_kind(kind, ty) {
            prop_assert_eq!(ab_c.encode(), a_bc.encode());
        }
        let rows_ab: Vec<Row> = [sets[0].clone(), sets[1].clone()].concat();
        check_all(kind, ty, &rows_ab, extra_q, &[&ab, &ba])?;
    }

    #[test]
    fn merging_an_empty_state_changes_nothing((kind, ty, rows) in case(60)) {
        let state = build(kind, ty, &rows);
        let empty = State::new(kind, ty).unwrap();
        prop_assert!(empty.is_empty());
        prop_assert_eq!(merged(&state, &empty).encode(), state.encode());
        prop_assert_eq!(merged(&empty, &state).encode(), state.encode());
    }
}

/// A fixed shuffle (a linear congruential generator) so that the large tests
/// are deterministic.
fn shuffled(n: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..v.len()).rev() {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        v.swap(i, (x >> 33) as usize % (i + 1));
    }
    v
}

fn merge_tree(mut states: Vec<State>) -> State {
    while states.len() > 1 {
        let mut next = Vec::new();
        for pair in states.chunks(2) {
            let mut s = pair[0].clone();
            if let Some(other) = pair.get(1) {
                s.merge(&State::decode(&other.encode()).unwrap()).unwrap();
            }
            next.push(s);
        }
        states = next;
    }
    states.pop().unwrap()
}

#[test]
fn percentile_of_many_rows_over_many_parts_is_within_one_percent_rank() {
    let n = 100_000u64;
    let values = shuffled(n);
    let states: Vec<State> = values
        .chunks(n as usize / 13)
        .map(|chunk| {
            let mut s = State::new(AggregateKind::Percentile, ValueType::U64).unwrap();
            for v in chunk {
                // A skewed distribution: squares spread the upper tail.
                s.update(0, &Value::U64(v * v)).unwrap();
            }
            s
        })
        .collect();
    let merged = merge_tree(states);
    for q in [0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999] {
        let Some(Value::F64(got)) = merged.finalize(Finalize::Quantile(q)).unwrap() else {
            panic!("no quantile")
        };
        // The rank of the answer among 0², 1², …, (n-1)².
        let rank = got.sqrt() / n as f64;
        assert!((rank - q).abs() < 0.01, "q={q} got={got} rank={rank}");
    }
}

#[test]
fn approx_distinct_over_overlapping_parts_is_within_two_percent() {
    let n = 200_000u64;
    let values = shuffled(n);
    // Every value lands in two of eight parts: the union must not count it
    // twice.
    let mut states: Vec<State> = (0..8)
        .map(|_| State::new(AggregateKind::ApproxDistinct, ValueType::Str).unwrap())
        .collect();
    for (i, v) in values.iter().enumerate() {
        let value = Value::Str(format!("host-{v}"));
        states[i % 8].update(0, &value).unwrap();
        states[(i + 3) % 8].update(0, &value).unwrap();
    }
    let merged = merge_tree(states);
    let Some(Value::U64(got)) = merged.finalize(Finalize::Natural).unwrap() else {
        panic!("no estimate")
    };
    let rel = (got as f64 - n as f64).abs() / n as f64;
    assert!(rel < 0.02, "got {got} for {n}");
    let bytes = merged.encode();
    assert_eq!(
        bytes.len(),
        3 + 2 + 16_384,
        "a full HLL takes the dense form"
    );
}

#[test]
fn first_and_last_break_time_ties_by_value_whatever_the_order() {
    let rows = [(5, "b"), (1, "z"), (1, "a"), (9, "m"), (9, "x")];
    for rotation in 0..rows.len() {
        let mut first = State::new(AggregateKind::First, ValueType::Str).unwrap();
        let mut last = State::new(AggregateKind::Last, ValueType::Str).unwrap();
        for i in 0..rows.len() {
            let (t, v) = rows[(i + rotation) % rows.len()];
            first.update(t, &Value::from(v)).unwrap();
            last.update(t, &Value::from(v)).unwrap();
        }
        assert_eq!(
            first.finalize(Finalize::Natural).unwrap(),
            Some(Value::from("a"))
        );
        assert_eq!(
            last.finalize(Finalize::Natural).unwrap(),
            Some(Value::from("x"))
        );
    }
}

#[test]
fn min_and_max_order_nan_above_infinity_and_negative_zero_below_zero() {
    let xs = [
        0.0,
        f64::INFINITY,
        f64::from_bits(0xfff8_0000_0000_0001),
        -0.0,
    ];
    let mut min = State::new(AggregateKind::Min, ValueType::F64).unwrap();
    let mut max = State::new(AggregateKind::Max, ValueType::F64).unwrap();
    for x in xs {
        min.update(0, &Value::F64(x)).unwrap();
        max.update(0, &Value::F64(x)).unwrap();
    }
    let Some(Value::F64(lo)) = min.finalize(Finalize::Natural).unwrap() else {
        panic!()
    };
    let Some(Value::F64(hi)) = max.finalize(Finalize::Natural).unwrap() else {
        panic!()
    };
    assert_eq!(lo.to_bits(), (-0.0f64).to_bits());
    assert_eq!(hi.to_bits(), sealion_partial::CANONICAL_NAN_BITS);
}

#[test]
fn count_of_nothing_is_zero_and_sum_of_nothing_is_null() {
    for (kind, want) in [
        (AggregateKind::Count, Some(Value::I64(0))),
        (AggregateKind::ExactDistinct, Some(Value::U64(0))),
        (AggregateKind::ApproxDistinct, Some(Value::U64(0))),
        (AggregateKind::Sum, None),
        (AggregateKind::Avg, None),
        (AggregateKind::Min, None),
        (AggregateKind::First, None),
        (AggregateKind::Variance, None),
    ] {
        let state = State::new(kind, ValueType::I64).unwrap();
        assert_eq!(state.finalize(Finalize::Natural).unwrap(), want, "{kind}");
    }
    let p = State::new(AggregateKind::Percentile, ValueType::F64).unwrap();
    assert_eq!(p.finalize(Finalize::Quantile(0.5)).unwrap(), None);
}

#[test]
fn integer_sum_stays_exact_through_intermediate_overflow() {
    let mut up = State::new(AggregateKind::Sum, ValueType::I64).unwrap();
    let mut down = State::new(AggregateKind::Sum, ValueType::I64).unwrap();
    for _ in 0..4 {
        up.update(0, &Value::I64(i64::MAX)).unwrap();
        down.update(0, &Value::I64(i64::MIN + 1)).unwrap();
    }
    // Each part alone overflows BIGINT; together they cancel.
    assert!(up.finalize(Finalize::Natural).is_err());
    up.merge(&down).unwrap();
    up.update(0, &Value::I64(7)).unwrap();
    assert_eq!(up.finalize(Finalize::Natural).unwrap(), Some(Value::I64(7)));
}

#[test]
fn variance_modes_on_a_known_set() {
    let mut s = State::new(AggregateKind::Variance, ValueType::I64).unwrap();
    for x in [2, 4, 4, 4, 5, 5, 7, 9] {
        s.update(0, &Value::I64(x)).unwrap();
    }
    let get = |how| match s.finalize(how).unwrap() {
        Some(Value::F64(v)) => v,
        other => panic!("{other:?}"),
    };
    assert!((get(Finalize::VarPop) - 4.0).abs() < 1e-12);
    assert!((get(Finalize::StddevPop) - 2.0).abs() < 1e-12);
    assert!((get(Finalize::VarSamp) - 32.0 / 7.0).abs() < 1e-12);
    assert!((get(Finalize::Natural) - 32.0 / 7.0).abs() < 1e-12);
    assert!((get(Finalize::StddevSamp) - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);

    let mut one = State::new(AggregateKind::Variance, ValueType::F64).unwrap();
    one.update(0, &Value::F64(3.0)).unwrap();
    assert_eq!(one.finalize(Finalize::VarSamp).unwrap(), None);
    assert_eq!(
        one.finalize(Finalize::VarPop).unwrap(),
        Some(Value::F64(0.0))
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Feeding runs of values at once (`update_f64s`, `update_i64s`, as the
    /// storage node does over a decoded page) leaves the same state, byte for
    /// byte, as feeding them one by one in the same order at time 0.
    #[test]
    fn runs_fed_at_once_equal_values_fed_one_by_one(
        (kind, ty, rows) in case(150),
        cuts in prop::collection::vec(0usize..150, 0..6),
    ) {
        prop_assume!(matches!(ty, ValueType::F64 | ValueType::I64));
        let mut one_by_one = State::new(kind, ty).unwrap();
        for (_, v) in &rows {
            one_by_one.update(0, v).unwrap();
        }
        let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(rows.len())).collect();
        bounds.extend([0, rows.len()]);
        bounds.sort_unstable();
        let mut by_runs = State::new(kind, ty).unwrap();
        for w in bounds.windows(2) {
            let run = &rows[w[0]..w[1]];
            match ty {
                ValueType::F64 => {
                    let v: Vec<f64> = run.iter().map(|(_, v)| match v {
                        Value::F64(x) => *x,
                        other => panic!("not F64: {other:?}"),
                    }).collect();
                    by_runs.update_f64s(&v).unwrap();
                }
                _ => {
                    let v: Vec<i64> = run.iter().map(|(_, v)| match v {
                        Value::I64(x) => *x,
                        other => panic!("not I64: {other:?}"),
                    }).collect();
                    by_runs.update_i64s(&v).unwrap();
                }
            }
        }
        prop_assert_eq!(by_runs.encode(), one_by_one.encode());
    }
}

/// A reading as TSBS-like data has them (a small integer), now and then a
/// value at or past the bounds of the integer path, or one that is not an
/// integer at all.
fn reading() -> impl Strategy<Value = f64> {
    prop_oneof![
        12 => (-100i64..=100).prop_map(|i| i as f64),
        1 => Just(-0.0),
        1 => prop::sample::select(vec![
            4_294_967_296.0,
            -4_294_967_296.0,
            4_294_967_297.0,
            4_503_599_627_370_496.0,
            9.007_199_254_740_993e15,
            0.5,
            -2.25,
            1e300,
            f64::INFINITY,
            f64::NAN,
        ]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Sums and averages over runs of integer readings take a path of their
    /// own (summed as integers when that is exact): still the same state,
    /// byte for byte, as the values fed one by one, whatever the state held
    /// before (sums that are not integers, large or special).
    #[test]
    fn integer_runs_sum_as_values_fed_one_by_one(
        avg in any::<bool>(),
        before in prop::collection::vec(prop_oneof![
            2 => reading(),
            // Sums whose fractional bits an exact-looking step would lose.
            1 => prop::sample::select(vec![
                4_503_599_627_370_495.5,
                -4_503_599_627_370_495.5,
                2_251_799_813_685_248.5,
                4_503_599_627_370_496.0,
            ]),
        ], 0..3),
        values in prop::collection::vec(reading(), 0..200),
        cuts in prop::collection::vec(0usize..200, 0..6),
    ) {
        let kind = if avg { AggregateKind::Avg } else { AggregateKind::Sum };
        let mut one_by_one = State::new(kind, ValueType::F64).unwrap();
        let mut by_runs = State::new(kind, ValueType::F64).unwrap();
        for &x in &before {
            one_by_one.update(0, &Value::F64(x)).unwrap();
            by_runs.update(0, &Value::F64(x)).unwrap();
        }
        for &x in &values {
            one_by_one.update(0, &Value::F64(x)).unwrap();
        }
        let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(values.len())).collect();
        bounds.extend([0, values.len()]);
        bounds.sort_unstable();
        for w in bounds.windows(2) {
            by_runs.update_f64s(&values[w[0]..w[1]]).unwrap();
        }
        prop_assert_eq!(by_runs.encode(), one_by_one.encode());
    }
}

#[test]
fn a_run_of_the_wrong_type_is_refused_and_changes_nothing() {
    let mut s = State::new(AggregateKind::Sum, ValueType::F64).unwrap();
    s.update_f64s(&[1.5, 2.0]).unwrap();
    let before = s.encode();
    assert!(s.update_i64s(&[3]).is_err());
    assert_eq!(s.encode(), before);
    let mut m = State::new(AggregateKind::Max, ValueType::I64).unwrap();
    assert!(m.update_f64s(&[1.0]).is_err());
    assert!(m.is_empty());
}
