//! Tag and field predicates of a scan, compiled from the request and checked
//! against the table's columns, so evaluation cannot meet a surprise.
//!
//! Field predicates follow SQL's three-valued logic: a comparison with a NULL
//! is unknown (`None`), `NOT unknown` is unknown, `false AND unknown` is
//! false, `true OR unknown` is true; a row is kept only when the whole
//! predicate is `Some(true)`. Floats compare in IEEE total order
//! (`f64::total_cmp`), as Arrow's comparison kernels do, so that the node and
//! DataFusion agree on -0.0 and NaN.

use std::cmp::Ordering;
use std::collections::HashSet;

use sealion_common::proto::{
    ArithOp, Column, ColumnKind, CompareOp, DataType, FieldPredicate, FieldValue, TagOp,
    TagPredicate, field_predicate, field_value, literal,
};

use crate::rows::Value;
use crate::{Error, Result};

/// Most values an IN list may hold, and most nodes a field predicate may have.
pub const MAX_IN_VALUES: usize = 100_000;
pub const MAX_PREDICATE_NODES: usize = 10_000;
/// Deepest nesting of a field predicate.
pub const MAX_PREDICATE_DEPTH: usize = 64;

/// One tag predicate.
#[derive(Debug, Clone)]
pub struct TagPred {
    pub column: String,
    pub test: TagTest,
}

#[derive(Debug, Clone)]
pub enum TagTest {
    In(HashSet<String>),
    NotIn(HashSet<String>),
    IsNull,
    IsNotNull,
}

impl TagPred {
    /// Whether a series whose value of this tag is `value` (None = the series
    /// lacks the tag) passes.
    pub fn matches(&self, value: Option<&str>) -> bool {
        match (&self.test, value) {
            (TagTest::In(set), Some(v)) => set.contains(v),
            (TagTest::NotIn(set), Some(v)) => !set.contains(v),
            // NULL = 'x' and NULL <> 'x' are both unknown: the row goes.
            (TagTest::In(_) | TagTest::NotIn(_), None) => false,
            (TagTest::IsNull, v) => v.is_none(),
            (TagTest::IsNotNull, v) => v.is_some(),
        }
    }
}

/// Compiles the request's tag predicates against the table.
pub fn compile_tags(preds: &[TagPredicate], columns: &[Column]) -> Result<Vec<TagPred>> {
    let mut out = Vec::with_capacity(preds.len());
    for p in preds {
        let Some(c) = columns.iter().find(|c| c.name == p.column) else {
            return Err(Error::Invalid(format!(
                "tag predicate on unknown column {:?}",
                p.column
            )));
        };
        if c.kind() != ColumnKind::Tag {
            return Err(Error::Invalid(format!(
                "column {:?} is not a tag",
                p.column
            )));
        }
        if p.values.len() > MAX_IN_VALUES {
            return Err(Error::Invalid(format!(
                "tag predicate on {:?} lists {} values; the limit is {MAX_IN_VALUES}",
                p.column,
                p.values.len()
            )));
        }
        let set = || p.values.iter().cloned().collect::<HashSet<String>>();
        let one = || {
            if p.values.len() == 1 {
                Ok(set())
            } else {
                Err(Error::Invalid(format!(
                    "tag predicate {:?} on {:?} takes one value, got {}",
                    p.op(),
                    p.column,
                    p.values.len()
                )))
            }
        };
        let test = match p.op() {
            TagOp::TagEq => TagTest::In(one()?),
            TagOp::TagNe => TagTest::NotIn(one()?),
            TagOp::TagIn => TagTest::In(set()),
            TagOp::TagNotIn => TagTest::NotIn(set()),
            TagOp::TagIsNull => TagTest::IsNull,
            TagOp::TagIsNotNull => TagTest::IsNotNull,
            TagOp::Unspecified => {
                return Err(Error::Invalid(format!(
                    "tag predicate on {:?} has no operator",
                    p.column
                )));
            }
        };
        out.push(TagPred {
            column: p.column.clone(),
            test,
        });
    }
    Ok(out)
}

/// A compiled field predicate; columns are indexes into [`FieldFilter::columns`].
#[derive(Debug, Clone)]
pub enum Expr {
    Cmp {
        col: usize,
        op: CompareOp,
        lit: Value,
    },
    All(Vec<Expr>),
    Any(Vec<Expr>),
    Not(Box<Expr>),
    IsNull(usize),
    IsNotNull(usize),
    /// Two arithmetic values of one numeric type compared.
    CmpValues {
        left: Num,
        op: CompareOp,
        right: Num,
        ty: NumType,
    },
}

/// The one type of every column and literal of a [`Expr::CmpValues`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumType {
    F64,
    I64,
}

/// An arithmetic value over field columns (indexes into
/// [`FieldFilter::columns`]); every leaf has the comparison's [`NumType`].
#[derive(Debug, Clone)]
pub enum Num {
    Col(usize),
    F64(f64),
    I64(i64),
    Arith(ArithOp, Box<Num>, Box<Num>),
}

impl Num {
    /// The value over `f64` leaves; `col` gives a column's value (None is
    /// NULL, which makes the whole value NULL).
    pub fn eval_f64(&self, col: &mut impl FnMut(usize) -> Option<f64>) -> Option<f64> {
        Some(match self {
            Num::Col(c) => col(*c)?,
            Num::F64(x) => *x,
            // Compile rules out other leaves for a DOUBLE comparison.
            Num::I64(_) => return None,
            Num::Arith(op, a, b) => {
                let (x, y) = (a.eval_f64(col)?, b.eval_f64(col)?);
                match op {
                    ArithOp::ArithAdd => x + y,
                    ArithOp::ArithSub => x - y,
                    ArithOp::ArithMul => x * y,
                    ArithOp::Unspecified => return None,
                }
            }
        })
    }

    /// The value over `i64` leaves, wrapping on overflow as DataFusion's
    /// arithmetic does.
    pub fn eval_i64(&self, col: &mut impl FnMut(usize) -> Option<i64>) -> Option<i64> {
        Some(match self {
            Num::Col(c) => col(*c)?,
            Num::I64(x) => *x,
            Num::F64(_) => return None,
            Num::Arith(op, a, b) => {
                let (x, y) = (a.eval_i64(col)?, b.eval_i64(col)?);
                match op {
                    ArithOp::ArithAdd => x.wrapping_add(y),
                    ArithOp::ArithSub => x.wrapping_sub(y),
                    ArithOp::ArithMul => x.wrapping_mul(y),
                    ArithOp::Unspecified => return None,
                }
            }
        })
    }

    /// The columns this value reads, each once.
    pub fn columns(&self, out: &mut Vec<usize>) {
        match self {
            Num::Col(c) => {
                if !out.contains(c) {
                    out.push(*c);
                }
            }
            Num::F64(_) | Num::I64(_) => {}
            Num::Arith(_, a, b) => {
                a.columns(out);
                b.columns(out);
            }
        }
    }
}

/// Compares two values of a [`Expr::CmpValues`] given how to read a column.
pub fn cmp_values(
    left: &Num,
    op: CompareOp,
    right: &Num,
    ty: NumType,
    mut f64_of: impl FnMut(usize) -> Option<f64>,
    mut i64_of: impl FnMut(usize) -> Option<i64>,
) -> Option<bool> {
    if op == CompareOp::Unspecified {
        return None;
    }
    let ord = match ty {
        NumType::F64 => {
            let a = left.eval_f64(&mut f64_of)?;
            let b = right.eval_f64(&mut f64_of)?;
            a.total_cmp(&b)
        }
        NumType::I64 => {
            let a = left.eval_i64(&mut i64_of)?;
            let b = right.eval_i64(&mut i64_of)?;
            a.cmp(&b)
        }
    };
    Some(holds(op, ord))
}

/// A field predicate and the columns it reads.
#[derive(Debug, Clone)]
pub struct FieldFilter {
    pub expr: Expr,
    pub columns: Vec<Column>,
}

impl FieldFilter {
    pub fn compile(pred: &FieldPredicate, table: &[Column]) -> Result<FieldFilter> {
        let mut columns = Vec::new();
        let mut nodes = 0usize;
        let expr = compile_expr(pred, table, &mut columns, &mut nodes, 0)?;
        Ok(FieldFilter { expr, columns })
    }

    /// Evaluates over the values of [`Self::columns`], in that order.
    pub fn eval(&self, values: &[Option<Value>]) -> Option<bool> {
        eval(&self.expr, values)
    }

    /// True when the row passes (the predicate is true, not unknown).
    pub fn keeps(&self, values: &[Option<Value>]) -> bool {
        self.eval(values) == Some(true)
    }
}

fn compile_expr(
    p: &FieldPredicate,
    table: &[Column],
    columns: &mut Vec<Column>,
    nodes: &mut usize,
    depth: usize,
) -> Result<Expr> {
    *nodes += 1;
    if *nodes > MAX_PREDICATE_NODES || depth > MAX_PREDICATE_DEPTH {
        return Err(Error::Invalid(format!(
            "field predicate is too large (limits: {MAX_PREDICATE_NODES} nodes, depth {MAX_PREDICATE_DEPTH})"
        )));
    }
    let mut column = |name: &str| -> Result<(usize, DataType)> {
        let Some(c) = table.iter().find(|c| c.name == name) else {
            return Err(Error::Invalid(format!(
                "field predicate on unknown column {name:?}"
            )));
        };
        if !matches!(c.kind(), ColumnKind::Field | ColumnKind::Unspecified) {
            return Err(Error::Invalid(format!(
                "field predicate on {name:?}, which is not a field (tags and time have their own predicates)"
            )));
        }
        let i = match columns.iter().position(|x| x.name == name) {
            Some(i) => i,
            None => {
                columns.push(c.clone());
                columns.len() - 1
            }
        };
        Ok((i, c.data_type()))
    };
    let Some(expr) = &p.expr else {
        return Err(Error::Invalid("empty field predicate".into()));
    };
    Ok(match expr {
        field_predicate::Expr::Compare(c) => {
            let (col, ty) = column(&c.column)?;
            let lit = match c.value.as_ref().and_then(|l| l.value.as_ref()) {
                Some(literal::Value::F64(x)) => Value::F64(*x),
                Some(literal::Value::I64(x)) => Value::I64(*x),
                Some(literal::Value::U64(x)) => Value::U64(*x),
                Some(literal::Value::Bool(x)) => Value::Bool(*x),
                Some(literal::Value::Str(x)) => Value::Str(x.clone()),
                None => {
                    return Err(Error::Invalid(format!(
                        "comparison on {:?} has no literal",
                        c.column
                    )));
                }
            };
            let numeric =
                |t: DataType| matches!(t, DataType::Float64 | DataType::Int64 | DataType::Uint64);
            let fits = match (&lit, ty) {
                (Value::F64(_) | Value::I64(_) | Value::U64(_), t) => numeric(t),
                (Value::Bool(_), t) => t == DataType::Bool,
                (Value::Str(_), t) => t == DataType::String,
            };
            if !fits {
                return Err(Error::Invalid(format!(
                    "cannot compare column {:?} ({:?}) with {lit:?}",
                    c.column, ty
                )));
            }
            if c.op() == CompareOp::Unspecified {
                return Err(Error::Invalid(format!(
                    "comparison on {:?} has no operator",
                    c.column
                )));
            }
            Expr::Cmp {
                col,
                op: c.op(),
                lit,
            }
        }
        field_predicate::Expr::All(list) => Expr::All(
            list.terms
                .iter()
                .map(|t| compile_expr(t, table, columns, nodes, depth + 1))
                .collect::<Result<_>>()?,
        ),
        field_predicate::Expr::Any(list) => Expr::Any(
            list.terms
                .iter()
                .map(|t| compile_expr(t, table, columns, nodes, depth + 1))
                .collect::<Result<_>>()?,
        ),
        field_predicate::Expr::Not(inner) => Expr::Not(Box::new(compile_expr(
            inner,
            table,
            columns,
            nodes,
            depth + 1,
        )?)),
        field_predicate::Expr::IsNull(name) => Expr::IsNull(column(name)?.0),
        field_predicate::Expr::IsNotNull(name) => Expr::IsNotNull(column(name)?.0),
        field_predicate::Expr::CompareValues(c) => {
            if c.op() == CompareOp::Unspecified {
                return Err(Error::Invalid("value comparison has no operator".into()));
            }
            let mut leaves = Vec::new();
            let left = compile_num(c.left.as_ref(), &mut column, &mut leaves, nodes, depth + 1)?;
            let right = compile_num(c.right.as_ref(), &mut column, &mut leaves, nodes, depth + 1)?;
            // One type for every leaf: the first column's, or the first
            // literal's when no column is named.
            let ty = leaves
                .iter()
                .find(|l| l.0.starts_with("column"))
                .or(leaves.first())
                .map(|l| l.1)
                .ok_or_else(|| Error::Invalid("value comparison has no operand".into()))?;
            if let Some(bad) = leaves.iter().find(|l| l.1 != ty) {
                return Err(Error::Invalid(format!(
                    "value comparison mixes types: {} is {:?}, not {ty:?}",
                    bad.0, bad.1
                )));
            }
            Expr::CmpValues {
                left,
                op: c.op(),
                right,
                ty,
            }
        }
    })
}

/// A leaf of a value comparison, for its type check: what it is, in
/// words, and its type.
struct Leaf(String, NumType);

fn compile_num(
    v: Option<&FieldValue>,
    column: &mut impl FnMut(&str) -> Result<(usize, DataType)>,
    leaves: &mut Vec<Leaf>,
    nodes: &mut usize,
    depth: usize,
) -> Result<Num> {
    *nodes += 1;
    if *nodes > MAX_PREDICATE_NODES || depth > MAX_PREDICATE_DEPTH {
        return Err(Error::Invalid(format!(
            "field predicate is too large (limits: {MAX_PREDICATE_NODES} nodes, depth {MAX_PREDICATE_DEPTH})"
        )));
    }
    let Some(value) = v.and_then(|v| v.value.as_ref()) else {
        return Err(Error::Invalid(
            "value comparison has an empty operand".into(),
        ));
    };
    Ok(match value {
        field_value::Value::Column(name) => {
            let (i, ty) = column(name)?;
            let t = match ty {
                DataType::Float64 => NumType::F64,
                DataType::Int64 => NumType::I64,
                other => {
                    return Err(Error::Invalid(format!(
                        "arithmetic on column {name:?} of type {other:?} (only DOUBLE and BIGINT)"
                    )));
                }
            };
            leaves.push(Leaf(format!("column {name:?}"), t));
            Num::Col(i)
        }
        field_value::Value::Literal(l) => match l.value.as_ref() {
            Some(literal::Value::F64(x)) => {
                leaves.push(Leaf(format!("literal {x}"), NumType::F64));
                Num::F64(*x)
            }
            Some(literal::Value::I64(x)) => {
                leaves.push(Leaf(format!("literal {x}"), NumType::I64));
                Num::I64(*x)
            }
            _ => {
                return Err(Error::Invalid(
                    "a value comparison takes DOUBLE or BIGINT literals only".into(),
                ));
            }
        },
        field_value::Value::Arith(a) => {
            if a.op() == ArithOp::Unspecified {
                return Err(Error::Invalid("arithmetic has no operator".into()));
            }
            let left = compile_num(a.left.as_deref(), column, leaves, nodes, depth + 1)?;
            let right = compile_num(a.right.as_deref(), column, leaves, nodes, depth + 1)?;
            Num::Arith(a.op(), Box::new(left), Box::new(right))
        }
    })
}

/// Orders two values of comparable types: same type; integers of either
/// signedness exactly; an integer against a float as f64. `None` when the
/// types cannot be compared (compile rules this out).
pub fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    use Value::*;
    Some(match (a, b) {
        (F64(x), F64(y)) => x.total_cmp(y),
        (I64(x), I64(y)) => x.cmp(y),
        (U64(x), U64(y)) => x.cmp(y),
        (I64(x), U64(y)) => i128::from(*x).cmp(&i128::from(*y)),
        (U64(x), I64(y)) => i128::from(*x).cmp(&i128::from(*y)),
        (F64(x), I64(y)) => x.total_cmp(&(*y as f64)),
        (F64(x), U64(y)) => x.total_cmp(&(*y as f64)),
        (I64(x), F64(y)) => (*x as f64).total_cmp(y),
        (U64(x), F64(y)) => (*x as f64).total_cmp(y),
        (Bool(x), Bool(y)) => x.cmp(y),
        (Str(x), Str(y)) => x.as_bytes().cmp(y.as_bytes()),
        _ => return None,
    })
}

/// Whether `ord` (a value compared with a literal) satisfies `op`; false
/// for an unspecified operator.
pub fn holds(op: CompareOp, ord: Ordering) -> bool {
    match op {
        CompareOp::CmpEq => ord == Ordering::Equal,
        CompareOp::CmpNe => ord != Ordering::Equal,
        CompareOp::CmpLt => ord == Ordering::Less,
        CompareOp::CmpLe => ord != Ordering::Greater,
        CompareOp::CmpGt => ord == Ordering::Greater,
        CompareOp::CmpGe => ord != Ordering::Less,
        CompareOp::Unspecified => false,
    }
}

fn eval(e: &Expr, values: &[Option<Value>]) -> Option<bool> {
    match e {
        Expr::Cmp { col, op, lit } => {
            let v = values.get(*col)?.as_ref()?;
            let ord = compare(v, lit)?;
            if *op == CompareOp::Unspecified {
                return None;
            }
            Some(holds(*op, ord))
        }
        Expr::All(terms) => {
            let mut unknown = false;
            for t in terms {
                match eval(t, values) {
                    Some(false) => return Some(false),
                    None => unknown = true,
                    Some(true) => {}
                }
            }
            if unknown { None } else { Some(true) }
        }
        Expr::Any(terms) => {
            let mut unknown = false;
            for t in terms {
                match eval(t, values) {
                    Some(true) => return Some(true),
                    None => unknown = true,
                    Some(false) => {}
                }
            }
            if unknown { None } else { Some(false) }
        }
        Expr::Not(inner) => eval(inner, values).map(|b| !b),
        Expr::IsNull(col) => Some(values.get(*col).is_none_or(Option::is_none)),
        Expr::IsNotNull(col) => Some(values.get(*col).is_some_and(Option::is_some)),
        Expr::CmpValues {
            left,
            op,
            right,
            ty,
        } => cmp_values(
            left,
            *op,
            right,
            *ty,
            |c| match values.get(c)? {
                Some(Value::F64(x)) => Some(*x),
                _ => None,
            },
            |c| match values.get(c)? {
                Some(Value::I64(x)) => Some(*x),
                _ => None,
            },
        ),
    }
}
