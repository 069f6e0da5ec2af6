//! Differential tests of the scan paths: for random rows and random requests,
//! the row path and the sealed file's column paths both give what a plain
//! model computes over the rows in memory; and the counters show what the
//! directory lets the column paths skip.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Float64Array, Int64Array, StringArray, TimestampNanosecondArray,
};
use arrow::record_batch::RecordBatch;
use arrow::util::display::array_value_to_string;
use proptest::prelude::*;
use sealion_common::catalog::arrow_schema;
use sealion_common::proto::{
    AggregateCall, AggregateFunction, AggregateSpec, ArithOp, Column, ColumnKind, CompareOp,
    DataType, FieldArith, FieldCompare, FieldPredicate, FieldPredicateList, FieldValue,
    FieldValueCompare, Literal, ScanMetrics, ScanOrder, ScanRequest, TagOp, TagPredicate,
    field_predicate, field_value, literal,
};
use sealion_partial::{AggregateKind, Finalize, State, Value as PValue};

use super::states::StateColumn;
use super::{Mode, Output, Query, scan_rows};
use crate::rows::{decode_key, encode_batch};
use crate::sealed::writer::{Layout, write_sealed_with};
use crate::sealed::{SEALED_FORMAT_VERSION, SealedFile, SortedRow};

const PID: u64 = 7;

fn col(name: &str, kind: ColumnKind, ty: DataType) -> Column {
    Column {
        name: name.into(),
        kind: kind as i32,
        data_type: ty as i32,
    }
}

fn table() -> Vec<Column> {
    vec![
        col("host", ColumnKind::Tag, DataType::String),
        col("region", ColumnKind::Tag, DataType::String),
        col("time", ColumnKind::Time, DataType::Timestamp),
        col("usage", ColumnKind::Field, DataType::Float64),
        col("count", ColumnKind::Field, DataType::Int64),
        col("idle", ColumnKind::Field, DataType::Float64),
    ]
}

/// How many columns [`table`] has.
const COLUMNS: usize = 6;

/// One generated row.
#[derive(Debug, Clone)]
struct Row {
    host: String,
    region: Option<String>,
    time: i64,
    usage: Option<f64>,
    count: Option<i64>,
    /// A second DOUBLE field, NULL in other rows than `usage`, so value
    /// comparisons read two columns whose pages end at other rows.
    idle: Option<f64>,
}

/// The rows as the engine stores them: encoded, in key order, one per
/// (series, time), the last written winning.
fn stored(rows: &[Row]) -> Vec<SortedRow> {
    stored_in(&table(), rows)
}

/// [`stored`] for a table whose columns (the same six) are `columns`, in
/// that order: stored fields name their column by its index there.
fn stored_in(columns: &[Column], rows: &[Row]) -> Vec<SortedRow> {
    if rows.is_empty() {
        return Vec::new();
    }
    let arrays = columns
        .iter()
        .map(|c| -> ArrayRef {
            match c.name.as_str() {
                "host" => Arc::new(StringArray::from(
                    rows.iter()
                        .map(|r| Some(r.host.clone()))
                        .collect::<Vec<_>>(),
                )),
                "region" => Arc::new(StringArray::from(
                    rows.iter().map(|r| r.region.clone()).collect::<Vec<_>>(),
                )),
                "time" => Arc::new(
                    TimestampNanosecondArray::from(rows.iter().map(|r| r.time).collect::<Vec<_>>())
                        .with_timezone("UTC"),
                ),
                "usage" => Arc::new(Float64Array::from(
                    rows.iter().map(|r| r.usage).collect::<Vec<_>>(),
                )),
                "count" => Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.count).collect::<Vec<_>>(),
                )),
                "idle" => Arc::new(Float64Array::from(
                    rows.iter().map(|r| r.idle).collect::<Vec<_>>(),
                )),
                other => panic!("no column {other} in the test table"),
            }
        })
        .collect();
    let batch = RecordBatch::try_new(arrow_schema(columns), arrays).unwrap();
    let mut map = BTreeMap::new();
    for (k, v) in encode_batch(PID, columns, &batch).unwrap() {
        map.insert(k, v);
    }
    map.into_iter()
        .map(|(k, v)| {
            let (_, series, time_ns) = decode_key(&k).unwrap();
            SortedRow {
                series: series.to_vec(),
                time_ns,
                value: v,
            }
        })
        .collect()
}

/// The model's view of a stored row.
#[derive(Debug, Clone)]
struct Model {
    series: Vec<u8>,
    host: Option<String>,
    region: Option<String>,
    time: i64,
    usage: Option<f64>,
    count: Option<i64>,
    idle: Option<f64>,
}

fn model_rows(rows: &[SortedRow]) -> Vec<Model> {
    let columns = table();
    rows.iter()
        .map(|r| {
            let tags = crate::rows::decode_series(&r.series).unwrap();
            let fields = crate::rows::decode_fields(&r.value, &columns).unwrap();
            let tag = |n: &str| {
                tags.iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            };
            let f = |n: &str| fields.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
            Model {
                series: r.series.clone(),
                host: tag("host"),
                region: tag("region"),
                time: r.time_ns,
                usage: match f("usage") {
                    Some(crate::rows::Value::F64(x)) => Some(x),
                    _ => None,
                },
                count: match f("count") {
                    Some(crate::rows::Value::I64(x)) => Some(x),
                    _ => None,
                },
                idle: match f("idle") {
                    Some(crate::rows::Value::F64(x)) => Some(x),
                    _ => None,
                },
            }
        })
        .collect()
}

// ---------- requests ----------

#[derive(Debug, Clone)]
enum TagP {
    Eq(&'static str, String),
    Ne(&'static str, String),
    In(&'static str, Vec<String>),
    NotIn(&'static str, Vec<String>),
    IsNull(&'static str),
    IsNotNull(&'static str),
}

#[derive(Debug, Clone)]
enum FieldP {
    Usage(CompareOp, f64),
    Count(CompareOp, i64),
    All(Box<FieldP>, Box<FieldP>),
    Any(Box<FieldP>, Box<FieldP>),
    Not(Box<FieldP>),
    UsageNull,
    CountNotNull,
    /// Two arithmetic values over `usage` and `idle` (DOUBLE) compared.
    UsageValues(NumP, CompareOp, NumP),
    /// Two arithmetic values over `count` (BIGINT) compared.
    CountValues(NumP, CompareOp, NumP),
}

/// An arithmetic value over the columns of one type; literals are read as
/// `x / 2` for DOUBLE and as `x` for BIGINT.
#[derive(Debug, Clone)]
enum NumP {
    /// `usage` or `count`.
    Col,
    /// `idle` (DOUBLE only).
    Idle,
    Lit(i64),
    Op(ArithOp, Box<NumP>, Box<NumP>),
}

fn num_p(float: bool) -> impl Strategy<Value = NumP> {
    let leaf = prop_oneof![
        3 => Just(NumP::Col),
        // The other DOUBLE column; BIGINT has one column only.
        2 => Just(if float { NumP::Idle } else { NumP::Col }),
        3 => (-6..12i64).prop_map(NumP::Lit),
        // BIGINT arithmetic wraps on overflow; DOUBLE goes to infinity.
        1 => Just(NumP::Lit(i64::MAX)),
        1 => Just(NumP::Lit(i64::MIN / 3)),
    ];
    leaf.prop_recursive(3, 8, 2, |inner| {
        (
            prop_oneof![
                Just(ArithOp::ArithAdd),
                Just(ArithOp::ArithSub),
                Just(ArithOp::ArithMul)
            ],
            inner.clone(),
            inner,
        )
            .prop_map(|(op, a, b)| NumP::Op(op, Box::new(a), Box::new(b)))
    })
}

/// NULL when the value reads a NULL column.
fn model_f64(n: &NumP, m: &Model) -> Option<f64> {
    Some(match n {
        NumP::Col => m.usage?,
        NumP::Idle => m.idle?,
        NumP::Lit(x) => *x as f64 / 2.0,
        NumP::Op(op, a, b) => {
            let (x, y) = (model_f64(a, m)?, model_f64(b, m)?);
            match op {
                ArithOp::ArithAdd => x + y,
                ArithOp::ArithSub => x - y,
                _ => x * y,
            }
        }
    })
}

fn model_i64(n: &NumP, count: Option<i64>) -> Option<i64> {
    Some(match n {
        NumP::Col => count?,
        NumP::Idle => unreachable!("no second BIGINT column"),
        NumP::Lit(x) => *x,
        NumP::Op(op, a, b) => {
            let (x, y) = (model_i64(a, count)?, model_i64(b, count)?);
            match op {
                ArithOp::ArithAdd => x.wrapping_add(y),
                ArithOp::ArithSub => x.wrapping_sub(y),
                _ => x.wrapping_mul(y),
            }
        }
    })
}

fn proto_num(n: &NumP, column: &str, float: bool) -> FieldValue {
    let value = match n {
        NumP::Col => field_value::Value::Column(column.into()),
        NumP::Idle => field_value::Value::Column("idle".into()),
        NumP::Lit(x) => field_value::Value::Literal(Literal {
            value: Some(if float {
                literal::Value::F64(*x as f64 / 2.0)
            } else {
                literal::Value::I64(*x)
            }),
        }),
        NumP::Op(op, a, b) => field_value::Value::Arith(Box::new(FieldArith {
            op: *op as i32,
            left: Some(Box::new(proto_num(a, column, float))),
            right: Some(Box::new(proto_num(b, column, float))),
        })),
    };
    FieldValue { value: Some(value) }
}

#[derive(Debug, Clone)]
enum Want {
    Rows {
        limit: u64,
    },
    Ordered {
        desc: bool,
        limit: u64,
    },
    /// The newest `rows` matching rows of each series (0: unset, one).
    Last {
        rows: u64,
    },
    Agg {
        width: i64,
        origin: i64,
        by_host: bool,
        by_region: bool,
        calls: Vec<(AggregateKind, &'static str)>,
        /// Count, min and max states asked for as their answers.
        as_answers: bool,
    },
}

#[derive(Debug, Clone)]
struct Req {
    start: i64,
    end: i64,
    tags: Vec<TagP>,
    field: Option<FieldP>,
    want: Want,
    /// Which table columns to return (rows answers), in table order.
    columns: Vec<bool>,
}

fn host_name() -> impl Strategy<Value = String> {
    (0..5u8).prop_map(|h| format!("h{h}"))
}

fn cmp_op() -> impl Strategy<Value = CompareOp> {
    prop_oneof![
        Just(CompareOp::CmpEq),
        Just(CompareOp::CmpNe),
        Just(CompareOp::CmpLt),
        Just(CompareOp::CmpLe),
        Just(CompareOp::CmpGt),
        Just(CompareOp::CmpGe),
    ]
}

fn tag_p() -> impl Strategy<Value = TagP> {
    prop_oneof![
        host_name().prop_map(|h| TagP::Eq("host", h)),
        host_name().prop_map(|h| TagP::Ne("host", h)),
        prop::collection::vec(host_name(), 0..3).prop_map(|v| TagP::In("host", v)),
        prop::collection::vec(host_name(), 0..3).prop_map(|v| TagP::NotIn("host", v)),
        Just(TagP::IsNull("region")),
        Just(TagP::IsNotNull("region")),
        Just(TagP::Eq("region", "r0".into())),
    ]
}

fn field_p() -> impl Strategy<Value = FieldP> {
    let leaf = prop_oneof![
        (cmp_op(), (-2..12i32).prop_map(|x| f64::from(x) / 2.0))
            .prop_map(|(o, x)| FieldP::Usage(o, x)),
        (cmp_op(), -3..8i64).prop_map(|(o, x)| FieldP::Count(o, x)),
        Just(FieldP::UsageNull),
        Just(FieldP::CountNotNull),
        (num_p(true), cmp_op(), num_p(true)).prop_map(|(a, o, b)| FieldP::UsageValues(a, o, b)),
        (num_p(false), cmp_op(), num_p(false)).prop_map(|(a, o, b)| FieldP::CountValues(a, o, b)),
    ];
    leaf.prop_recursive(2, 6, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| FieldP::All(Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| FieldP::Any(Box::new(a), Box::new(b))),
            inner.prop_map(|a| FieldP::Not(Box::new(a))),
        ]
    })
}

fn agg_kind() -> impl Strategy<Value = (AggregateKind, &'static str)> {
    prop_oneof![
        Just((AggregateKind::Count, "")),
        Just((AggregateKind::Count, "usage")),
        Just((AggregateKind::Sum, "usage")),
        Just((AggregateKind::Sum, "count")),
        Just((AggregateKind::Min, "usage")),
        Just((AggregateKind::Max, "usage")),
        Just((AggregateKind::Sum, "idle")),
        Just((AggregateKind::Max, "count")),
        Just((AggregateKind::Avg, "count")),
        Just((AggregateKind::First, "usage")),
        Just((AggregateKind::Last, "count")),
        Just((AggregateKind::Variance, "usage")),
        Just((AggregateKind::Percentile, "count")),
        Just((AggregateKind::ApproxDistinct, "count")),
        Just((AggregateKind::ExactDistinct, "usage")),
        Just((AggregateKind::Min, "time")),
        Just((AggregateKind::Max, "host")),
        Just((AggregateKind::Count, "region")),
        Just((AggregateKind::ExactDistinct, "host")),
    ]
}

fn want() -> impl Strategy<Value = Want> {
    prop_oneof![
        prop_oneof![Just(0u64), 1..40u64].prop_map(|limit| Want::Rows { limit }),
        // LIMIT 1 newest-first has a path of its own (the directory).
        (any::<bool>(), prop_oneof![Just(1u64), 1..30u64])
            .prop_map(|(desc, limit)| Want::Ordered { desc, limit }),
        (0..4u64).prop_map(|rows| Want::Last { rows }),
        (
            prop_oneof![Just(0i64), 1..60i64],
            -20..20i64,
            any::<bool>(),
            any::<bool>(),
            prop::collection::vec(agg_kind(), 0..4),
            any::<bool>(),
        )
            .prop_map(
                |(width, origin, by_host, by_region, calls, as_answers)| Want::Agg {
                    width,
                    origin,
                    by_host,
                    by_region,
                    calls,
                    as_answers,
                }
            ),
    ]
}

fn req() -> impl Strategy<Value = Req> {
    (
        prop_oneof![
            Just((i64::MIN, i64::MAX)),
            (-10..300i64, 0..300i64).prop_map(|(a, n)| (a, a + n)),
            (-400..300i64).prop_map(|a| (a, i64::MAX)),
            (-400..300i64).prop_map(|b| (i64::MIN, b)),
            (0..300i64, 0..20i64).prop_map(|(a, n)| (a, a - n))
        ],
        prop::collection::vec(tag_p(), 0..3),
        prop::option::of(field_p()),
        want(),
        prop_oneof![
            3 => Just(vec![true; COLUMNS]),
            1 => prop::collection::vec(any::<bool>(), COLUMNS)
        ],
    )
        .prop_map(|((start, end), tags, field, want, columns)| Req {
            start,
            end,
            tags,
            field,
            want,
            columns,
        })
}

fn special_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => (-4..20i32).prop_map(|x| f64::from(x) / 2.0),
        // Sums of these are inexact: any change of order shows.
        2 => (-40..200i32).prop_map(|x| f64::from(x) / 10.0),
        1 => Just(1e16),
        1 => Just(-1e16),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(-0.0),
    ]
}

fn row() -> impl Strategy<Value = Row> {
    (
        host_name(),
        prop::option::of(prop_oneof![Just("r0".to_string()), Just("r1".to_string())]),
        prop_oneof![
            20 => 0..300i64,
            1 => Just(i64::MIN),
            1 => Just(i64::MIN + 1),
            1 => Just(i64::MAX - 1),
            1 => -300..0i64,
        ],
        prop::option::weighted(0.85, special_f64()),
        prop::option::weighted(0.8, -5..10i64),
        prop::option::weighted(0.7, special_f64()),
    )
        .prop_map(|(host, region, time, usage, count, idle)| Row {
            host,
            region,
            time,
            usage,
            count,
            idle,
        })
}

fn to_proto_field(p: &FieldP) -> FieldPredicate {
    let expr = match p {
        FieldP::Usage(op, x) => field_predicate::Expr::Compare(FieldCompare {
            column: "usage".into(),
            op: *op as i32,
            value: Some(Literal {
                value: Some(literal::Value::F64(*x)),
            }),
        }),
        FieldP::Count(op, x) => field_predicate::Expr::Compare(FieldCompare {
            column: "count".into(),
            op: *op as i32,
            value: Some(Literal {
                value: Some(literal::Value::I64(*x)),
            }),
        }),
        FieldP::All(a, b) => field_predicate::Expr::All(FieldPredicateList {
            terms: vec![to_proto_field(a), to_proto_field(b)],
        }),
        FieldP::Any(a, b) => field_predicate::Expr::Any(FieldPredicateList {
            terms: vec![to_proto_field(a), to_proto_field(b)],
        }),
        FieldP::Not(a) => field_predicate::Expr::Not(Box::new(to_proto_field(a))),
        FieldP::UsageNull => field_predicate::Expr::IsNull("usage".into()),
        FieldP::CountNotNull => field_predicate::Expr::IsNotNull("count".into()),
        FieldP::UsageValues(a, op, b) => field_predicate::Expr::CompareValues(FieldValueCompare {
            left: Some(proto_num(a, "usage", true)),
            op: *op as i32,
            right: Some(proto_num(b, "usage", true)),
        }),
        FieldP::CountValues(a, op, b) => field_predicate::Expr::CompareValues(FieldValueCompare {
            left: Some(proto_num(a, "count", false)),
            op: *op as i32,
            right: Some(proto_num(b, "count", false)),
        }),
    };
    FieldPredicate { expr: Some(expr) }
}

fn agg_function(k: AggregateKind) -> AggregateFunction {
    match k {
        AggregateKind::Count => AggregateFunction::AggCount,
        AggregateKind::Sum => AggregateFunction::AggSum,
        AggregateKind::Min => AggregateFunction::AggMin,
        AggregateKind::Max => AggregateFunction::AggMax,
        AggregateKind::Avg => AggregateFunction::AggAvg,
        AggregateKind::First => AggregateFunction::AggFirst,
        AggregateKind::Last => AggregateFunction::AggLast,
        AggregateKind::Variance => AggregateFunction::AggVariance,
        AggregateKind::Percentile => AggregateFunction::AggPercentile,
        AggregateKind::ApproxDistinct => AggregateFunction::AggApproxDistinct,
        AggregateKind::ExactDistinct => AggregateFunction::AggExactDistinct,
    }
}

fn to_proto(r: &Req) -> ScanRequest {
    let tag_predicates = r
        .tags
        .iter()
        .map(|t| {
            let (column, op, values) = match t {
                TagP::Eq(c, v) => (c, TagOp::TagEq, vec![v.clone()]),
                TagP::Ne(c, v) => (c, TagOp::TagNe, vec![v.clone()]),
                TagP::In(c, v) => (c, TagOp::TagIn, v.clone()),
                TagP::NotIn(c, v) => (c, TagOp::TagNotIn, v.clone()),
                TagP::IsNull(c) => (c, TagOp::TagIsNull, vec![]),
                TagP::IsNotNull(c) => (c, TagOp::TagIsNotNull, vec![]),
            };
            TagPredicate {
                column: column.to_string(),
                op: op as i32,
                values,
            }
        })
        .collect();
    let mut req = ScanRequest {
        table_id: 1,
        partition_ids: vec![PID],
        start_ns: r.start,
        end_ns: r.end,
        projection: table()
            .into_iter()
            .zip(&r.columns)
            .filter(|(_, k)| **k)
            .map(|(c, _)| c)
            .collect(),
        table_columns: table(),
        limit: 0,
        tag_predicates,
        field_predicate: r.field.as_ref().map(to_proto_field),
        order: ScanOrder::OrderSeries as i32,
        aggregate: None,
        last_per_series: false,
        rows_per_series: 0,
    };
    match &r.want {
        Want::Rows { limit } => req.limit = *limit,
        Want::Ordered { desc, limit } => {
            req.limit = *limit;
            req.order = if *desc {
                ScanOrder::OrderTimeDesc
            } else {
                ScanOrder::OrderTimeAsc
            } as i32;
        }
        Want::Last { rows } => {
            req.last_per_series = true;
            req.rows_per_series = *rows;
        }
        Want::Agg {
            width,
            origin,
            by_host,
            by_region,
            calls,
            as_answers,
        } => {
            let mut group_tags = Vec::new();
            if *by_host {
                group_tags.push("host".into());
            }
            if *by_region {
                group_tags.push("region".into());
            }
            req.aggregate = Some(AggregateSpec {
                bucket_width_ns: *width,
                bucket_origin_ns: *origin,
                group_tags,
                calls: calls
                    .iter()
                    .map(|(k, c)| AggregateCall {
                        function: agg_function(*k) as i32,
                        column: c.to_string(),
                    })
                    .collect(),
                states_as_answers: *as_answers,
            });
        }
    }
    req
}

// ---------- the model ----------

fn tag_ok(p: &TagP, m: &Model) -> bool {
    let get = |c: &str| {
        if c == "host" {
            m.host.clone()
        } else {
            m.region.clone()
        }
    };
    match p {
        TagP::Eq(c, v) => get(c).is_some_and(|x| x == *v),
        TagP::Ne(c, v) => get(c).is_some_and(|x| x != *v),
        TagP::In(c, v) => get(c).is_some_and(|x| v.contains(&x)),
        TagP::NotIn(c, v) => get(c).is_some_and(|x| !v.contains(&x)),
        TagP::IsNull(c) => get(c).is_none(),
        TagP::IsNotNull(c) => get(c).is_some(),
    }
}

fn cmp_holds<T: PartialOrd>(op: CompareOp, ord: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match op {
        CompareOp::CmpEq => ord == Equal,
        CompareOp::CmpNe => ord != Equal,
        CompareOp::CmpLt => ord == Less,
        CompareOp::CmpLe => ord != Greater,
        CompareOp::CmpGt => ord == Greater,
        CompareOp::CmpGe => ord != Less,
        CompareOp::Unspecified => false,
    }
}

/// SQL's three-valued logic, written out plainly.
fn field_ok(p: &FieldP, m: &Model) -> Option<bool> {
    match p {
        FieldP::Usage(op, x) => m.usage.map(|u| cmp_holds::<f64>(*op, u.total_cmp(x))),
        FieldP::Count(op, x) => m.count.map(|c| cmp_holds::<i64>(*op, c.cmp(x))),
        FieldP::All(a, b) => match (field_ok(a, m), field_ok(b, m)) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (Some(true), Some(true)) => Some(true),
            _ => None,
        },
        FieldP::Any(a, b) => match (field_ok(a, m), field_ok(b, m)) {
            (Some(true), _) | (_, Some(true)) => Some(true),
            (Some(false), Some(false)) => Some(false),
            _ => None,
        },
        FieldP::Not(a) => field_ok(a, m).map(|b| !b),
        FieldP::UsageNull => Some(m.usage.is_none()),
        FieldP::CountNotNull => Some(m.count.is_some()),
        FieldP::UsageValues(a, op, b) => {
            let (x, y) = (model_f64(a, m)?, model_f64(b, m)?);
            Some(cmp_holds::<f64>(*op, x.total_cmp(&y)))
        }
        FieldP::CountValues(a, op, b) => {
            let (x, y) = (model_i64(a, m.count)?, model_i64(b, m.count)?);
            Some(cmp_holds::<i64>(*op, x.cmp(&y)))
        }
    }
}

fn matches(r: &Req, m: &Model) -> bool {
    m.time >= r.start
        && m.time < r.end
        && r.tags.iter().all(|t| tag_ok(t, m))
        && r.field
            .as_ref()
            .is_none_or(|f| field_ok(f, m) == Some(true))
}

/// A normalized answer: rows as text, or groups with finalized values.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Rows(Vec<Vec<String>>),
    Groups(BTreeMap<Vec<String>, Vec<Fin>>),
    /// The scan must fail (a kept row's time bucket is out of range).
    Error,
}

/// A finalized aggregate, compared with a tolerance for floats.
#[derive(Debug, Clone)]
enum Fin {
    Null,
    F(f64),
    Other(String),
}

impl PartialEq for Fin {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Fin::Null, Fin::Null) => true,
            // Every path feeds each state the same values in the same order,
            // so answers are equal to the bit (NaNs aside).
            (Fin::F(a), Fin::F(b)) => (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits(),
            (Fin::Other(a), Fin::Other(b)) => a == b,
            _ => false,
        }
    }
}

fn finalize(s: &State) -> Fin {
    let how = match s.kind() {
        AggregateKind::Percentile => Finalize::Quantile(0.5),
        _ => Finalize::Natural,
    };
    match s.finalize(how).unwrap() {
        None => Fin::Null,
        Some(PValue::F64(x)) => Fin::F(x),
        Some(v) => Fin::Other(format!("{v:?}")),
    }
}

fn model_row_text(m: &Model, columns: &[bool]) -> Vec<String> {
    vec![
        m.host.clone().unwrap_or_default(),
        m.region.clone().unwrap_or_default(),
        m.time.to_string(),
        m.usage.map(|x| format!("{x:?}")).unwrap_or_default(),
        m.count.map(|x| x.to_string()).unwrap_or_default(),
        m.idle.map(|x| format!("{x:?}")).unwrap_or_default(),
    ]
    .into_iter()
    .zip(columns)
    .filter(|(_, k)| **k)
    .map(|(v, _)| v)
    .collect()
}

fn model_answer(r: &Req, rows: &[Model]) -> Answer {
    let kept: Vec<&Model> = rows.iter().filter(|m| matches(r, m)).collect();
    match &r.want {
        Want::Rows { limit } => {
            let n = if *limit == 0 {
                usize::MAX
            } else {
                *limit as usize
            };
            Answer::Rows(
                kept.iter()
                    .take(n)
                    .map(|m| model_row_text(m, &r.columns))
                    .collect(),
            )
        }
        Want::Ordered { desc, limit } => {
            let mut v = kept.clone();
            v.sort_by(|a, b| {
                let t = a.time.cmp(&b.time);
                let t = if *desc { t.reverse() } else { t };
                t.then_with(|| a.series.cmp(&b.series))
            });
            Answer::Rows(
                v.iter()
                    .take(*limit as usize)
                    .map(|m| model_row_text(m, &r.columns))
                    .collect(),
            )
        }
        Want::Last { rows } => {
            // Each series' rows, newest first; its first `rows` (at least
            // one) of them, in (series, time) order.
            let mut by_series: BTreeMap<Vec<u8>, Vec<&Model>> = BTreeMap::new();
            for m in kept {
                by_series.entry(m.series.clone()).or_default().push(m);
            }
            let mut out = Vec::new();
            for v in by_series.values_mut() {
                v.sort_by_key(|m| std::cmp::Reverse(m.time));
                v.truncate((*rows).max(1) as usize);
                v.reverse();
                out.extend(v.iter().map(|m| model_row_text(m, &r.columns)));
            }
            Answer::Rows(out)
        }
        Want::Agg {
            width,
            origin,
            by_host,
            by_region,
            calls,
            ..
        } => {
            let mut groups: BTreeMap<Vec<String>, Vec<State>> = BTreeMap::new();
            for m in kept {
                let mut key = Vec::new();
                if *width > 0 {
                    let (t, o, w) = (i128::from(m.time), i128::from(*origin), i128::from(*width));
                    let b = o + (t - o).div_euclid(w) * w;
                    if i64::try_from(b).is_err() {
                        return Answer::Error;
                    }
                    key.push(b.to_string());
                }
                if *by_host {
                    key.push(m.host.clone().unwrap_or_else(|| "NULL".into()));
                }
                if *by_region {
                    key.push(m.region.clone().unwrap_or_else(|| "NULL".into()));
                }
                let states = groups.entry(key).or_insert_with(|| {
                    calls
                        .iter()
                        .map(|(k, c)| {
                            let input = match *c {
                                "" => sealion_partial::ValueType::Bool,
                                "usage" | "idle" => sealion_partial::ValueType::F64,
                                "count" | "time" => sealion_partial::ValueType::I64,
                                _ => sealion_partial::ValueType::Str,
                            };
                            State::new(*k, input).unwrap()
                        })
                        .collect()
                });
                for (i, (_, c)) in calls.iter().enumerate() {
                    let v = match *c {
                        "" => Some(PValue::Bool(true)),
                        "usage" => m.usage.map(PValue::F64),
                        "idle" => m.idle.map(PValue::F64),
                        "count" => m.count.map(PValue::I64),
                        "time" => Some(PValue::I64(m.time)),
                        "host" => m.host.clone().map(PValue::Str),
                        _ => m.region.clone().map(PValue::Str),
                    };
                    if let Some(v) = v {
                        states[i].update(m.time, &v).unwrap();
                    }
                }
            }
            Answer::Groups(
                groups
                    .into_iter()
                    .map(|(k, s)| (k, s.iter().map(finalize).collect()))
                    .collect(),
            )
        }
    }
}

// ---------- running the paths ----------

fn batch_rows(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .enumerate()
                    .map(|(c, a)| {
                        if a.is_null(i) {
                            String::new()
                        } else if b.schema().field(c).name() == "time" {
                            a.as_any()
                                .downcast_ref::<TimestampNanosecondArray>()
                                .unwrap()
                                .value(i)
                                .to_string()
                        } else if let Some(f) = a.as_any().downcast_ref::<Float64Array>() {
                            format!("{:?}", f.value(i))
                        } else {
                            array_value_to_string(a, i).unwrap()
                        }
                    })
                    .collect(),
            );
        }
    }
    out
}

fn answer_of(r: &Req, batches: &[RecordBatch]) -> Answer {
    answer_from(r, batches, false)
}

/// The answer in `batches`; with `merge`, a group that comes back more than
/// once (from several parts of a split scan) has its states merged, as a
/// query node merges them.
fn answer_from(r: &Req, batches: &[RecordBatch], merge: bool) -> Answer {
    let Want::Agg { width, calls, .. } = &r.want else {
        return Answer::Rows(batch_rows(batches));
    };
    let Mode::Aggregate(plan) = Query::compile(&to_proto(r)).unwrap().mode else {
        panic!("an aggregate request compiled to another mode");
    };
    let mut groups = BTreeMap::new();
    for b in batches {
        // Key columns: the bucket (when bucketed) and the group tags.
        let keys = b.num_columns() - calls.len();
        for i in 0..b.num_rows() {
            let mut key = Vec::new();
            for c in 0..keys {
                let a = b.column(c);
                key.push(if a.is_null(i) {
                    "NULL".into()
                } else if c == 0 && *width > 0 {
                    a.as_any()
                        .downcast_ref::<TimestampNanosecondArray>()
                        .unwrap()
                        .value(i)
                        .to_string()
                } else {
                    array_value_to_string(a, i).unwrap()
                });
            }
            let states: Vec<State> = plan
                .calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let column = StateColumn::new(b.column(keys + k).as_ref(), c.kind, c.input);
                    column.unwrap().state(i).unwrap()
                })
                .collect();
            match groups.entry(key) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(states);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    assert!(merge, "a group came back twice");
                    for (have, more) in o.get_mut().iter_mut().zip(&states) {
                        have.merge(more).unwrap();
                    }
                }
            }
        }
    }
    Answer::Groups(
        groups
            .into_iter()
            .map(|(k, states)| (k, states.iter().map(finalize).collect()))
            .collect(),
    )
}

/// Whether two answers agree, floats to a relative 1e-9: states merged in
/// another order round differently in the last bits. Percentiles are left
/// out: a t-digest merged from parts is not the digest of the whole, and
/// `sealion_partial`'s own tests hold it to its rank error after any split.
fn close(r: &Req, a: &Answer, b: &Answer) -> bool {
    let skip: Vec<bool> = match &r.want {
        Want::Agg { calls, .. } => calls
            .iter()
            .map(|(k, _)| *k == AggregateKind::Percentile)
            .collect(),
        _ => Vec::new(),
    };
    let near = |x: &Fin, y: &Fin| match (x, y) {
        (Fin::F(x), Fin::F(y)) => {
            (x.is_nan() && y.is_nan())
                || x == y
                || (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
        }
        _ => x == y,
    };
    match (a, b) {
        (Answer::Groups(a), Answer::Groups(b)) => {
            a.len() == b.len()
                && a.iter().zip(b).all(|((ka, fa), (kb, fb))| {
                    ka == kb
                        && fa.len() == fb.len()
                        && fa
                            .iter()
                            .zip(fb)
                            .enumerate()
                            .all(|(i, (x, y))| skip.get(i) == Some(&true) || near(x, y))
                })
        }
        _ => a == b,
    }
}

/// What a path answers, or `Answer::Error` when it fails.
fn try_answer(r: &Req, run: impl FnOnce() -> crate::Result<Vec<RecordBatch>>) -> Answer {
    match run() {
        Ok(batches) => answer_of(r, &batches),
        Err(_) => Answer::Error,
    }
}

fn try_plain(req: &ScanRequest, rows: &[SortedRow]) -> crate::Result<Vec<RecordBatch>> {
    let q = Query::compile(req)?;
    let mut batches = Vec::new();
    let mut emit = |b: RecordBatch| {
        batches.push(b);
        true
    };
    let mut out = Output::new(&q, &mut emit);
    scan_rows(&mut out, PID, rows.iter().cloned().map(Ok))?;
    out.finish()?;
    Ok(batches)
}

fn try_sealed(req: &ScanRequest, file: &SealedFile) -> crate::Result<Vec<RecordBatch>> {
    let q = Query::compile(req)?;
    let mut batches = Vec::new();
    let mut emit = |b: RecordBatch| {
        batches.push(b);
        true
    };
    let mut out = Output::new(&q, &mut emit);
    file.run(&mut out)?;
    out.finish()?;
    Ok(batches)
}

/// The sealed paths as a scan split into `shares` parts runs them: one
/// collector per part, the parts' batches one after another.
fn try_sealed_shares(
    req: &ScanRequest,
    file: &SealedFile,
    shares: usize,
) -> crate::Result<(Vec<RecordBatch>, Vec<ScanMetrics>)> {
    let q = Query::compile(req)?;
    let groups = file.groups_to_read(&q)?;
    let mut batches = Vec::new();
    let mut metrics = Vec::new();
    for share in 0..shares {
        let mut emit = |b: RecordBatch| {
            batches.push(b);
            true
        };
        let mut out = Output::new(&q, &mut emit);
        file.run_share(&mut out, &groups, share, shares)?;
        metrics.push(out.finish()?);
    }
    Ok((batches, metrics))
}

fn run_plain(req: &ScanRequest, rows: &[SortedRow]) -> (Vec<RecordBatch>, ScanMetrics) {
    let q = Query::compile(req).unwrap();
    let mut batches = Vec::new();
    let mut emit = |b: RecordBatch| {
        batches.push(b);
        true
    };
    let mut out = Output::new(&q, &mut emit);
    scan_rows(&mut out, PID, rows.iter().cloned().map(Ok)).unwrap();
    let m = out.finish().unwrap();
    (batches, m)
}

fn run_sealed(req: &ScanRequest, file: &SealedFile) -> (Vec<RecordBatch>, ScanMetrics) {
    let q = Query::compile(req).unwrap();
    let mut batches = Vec::new();
    let mut emit = |b: RecordBatch| {
        batches.push(b);
        true
    };
    let mut out = Output::new(&q, &mut emit);
    file.run(&mut out).unwrap();
    let m = out.finish().unwrap();
    (batches, m)
}

fn seal(
    dir: &std::path::Path,
    rows: &[SortedRow],
    rows_per_group: usize,
    values_per_page: usize,
) -> SealedFile {
    seal_version(
        dir,
        rows,
        rows_per_group,
        values_per_page,
        SEALED_FORMAT_VERSION,
    )
}

fn seal_version(
    dir: &std::path::Path,
    rows: &[SortedRow],
    rows_per_group: usize,
    values_per_page: usize,
    version: u32,
) -> SealedFile {
    let path = dir.join(format!(
        "p-{rows_per_group}-{values_per_page}-v{version}.slf"
    ));
    let layout = Layout {
        rows_per_group,
        values_per_page,
        parallel: false,
        version,
    };
    write_sealed_with(&path, PID, &table(), rows.iter().cloned().map(Ok), layout).unwrap();
    SealedFile::open(&path).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The row path and the column paths over a sealed file (small row
    /// groups and pages, so the directory has something to skip) both answer
    /// every request as the model does, in files of this build's format
    /// version and of version 1 (which also holds tag pages).
    #[test]
    fn every_path_answers_as_the_model(
        rows in prop::collection::vec(row(), 0..300),
        reqs in prop::collection::vec(req(), 1..6),
        group in prop_oneof![Just(16usize), Just(64), Just(1000)],
        page in prop_oneof![Just(4usize), Just(16)],
        version in prop_oneof![Just(1u32), Just(SEALED_FORMAT_VERSION)],
        shares in 2usize..5,
    ) {
        let stored = stored(&rows);
        let model = model_rows(&stored);
        let dir = tempfile::tempdir().unwrap();
        let file = (!stored.is_empty())
            .then(|| seal_version(dir.path(), &stored, group, page, version));
        for r in &reqs {
            let want = model_answer(r, &model);
            let req = to_proto(r);
            let plain = try_answer(r, || try_plain(&req, &stored));
            prop_assert_eq!(&plain, &want, "row path, request {:?}", r);
            if let Some(f) = &file {
                let sealed = try_answer(r, || try_sealed(&req, f));
                prop_assert_eq!(&sealed, &want, "sealed paths, request {:?}", r);
                // Split across threads, where the request allows it: rows
                // in the same order, groups merged from the parts.
                if Query::compile(&req).is_ok_and(|q| q.splits()) {
                    let split = match try_sealed_shares(&req, f, shares) {
                        Ok((batches, _)) => answer_from(r, &batches, true),
                        Err(_) => Answer::Error,
                    };
                    prop_assert!(
                        close(r, &split, &want),
                        "sealed paths in {} parts, request {:?}: {:?} against {:?}",
                        shares, r, split, want
                    );
                }
            }
        }
    }
}

/// 50 hosts, 200 rows each, 10 s apart.
fn fleet() -> Vec<SortedRow> {
    let mut rows = Vec::new();
    for h in 0..50 {
        for i in 0..200 {
            rows.push(Row {
                host: format!("host_{h:02}"),
                region: Some(format!("r{}", h % 3)),
                time: i * 10,
                usage: Some(f64::from((h * 7 + i as i32) % 100)),
                count: Some(i),
                idle: None,
            });
        }
    }
    stored(&rows)
}

fn plain_req() -> ScanRequest {
    to_proto(&Req {
        start: i64::MIN,
        end: i64::MAX,
        tags: vec![],
        field: None,
        columns: vec![true; COLUMNS],
        want: Want::Rows { limit: 0 },
    })
}

#[test]
fn a_last_point_scan_decodes_no_page() {
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 1024, 128);
    let mut req = plain_req();
    req.last_per_series = true;
    let (batches, m) = run_sealed(&req, &file);
    let (plain, _) = run_plain(&req, &rows);
    assert_eq!(batch_rows(&batches), batch_rows(&plain));
    assert_eq!(batch_rows(&batches).len(), 50);
    assert_eq!(m.pages_decoded, 0, "{m:?}");
    assert_eq!(m.last_points_from_directory, 50);
    assert_eq!(m.row_groups_skipped, m.row_groups_total);
}

#[test]
fn newest_rows_of_each_series_read_only_the_row_groups_that_hold_them() {
    // 100-row groups: each host's 200 rows span two of them; `usage > 95`
    // holds on 4 of each 100 rows.
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 100, 50);
    let mut req = plain_req();
    req.last_per_series = true;
    req.field_predicate = Some(to_proto_field(&FieldP::Usage(CompareOp::CmpGt, 95.0)));
    for (per_series, newest_only) in [(3, true), (4, true), (5, false), (50, false)] {
        req.rows_per_series = per_series;
        let (batches, m) = run_sealed(&req, &file);
        let (plain, _) = run_plain(&req, &rows);
        let got = batch_rows(&batches);
        assert_eq!(got, batch_rows(&plain), "{per_series} per series");
        assert_eq!(got.len(), 50 * per_series.min(8) as usize, "{per_series}");
        // A series' newest group answers for up to 4 rows; more need the
        // older one too.
        if newest_only {
            assert_eq!(m.row_groups_skipped, 50, "{per_series}: {m:?}");
        } else {
            assert_eq!(m.row_groups_skipped, 0, "{per_series}: {m:?}");
        }
    }
}

/// The time-ordered and last-point paths decode the pages of the projected
/// fields only: asked for `time` and `usage`, a scan of each series'
/// newest rows and a newest-first `LIMIT` decode the time and usage pages
/// of the rows they keep, not the other fields' (the answers are the row
/// path's either way).
#[test]
fn kept_rows_decode_only_the_projected_fields() {
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 100, 50);
    // host, region, time, usage, count, idle: time and usage alone.
    let narrow = vec![false, false, true, true, false, false];
    let mut last = plain_req();
    last.last_per_series = true;
    last.rows_per_series = 3;
    let mut newest = plain_req();
    newest.order = ScanOrder::OrderTimeDesc as i32;
    newest.limit = 5;
    for whole in [last, newest] {
        let mut req = whole.clone();
        req.projection = whole
            .projection
            .iter()
            .zip(&narrow)
            .filter(|&(_, &keep)| keep)
            .map(|(c, _)| c.clone())
            .collect();
        let (all, m_all) = run_sealed(&whole, &file);
        let (some, m_some) = run_sealed(&req, &file);
        assert_eq!(batch_rows(&some), batch_rows(&run_plain(&req, &rows).0));
        assert_eq!(batch_rows(&all), batch_rows(&run_plain(&whole, &rows).0));
        // `count` and `idle` (all null here: no page, or pages of nulls)
        // add pages to the whole projection only.
        assert!(m_some.pages_decoded > 0, "{m_some:?}");
        assert!(
            m_some.pages_decoded < m_all.pages_decoded,
            "{m_some:?} against {m_all:?}"
        );
        assert_eq!(m_some.rows_matched, m_all.rows_matched);
    }
}

#[test]
fn a_one_series_scan_skips_the_other_series_row_groups() {
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 1000, 100);
    let mut req = plain_req();
    req.tag_predicates = vec![TagPredicate {
        column: "host".into(),
        op: TagOp::TagEq as i32,
        values: vec!["host_17".into()],
    }];
    let (batches, m) = run_sealed(&req, &file);
    let got = batch_rows(&batches);
    assert_eq!(got.len(), 200);
    assert!(got.iter().all(|r| r[0] == "host_17"));
    // 10,000 rows in groups of 1,000: host_17's 200 rows lie in one group.
    assert_eq!(m.row_groups_total, 10);
    assert_eq!(m.row_groups_skipped, 9, "{m:?}");
    assert_eq!(m.rows_scanned, 200);
    // Time pages are whole inside the range (no decode needed to select);
    // the projected columns' pages that hold the series' rows are decoded.
    assert!(m.pages_decoded <= 5 * 3, "{m:?}");
}

/// Counts and tag extremes over a whole file come from its directory: each
/// series' row count, no row group read (all skipped), and the same answer as the model
/// and as the split scan; a time range that cuts the file, a bucket edge
/// inside it, a field call or a field predicate read its row groups.
#[test]
fn counts_over_a_whole_file_come_from_the_directory() {
    let rows = fleet();
    let model = model_rows(&rows);
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 1000, 100);
    let agg = |start, end, width, tags: Vec<TagP>, field, calls| Req {
        start,
        end,
        tags,
        field,
        columns: vec![true; COLUMNS],
        want: Want::Agg {
            width,
            origin: 0,
            by_host: true,
            by_region: true,
            calls,
            as_answers: true,
        },
    };
    let counts = vec![
        (AggregateKind::Count, ""),
        (AggregateKind::Max, "host"),
        (AggregateKind::Count, "region"),
    ];
    let two_hosts = vec![TagP::In("host", vec!["host_01".into(), "host_07".into()])];
    // The fleet's times are 0..=1990.
    let folded = [
        agg(i64::MIN, i64::MAX, 0, vec![], None, counts.clone()),
        agg(0, 1991, 0, two_hosts.clone(), None, counts.clone()),
        agg(i64::MIN, i64::MAX, 0, vec![], None, vec![]),
        agg(i64::MIN, i64::MAX, 10_000, vec![], None, counts.clone()),
    ];
    let read = [
        agg(1, i64::MAX, 0, vec![], None, counts.clone()),
        agg(i64::MIN, 1990, 0, two_hosts, None, counts.clone()),
        agg(i64::MIN, i64::MAX, 1000, vec![], None, counts.clone()),
        agg(
            i64::MIN,
            i64::MAX,
            0,
            vec![],
            None,
            vec![(AggregateKind::Count, "usage")],
        ),
        agg(
            i64::MIN,
            i64::MAX,
            0,
            vec![],
            Some(FieldP::CountNotNull),
            counts,
        ),
    ];
    for (r, from_directory) in folded
        .iter()
        .map(|r| (r, true))
        .chain(read.iter().map(|r| (r, false)))
    {
        let req = to_proto(r);
        let want = model_answer(r, &model);
        assert!(matches!(&want, Answer::Groups(g) if !g.is_empty()), "{r:?}");
        let (sealed, m) = run_sealed(&req, &file);
        assert_eq!(answer_of(r, &sealed), want, "{r:?}");
        let (batches, _) = try_sealed_shares(&req, &file, 3).unwrap();
        assert!(
            close(r, &answer_from(r, &batches, true), &want),
            "3 parts of {r:?}"
        );
        if from_directory {
            assert_eq!(m.pages_decoded, 0, "{r:?}: {m:?}");
            assert_eq!(m.row_groups_skipped, m.row_groups_total, "{r:?}: {m:?}");
            assert!(
                file.groups_to_read(&Query::compile(&req).unwrap())
                    .unwrap()
                    .is_empty()
            );
        } else {
            assert!(m.row_groups_skipped < m.row_groups_total, "{r:?}: {m:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// The aggregates the directory answers (the whole file in range, no
    /// field predicate, every call a count or a tag's min or max) answer as
    /// the model does over series with NULL tags and any tag predicates,
    /// grouped by no tag, one or two, whole and split in parts, and decode
    /// no page.
    #[test]
    fn directory_counts_answer_as_the_model(
        rows in prop::collection::vec(row(), 1..300),
        tags in prop::collection::vec(tag_p(), 0..3),
        by_host in any::<bool>(),
        by_region in any::<bool>(),
        calls in prop::collection::vec(prop_oneof![
            Just((AggregateKind::Count, "")),
            Just((AggregateKind::Count, "region")),
            Just((AggregateKind::Max, "host")),
            Just((AggregateKind::Min, "region")),
        ], 0..4),
        as_answers in any::<bool>(),
        group in prop_oneof![Just(16usize), Just(1000)],
        shares in 2usize..5,
    ) {
        let stored = stored(&rows);
        let dir = tempfile::tempdir().unwrap();
        let file = seal(dir.path(), &stored, group, 4);
        let r = Req {
            start: i64::MIN,
            end: i64::MAX,
            tags,
            field: None,
            columns: vec![true; COLUMNS],
            want: Want::Agg { width: 0, origin: 0, by_host, by_region, calls, as_answers },
        };
        let want = model_answer(&r, &model_rows(&stored));
        let req = to_proto(&r);
        let (sealed, m) = run_sealed(&req, &file);
        prop_assert_eq!(answer_of(&r, &sealed), want.clone());
        prop_assert_eq!(m.pages_decoded, 0, "{:?}", m);
        prop_assert_eq!(m.row_groups_skipped, m.row_groups_total, "{:?}", m);
        let (batches, _) = try_sealed_shares(&req, &file, shares).unwrap();
        prop_assert!(close(&r, &answer_from(&r, &batches, true), &want));
    }

    /// `groups_may_read`, asked before a scan of one sealed file, is never
    /// below the row groups the scan then reads, in every mode.
    #[test]
    fn groups_may_read_bounds_the_groups_a_scan_reads(
        rows in prop::collection::vec(row(), 1..300),
        reqs in prop::collection::vec(req(), 1..6),
        group in prop_oneof![Just(16usize), Just(64)],
    ) {
        let stored = stored(&rows);
        let dir = tempfile::tempdir().unwrap();
        let file = seal(dir.path(), &stored, group, 4);
        for r in &reqs {
            let Ok(q) = Query::compile(&to_proto(r)) else {
                continue;
            };
            let mut emit = |_: RecordBatch| true;
            let mut out = Output::new(&q, &mut emit);
            let bound = file.groups_may_read(&out);
            if file.run(&mut out).is_err() {
                continue;
            }
            let m = out.finish().unwrap();
            let read = m.row_groups_total - m.row_groups_skipped;
            prop_assert!(read <= bound as u64, "read {} > {} for {:?}: {:?}", read, bound, r, m);
        }
    }
}

/// `groups_may_read` counts only what the directory cannot rule out: the
/// groups of the one host asked for, none for a count the directory gives
/// or for a host's last row, every group in range without a tag predicate.
#[test]
fn groups_may_read_counts_only_the_candidates() {
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    // Groups of 100 rows: two per host.
    let file = seal(dir.path(), &rows, 100, 50);
    let may_read = |r: Req| {
        let q = Query::compile(&to_proto(&r)).unwrap();
        let mut emit = |_: RecordBatch| true;
        let out = Output::new(&q, &mut emit);
        file.groups_may_read(&out)
    };
    let of = |tags: Vec<TagP>, want: Want| Req {
        start: i64::MIN,
        end: i64::MAX,
        tags,
        field: None,
        columns: vec![true; COLUMNS],
        want,
    };
    let host = || vec![TagP::Eq("host", "host_03".into())];
    let rows_of = || Want::Rows { limit: 0 };
    assert_eq!(may_read(of(host(), rows_of())), 2);
    assert_eq!(may_read(of(vec![], rows_of())), 100);
    // Rows 0..1000 s of every host: its first group only.
    let mut early = of(host(), rows_of());
    early.end = 900;
    assert_eq!(may_read(early), 1);
    let count = Want::Agg {
        width: 0,
        origin: 0,
        by_host: true,
        by_region: false,
        calls: vec![(AggregateKind::Count, "")],
        as_answers: true,
    };
    assert_eq!(may_read(of(vec![], count)), 0);
    assert_eq!(may_read(of(host(), Want::Last { rows: 1 })), 0);
    assert_eq!(may_read(of(host(), Want::Last { rows: 2 })), 2);
}

#[test]
fn wide_buckets_fold_whole_pages_from_their_statistics() {
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 1000, 100);
    let r = Req {
        start: i64::MIN,
        end: i64::MAX,
        tags: vec![],
        field: None,
        columns: vec![true; COLUMNS],
        want: Want::Agg {
            width: 1_000_000,
            origin: 0,
            by_host: true,
            by_region: false,
            calls: vec![
                (AggregateKind::Max, "usage"),
                (AggregateKind::Sum, "count"),
                (AggregateKind::Count, ""),
            ],
            as_answers: true,
        },
    };
    let req = to_proto(&r);
    let (sealed, m) = run_sealed(&req, &file);
    assert_eq!(answer_of(&r, &sealed), model_answer(&r, &model_rows(&rows)));
    assert!(m.pages_from_stats > 0, "{m:?}");
    // Host boundaries fall inside pages at times (200 rows a host, pages of
    // 100 do align here), so every page is whole: nothing is decoded.
    assert_eq!(m.pages_decoded, 0, "{m:?}");
}

#[test]
fn newest_first_stops_once_the_limit_is_certain() {
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    // Groups of 100 rows: each holds half of one host's history, so the
    // newest rows are spread over the second half of every host.
    let file = seal(dir.path(), &rows, 100, 50);
    let r = Req {
        start: i64::MIN,
        end: i64::MAX,
        tags: vec![TagP::Eq("host", "host_03".into())],
        field: None,
        columns: vec![true; COLUMNS],
        want: Want::Ordered {
            desc: true,
            limit: 5,
        },
    };
    let req = to_proto(&r);
    let (sealed, m) = run_sealed(&req, &file);
    assert_eq!(answer_of(&r, &sealed), model_answer(&r, &model_rows(&rows)));
    assert_eq!(m.row_groups_total, 100);
    assert_eq!(m.row_groups_skipped, 99, "{m:?}");
}

/// Groups that hold many series and many pages: the newest rows of one
/// series decode the pages that hold them, not the group.
#[test]
fn newest_first_decodes_only_the_pages_of_the_newest_rows() {
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    // 2,000 rows a group (ten hosts), 20 rows a page: a host's 200 rows
    // are ten pages of each column.
    let file = seal(dir.path(), &rows, 2000, 20);
    for (desc, limit) in [(true, 5), (false, 5), (true, 30)] {
        let r = Req {
            start: i64::MIN,
            end: i64::MAX,
            tags: vec![TagP::Eq("host", "host_13".into())],
            field: None,
            columns: vec![true; COLUMNS],
            want: Want::Ordered { desc, limit },
        };
        let (sealed, m) = run_sealed(&to_proto(&r), &file);
        assert_eq!(answer_of(&r, &sealed), model_answer(&r, &model_rows(&rows)));
        // Per column (time, usage, count): the pages of `limit` rows at one
        // end of the host's history. The whole group would be 100 each.
        let pages_per_column = limit.div_ceil(20) + 1;
        assert!(
            m.pages_decoded <= 3 * pages_per_column,
            "desc={desc} limit={limit}: {m:?}"
        );
    }
}

/// Newest-first LIMIT 1: a series whose directory last row lies in the time
/// range and passes the field filter is answered from the directory; the
/// others are looked for in their row groups, with the same answer.
#[test]
fn newest_row_comes_from_the_directory_when_it_can() {
    let rows = fleet();
    let model = model_rows(&rows);
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 2000, 20);
    let host = || vec![TagP::Eq("host", "host_13".into())];
    // (tags, field filter, end, desc, expect the directory to answer)
    let cases = [
        (host(), None, i64::MAX, true, true),
        (vec![], None, i64::MAX, true, true),
        // host_13's last row has count 199: the filter rejects it.
        (
            host(),
            Some(FieldP::Count(CompareOp::CmpLt, 150)),
            i64::MAX,
            true,
            false,
        ),
        (
            host(),
            Some(FieldP::Count(CompareOp::CmpGt, 150)),
            i64::MAX,
            true,
            true,
        ),
        // The last rows lie past the end of the range.
        (host(), None, 1000, true, false),
        (host(), None, i64::MAX, false, false),
    ];
    for (tags, field, end, desc, from_directory) in cases {
        let r = Req {
            start: i64::MIN,
            end,
            tags,
            field,
            columns: vec![true; COLUMNS],
            want: Want::Ordered { desc, limit: 1 },
        };
        let (sealed, m) = run_sealed(&to_proto(&r), &file);
        assert_eq!(answer_of(&r, &sealed), model_answer(&r, &model), "{r:?}");
        if from_directory {
            assert_eq!(m.pages_decoded, 0, "{r:?}: {m:?}");
            assert!(m.last_points_from_directory >= 1, "{r:?}: {m:?}");
        } else {
            assert_eq!(m.last_points_from_directory, 0, "{r:?}: {m:?}");
            assert!(m.pages_decoded > 0, "{r:?}: {m:?}");
        }
    }
}

/// Tags are constant within a series: a row scan takes them from the
/// series keys in the directory and decodes no tag page.
#[test]
fn row_scans_take_tags_from_series_keys_without_decoding_tag_pages() {
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 2000, 20);
    let time_pages = (rows.len() / 20) as u64;
    for (columns, field) in [
        (vec![true, true, true, false, false], None),
        (
            vec![true, true, true, true, false],
            Some(FieldP::Usage(CompareOp::CmpGt, 90.0)),
        ),
    ] {
        let r = Req {
            start: i64::MIN,
            end: i64::MAX,
            tags: vec![],
            field,
            columns,
            want: Want::Rows { limit: 0 },
        };
        let (sealed, m) = run_sealed(&to_proto(&r), &file);
        assert_eq!(answer_of(&r, &sealed), model_answer(&r, &model_rows(&rows)));
        // Time pages, and usage pages when asked for or filtered on; never
        // the host and region pages (as many again as the time pages each).
        let fields = u64::from(r.columns[3]);
        assert!(m.pages_decoded <= time_pages * (1 + fields), "{m:?}");
    }
}

#[test]
fn requests_the_node_cannot_answer_are_refused_with_a_reason() {
    let mut bad = plain_req();
    bad.order = ScanOrder::OrderTimeDesc as i32;
    let e = Query::compile(&bad).unwrap_err().to_string();
    assert!(e.contains("needs a limit"), "{e}");

    let mut bad = plain_req();
    bad.tag_predicates = vec![TagPredicate {
        column: "usage".into(),
        op: TagOp::TagEq as i32,
        values: vec!["x".into()],
    }];
    let e = Query::compile(&bad).unwrap_err().to_string();
    assert!(e.contains("not a tag"), "{e}");

    let mut bad = plain_req();
    bad.field_predicate = Some(FieldPredicate {
        expr: Some(field_predicate::Expr::Compare(FieldCompare {
            column: "usage".into(),
            op: CompareOp::CmpEq as i32,
            value: Some(Literal {
                value: Some(literal::Value::Str("x".into())),
            }),
        })),
    });
    let e = Query::compile(&bad).unwrap_err().to_string();
    assert!(e.contains("cannot compare"), "{e}");

    // A value comparison over a DOUBLE and a BIGINT column, over a text
    // column, and with an operand missing.
    let value = |v: field_value::Value| FieldValue { value: Some(v) };
    let column = |c: &str| value(field_value::Value::Column(c.into()));
    let sum = |a: FieldValue, b: FieldValue| {
        value(field_value::Value::Arith(Box::new(FieldArith {
            op: ArithOp::ArithAdd as i32,
            left: Some(Box::new(a)),
            right: Some(Box::new(b)),
        })))
    };
    let cases = [
        (
            sum(column("usage"), column("count")),
            Some(column("usage")),
            "mixes types",
        ),
        (
            sum(column("host"), column("host")),
            Some(column("usage")),
            "not a field",
        ),
        (column("usage"), None, "empty operand"),
    ];
    for (left, right, want) in cases {
        let mut bad = plain_req();
        bad.field_predicate = Some(FieldPredicate {
            expr: Some(field_predicate::Expr::CompareValues(FieldValueCompare {
                left: Some(left),
                op: CompareOp::CmpGt as i32,
                right,
            })),
        });
        let e = Query::compile(&bad).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }

    let mut bad = plain_req();
    bad.aggregate = Some(AggregateSpec {
        bucket_width_ns: 0,
        bucket_origin_ns: 0,
        group_tags: vec![],
        calls: vec![AggregateCall {
            function: AggregateFunction::AggSum as i32,
            column: "host".into(),
        }],
        ..Default::default()
    });
    let e = Query::compile(&bad).unwrap_err().to_string();
    assert!(e.contains("does not take"), "{e}");
}

/// Every comparison against literals below, at, between and above the
/// values of each page: pages are skipped by their statistics only when no
/// row can pass, so the answer stays the model's, and some pages go unread.
#[test]
fn field_statistics_skip_pages_only_when_no_row_can_pass() {
    // One host, usage 0, 0.5, 1, ... in time order: pages of 4 rows hold
    // 4 consecutive values.
    let rows: Vec<Row> = (0..64)
        .map(|i| Row {
            host: "h0".into(),
            region: None,
            time: i,
            usage: Some(i as f64 / 2.0),
            count: if i % 5 == 0 { None } else { Some(i) },
            idle: None,
        })
        .collect();
    let stored = stored(&rows);
    let model = model_rows(&stored);
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &stored, 64, 4);
    let ops = [
        CompareOp::CmpEq,
        CompareOp::CmpNe,
        CompareOp::CmpLt,
        CompareOp::CmpLe,
        CompareOp::CmpGt,
        CompareOp::CmpGe,
    ];
    let mut skipped_somewhere = false;
    for op in ops {
        for lit in [-1.0, 0.0, 2.0, 3.5, 7.5, 8.0, 31.5, 40.0] {
            for both in [false, true] {
                let usage = FieldP::Usage(op, lit);
                let field = if both {
                    FieldP::All(
                        Box::new(usage),
                        Box::new(FieldP::Count(CompareOp::CmpGe, 3)),
                    )
                } else {
                    usage
                };
                let r = Req {
                    start: i64::MIN,
                    end: i64::MAX,
                    tags: vec![],
                    field: Some(field),
                    columns: vec![true; COLUMNS],
                    want: Want::Rows { limit: 0 },
                };
                let (sealed, m) = run_sealed(&to_proto(&r), &file);
                assert_eq!(answer_of(&r, &sealed), model_answer(&r, &model), "{r:?}");
                // 16 pages per column, 5 columns. A literal above every
                // value, compared for equality or as a lower bound, leaves
                // no page to read.
                skipped_somewhere |= m.pages_decoded < 5 * 16;
                let rules_out_all = lit == 40.0
                    && matches!(op, CompareOp::CmpEq | CompareOp::CmpGt | CompareOp::CmpGe);
                if rules_out_all {
                    assert_eq!(m.pages_decoded, 0, "{r:?}: {m:?}");
                }
            }
        }
    }
    assert!(skipped_somewhere, "no comparison let a page go unread");
}

/// A comparison of two values (`usage + idle > x`) skips the pages whose
/// statistics bound the sum away from `x`, and answers as the model does
/// wherever `x` lies: below, inside and above the page sums.
#[test]
fn value_comparisons_skip_pages_their_bounds_rule_out() {
    // One host; usage climbs 0, 0.5, ... 31.5 and idle stays at 10, so the
    // sum climbs page by page (pages of 4 rows).
    let rows: Vec<Row> = (0..64)
        .map(|i| Row {
            host: "h0".into(),
            region: None,
            time: i,
            usage: Some(i as f64 / 2.0),
            count: Some(i),
            idle: if i % 9 == 0 { None } else { Some(10.0) },
        })
        .collect();
    let stored = stored(&rows);
    let model = model_rows(&stored);
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &stored, 64, 4);
    let sum = || NumP::Op(ArithOp::ArithAdd, Box::new(NumP::Col), Box::new(NumP::Idle));
    let mut decoded = Vec::new();
    // Literals are read as x / 2: 5, 20, 30 and 45 against sums 10..=41.5.
    for x in [10, 40, 60, 90] {
        for op in [CompareOp::CmpGt, CompareOp::CmpLt, CompareOp::CmpEq] {
            let r = Req {
                start: i64::MIN,
                end: i64::MAX,
                tags: vec![],
                field: Some(FieldP::UsageValues(sum(), op, NumP::Lit(x))),
                columns: vec![true; COLUMNS],
                want: Want::Rows { limit: 0 },
            };
            let (sealed, m) = run_sealed(&to_proto(&r), &file);
            assert_eq!(answer_of(&r, &sealed), model_answer(&r, &model), "{r:?}");
            decoded.push((x, op, m.pages_decoded));
        }
    }
    let pages = |x: i64, op: CompareOp| {
        decoded
            .iter()
            .find(|d| d.0 == x && d.1 == op)
            .map(|d| d.2)
            .unwrap()
    };
    // Sums never pass 41.5: `> 45` and `= 45` read nothing, nor does
    // `< 5`, since every sum is at least 10.
    assert_eq!(pages(90, CompareOp::CmpGt), 0, "{decoded:?}");
    assert_eq!(pages(90, CompareOp::CmpEq), 0, "{decoded:?}");
    assert_eq!(pages(10, CompareOp::CmpLt), 0, "{decoded:?}");
    // `> 30` reads only the pages whose sums can pass it (the later
    // half of the rows), fewer than `> 20` reads.
    assert!(pages(60, CompareOp::CmpGt) > 0, "{decoded:?}");
    assert!(
        pages(60, CompareOp::CmpGt) < pages(40, CompareOp::CmpGt),
        "{decoded:?}"
    );
}

fn one_series(points: &[(i64, f64)]) -> Vec<SortedRow> {
    stored(
        &points
            .iter()
            .map(|&(time, u)| Row {
                host: "h0".into(),
                region: None,
                time,
                usage: Some(u),
                count: None,
                idle: None,
            })
            .collect::<Vec<_>>(),
    )
}

/// Found in review: a page's float sum (a plain loop) folded whole differs
/// from adding its values one by one; float sums are therefore decoded.
#[test]
fn float_sums_are_the_same_on_every_path() {
    for points in [
        vec![(0, 1e16), (1, 1.0), (2, -1e16)],
        vec![(0, 0.0), (1, 1e308), (2, 1e308), (3, -1e308)],
    ] {
        let rows = one_series(&points);
        let dir = tempfile::tempdir().unwrap();
        let file = seal(dir.path(), &rows, 16, 2);
        for kind in [AggregateKind::Sum, AggregateKind::Avg] {
            let r = Req {
                start: i64::MIN,
                end: i64::MAX,
                tags: vec![],
                field: None,
                columns: vec![true; COLUMNS],
                want: Want::Agg {
                    width: 0,
                    origin: 0,
                    by_host: false,
                    by_region: false,
                    calls: vec![(kind, "usage")],
                    as_answers: true,
                },
            };
            let req = to_proto(&r);
            let want = model_answer(&r, &model_rows(&rows));
            assert_eq!(
                answer_of(&r, &run_sealed(&req, &file).0),
                want,
                "{points:?}"
            );
            assert_eq!(answer_of(&r, &run_plain(&req, &rows).0), want, "{points:?}");
        }
    }
}

/// Found in review: a time page's min or max may belong to a row outside
/// the query whose bucket is out of range; that must not fail the scan.
#[test]
fn rows_outside_the_range_do_not_break_bucketing() {
    let rows = one_series(&[(i64::MIN, 1.0), (5, 2.0), (6, 3.0)]);
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 16, 4);
    let r = Req {
        start: 0,
        end: 100,
        tags: vec![],
        field: None,
        columns: vec![true; COLUMNS],
        want: Want::Agg {
            width: 10,
            origin: 0,
            by_host: false,
            by_region: false,
            calls: vec![(AggregateKind::Count, "")],
            as_answers: false,
        },
    };
    let want = model_answer(&r, &model_rows(&rows));
    assert_eq!(answer_of(&r, &run_sealed(&to_proto(&r), &file).0), want);
}

/// Found in review: a tag sealed without a column of its own (the table's
/// columns at seal time were older than the rows) still answers from the
/// series key, as the row path does.
#[test]
fn a_tag_without_a_column_in_the_file_still_answers() {
    // Columns are only ever appended, so the seal's older columns are a
    // prefix of the table's: here the region tag came last.
    let mut newer = table();
    let at = newer.iter().position(|c| c.name == "region").unwrap();
    let region = newer.remove(at);
    newer.push(region);
    let rows = stored_in(
        &newer,
        &[Row {
            host: "h0".into(),
            region: Some("r0".into()),
            time: 1,
            usage: Some(1.0),
            count: Some(1),
            idle: None,
        }],
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.slf");
    let old: Vec<Column> = newer[..newer.len() - 1].to_vec();
    let layout = Layout {
        rows_per_group: 16,
        values_per_page: 4,
        ..Layout::default()
    };
    write_sealed_with(&path, PID, &old, rows.iter().cloned().map(Ok), layout).unwrap();
    let file = SealedFile::open(&path).unwrap();
    let mut req = plain_req();
    req.projection = newer.clone();
    req.table_columns = newer.clone();
    let sealed = batch_rows(&run_sealed(&req, &file).0);
    assert_eq!(sealed, batch_rows(&run_plain(&req, &rows).0));
    assert_eq!(sealed[0][newer.len() - 1], "r0");
}

/// Every tag pinned: the one series is found by binary search in the
/// directory, with the same answer as the model; a key no series has
/// reads nothing.
#[test]
fn a_fully_pinned_series_is_looked_up_by_key() {
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 1000, 100);
    let model = model_rows(&rows);
    for (host, region, want_rows) in [("host_17", "r2", 200), ("host_17", "r0", 0)] {
        let r = Req {
            start: i64::MIN,
            end: i64::MAX,
            tags: vec![
                TagP::Eq("host", host.into()),
                TagP::Eq("region", region.into()),
            ],
            field: None,
            columns: vec![true; COLUMNS],
            want: Want::Rows { limit: 0 },
        };
        let (sealed, m) = run_sealed(&to_proto(&r), &file);
        let got = answer_of(&r, &sealed);
        assert_eq!(got, model_answer(&r, &model));
        let Answer::Rows(got) = got else {
            unreachable!()
        };
        assert_eq!(got.len(), want_rows);
        assert_eq!(
            m.row_groups_total - m.row_groups_skipped,
            u64::from(want_rows > 0)
        );
    }
}

proptest! {
    /// `AggPlan::bucket` is `date_bin`'s `origin + floor((t - origin) /
    /// width) * width`, computed exactly (in i128 here) for any time, width
    /// and origin, and an error exactly when the bucket start is not an i64.
    #[test]
    fn buckets_are_date_bin_for_every_time_width_and_origin(
        time in prop_oneof![any::<i64>(), -1_000_000i64..1_000_000, Just(i64::MIN), Just(i64::MAX)],
        width in prop_oneof![1i64..1_000, 1i64..i64::MAX, Just(i64::MAX)],
        origin in prop_oneof![Just(0i64), any::<i64>(), -1_000i64..1_000],
    ) {
        let plan = super::AggPlan {
            width_ns: width,
            origin_ns: origin,
            group_tags: vec![],
            calls: vec![],
            states_as_answers: false,
        };
        let (t, o, w) = (i128::from(time), i128::from(origin), i128::from(width));
        let want = o + (t - o).div_euclid(w) * w;
        match plan.bucket(time) {
            Ok(b) => prop_assert_eq!(i128::from(b), want),
            Err(_) => prop_assert!(i64::try_from(want).is_err()),
        }
    }
}

/// The counters of a split scan's parts, added up.
fn summed(parts: &[ScanMetrics]) -> ScanMetrics {
    let mut m = ScanMetrics::default();
    for p in parts {
        super::Metrics::add_proto(&mut m, p);
    }
    m
}

#[test]
fn scans_split_over_row_groups_answer_and_count_as_one_and_ordered_scans_refuse() {
    // 10,000 rows in 100-row groups; hosts 20 to 29 pass the tag predicate,
    // so the parts share out 20 of the 100 groups.
    let rows = fleet();
    let dir = tempfile::tempdir().unwrap();
    let file = seal(dir.path(), &rows, 100, 25);
    let hosts = (20..30).map(|h| format!("host_{h:02}")).collect();
    let tags = vec![TagP::In("host".into(), hosts)];
    let rows_req = Req {
        start: 300,
        end: 1_900,
        tags: tags.clone(),
        field: Some(FieldP::Usage(CompareOp::CmpGt, 30.0)),
        columns: vec![true; COLUMNS],
        want: Want::Rows { limit: 0 },
    };
    let agg_req = Req {
        want: Want::Agg {
            width: 100,
            origin: 0,
            by_host: false,
            by_region: true,
            calls: vec![
                (AggregateKind::Count, ""),
                (AggregateKind::Max, "usage"),
                (AggregateKind::Avg, "count"),
            ],
            as_answers: true,
        },
        ..rows_req.clone()
    };
    for r in [&rows_req, &agg_req] {
        let req = to_proto(r);
        let (whole, whole_m) = run_sealed(&req, &file);
        let want = answer_of(r, &whole);
        assert!(
            matches!(&want, Answer::Rows(v) if !v.is_empty())
                || matches!(&want, Answer::Groups(g) if !g.is_empty())
        );
        assert_eq!(
            file.groups_to_read(&Query::compile(&req).unwrap())
                .unwrap()
                .len(),
            20
        );
        for shares in [2, 3, 7, 20, 40] {
            let (batches, parts) = try_sealed_shares(&req, &file, shares).unwrap();
            assert!(
                close(r, &answer_from(r, &batches, true), &want),
                "{shares} parts of {r:?}"
            );
            let mut got = summed(&parts);
            let mut expected = whole_m.clone();
            got.rows_returned = 0;
            expected.rows_returned = 0;
            assert_eq!(got, expected, "{shares} parts of {r:?}");
        }
    }
    // A limit, the first rows by time and the newest rows of each series
    // need one collector.
    for want in [
        Want::Rows { limit: 10 },
        Want::Ordered {
            desc: true,
            limit: 10,
        },
        Want::Last { rows: 1 },
    ] {
        let r = Req {
            want,
            ..rows_req.clone()
        };
        let req = to_proto(&r);
        assert!(!Query::compile(&req).unwrap().splits(), "{r:?}");
        assert!(try_sealed_shares(&req, &file, 2).is_err(), "{r:?}");
    }
}
