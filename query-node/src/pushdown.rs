//! What of a query's filters the storage nodes can apply themselves, and
//! which partitions the tag filters published to meta rule out.
//!
//! What is pushed follows the node's rules exactly (SQL three-valued logic,
//! floats in IEEE total order as Arrow compares them), and only shapes the
//! node accepts are pushed: a filter the node would refuse is left to
//! DataFusion alone. Tag predicates, time bounds (which go into the scan's
//! range) and field comparisons are applied by the nodes to every row they
//! send, so the table reports them `Exact` and DataFusion does not apply
//! them again. A set of field comparisons that together pass the nodes'
//! limits is not pushed at all; the table's scan then applies them itself.

use datafusion::common::ScalarValue;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use sealion_common::proto::{
    ArithOp, ColumnKind, CompareOp, DataType, FieldArith, FieldCompare, FieldPredicate,
    FieldPredicateList, FieldValue, FieldValueCompare, Literal, Partition, Table, TagOp,
    TagPredicate, field_predicate, field_value, literal,
};
use sealion_format::scan::predicate::{MAX_PREDICATE_DEPTH, MAX_PREDICATE_NODES};
use sealion_format::sealed::TagFilters;

/// Most values pushed in one IN list (the node's own limit is higher).
pub(crate) const MAX_PUSHED_IN_VALUES: usize = 10_000;

/// Deepest nesting of one pushed field conjunct, in protobuf messages.
/// The node's compiler refuses a predicate nested deeper than
/// [`MAX_PREDICATE_DEPTH`] of its own levels (each at least one message),
/// and prost's decoder one nested deeper than 100 messages; a conjunct
/// nested this deep still fits both inside the `AND` that [`push`] wraps
/// around several (two messages more) and the scan request around that.
const MAX_PUSHED_FIELD_DEPTH: usize = MAX_PREDICATE_DEPTH - 4;

/// The part of a scan's filters that storage nodes evaluate.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Pushed {
    pub tags: Vec<TagPredicate>,
    pub field: Option<FieldPredicate>,
    /// Per tag compared with `=` or `IN`: the values it may take. A
    /// partition whose tag filters hold none of them cannot match.
    pub tag_sets: Vec<(String, Vec<String>)>,
    /// Field conjuncts the nodes evaluate together made a predicate past
    /// the nodes' size limits, so none was pushed: the table's scan applies
    /// them in a `FilterExec` of its own, and a plan that needs the nodes
    /// to apply every conjunct (a pushed aggregate) must not be made.
    pub field_over_limits: bool,
}

fn column_of<'a>(table: &'a Table, e: &Expr) -> Option<&'a sealion_common::proto::Column> {
    match e {
        Expr::Column(c) => table.columns.iter().find(|x| x.name == c.name),
        _ => None,
    }
}

pub(crate) fn text(e: &Expr) -> Option<String> {
    match e {
        Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
            _,
        ) => Some(s.clone()),
        _ => None,
    }
}

fn is_tag(table: &Table, e: &Expr) -> Option<String> {
    column_of(table, e)
        .filter(|c| c.kind() == ColumnKind::Tag)
        .map(|c| c.name.clone())
}

/// `tag = 'v'`, `'v' = tag`, an OR of those on one tag, or `tag IN (...)`
/// (what DataFusion makes of a short IN list): the tag and its values.
pub(crate) fn tag_in(table: &Table, e: &Expr) -> Option<(String, Vec<String>)> {
    match e {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Eq,
            right,
        }) => match (
            is_tag(table, left),
            text(right),
            is_tag(table, right),
            text(left),
        ) {
            (Some(t), Some(v), _, _) | (_, _, Some(t), Some(v)) => Some((t, vec![v])),
            _ => None,
        },
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => {
            let (a, mut va) = tag_in(table, left)?;
            let (b, vb) = tag_in(table, right)?;
            (a == b).then(|| {
                va.extend(vb);
                (a, va)
            })
        }
        Expr::InList(list) if !list.negated => {
            let values: Option<Vec<String>> = list.list.iter().map(text).collect();
            Some((is_tag(table, &list.expr)?, values?))
        }
        _ => None,
    }
}

pub(crate) fn tag_predicate(table: &Table, e: &Expr) -> Option<TagPredicate> {
    let pred = |column: String, op: TagOp, values: Vec<String>| TagPredicate {
        column,
        op: op as i32,
        values,
    };
    if let Some((t, values)) = tag_in(table, e) {
        return Some(pred(t, TagOp::TagIn, values));
    }
    match e {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::NotEq,
            right,
        }) => match (
            is_tag(table, left),
            text(right),
            is_tag(table, right),
            text(left),
        ) {
            (Some(t), Some(v), _, _) | (_, _, Some(t), Some(v)) => {
                Some(pred(t, TagOp::TagNe, vec![v]))
            }
            _ => None,
        },
        Expr::InList(list) if list.negated => {
            let values: Option<Vec<String>> = list.list.iter().map(text).collect();
            Some(pred(is_tag(table, &list.expr)?, TagOp::TagNotIn, values?))
        }
        Expr::IsNull(inner) => Some(pred(is_tag(table, inner)?, TagOp::TagIsNull, vec![])),
        Expr::IsNotNull(inner) => Some(pred(is_tag(table, inner)?, TagOp::TagIsNotNull, vec![])),
        _ => None,
    }
}

/// A literal the node can compare with a column of type `ty`.
fn literal_for(ty: DataType, v: &ScalarValue) -> Option<Literal> {
    let numeric = matches!(ty, DataType::Float64 | DataType::Int64 | DataType::Uint64);
    let value = match v {
        ScalarValue::Float64(Some(x)) if numeric => literal::Value::F64(*x),
        ScalarValue::Float32(Some(x)) if numeric => literal::Value::F64(f64::from(*x)),
        ScalarValue::Int64(Some(x)) if numeric => literal::Value::I64(*x),
        ScalarValue::Int32(Some(x)) if numeric => literal::Value::I64(i64::from(*x)),
        ScalarValue::Int16(Some(x)) if numeric => literal::Value::I64(i64::from(*x)),
        ScalarValue::Int8(Some(x)) if numeric => literal::Value::I64(i64::from(*x)),
        ScalarValue::UInt64(Some(x)) if numeric => literal::Value::U64(*x),
        ScalarValue::UInt32(Some(x)) if numeric => literal::Value::U64(u64::from(*x)),
        ScalarValue::UInt16(Some(x)) if numeric => literal::Value::U64(u64::from(*x)),
        ScalarValue::UInt8(Some(x)) if numeric => literal::Value::U64(u64::from(*x)),
        ScalarValue::Boolean(Some(x)) if ty == DataType::Bool => literal::Value::Bool(*x),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s))
            if ty == DataType::String =>
        {
            literal::Value::Str(s.clone())
        }
        _ => return None,
    };
    Some(Literal { value: Some(value) })
}

fn field_column<'a>(table: &'a Table, e: &Expr) -> Option<&'a sealion_common::proto::Column> {
    column_of(table, e).filter(|c| matches!(c.kind(), ColumnKind::Field | ColumnKind::Unspecified))
}

fn compare_op(op: Operator) -> Option<(CompareOp, CompareOp)> {
    // (op as written, op with its sides swapped)
    Some(match op {
        Operator::Eq => (CompareOp::CmpEq, CompareOp::CmpEq),
        Operator::NotEq => (CompareOp::CmpNe, CompareOp::CmpNe),
        Operator::Lt => (CompareOp::CmpLt, CompareOp::CmpGt),
        Operator::LtEq => (CompareOp::CmpLe, CompareOp::CmpGe),
        Operator::Gt => (CompareOp::CmpGt, CompareOp::CmpLt),
        Operator::GtEq => (CompareOp::CmpGe, CompareOp::CmpLe),
        _ => return None,
    })
}

/// A filter over field columns in the node's terms, when it has one that
/// the node accepts: a filter nested deeper than the node's limits (a sum
/// of a hundred fields, an OR of a hundred comparisons) would fail the
/// query there, so it is left to DataFusion.
pub(crate) fn field_predicate(table: &Table, e: &Expr) -> Option<FieldPredicate> {
    field_predicate_of(table, e, 0).filter(|p| {
        let (nodes, depth) = predicate_size(p);
        nodes <= MAX_PREDICATE_NODES && depth <= MAX_PUSHED_FIELD_DEPTH
    })
}

/// How many nodes `p` has as the node's compiler counts them (each
/// predicate and each arithmetic value), and how deep it nests in
/// protobuf messages.
fn predicate_size(p: &FieldPredicate) -> (usize, usize) {
    let (nodes, depth) = match &p.expr {
        Some(field_predicate::Expr::All(l) | field_predicate::Expr::Any(l)) => {
            let (n, d) = l
                .terms
                .iter()
                .map(predicate_size)
                .fold((0, 0), |(n, d), (tn, td)| (n + tn, d.max(td)));
            // The list is a message of its own.
            (n, d + 1)
        }
        Some(field_predicate::Expr::Not(inner)) => predicate_size(inner),
        // The comparison's message and its literal's.
        Some(field_predicate::Expr::Compare(_)) => (0, 2),
        Some(field_predicate::Expr::CompareValues(c)) => {
            let (ln, ld) = c.left.as_ref().map_or((0, 0), value_size);
            let (rn, rd) = c.right.as_ref().map_or((0, 0), value_size);
            (ln + rn, 1 + ld.max(rd))
        }
        Some(field_predicate::Expr::IsNull(_) | field_predicate::Expr::IsNotNull(_)) | None => {
            (0, 0)
        }
    };
    (nodes + 1, depth + 1)
}

fn value_size(v: &FieldValue) -> (usize, usize) {
    let (nodes, depth) = match &v.value {
        Some(field_value::Value::Arith(a)) => {
            let (ln, ld) = a.left.as_deref().map_or((0, 0), value_size);
            let (rn, rd) = a.right.as_deref().map_or((0, 0), value_size);
            // The arithmetic is a message of its own.
            (ln + rn, 1 + ld.max(rd))
        }
        Some(field_value::Value::Literal(_)) => (0, 1),
        Some(field_value::Value::Column(_)) | None => (0, 0),
    };
    (nodes + 1, depth + 1)
}

/// `e` as a field predicate, built only as deep as the nodes could take
/// it: `depth` is this call's nesting, and each level is at least one
/// protobuf message, so nothing deeper is looked at (a filter of any depth
/// costs no more than that here).
fn field_predicate_of(table: &Table, e: &Expr, depth: usize) -> Option<FieldPredicate> {
    if depth > MAX_PUSHED_FIELD_DEPTH {
        return None;
    }
    let depth = depth + 1;
    let wrap = |expr| Some(FieldPredicate { expr: Some(expr) });
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => wrap(field_predicate::Expr::All(FieldPredicateList {
                terms: vec![
                    field_predicate_of(table, left, depth)?,
                    field_predicate_of(table, right, depth)?,
                ],
            })),
            Operator::Or => wrap(field_predicate::Expr::Any(FieldPredicateList {
                terms: vec![
                    field_predicate_of(table, left, depth)?,
                    field_predicate_of(table, right, depth)?,
                ],
            })),
            op => {
                let (as_written, swapped) = compare_op(*op)?;
                let (col, op, lit) = match (left.as_ref(), right.as_ref()) {
                    (c @ Expr::Column(_), Expr::Literal(v, _)) => {
                        (field_column(table, c)?, as_written, v)
                    }
                    (Expr::Literal(v, _), c @ Expr::Column(_)) => {
                        (field_column(table, c)?, swapped, v)
                    }
                    (l, r) => {
                        // Arithmetic, or two columns: values of one type.
                        let mut ty = None;
                        let left = field_value(table, l, &mut ty, depth)?;
                        let right = field_value(table, r, &mut ty, depth)?;
                        return wrap(field_predicate::Expr::CompareValues(FieldValueCompare {
                            left: Some(left),
                            op: as_written as i32,
                            right: Some(right),
                        }));
                    }
                };
                wrap(field_predicate::Expr::Compare(FieldCompare {
                    column: col.name.clone(),
                    op: op as i32,
                    value: Some(literal_for(col.data_type(), lit)?),
                }))
            }
        },
        Expr::Not(inner) => wrap(field_predicate::Expr::Not(Box::new(field_predicate_of(
            table, inner, depth,
        )?))),
        Expr::IsNull(inner) => wrap(field_predicate::Expr::IsNull(
            field_column(table, inner)?.name.clone(),
        )),
        Expr::IsNotNull(inner) => wrap(field_predicate::Expr::IsNotNull(
            field_column(table, inner)?.name.clone(),
        )),
        _ => None,
    }
}

/// `e` as an arithmetic value the nodes compute exactly as DataFusion
/// does: `+`, `-` and `*` over DOUBLE or BIGINT field columns and literals,
/// every leaf of the one type `ty` (set by the first leaf). Coercion has
/// already cast what SQL mixes; a cast left in the expression, a NULL
/// literal, division (which errors on zero for integers) and anything else
/// are not pushed.
fn field_value(
    table: &Table,
    e: &Expr,
    ty: &mut Option<DataType>,
    depth: usize,
) -> Option<FieldValue> {
    if depth > MAX_PUSHED_FIELD_DEPTH {
        return None;
    }
    let depth = depth + 1;
    let mut same = |t: DataType| match *ty {
        None => {
            *ty = Some(t);
            true
        }
        Some(have) => have == t,
    };
    let value = match e {
        Expr::Column(_) => {
            let c = field_column(table, e)?;
            let t = c.data_type();
            if !matches!(t, DataType::Float64 | DataType::Int64) || !same(t) {
                return None;
            }
            field_value::Value::Column(c.name.clone())
        }
        Expr::Literal(ScalarValue::Float64(Some(x)), _) if same(DataType::Float64) => {
            field_value::Value::Literal(Literal {
                value: Some(literal::Value::F64(*x)),
            })
        }
        Expr::Literal(ScalarValue::Int64(Some(x)), _) if same(DataType::Int64) => {
            field_value::Value::Literal(Literal {
                value: Some(literal::Value::I64(*x)),
            })
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let op = match op {
                Operator::Plus => ArithOp::ArithAdd,
                Operator::Minus => ArithOp::ArithSub,
                Operator::Multiply => ArithOp::ArithMul,
                _ => return None,
            };
            let left = field_value(table, left, ty, depth)?;
            let right = field_value(table, right, ty, depth)?;
            field_value::Value::Arith(Box::new(FieldArith {
                op: op as i32,
                left: Some(Box::new(left)),
                right: Some(Box::new(right)),
            }))
        }
        _ => return None,
    };
    Some(FieldValue { value: Some(value) })
}

fn describe_value(v: &FieldValue) -> String {
    match &v.value {
        Some(field_value::Value::Column(c)) => c.clone(),
        Some(field_value::Value::Literal(l)) => match &l.value {
            Some(literal::Value::F64(x)) => format!("{x}"),
            Some(literal::Value::I64(x)) => format!("{x}"),
            _ => "?".into(),
        },
        Some(field_value::Value::Arith(a)) => {
            let op = match a.op() {
                ArithOp::ArithAdd => "+",
                ArithOp::ArithSub => "-",
                ArithOp::ArithMul => "*",
                ArithOp::Unspecified => "?",
            };
            let side =
                |s: &Option<Box<FieldValue>>| s.as_deref().map_or("?".into(), describe_value);
            format!("({} {op} {})", side(&a.left), side(&a.right))
        }
        None => "?".into(),
    }
}

/// A field predicate in words, for EXPLAIN.
pub fn describe_field(p: &FieldPredicate) -> String {
    let list = |terms: &[FieldPredicate], sep: &str| {
        let parts: Vec<String> = terms.iter().map(describe_field).collect();
        format!("({})", parts.join(sep))
    };
    match &p.expr {
        Some(field_predicate::Expr::Compare(c)) => {
            let v = match c.value.as_ref().and_then(|l| l.value.as_ref()) {
                Some(literal::Value::F64(x)) => format!("{x}"),
                Some(literal::Value::I64(x)) => format!("{x}"),
                Some(literal::Value::U64(x)) => format!("{x}"),
                Some(literal::Value::Bool(x)) => format!("{x}"),
                Some(literal::Value::Str(x)) => format!("{x:?}"),
                None => "?".into(),
            };
            format!("{} {} {v}", c.column, c.op().as_str_name())
        }
        Some(field_predicate::Expr::All(l)) => list(&l.terms, " AND "),
        Some(field_predicate::Expr::Any(l)) => list(&l.terms, " OR "),
        Some(field_predicate::Expr::Not(inner)) => format!("NOT {}", describe_field(inner)),
        Some(field_predicate::Expr::IsNull(c)) => format!("{c} IS NULL"),
        Some(field_predicate::Expr::IsNotNull(c)) => format!("{c} IS NOT NULL"),
        Some(field_predicate::Expr::CompareValues(c)) => {
            let side = |s: &Option<FieldValue>| s.as_ref().map_or("?".into(), describe_value);
            format!(
                "{} {} {}",
                side(&c.left),
                c.op().as_str_name(),
                side(&c.right)
            )
        }
        None => "?".into(),
    }
}

/// Splits `filters` into what the nodes evaluate; the rest stays with
/// DataFusion only.
pub fn push(table: &Table, filters: &[Expr]) -> Pushed {
    let mut out = Pushed::default();
    let mut fields = Vec::new();
    for e in filters.iter().flat_map(|f| split_conjunction(f)) {
        if let Some(p) = tag_predicate(table, e) {
            if p.values.len() > MAX_PUSHED_IN_VALUES {
                continue;
            }
            if p.op() == TagOp::TagIn {
                out.tag_sets.push((p.column.clone(), p.values.clone()));
            }
            out.tags.push(p);
        } else if let Some(p) = field_predicate(table, e) {
            fields.push(p);
        }
    }
    out.field = match fields.len() {
        0 => None,
        1 => fields.pop(),
        _ => Some(FieldPredicate {
            expr: Some(field_predicate::Expr::All(FieldPredicateList {
                terms: fields,
            })),
        }),
    };
    // Each conjunct fits the nodes' limits alone; together they may not.
    if out
        .field
        .as_ref()
        .is_some_and(|p| predicate_size(p).0 > MAX_PREDICATE_NODES)
    {
        out.field = None;
        out.field_over_limits = true;
    }
    out
}

/// Whether a partition's published tag filters rule it out for `tag_sets`:
/// for some tag, none of the allowed values may be in it. A partition with
/// no published filters (open, or late rows since its seal) is never ruled
/// out, nor one whose filters do not parse.
pub fn ruled_out_by_tags(p: &Partition, tag_sets: &[(String, Vec<String>)]) -> bool {
    if tag_sets.is_empty() || p.tag_filters.is_empty() {
        return false;
    }
    let Ok(filters) = TagFilters::from_bytes(&p.tag_filters) else {
        return false;
    };
    tag_sets
        .iter()
        .any(|(tag, values)| !values.iter().any(|v| filters.may_contain(tag, v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};
    use sealion_common::proto::Column;

    fn table() -> Table {
        let c = |n: &str, k: ColumnKind, t: DataType| Column {
            name: n.into(),
            kind: k as i32,
            data_type: t as i32,
        };
        Table {
            name: "cpu".into(),
            columns: vec![
                c("time", ColumnKind::Time, DataType::Timestamp),
                c("host", ColumnKind::Tag, DataType::String),
                c("usage", ColumnKind::Field, DataType::Float64),
                c("note", ColumnKind::Field, DataType::String),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn tag_and_field_conjuncts_are_pushed_in_the_nodes_terms() {
        let t = table();
        let filters = vec![
            col("host").eq(lit("a")).or(col("host").eq(lit("b"))),
            lit(5.0).lt(col("usage")).and(col("note").is_not_null()),
            col("host").not_eq(lit("c")),
        ];
        let p = push(&t, &filters);
        assert_eq!(
            p.tag_sets,
            vec![("host".to_string(), vec!["a".to_string(), "b".to_string()])]
        );
        assert_eq!(p.tags.len(), 2);
        assert_eq!(p.tags[1].op(), TagOp::TagNe);
        let Some(field_predicate::Expr::All(list)) = p.field.and_then(|f| f.expr) else {
            panic!("two field conjuncts make an AND");
        };
        let Some(field_predicate::Expr::Compare(c)) = &list.terms[0].expr else {
            panic!("a comparison");
        };
        // `5 < usage` is `usage > 5` from the column's side.
        assert_eq!((c.column.as_str(), c.op()), ("usage", CompareOp::CmpGt));
    }

    #[test]
    fn shapes_the_node_would_refuse_stay_with_datafusion() {
        let t = table();
        // A tag against a field in one OR, a text literal against a float, a
        // function of a column: none is pushed.
        let filters = vec![
            col("host").eq(lit("a")).or(col("usage").gt(lit(1.0))),
            col("usage").eq(lit("x")),
            datafusion::functions::expr_fn::abs(col("usage")).gt(lit(1.0)),
        ];
        assert_eq!(push(&t, &filters), Pushed::default());
    }

    #[test]
    fn arithmetic_of_one_numeric_type_is_pushed_as_a_value_comparison() {
        let mut t = table();
        t.columns.push(Column {
            name: "n".into(),
            kind: ColumnKind::Field as i32,
            data_type: DataType::Int64 as i32,
        });
        t.columns.push(Column {
            name: "idle".into(),
            kind: ColumnKind::Field as i32,
            data_type: DataType::Float64 as i32,
        });
        // As coercion leaves them: every leaf of one type.
        let sum = (col("usage") + col("idle")).gt(lit(150.0));
        let p = push(&t, &[sum]);
        let Some(field_predicate::Expr::CompareValues(c)) = p.field.clone().and_then(|f| f.expr)
        else {
            panic!("a value comparison: {p:?}");
        };
        assert_eq!(c.op(), CompareOp::CmpGt);
        assert_eq!(
            describe_field(&p.field.unwrap()),
            "(usage + idle) CMP_GT 150"
        );
        let ints = (col("n") * lit(3i64) - lit(1i64)).lt_eq(col("n") + lit(30i64));
        assert!(push(&t, &[ints]).field.is_some());
        assert!(push(&t, &[col("usage").gt(col("idle"))]).field.is_some());
        // Two types in one comparison, division, a NULL literal, a cast:
        // left to DataFusion.
        let refused = vec![
            (col("usage") + col("n")).gt(lit(1.0)),
            (col("n") + lit(1i64)).gt(lit(1.0)),
            (col("n") / lit(2i64)).gt(lit(1i64)),
            (col("usage") + lit(ScalarValue::Float64(None))).gt(lit(1.0)),
            (datafusion::prelude::cast(col("n"), arrow::datatypes::DataType::Float64)
                + col("usage"))
            .gt(lit(1.0)),
            (col("note") + col("note")).gt(lit("x")),
        ];
        for e in refused {
            assert_eq!(push(&t, std::slice::from_ref(&e)), Pushed::default(), "{e}");
        }
    }

    /// Whether a storage node takes `p` as pushed: through protobuf (as a
    /// cluster's nodes get it) and through the node's compiler.
    fn node_accepts(t: &Table, p: &FieldPredicate) -> Result<(), String> {
        use prost::Message;
        let req = sealion_common::proto::ScanRequest {
            field_predicate: Some(p.clone()),
            ..Default::default()
        };
        let back = sealion_common::proto::ScanRequest::decode(req.encode_to_vec().as_slice())
            .map_err(|e| e.to_string())?;
        let field = back.field_predicate.ok_or("no predicate after decoding")?;
        sealion_format::scan::predicate::FieldFilter::compile(&field, &t.columns)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn filters_past_the_nodes_limits_stay_with_datafusion() {
        let t = table();
        let sum = |terms: usize| {
            (1..terms)
                .fold(col("usage"), |e, _| e + col("usage"))
                .gt(lit(1.0))
        };
        let any = |terms: usize| {
            (1..terms).fold(col("usage").gt(lit(0.0)), |e, i| {
                e.or(col("usage").gt(lit(i as f64)))
            })
        };
        let not = |terms: usize| (0..terms).fold(col("usage").gt(lit(0.0)), |e, _| !e);
        let mut pushed = 0;
        for terms in [1, 2, 5, 10, 20, 25, 28, 30, 33, 40, 50, 64, 80, 200, 1_000] {
            for e in [sum(terms), any(terms), not(terms)] {
                let p = push(&t, std::slice::from_ref(&e));
                assert!(!p.field_over_limits, "one conjunct: {terms}");
                match p.field {
                    Some(f) => {
                        node_accepts(&t, &f).unwrap_or_else(|err| panic!("{terms}: {err}"));
                        pushed += 1;
                    }
                    None => assert!(terms > 25, "{terms} terms should be pushed"),
                }
            }
        }
        assert!(pushed >= 18, "small filters are pushed ({pushed})");
        assert!(push(&t, &[sum(80)]).field.is_none());
        // Conjuncts small alone, too many together: none is pushed, and
        // the scan says so (an aggregate over it cannot be pushed).
        let many =
            |n: usize| -> Vec<Expr> { (0..n).map(|i| col("usage").gt(lit(i as f64))).collect() };
        let p = push(&t, &many(MAX_PREDICATE_NODES));
        assert!(
            p.field.is_none() && p.field_over_limits,
            "{:?}",
            p.field.map(|_| ())
        );
        let p = push(&t, &many(MAX_PREDICATE_NODES / 2));
        assert!(!p.field_over_limits);
        node_accepts(&t, &p.field.expect("pushed")).expect("the node takes it");
    }

    #[test]
    fn published_filters_rule_out_partitions_that_cannot_hold_the_values() {
        let mut values = std::collections::BTreeMap::new();
        values.insert(
            "host".to_string(),
            ["a", "b"]
                .iter()
                .map(|s| s.to_string())
                .collect::<std::collections::BTreeSet<_>>(),
        );
        let sealed = Partition {
            tag_filters: TagFilters::build(&values).to_bytes(),
            ..Default::default()
        };
        let want = |v: &[&str]| {
            vec![(
                "host".to_string(),
                v.iter().map(|s| s.to_string()).collect(),
            )]
        };
        assert!(!ruled_out_by_tags(&sealed, &want(&["a"])));
        assert!(!ruled_out_by_tags(&sealed, &want(&["zz", "b"])));
        assert!(ruled_out_by_tags(&sealed, &want(&["zz"])));
        // A tag the partition never saw cannot equal anything.
        assert!(ruled_out_by_tags(
            &sealed,
            &[("region".to_string(), vec!["eu".to_string()])]
        ));
        // No published filters: never ruled out.
        assert!(!ruled_out_by_tags(&Partition::default(), &want(&["zz"])));
    }
}
