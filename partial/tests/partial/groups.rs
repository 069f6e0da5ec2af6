//! A column of states (`GroupStates`) against its model, a `Vec<State>` fed
//! the same calls: after every call both hold the same bytes for every
//! group and answer the same, and a call fails on one exactly when it fails
//! on the other.

use proptest::prelude::*;
use sealion_partial::{AggregateKind, Finalize, GroupStates, State, SumOf, Value, ValueType};

use crate::support::{Row, build, combos, modes, time_strategy, value_strategy};

#[derive(Debug, Clone)]
enum Op {
    Push,
    Update(usize, i64, Value),
    F64s(usize, Vec<f64>),
    I64s(usize, Vec<i64>),
    Summary(usize, u64, Option<SumOf>, Option<Value>, Option<Value>),
    Merge(usize, Vec<Row>),
    /// The answer of a state built from these rows (when the kind's state
    /// is its answer), or this value.
    Answer(usize, Vec<Row>, Option<Value>),
    /// Keep groups whose index is not a multiple of this (0: keep all).
    Retain(usize),
}

/// A value of some other type than `ty`, for calls that must be refused.
fn other_value(ty: ValueType) -> BoxedStrategy<Value> {
    let all = [
        Value::F64(2.5),
        Value::I64(-7),
        Value::U64(7),
        Value::Bool(false),
        Value::Str("q".into()),
    ];
    let others: Vec<Value> = all.into_iter().filter(|v| v.value_type() != ty).collect();
    prop::sample::select(others).boxed()
}

fn f64_run() -> BoxedStrategy<Vec<f64>> {
    let value = prop_oneof![
        4 => (-4i32..100).prop_map(f64::from),
        2 => any::<f64>(),
        1 => prop::sample::select(vec![
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7ff0_0000_0000_0001),
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
        ]),
    ];
    prop::collection::vec(value, 0..8).boxed()
}

fn i64_run() -> BoxedStrategy<Vec<i64>> {
    let value = prop_oneof![
        4 => -5i64..100,
        1 => any::<i64>(),
        1 => prop::sample::select(vec![i64::MIN, i64::MAX]),
    ];
    prop::collection::vec(value, 0..8).boxed()
}

fn op(kind: AggregateKind, ty: ValueType) -> BoxedStrategy<Op> {
    let g = || 0usize..12;
    let value = value_strategy(kind, ty);
    let rows = || prop::collection::vec((time_strategy(), value_strategy(kind, ty)), 0..6);
    let any_value = prop_oneof![8 => value.clone(), 1 => other_value(ty)];
    let sum = prop_oneof![
        Just(None),
        (-1000i128..1000).prop_map(|s| Some(SumOf::Int(s))),
        (0u128..1000).prop_map(|s| Some(SumOf::UInt(s))),
        (-1e3f64..1e3).prop_map(|s| Some(SumOf::Float(s))),
    ];
    let answer = prop_oneof![
        Just(None),
        any_value.clone().prop_map(Some),
        (-3i64..50).prop_map(|n| Some(Value::I64(n))),
    ];
    prop_oneof![
        4 => Just(Op::Push),
        6 => (g(), time_strategy(), any_value.clone()).prop_map(|(g, t, v)| Op::Update(g, t, v)),
        4 => (g(), f64_run()).prop_map(|(g, v)| Op::F64s(g, v)),
        3 => (g(), i64_run()).prop_map(|(g, v)| Op::I64s(g, v)),
        2 => (g(), 0u64..20, sum, prop::option::of(value.clone()), prop::option::of(value))
            .prop_map(|(g, n, s, lo, hi)| Op::Summary(g, n, s, lo, hi)),
        3 => (g(), rows()).prop_map(|(g, r)| Op::Merge(g, r)),
        3 => (g(), rows(), answer).prop_map(|(g, r, a)| Op::Answer(g, r, a)),
        1 => (0usize..4).prop_map(Op::Retain),
    ]
    .boxed()
}

fn case() -> impl Strategy<Value = (AggregateKind, ValueType, Vec<Op>)> {
    prop::sample::select(combos()).prop_flat_map(|(kind, ty)| {
        (
            Just(kind),
            Just(ty),
            prop::collection::vec(op(kind, ty), 1..40),
        )
    })
}

/// Runs `op` on the model; `Err(())` where it fails (nothing changed then).
fn on_model(model: &mut Vec<State>, kind: AggregateKind, ty: ValueType, op: &Op) -> Result<(), ()> {
    let at =
        |model: &mut Vec<State>, g: usize| -> Result<State, ()> { model.get(g).cloned().ok_or(()) };
    let mut apply = |g: usize, f: &dyn Fn(&mut State) -> sealion_partial::Result<()>| {
        let mut s = at(model, g)?;
        f(&mut s).map_err(|_| ())?;
        model[g] = s;
        Ok(())
    };
    match op {
        Op::Push => {
            model.push(State::new(kind, ty).unwrap());
            Ok(())
        }
        Op::Update(g, t, v) => apply(*g, &|s| s.update(*t, v)),
        Op::F64s(g, v) => apply(*g, &|s| s.update_f64s(v)),
        Op::I64s(g, v) => apply(*g, &|s| s.update_i64s(v)),
        Op::Summary(g, n, sum, lo, hi) => apply(*g, &|s| {
            s.update_summary(*n, *sum, lo.as_ref(), hi.as_ref())
        }),
        Op::Merge(g, rows) => {
            let other = build(kind, ty, rows);
            apply(*g, &|s| s.merge(&other))
        }
        Op::Answer(g, rows, v) => {
            let a = answer_of(kind, ty, rows, v);
            apply(*g, &|s| s.merge_answer(a.as_ref()))
        }
        Op::Retain(k) => {
            let mut i = 0;
            model.retain(|_| {
                i += 1;
                *k == 0 || (i - 1) % k != 0
            });
            Ok(())
        }
    }
}

fn answer_of(kind: AggregateKind, ty: ValueType, rows: &[Row], v: &Option<Value>) -> Option<Value> {
    if kind.state_is_answer() && !rows.is_empty() {
        build(kind, ty, rows).finalize(Finalize::Natural).unwrap()
    } else {
        v.clone()
    }
}

fn on_column(col: &mut GroupStates, kind: AggregateKind, ty: ValueType, op: &Op) -> Result<(), ()> {
    let r = match op {
        Op::Push => {
            col.push_empty();
            Ok(())
        }
        Op::Update(g, t, v) => col.update(*g, *t, v),
        Op::F64s(g, v) => col.update_f64s(*g, v),
        Op::I64s(g, v) => col.update_i64s(*g, v),
        Op::Summary(g, n, sum, lo, hi) => {
            col.update_summary(*g, *n, *sum, lo.as_ref(), hi.as_ref())
        }
        Op::Merge(g, rows) => col.merge(*g, &build(kind, ty, rows)),
        Op::Answer(g, rows, v) => col.merge_answer(*g, answer_of(kind, ty, rows, v).as_ref()),
        Op::Retain(k) => {
            col.retain(|g| *k == 0 || g % k != 0);
            Ok(())
        }
    };
    r.map_err(|_| ())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn a_column_of_states_answers_as_states_one_by_one((kind, ty, ops) in case()) {
        let mut model: Vec<State> = Vec::new();
        let mut col = GroupStates::new(kind, ty).unwrap();
        for (step, op) in ops.iter().enumerate() {
            let want = on_model(&mut model, kind, ty, op);
            let got = on_column(&mut col, kind, ty, op);
            prop_assert_eq!(got, want, "step {} {:?}: {} over {}", step, op, kind, ty);
            prop_assert_eq!(col.len(), model.len());
            for (g, s) in model.iter().enumerate() {
                let mut bytes = Vec::new();
                col.encode_into(g, &mut bytes).unwrap();
                prop_assert_eq!(&bytes, &s.encode(), "group {} after step {} {:?}", g, step, op);
                prop_assert_eq!(col.state(g).unwrap().encode(), s.encode());
                for how in modes(kind, 0.3) {
                    let (a, b) = (col.finalize(g, how), s.finalize(how));
                    let same = match (&a, &b) {
                        (Ok(Some(Value::F64(x))), Ok(Some(Value::F64(y)))) => x.to_bits() == y.to_bits(),
                        _ => a == b,
                    };
                    prop_assert!(same, "group {} {}: {:?} vs {:?}", g, how, a, b);
                }
            }
            // One past the last group is refused everywhere.
            prop_assert!(col.state(model.len()).is_err());
        }
    }
}

#[test]
fn an_empty_float_run_leaves_a_missing_group_an_error() {
    for kind in [AggregateKind::Min, AggregateKind::Max] {
        let mut col = GroupStates::new(kind, ValueType::F64).unwrap();
        assert!(col.update_f64s(0, &[]).is_err());
        col.push_empty();
        col.update_f64s(0, &[]).unwrap();
        assert_eq!(col.finalize(0, Finalize::Natural).unwrap(), None);
    }
}
