//! Strategies for rows, a plain model of every aggregate (sorting and exact
//! arithmetic over all the rows at once) and the comparisons that hold a
//! state's answer to the model.

use std::cmp::Ordering;

use proptest::prelude::*;
use sealion_partial::{
    AggregateKind, CANONICAL_NAN_BITS, Error, Finalize, State, Value, ValueType,
};

pub type Row = (i64, Value);

/// Every (kind, input type) pair a state can be made for.
pub fn combos() -> Vec<(AggregateKind, ValueType)> {
    AggregateKind::ALL
        .into_iter()
        .flat_map(|k| ValueType::ALL.into_iter().map(move |t| (k, t)))
        .filter(|(k, t)| k.accepts(*t))
        .collect()
}

/// Kinds whose float answers come from float arithmetic over the inputs;
/// they are fed finite values of moderate size (plus the specials), since
/// finite overflow is order-dependent by nature (see `float.rs`).
fn arithmetic(kind: AggregateKind) -> bool {
    matches!(
        kind,
        AggregateKind::Sum
            | AggregateKind::Avg
            | AggregateKind::Variance
            | AggregateKind::Percentile
    )
}

fn special_f64() -> impl Strategy<Value = f64> {
    prop::sample::select(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 0.0])
}

fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => any::<f64>(),
        2 => (-4i32..4).prop_map(|i| f64::from(i) * 0.5),
        2 => special_f64(),
        1 => prop::sample::select(vec![
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            5e-324,
            -5e-324,
            f64::from_bits(0x7ff0_0000_0000_0001), // signalling NaN
            f64::from_bits(0xfff8_0000_0000_0000), // negative NaN
            f64::from_bits(0x7ff8_0000_dead_beef), // NaN with a payload
        ]),
    ]
}

fn moderate_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => -1e6f64..1e6,
        3 => (-20i32..20).prop_map(|i| f64::from(i) * 0.25),
        1 => special_f64(),
    ]
}

pub fn value_strategy(kind: AggregateKind, ty: ValueType) -> BoxedStrategy<Value> {
    match ty {
        ValueType::F64 if arithmetic(kind) => moderate_f64().prop_map(Value::F64).boxed(),
        ValueType::F64 => any_f64().prop_map(Value::F64).boxed(),
        ValueType::I64 => prop_oneof![
            3 => any::<i64>(),
            2 => -5i64..5,
            1 => prop::sample::select(vec![i64::MIN, i64::MAX, i64::MIN + 1, i64::MAX - 1]),
        ]
        .prop_map(Value::I64)
        .boxed(),
        ValueType::U64 => prop_oneof![
            3 => any::<u64>(),
            2 => 0u64..5,
            1 => prop::sample::select(vec![u64::MAX, u64::MAX - 1, 1 << 63]),
        ]
        .prop_map(Value::U64)
        .boxed(),
        ValueType::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        ValueType::Str => prop_oneof![
            3 => "[a-c]{0,3}",
            1 => "\\PC{0,6}",
        ]
        .prop_map(Value::Str)
        .boxed(),
    }
}

pub fn time_strategy() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => -3i64..3,
        2 => any::<i64>(),
        1 => prop::sample::select(vec![i64::MIN, i64::MAX]),
    ]
}

/// A (kind, type) pair and rows for it.
pub fn case(max_rows: usize) -> impl Strategy<Value = (AggregateKind, ValueType, Vec<Row>)> {
    prop::sample::select(combos()).prop_flat_map(move |(kind, ty)| {
        let rows = prop::collection::vec((time_strategy(), value_strategy(kind, ty)), 0..max_rows);
        (Just(kind), Just(ty), rows)
    })
}

#[allow(clippy::unwrap_used)]
pub fn build(kind: AggregateKind, ty: ValueType, rows: &[Row]) -> State {
    let mut state = State::new(kind, ty).unwrap();
    for (t, v) in rows {
        state.update(*t, v).unwrap();
    }
    state
}

/// The finalize modes a kind has, with a few quantiles for percentile.
pub fn modes(kind: AggregateKind, extra_quantile: f64) -> Vec<Finalize> {
    match kind {
        AggregateKind::Variance => vec![
            Finalize::Natural,
            Finalize::VarSamp,
            Finalize::VarPop,
            Finalize::StddevSamp,
            Finalize::StddevPop,
        ],
        AggregateKind::Percentile => [0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0, extra_quantile]
            .into_iter()
            .map(Finalize::Quantile)
            .collect(),
        _ => vec![Finalize::Natural],
    }
}

/// What the model says a state must answer.
#[derive(Debug)]
pub enum Expect {
    /// Exactly this (floats bit for bit).
    Exact(Result<Option<Value>, Error>),
    /// A float within `tol` (NaN and infinities must match exactly).
    Close(Option<f64>, f64),
    /// A quantile: the answer's rank among the inputs within `slack` of `q`.
    Rank {
        q: f64,
        sorted: Vec<f64>,
        slack: f64,
    },
    /// A distinct-count estimate within `tol` of `n`.
    Estimate { n: u64, tol: f64 },
}

/// The value order of the crate's doc: NaN (all one) above `+inf`.
fn order_f64(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.total_cmp(&b),
    }
}

fn order(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::F64(a), Value::F64(b)) => order_f64(*a, *b),
        (Value::I64(a), Value::I64(b)) => a.cmp(b),
        (Value::U64(a), Value::U64(b)) => a.cmp(b),
        (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
        (Value::Str(a), Value::Str(b)) => a.as_bytes().cmp(b.as_bytes()),
        _ => panic!("mixed types in one test case"),
    }
}

fn canonical(v: &Value) -> Value {
    match v {
        Value::F64(f) if f.is_nan() => Value::F64(f64::from_bits(CANONICAL_NAN_BITS)),
        other => other.clone(),
    }
}

/// SQL equality for distinct counting: -0.0 is 0.0, NaNs are one value.
fn distinct_key(v: &Value) -> Vec<u8> {
    match v {
        Value::F64(f) if f.is_nan() => vec![0xff; 9],
        Value::F64(f) if *f == 0.0 => 0.0f64.to_le_bytes().to_vec(),
        Value::F64(f) => f.to_le_bytes().to_vec(),
        Value::I64(i) => i.to_le_bytes().to_vec(),
        Value::U64(u) => u.to_le_bytes().to_vec(),
        Value::Bool(b) => vec![u8::from(*b)],
        Value::Str(s) => s.as_bytes().to_vec(),
    }
}

fn as_f64(v: &Value) -> f64 {
    match v {
        Value::F64(f) => *f,
        Value::I64(i) => *i as f64,
        Value::U64(u) => *u as f64,
        _ => panic!("not numeric"),
    }
}

/// The IEEE answer for a sum over values with specials, or None when all
/// values are finite.
fn special_sum(xs: &[f64]) -> Option<f64> {
    let nan = xs.iter().any(|x| x.is_nan());
    let pos = xs.contains(&f64::INFINITY);
    let neg = xs.contains(&f64::NEG_INFINITY);
    if nan || (pos && neg) {
        Some(f64::NAN)
    } else if pos {
        Some(f64::INFINITY)
    } else if neg {
        Some(f64::NEG_INFINITY)
    } else {
        None
    }
}

pub fn model(kind: AggregateKind, ty: ValueType, how: Finalize, rows: &[Row]) -> Expect {
    let values: Vec<&Value> = rows.iter().map(|(_, v)| v).collect();
    let n = values.len();
    let exact = |v: Option<Value>| Expect::Exact(Ok(v));
    match kind {
        AggregateKind::Count => exact(Some(Value::I64(n as i64))),
        AggregateKind::Min => exact(
            values
                .iter()
                .min_by(|a, b| order(a, b))
                .map(|v| canonical(v)),
        ),
        AggregateKind::Max => exact(
            values
                .iter()
                .max_by(|a, b| order(a, b))
                .map(|v| canonical(v)),
        ),
        AggregateKind::First => exact(
            rows.iter()
                .min_by(|a, b| a.0.cmp(&b.0).then_with(|| order(&a.1, &b.1)))
                .map(|(_, v)| canonical(v)),
        ),
        AggregateKind::Last => exact(
            rows.iter()
                .max_by(|a, b| a.0.cmp(&b.0).then_with(|| order(&a.1, &b.1)))
                .map(|(_, v)| canonical(v)),
        ),
        AggregateKind::ExactDistinct => {
            let mut keys: Vec<Vec<u8>> = values.iter().map(|v| distinct_key(v)).collect();
            keys.sort();
            keys.dedup();
            exact(Some(Value::U64(keys.len() as u64)))
        }
        AggregateKind::ApproxDistinct => {
            let mut keys: Vec<Vec<u8>> = values.iter().map(|v| distinct_key(v)).collect();
            keys.sort();
            keys.dedup();
            let d = keys.len() as u64;
            // Small sets: only register collisions (expected C(d,2)/16384,
            // under 0.5 for d <= 120) and rounding separate the estimate from
            // d. Large sets: 1.04/sqrt(16384) = 0.8% standard error.
            Expect::Estimate {
                n: d,
                tol: if d <= 1000 {
                    2.0 + d as f64 / 20.0
                } else {
                    0.03 * d as f64
                },
            }
        }
        AggregateKind::Sum | AggregateKind::Avg if n == 0 => exact(None),
        AggregateKind::Sum | AggregateKind::Avg if ty != ValueType::F64 => {
            let sum: i128 = values
                .iter()
                .map(|v| match v {
                    Value::I64(i) => i128::from(*i),
                    Value::U64(u) => i128::from(*u),
                    _ => panic!("not an integer"),
                })
                .sum();
            if kind == AggregateKind::Avg {
                let count = n as i128;
                let mean = (sum / count) as f64 + (sum % count) as f64 / n as f64;
                return exact(Some(Value::F64(mean)));
            }
            Expect::Exact(match ty {
                ValueType::I64 => i64::try_from(sum)
                    .map(|s| Some(Value::I64(s)))
                    .map_err(|_| Error::SumOverflow(ValueType::I64)),
                _ => u64::try_from(sum)
                    .map(|s| Some(Value::U64(s)))
                    .map_err(|_| Error::SumOverflow(ValueType::U64)),
            })
        }
        AggregateKind::Sum | AggregateKind::Avg => {
            let xs: Vec<f64> = values.iter().map(|v| as_f64(v)).collect();
            let divisor = if kind == AggregateKind::Avg {
                n as f64
            } else {
                1.0
            };
            if let Some(special) = special_sum(&xs) {
                return Expect::Close(Some(special), 0.0);
            }
            let sum: f64 = xs.iter().sum();
            let magnitude: f64 = xs.iter().map(|x| x.abs()).sum();
            // Neumaier's sum is within ~2 eps of the sum of magnitudes; the
            // model's naive one within n eps.
            Expect::Close(Some(sum / divisor), 1e-12 * magnitude / divisor)
        }
        AggregateKind::Variance => {
            let (ddof, sqrt) = match how {
                Finalize::VarPop => (0, false),
                Finalize::StddevSamp => (1, true),
                Finalize::StddevPop => (0, true),
                _ => (1, false),
            };
            if n == 0 || n <= ddof {
                return exact(None);
            }
            let xs: Vec<f64> = values.iter().map(|v| as_f64(v)).collect();
            if xs.iter().any(|x| !x.is_finite()) {
                return Expect::Close(Some(f64::NAN), 0.0);
            }
            let mean = xs.iter().sum::<f64>() / n as f64;
            let m2: f64 = xs.iter().map(|x| (x - mean).powi(2)).sum();
            let var = m2 / (n - ddof) as f64;
            let scale = xs.iter().map(|x| x * x).fold(0.0, f64::max);
            // Welford and Chan lose about eps * max(x^2) per step to the
            // rounding of the mean; 1e-10 is far above that for n <= 200.
            let tol = 1e-10 * scale + 1e-9 * var;
            if sqrt {
                Expect::Close(Some(var.sqrt()), tol.sqrt())
            } else {
                Expect::Close(Some(var), tol)
            }
        }
        AggregateKind::Percentile => {
            let Finalize::Quantile(q) = how else {
                panic!("percentile needs a quantile")
            };
            let mut sorted: Vec<f64> = values
                .iter()
                .map(|v| as_f64(v))
                .map(|x| if x == 0.0 { 0.0 } else { x })
                .collect();
            sorted.sort_by(|a, b| order_f64(*a, *b));
            // Rank error of the t-digest (see `check` and percentile.rs): a
            // centroid holds at most ~2% of the values at compression 100, and
            // merging may join two such spans; plus one value, because an
            // interpolated answer sits between two neighbouring inputs.
            let slack = 0.05 + 1.0 / n.max(1) as f64;
            Expect::Rank { q, sorted, slack }
        }
    }
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

pub fn same_answer(a: &Result<Option<Value>, Error>, b: &Result<Option<Value>, Error>) -> bool {
    match (a, b) {
        (Ok(Some(x)), Ok(Some(y))) => same_value(x, y),
        (Ok(None), Ok(None)) => true,
        (Err(x), Err(y)) => x == y,
        _ => false,
    }
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return want == got;
    }
    (got - want).abs() <= tol
}

/// Holds `got` to the model; the error says how it missed.
pub fn check(expect: &Expect, got: &Result<Option<Value>, Error>) -> Result<(), String> {
    let miss = || Err(format!("expected {expect:?}, got {got:?}"));
    match expect {
        Expect::Exact(want) => {
            if same_answer(want, got) {
                Ok(())
            } else {
                miss()
            }
        }
        Expect::Close(want, tol) => match (want, got) {
            (None, Ok(None)) => Ok(()),
            (Some(w), Ok(Some(Value::F64(g)))) if close(*g, *w, *tol) => Ok(()),
            _ => miss(),
        },
        Expect::Rank { q, sorted, slack } => {
            let got_f = match got {
                Ok(None) if sorted.is_empty() => return Ok(()),
                Ok(Some(Value::F64(g))) if !sorted.is_empty() => *g,
                _ => return miss(),
            };
            let n = sorted.len() as f64;
            let below = sorted
                .iter()
                .filter(|x| order_f64(**x, got_f) == Ordering::Less)
                .count();
            let at_or_below = sorted
                .iter()
                .filter(|x| order_f64(**x, got_f) != Ordering::Greater)
                .count();
            let (lo, hi) = (below as f64 / n, at_or_below as f64 / n);
            let within_inputs = got_f.is_nan()
                || (order_f64(sorted[0], got_f) != Ordering::Greater
                    && order_f64(got_f, sorted[sorted.len() - 1]) != Ordering::Greater);
            if within_inputs && lo - slack <= *q && *q <= hi + slack {
                Ok(())
            } else {
                Err(format!(
                    "quantile {q}: {got_f} has rank [{lo}, {hi}], slack {slack}"
                ))
            }
        }
        Expect::Estimate { n, tol } => match got {
            Ok(Some(Value::U64(g))) if (*g as f64 - *n as f64).abs() <= *tol => Ok(()),
            _ => miss(),
        },
    }
}

/// A (kind, type) pair and `parts` row sets for it.
pub fn case_parts(
    parts: usize,
    max_rows: usize,
) -> impl Strategy<Value = (AggregateKind, ValueType, Vec<Vec<Row>>)> {
    prop::sample::select(combos()).prop_flat_map(move |(kind, ty)| {
        let rows = prop::collection::vec((time_strategy(), value_strategy(kind, ty)), 0..max_rows);
        (Just(kind), Just(ty), prop::collection::vec(rows, parts))
    })
}

/// Whether merges of this kind are exact whatever the tree shape (every
/// kind but the float arithmetic ones).
pub fn exact_kind(kind: AggregateKind, ty: ValueType) -> bool {
    match kind {
        AggregateKind::Variance | AggregateKind::Percentile => false,
        AggregateKind::Sum | AggregateKind::Avg => ty != ValueType::F64,
        _ => true,
    }
}

#[allow(clippy::unwrap_used)]
pub fn merged(a: &State, b: &State) -> State {
    let mut out = a.clone();
    out.merge(b).unwrap();
    out
}
