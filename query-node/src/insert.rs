//! A direct path for `INSERT INTO t [(columns)] VALUES (...), ...` whose
//! values are all literals, into a Sealion table.
//!
//! DataFusion plans such a statement as a VALUES plan of one expression per
//! value, then simplifies, type-checks and casts every one of them: for a
//! batch of 1,000 rows of 21 columns that planning is nearly all of the
//! statement's time. This path builds the batch straight from the literals
//! and casts each column to the table's type with the same Arrow cast
//! kernel DataFusion's plan ends in. Anything else (an expression, a
//! column of mixed literal kinds, a value that does not cast, an unknown
//! table or column, a NULL time) is left to DataFusion, which plans it as
//! before and gives its own answer or error.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray, new_null_array,
};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::record_batch::RecordBatch;
use datafusion::sql::sqlparser::ast::{
    Expr, Ident, Insert, ObjectName, ObjectNamePart, SetExpr, TableObject, UnaryOperator, Value,
};
use sealion_common::catalog::{arrow_schema, find_table};
use sealion_common::proto::{ClusterState, ColumnKind, Table};

/// One literal of a VALUES list.
enum Literal<'a> {
    Null,
    Str(&'a str),
    /// The number's text, with its sign.
    Num(String),
    Bool(bool),
}

fn literal(e: &Expr) -> Option<Literal<'_>> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Null => Some(Literal::Null),
            Value::SingleQuotedString(s) => Some(Literal::Str(s)),
            Value::Number(n, false) => Some(Literal::Num(n.clone())),
            Value::Boolean(b) => Some(Literal::Bool(*b)),
            _ => None,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match expr.as_ref() {
            Expr::Value(v) => match &v.value {
                Value::Number(n, false) => Some(Literal::Num(format!("-{n}"))),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// An identifier as DataFusion resolves it: unquoted ones in lower case.
fn normalized(ident: &Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

fn single_name(name: &ObjectName) -> Option<String> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => Some(normalized(ident)),
        _ => None,
    }
}

/// Each literal of `values` through `pick`, NULLs kept as nulls; None when
/// `pick` refuses one (another kind of literal, a number that does not
/// parse).
fn column_of<'a, T>(
    values: &[Literal<'a>],
    pick: impl Fn(&Literal<'a>) -> Option<T>,
) -> Option<Vec<Option<T>>> {
    values
        .iter()
        .map(|v| match v {
            Literal::Null => Some(None),
            v => pick(v).map(Some),
        })
        .collect()
}

/// The column of literals `values` as an Arrow array of their own type
/// (text, integer, float or boolean; NULLs anywhere), None when kinds mix
/// or a number does not parse.
fn literal_array(values: &[Literal<'_>]) -> Option<ArrayRef> {
    let kind = values.iter().find(|v| !matches!(v, Literal::Null));
    Some(match kind {
        None => new_null_array(&arrow::datatypes::DataType::Null, values.len()),
        Some(Literal::Str(_)) => Arc::new(StringArray::from(column_of(values, |v| match v {
            Literal::Str(s) => Some(*s),
            _ => None,
        })?)),
        Some(Literal::Bool(_)) => Arc::new(BooleanArray::from(column_of(values, |v| match v {
            Literal::Bool(b) => Some(*b),
            _ => None,
        })?)),
        Some(Literal::Num(_)) => {
            fn number<'b>(v: &'b Literal<'_>) -> Option<&'b str> {
                match v {
                    Literal::Num(n) => Some(n),
                    _ => None,
                }
            }
            // Integers when every number is one, else floats.
            match column_of(values, |v| number(v)?.parse::<i64>().ok()) {
                Some(ints) => Arc::new(Int64Array::from(ints)),
                None => Arc::new(Float64Array::from(column_of(values, |v| {
                    number(v)?.parse::<f64>().ok()
                })?)),
            }
        }
        Some(Literal::Null) => return None,
    })
}

/// The table and the batch of rows `insert` writes, when it is a plain
/// INSERT of literal rows into a Sealion table of database `db`; None to
/// leave the statement to DataFusion.
pub fn literal_rows(
    state: &ClusterState,
    db: &str,
    insert: &Insert,
) -> Option<(Table, RecordBatch)> {
    // Only `INSERT INTO name [(columns)] VALUES ...`: no other clause.
    if insert.or.is_some()
        || insert.ignore
        || insert.overwrite
        || insert.table_alias.is_some()
        || !insert.assignments.is_empty()
        || insert.partitioned.is_some()
        || !insert.after_columns.is_empty()
        || insert.on.is_some()
        || insert.returning.is_some()
        || insert.output.is_some()
        || insert.replace_into
        || insert.priority.is_some()
        || insert.insert_alias.is_some()
        || insert.settings.is_some()
        || insert.format_clause.is_some()
    {
        return None;
    }
    let TableObject::TableName(name) = &insert.table else {
        return None;
    };
    let table = find_table(state, db, &single_name(name)?)?.clone();
    let query = insert.source.as_ref()?;
    if query.with.is_some()
        || query.order_by.is_some()
        || query.limit_clause.is_some()
        || query.fetch.is_some()
        || !query.locks.is_empty()
        || query.for_clause.is_some()
        || query.settings.is_some()
        || query.format_clause.is_some()
        || !query.pipe_operators.is_empty()
    {
        return None;
    }
    let SetExpr::Values(values) = query.body.as_ref() else {
        return None;
    };
    if values.explicit_row || values.rows.is_empty() {
        return None;
    }
    // Which table column each VALUES position fills.
    let targets: Vec<usize> = if insert.columns.is_empty() {
        (0..table.columns.len()).collect()
    } else {
        let mut t = Vec::with_capacity(insert.columns.len());
        for c in &insert.columns {
            let name = single_name(c)?;
            let i = table.columns.iter().position(|col| col.name == name)?;
            if t.contains(&i) {
                return None;
            }
            t.push(i);
        }
        t
    };
    let width = targets.len();
    let rows = &values.rows;
    if rows.iter().any(|r| r.content.len() != width) {
        return None;
    }
    let schema = arrow_schema(&table.columns);
    let mut arrays: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| new_null_array(f.data_type(), rows.len()))
        .collect();
    let cast = CastOptions {
        safe: false,
        ..Default::default()
    };
    for (k, &col) in targets.iter().enumerate() {
        let mut lits = Vec::with_capacity(rows.len());
        for r in rows {
            lits.push(literal(&r.content[k])?);
        }
        let array = literal_array(&lits)?;
        let target = schema.field(col).data_type();
        arrays[col] = cast_with_options(&array, target, &cast).ok()?;
    }
    // A time is required of every row (DataFusion refuses the NULL).
    let time = table
        .columns
        .iter()
        .position(|c| c.kind() == ColumnKind::Time)?;
    if arrays[time].null_count() > 0 {
        return None;
    }
    let batch = RecordBatch::try_new(schema, arrays).ok()?;
    Some((table, batch))
}
