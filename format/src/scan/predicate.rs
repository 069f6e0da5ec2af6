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
                    ArithOp::ArithAdd => nan_first(x + y, x, y),
                    ArithOp::ArithSub => nan_first(x - y, x, y),
                    ArithOp::ArithMul => nan_first(x * y, x, y),
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

    /// Bounds `(lo, hi)` of this value over rows whose column `k` lies in
    /// `col(k)` (from page statistics), in [`f64::total_cmp`] order: every
    /// such row's value is in `lo..=hi`. None when it cannot tell: a column
    /// without bounds, a bound or an intermediate bound that is not finite
    /// (a NaN or an infinity could come of it), a leaf of the other type.
    /// Round to nearest is monotone, so bounds computed from the bounds hold
    /// the computed values; a zero bound is widened to both signed zeros,
    /// since a sum or product of zero may carry either sign.
    pub fn range_f64(&self, col: &impl Fn(usize) -> Option<(f64, f64)>) -> Option<(f64, f64)> {
        let finite = |lo: f64, hi: f64| {
            if !lo.is_finite() || !hi.is_finite() {
                return None;
            }
            let lo = if lo == 0.0 { -0.0 } else { lo };
            let hi = if hi == 0.0 { 0.0 } else { hi };
            Some((lo, hi))
        };
        match self {
            Num::Col(c) => {
                let (lo, hi) = col(*c)?;
                finite(lo, hi)
            }
            Num::F64(x) => finite(*x, *x),
            Num::I64(_) => None,
            Num::Arith(op, a, b) => {
                let ((a0, a1), (b0, b1)) = (a.range_f64(col)?, b.range_f64(col)?);
                match op {
                    ArithOp::ArithAdd => finite(a0 + b0, a1 + b1),
                    ArithOp::ArithSub => finite(a0 - b1, a1 - b0),
                    ArithOp::ArithMul => {
                        let corners = [a0 * b0, a0 * b1, a1 * b0, a1 * b1];
                        let lo = corners.iter().copied().fold(f64::INFINITY, f64::min);
                        let hi = corners.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        finite(lo, hi)
                    }
                    ArithOp::Unspecified => None,
                }
            }
        }
    }

    /// [`Num::range_f64`] over `i64` leaves. None when any operation on the
    /// bounds overflows: the values wrap, so no bounds hold them.
    pub fn range_i64(&self, col: &impl Fn(usize) -> Option<(i64, i64)>) -> Option<(i64, i64)> {
        match self {
            Num::Col(c) => col(*c),
            Num::I64(x) => Some((*x, *x)),
            Num::F64(_) => None,
            Num::Arith(op, a, b) => {
                let ((a0, a1), (b0, b1)) = (a.range_i64(col)?, b.range_i64(col)?);
                match op {
                    ArithOp::ArithAdd => Some((a0.checked_add(b0)?, a1.checked_add(b1)?)),
                    ArithOp::ArithSub => Some((a0.checked_sub(b1)?, a1.checked_sub(b0)?)),
                    ArithOp::ArithMul => {
                        let corners = [
                            a0.checked_mul(b0)?,
                            a0.checked_mul(b1)?,
                            a1.checked_mul(b0)?,
                            a1.checked_mul(b1)?,
                        ];
                        Some((*corners.iter().min()?, *corners.iter().max()?))
                    }
                    ArithOp::Unspecified => None,
                }
            }
        }
    }
}

/// Whether `l <op> r` is false for every `l` in `left` and `r` in `right`
/// (inclusive bounds `(lo, hi)`): a range of rows whose values lie in these
/// bounds can be dropped unread.
pub fn ranges_exclude<T: Ord>(op: CompareOp, left: (T, T), right: (T, T)) -> bool {
    let ((l0, l1), (r0, r1)) = (left, right);
    match op {
        CompareOp::CmpEq => l1 < r0 || l0 > r1,
        CompareOp::CmpNe => l0 == l1 && r0 == r1 && l0 == r0,
        CompareOp::CmpLt => l0 >= r1,
        CompareOp::CmpLe => l0 > r1,
        CompareOp::CmpGt => l1 <= r0,
        CompareOp::CmpGe => l1 < r0,
        CompareOp::Unspecified => false,
    }
}

/// Whether the comparison `left <op> right` of type `ty` is false (or
/// unknown) for every row whose columns lie in the bounds `f64_of` and
/// `i64_of` give (from statistics); false when the bounds cannot tell.
pub fn values_excluded(
    left: &Num,
    op: CompareOp,
    right: &Num,
    ty: NumType,
    f64_of: impl Fn(usize) -> Option<(f64, f64)>,
    i64_of: impl Fn(usize) -> Option<(i64, i64)>,
) -> bool {
    match ty {
        NumType::F64 => {
            let key = |(lo, hi): (f64, f64)| (columnwise::total_key(lo), columnwise::total_key(hi));
            match (left.range_f64(&f64_of), right.range_f64(&f64_of)) {
                (Some(l), Some(r)) => ranges_exclude(op, key(l), key(r)),
                _ => false,
            }
        }
        NumType::I64 => match (left.range_i64(&i64_of), right.range_i64(&i64_of)) {
            (Some(l), Some(r)) => ranges_exclude(op, l, r),
            _ => false,
        },
    }
}

/// Column-at-a-time evaluation of [`Num`] and of comparisons, for rows whose
/// values every column holds as one slice (the decoded pages of a sealed
/// file). Each function gives the row-at-a-time functions above
/// ([`Num::eval_f64`], [`Num::eval_i64`], [`cmp_values`]) the same answer for
/// every row whose columns are all non-null; nulls are the caller's, since
/// any null leaf makes a row's comparison unknown.
pub mod columnwise {
    use super::{ArithOp, CompareOp, Num, nan_first};

    /// Writes `num`'s value for each of `len` rows into `out` (cleared
    /// first); `cols[k]` holds filter column `k`'s values for those rows.
    /// `spare` lends scratch buffers (one per level of nesting, kept for
    /// the next call). False when `num` has a leaf of the other type or a
    /// column `cols` does not hold (compile rules both out), or a slice is
    /// shorter than `len`.
    pub fn eval_f64(
        num: &Num,
        cols: &[Option<&[f64]>],
        len: usize,
        out: &mut Vec<f64>,
        spare: &mut Vec<Vec<f64>>,
    ) -> bool {
        out.clear();
        match num {
            Num::Col(c) => match cols.get(*c).copied().flatten().and_then(|v| v.get(..len)) {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            Num::F64(x) => out.resize(len, *x),
            Num::I64(_) => return false,
            Num::Arith(op, a, b) => {
                if !eval_f64(a, cols, len, out, spare) {
                    return false;
                }
                let mut right = spare.pop().unwrap_or_default();
                let ok = eval_f64(b, cols, len, &mut right, spare);
                if ok {
                    let pairs = out.iter_mut().zip(&right);
                    match op {
                        ArithOp::ArithAdd => {
                            pairs.for_each(|(x, y)| *x = nan_first(*x + *y, *x, *y))
                        }
                        ArithOp::ArithSub => {
                            pairs.for_each(|(x, y)| *x = nan_first(*x - *y, *x, *y))
                        }
                        ArithOp::ArithMul => {
                            pairs.for_each(|(x, y)| *x = nan_first(*x * *y, *x, *y))
                        }
                        ArithOp::Unspecified => {
                            spare.push(right);
                            return false;
                        }
                    }
                }
                spare.push(right);
                return ok;
            }
        }
        true
    }

    /// [`eval_f64`] over `i64` leaves, wrapping on overflow as
    /// [`Num::eval_i64`] does.
    pub fn eval_i64(
        num: &Num,
        cols: &[Option<&[i64]>],
        len: usize,
        out: &mut Vec<i64>,
        spare: &mut Vec<Vec<i64>>,
    ) -> bool {
        out.clear();
        match num {
            Num::Col(c) => match cols.get(*c).copied().flatten().and_then(|v| v.get(..len)) {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            Num::I64(x) => out.resize(len, *x),
            Num::F64(_) => return false,
            Num::Arith(op, a, b) => {
                if !eval_i64(a, cols, len, out, spare) {
                    return false;
                }
                let mut right = spare.pop().unwrap_or_default();
                let ok = eval_i64(b, cols, len, &mut right, spare);
                if ok {
                    let pairs = out.iter_mut().zip(&right);
                    match op {
                        ArithOp::ArithAdd => pairs.for_each(|(x, y)| *x = x.wrapping_add(*y)),
                        ArithOp::ArithSub => pairs.for_each(|(x, y)| *x = x.wrapping_sub(*y)),
                        ArithOp::ArithMul => pairs.for_each(|(x, y)| *x = x.wrapping_mul(*y)),
                        ArithOp::Unspecified => {
                            spare.push(right);
                            return false;
                        }
                    }
                }
                spare.push(right);
                return ok;
            }
        }
        true
    }

    /// The key under which `i64` order is `f64::total_cmp`'s order (the
    /// same bit trick `total_cmp` uses), so float comparisons run as
    /// integer ones.
    #[inline]
    pub fn total_key(x: f64) -> i64 {
        let bits = x.to_bits() as i64;
        bits ^ ((((bits >> 63) as u64) >> 1) as i64)
    }

    /// Sets `keep[i]` to `f(left[i], right[i])` for `i` in `0..keep.len()`
    /// (every slice at least that long): one pass, no scratch.
    #[inline(always)]
    fn fill_pairs<T: Copy>(keep: &mut [bool], left: &[T], right: &[T], f: impl Fn(T, T) -> bool) {
        let n = keep.len();
        let rows = keep.iter_mut().zip(left[..n].iter().zip(&right[..n]));
        rows.for_each(|(k, (x, y))| *k = f(*x, *y));
    }

    /// Sets `keep[i]` to `f(values[i])`.
    #[inline(always)]
    fn fill_each<T: Copy>(keep: &mut [bool], values: &[T], f: impl Fn(T) -> bool) {
        let n = keep.len();
        keep.iter_mut()
            .zip(&values[..n])
            .for_each(|(k, x)| *k = f(*x));
    }

    /// Sets `keep[i]` to whether `left[i] <op> right[i]` holds, for `i` in
    /// `0..keep.len()` (every slice at least that long).
    pub fn compare_i64(op: CompareOp, left: &[i64], right: &[i64], keep: &mut [bool]) {
        match op {
            CompareOp::CmpEq => fill_pairs(keep, left, right, |x, y| x == y),
            CompareOp::CmpNe => fill_pairs(keep, left, right, |x, y| x != y),
            CompareOp::CmpLt => fill_pairs(keep, left, right, |x, y| x < y),
            CompareOp::CmpLe => fill_pairs(keep, left, right, |x, y| x <= y),
            CompareOp::CmpGt => fill_pairs(keep, left, right, |x, y| x > y),
            CompareOp::CmpGe => fill_pairs(keep, left, right, |x, y| x >= y),
            CompareOp::Unspecified => keep.fill(false),
        }
    }

    /// Sets `keep[i]` to whether `values[i] <op> lit` holds.
    pub fn compare_i64_lit(op: CompareOp, values: &[i64], lit: i64, keep: &mut [bool]) {
        match op {
            CompareOp::CmpEq => fill_each(keep, values, |x| x == lit),
            CompareOp::CmpNe => fill_each(keep, values, |x| x != lit),
            CompareOp::CmpLt => fill_each(keep, values, |x| x < lit),
            CompareOp::CmpLe => fill_each(keep, values, |x| x <= lit),
            CompareOp::CmpGt => fill_each(keep, values, |x| x > lit),
            CompareOp::CmpGe => fill_each(keep, values, |x| x >= lit),
            CompareOp::Unspecified => keep.fill(false),
        }
    }

    /// [`compare_i64_lit`] for floats in total order: each value's
    /// [`total_key`] is compared with the literal's as it is read.
    pub fn compare_f64_lit(op: CompareOp, values: &[f64], lit: f64, keep: &mut [bool]) {
        let l = total_key(lit);
        let k = total_key;
        match op {
            CompareOp::CmpEq => fill_each(keep, values, |x| k(x) == l),
            CompareOp::CmpNe => fill_each(keep, values, |x| k(x) != l),
            CompareOp::CmpLt => fill_each(keep, values, |x| k(x) < l),
            CompareOp::CmpLe => fill_each(keep, values, |x| k(x) <= l),
            CompareOp::CmpGt => fill_each(keep, values, |x| k(x) > l),
            CompareOp::CmpGe => fill_each(keep, values, |x| k(x) >= l),
            CompareOp::Unspecified => keep.fill(false),
        }
    }

    /// [`compare_i64`] for floats in total order: both sides' [`total_key`]s
    /// are compared as they are read.
    pub fn compare_f64(op: CompareOp, left: &[f64], right: &[f64], keep: &mut [bool]) {
        let k = total_key;
        match op {
            CompareOp::CmpEq => fill_pairs(keep, left, right, |x, y| k(x) == k(y)),
            CompareOp::CmpNe => fill_pairs(keep, left, right, |x, y| k(x) != k(y)),
            CompareOp::CmpLt => fill_pairs(keep, left, right, |x, y| k(x) < k(y)),
            CompareOp::CmpLe => fill_pairs(keep, left, right, |x, y| k(x) <= k(y)),
            CompareOp::CmpGt => fill_pairs(keep, left, right, |x, y| k(x) > k(y)),
            CompareOp::CmpGe => fill_pairs(keep, left, right, |x, y| k(x) >= k(y)),
            CompareOp::Unspecified => keep.fill(false),
        }
    }

    /// The comparison with its sides swapped: `a <op> b` is
    /// `b <swapped(op)> a`.
    pub fn swapped(op: CompareOp) -> CompareOp {
        match op {
            CompareOp::CmpLt => CompareOp::CmpGt,
            CompareOp::CmpLe => CompareOp::CmpGe,
            CompareOp::CmpGt => CompareOp::CmpLt,
            CompareOp::CmpGe => CompareOp::CmpLe,
            other => other,
        }
    }

    /// Scratch buffers of [`compare_values_f64`] and
    /// [`compare_values_i64`], kept from one call to the next.
    #[derive(Default)]
    pub struct Scratch<T> {
        left: Vec<T>,
        right: Vec<T>,
        spare: Vec<Vec<T>>,
    }

    /// Sets `keep[i]` to whether `left <op> right` holds in row `i`, for
    /// the `keep.len()` rows `cols` holds (as [`eval_f64`] reads them). A
    /// column against a column or a literal is compared straight from the
    /// column's slice; any other shape is evaluated into scratch first.
    /// False when [`eval_f64`] would refuse.
    pub fn compare_values_f64(
        left: &Num,
        op: CompareOp,
        right: &Num,
        cols: &[Option<&[f64]>],
        keep: &mut [bool],
        sc: &mut Scratch<f64>,
    ) -> bool {
        let n = keep.len();
        let col = |c: &usize| cols.get(*c).copied().flatten().and_then(|v| v.get(..n));
        match (left, right) {
            (Num::Col(a), Num::Col(b)) => match (col(a), col(b)) {
                (Some(a), Some(b)) => compare_f64(op, a, b, keep),
                _ => return false,
            },
            (Num::Col(a), Num::F64(x)) => match col(a) {
                Some(a) => compare_f64_lit(op, a, *x, keep),
                None => return false,
            },
            (Num::F64(x), Num::Col(b)) => match col(b) {
                Some(b) => compare_f64_lit(swapped(op), b, *x, keep),
                None => return false,
            },
            _ => {
                if !(eval_f64(left, cols, n, &mut sc.left, &mut sc.spare)
                    && eval_f64(right, cols, n, &mut sc.right, &mut sc.spare))
                {
                    return false;
                }
                compare_f64(op, &sc.left, &sc.right, keep);
            }
        }
        true
    }

    /// [`compare_values_f64`] over `i64` leaves.
    pub fn compare_values_i64(
        left: &Num,
        op: CompareOp,
        right: &Num,
        cols: &[Option<&[i64]>],
        keep: &mut [bool],
        sc: &mut Scratch<i64>,
    ) -> bool {
        let n = keep.len();
        let col = |c: &usize| cols.get(*c).copied().flatten().and_then(|v| v.get(..n));
        match (left, right) {
            (Num::Col(a), Num::Col(b)) => match (col(a), col(b)) {
                (Some(a), Some(b)) => compare_i64(op, a, b, keep),
                _ => return false,
            },
            (Num::Col(a), Num::I64(x)) => match col(a) {
                Some(a) => compare_i64_lit(op, a, *x, keep),
                None => return false,
            },
            (Num::I64(x), Num::Col(b)) => match col(b) {
                Some(b) => compare_i64_lit(swapped(op), b, *x, keep),
                None => return false,
            },
            _ => {
                if !(eval_i64(left, cols, n, &mut sc.left, &mut sc.spare)
                    && eval_i64(right, cols, n, &mut sc.right, &mut sc.spare))
                {
                    return false;
                }
                compare_i64(op, &sc.left, &sc.right, keep);
            }
        }
        true
    }

    /// Clears `keep[i]` where `nulls[i]` is set (true = null).
    pub fn drop_nulls(keep: &mut [bool], nulls: &[bool]) {
        keep.iter_mut().zip(nulls).for_each(|(k, n)| *k &= !*n);
    }
}

/// The result `r` of `x op y`, with the NaN it carries fixed: a NaN operand
/// is the result, the left one first (as x86 computes `x op y`). Rust and
/// LLVM leave the sign of a NaN result unspecified (an addition may be
/// commuted), and the sign decides where total order puts it, so without
/// this the row path and the column path could keep different rows.
#[inline]
pub fn nan_first(r: f64, x: f64, y: f64) -> f64 {
    if !r.is_nan() {
        r
    } else if x.is_nan() {
        x
    } else if y.is_nan() {
        y
    } else {
        r
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

#[cfg(test)]
mod tests {
    use super::columnwise;
    use super::*;
    use proptest::prelude::*;

    /// Three columns; a leaf of the other type appears only where the test
    /// asks for one.
    fn num(float: bool) -> impl Strategy<Value = Num> {
        let leaf = prop_oneof![
            3 => (0..3usize).prop_map(Num::Col),
            2 => if float {
                special_f64().prop_map(Num::F64).boxed()
            } else {
                special_i64().prop_map(Num::I64).boxed()
            },
        ];
        leaf.prop_recursive(4, 16, 2, |inner| {
            (
                prop_oneof![
                    Just(ArithOp::ArithAdd),
                    Just(ArithOp::ArithSub),
                    Just(ArithOp::ArithMul)
                ],
                inner.clone(),
                inner,
            )
                .prop_map(|(op, a, b)| Num::Arith(op, Box::new(a), Box::new(b)))
        })
    }

    fn special_f64() -> impl Strategy<Value = f64> + Clone {
        prop_oneof![
            6 => (-20..120i32).prop_map(f64::from),
            2 => (-40..200i32).prop_map(|x| f64::from(x) / 10.0),
            1 => Just(f64::NAN),
            1 => Just(-f64::NAN),
            1 => Just(f64::INFINITY),
            1 => Just(f64::NEG_INFINITY),
            1 => Just(-0.0),
            1 => Just(0.0),
            1 => Just(f64::MAX),
            1 => Just(f64::MIN_POSITIVE),
        ]
    }

    fn special_i64() -> impl Strategy<Value = i64> + Clone {
        prop_oneof![
            6 => -20..120i64,
            1 => Just(i64::MAX),
            1 => Just(i64::MIN),
            1 => Just(i64::MIN / 3),
            1 => any::<i64>(),
        ]
    }

    fn op() -> impl Strategy<Value = CompareOp> {
        prop_oneof![
            Just(CompareOp::CmpEq),
            Just(CompareOp::CmpNe),
            Just(CompareOp::CmpLt),
            Just(CompareOp::CmpLe),
            Just(CompareOp::CmpGt),
            Just(CompareOp::CmpGe),
        ]
    }

    /// Up to 40 rows of three columns, each value NULL or not.
    fn rows<T: std::fmt::Debug + Clone>(
        value: impl Strategy<Value = T> + Clone,
    ) -> impl Strategy<Value = Vec<[Option<T>; 3]>> {
        let cell = prop::option::weighted(0.85, value);
        prop::collection::vec(
            (cell.clone(), cell.clone(), cell).prop_map(|(a, b, c)| [a, b, c]),
            0..40,
        )
    }

    /// Whether each row passes, column at a time: values of NULL cells are
    /// the type's default (as in a decoded page), then every column the
    /// comparison reads drops its NULL rows. None when evaluation refuses.
    fn columnwise_f64(
        left: &Num,
        op: CompareOp,
        right: &Num,
        rows: &[[Option<f64>; 3]],
    ) -> Option<Vec<bool>> {
        let cols: Vec<Vec<f64>> = (0..3)
            .map(|c| rows.iter().map(|r| r[c].unwrap_or_default()).collect())
            .collect();
        let views: Vec<Option<&[f64]>> = cols.iter().map(|c| Some(c.as_slice())).collect();
        let mut keep = vec![false; rows.len()];
        let mut sc = columnwise::Scratch::default();
        if !columnwise::compare_values_f64(left, op, right, &views, &mut keep, &mut sc) {
            return None;
        }
        let mut read = Vec::new();
        left.columns(&mut read);
        right.columns(&mut read);
        for c in read {
            let nulls: Vec<bool> = rows.iter().map(|r| r[c].is_none()).collect();
            columnwise::drop_nulls(&mut keep, &nulls);
        }
        Some(keep)
    }

    fn columnwise_i64(
        left: &Num,
        op: CompareOp,
        right: &Num,
        rows: &[[Option<i64>; 3]],
    ) -> Option<Vec<bool>> {
        let cols: Vec<Vec<i64>> = (0..3)
            .map(|c| rows.iter().map(|r| r[c].unwrap_or_default()).collect())
            .collect();
        let views: Vec<Option<&[i64]>> = cols.iter().map(|c| Some(c.as_slice())).collect();
        let mut keep = vec![false; rows.len()];
        let mut sc = columnwise::Scratch::default();
        if !columnwise::compare_values_i64(left, op, right, &views, &mut keep, &mut sc) {
            return None;
        }
        let mut read = Vec::new();
        left.columns(&mut read);
        right.columns(&mut read);
        for c in read {
            let nulls: Vec<bool> = rows.iter().map(|r| r[c].is_none()).collect();
            columnwise::drop_nulls(&mut keep, &nulls);
        }
        Some(keep)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        /// Column at a time, a DOUBLE comparison keeps exactly the rows for
        /// which the row at a time evaluation says true: NaN of either sign,
        /// signed zeros, infinities and overflow included.
        #[test]
        fn float_comparisons_agree_with_the_row_evaluation(
            left in num(true), op in op(), right in num(true), rows in rows(special_f64()),
        ) {
            let want: Vec<bool> = rows
                .iter()
                .map(|r| {
                    cmp_values(&left, op, &right, NumType::F64, |c| r[c], |_| None) == Some(true)
                })
                .collect();
            prop_assert_eq!(columnwise_f64(&left, op, &right, &rows), Some(want));
        }

        /// The same for BIGINT, whose arithmetic wraps.
        #[test]
        fn integer_comparisons_agree_with_the_row_evaluation(
            left in num(false), op in op(), right in num(false), rows in rows(special_i64()),
        ) {
            let want: Vec<bool> = rows
                .iter()
                .map(|r| {
                    cmp_values(&left, op, &right, NumType::I64, |_| None, |c| r[c]) == Some(true)
                })
                .collect();
            prop_assert_eq!(columnwise_i64(&left, op, &right, &rows), Some(want));
        }

        /// A column compared with a literal keeps the rows `compare` and
        /// `holds` keep.
        #[test]
        fn literal_comparisons_agree_with_the_row_evaluation(
            op in op(),
            floats in prop::collection::vec(special_f64(), 0..40),
            lit_f in special_f64(),
            ints in prop::collection::vec(special_i64(), 0..40),
            lit_i in special_i64(),
        ) {
            let mut keep = vec![false; floats.len()];
            columnwise::compare_f64_lit(op, &floats, lit_f, &mut keep);
            let want: Vec<bool> = floats
                .iter()
                .map(|x| holds(op, x.total_cmp(&lit_f)))
                .collect();
            prop_assert_eq!(keep, want);
            let mut keep = vec![false; ints.len()];
            columnwise::compare_i64_lit(op, &ints, lit_i, &mut keep);
            let want: Vec<bool> = ints
                .iter()
                .map(|x| holds(op, compare(&Value::I64(*x), &Value::I64(lit_i)).unwrap()))
                .collect();
            prop_assert_eq!(keep, want);
        }
    }

    /// Per column, the total-order min and max of its non-null values, as
    /// page statistics keep them.
    fn bounds<T: Copy>(
        rows: &[[Option<T>; 3]],
        cmp: impl Fn(&T, &T) -> std::cmp::Ordering,
    ) -> Vec<Option<(T, T)>> {
        (0..3)
            .map(|c| {
                let mut it = rows.iter().filter_map(|r| r[c]);
                let first = it.next()?;
                Some(it.fold((first, first), |(lo, hi), x| {
                    (
                        if cmp(&x, &lo).is_lt() { x } else { lo },
                        if cmp(&x, &hi).is_gt() { x } else { hi },
                    )
                }))
            })
            .collect()
    }

    /// Small finite values only, so that bounds often prove something.
    fn tame_f64() -> impl Strategy<Value = f64> + Clone {
        prop_oneof![
            4 => (-20..120i32).prop_map(f64::from),
            1 => (-40..40i32).prop_map(|x| f64::from(x) / 8.0),
            1 => Just(-0.0),
            1 => Just(0.0),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// When the bounds of the columns prove a DOUBLE comparison false,
        /// no row within them passes it: NaN, signed zeros, infinities and
        /// overflow included.
        #[test]
        fn float_bounds_exclude_only_rows_that_fail(
            left in num(true),
            op in op(),
            right in num(true),
            rows in prop_oneof![rows(special_f64()), rows(tame_f64())],
        ) {
            let b = bounds(&rows, f64::total_cmp);
            if values_excluded(&left, op, &right, NumType::F64, |c| b[c], |_| None) {
                for r in &rows {
                    let got = cmp_values(&left, op, &right, NumType::F64, |c| r[c], |_| None);
                    prop_assert_ne!(got, Some(true), "{:?}", r);
                }
            }
        }

        /// The same for BIGINT, whose arithmetic wraps.
        #[test]
        fn integer_bounds_exclude_only_rows_that_fail(
            left in num(false),
            op in op(),
            right in num(false),
            rows in prop_oneof![rows(special_i64()), rows(-20..120i64)],
        ) {
            let b = bounds(&rows, i64::cmp);
            if values_excluded(&left, op, &right, NumType::I64, |_| None, |c| b[c]) {
                for r in &rows {
                    let got = cmp_values(&left, op, &right, NumType::I64, |_| None, |c| r[c]);
                    prop_assert_ne!(got, Some(true), "{:?}", r);
                }
            }
        }
    }

    /// Bounds prove what they should: two columns in 0..=100 never sum
    /// past 200, a product of bounds that overflows proves nothing, and a
    /// sum that could be either zero is not taken for one of them.
    #[test]
    fn bounds_prove_comparisons_false() {
        let sum = Num::Arith(
            ArithOp::ArithAdd,
            Box::new(Num::Col(0)),
            Box::new(Num::Col(1)),
        );
        let pct = |_: usize| Some((0.0, 100.0));
        let f = |x: f64| Num::F64(x);
        let ex = |op, right: &Num, bound: &dyn Fn(usize) -> Option<(f64, f64)>| {
            values_excluded(&sum, op, right, NumType::F64, bound, |_| None)
        };
        assert!(ex(CompareOp::CmpGt, &f(250.0), &pct));
        assert!(ex(CompareOp::CmpGt, &f(200.0), &pct));
        assert!(!ex(CompareOp::CmpGe, &f(200.0), &pct));
        assert!(!ex(CompareOp::CmpGt, &f(150.0), &pct));
        assert!(ex(CompareOp::CmpLt, &f(-0.5), &pct));
        assert!(ex(CompareOp::CmpEq, &f(201.0), &pct));
        // NaN or infinite bounds, or no bounds, prove nothing.
        assert!(!ex(CompareOp::CmpGt, &f(250.0), &|_| Some((0.0, f64::NAN))));
        assert!(!ex(CompareOp::CmpGt, &f(250.0), &|_| Some((
            0.0,
            f64::INFINITY
        ))));
        assert!(!ex(CompareOp::CmpGt, &f(250.0), &|_| None));
        // -0.0 + -0.0 is -0.0, 0.0 + -0.0 is 0.0: neither zero is ruled out.
        let zeros = |c: usize| Some(if c == 0 { (-0.0, 0.0) } else { (-0.0, -0.0) });
        assert!(!ex(CompareOp::CmpEq, &f(0.0), &zeros));
        assert!(!ex(CompareOp::CmpEq, &f(-0.0), &zeros));
        assert!(ex(CompareOp::CmpEq, &f(1.0), &zeros));

        let product = Num::Arith(
            ArithOp::ArithMul,
            Box::new(Num::Col(0)),
            Box::new(Num::Col(1)),
        );
        let lit = Num::I64(0);
        let small = |_: usize| Some((1i64, 10i64));
        let huge = |_: usize| Some((1i64, i64::MAX / 2));
        assert!(values_excluded(
            &product,
            CompareOp::CmpLt,
            &lit,
            NumType::I64,
            |_| None,
            small
        ));
        // Wrapping could make it anything.
        assert!(!values_excluded(
            &product,
            CompareOp::CmpLt,
            &lit,
            NumType::I64,
            |_| None,
            huge
        ));
    }

    /// A leaf of the other type, or a column the caller does not hold, is
    /// refused rather than read as something else.
    #[test]
    fn evaluation_refuses_leaves_it_cannot_read() {
        let (mut out, mut spare) = (Vec::new(), Vec::new());
        let col = [1.0, 2.0];
        let cols: [Option<&[f64]>; 2] = [Some(&col), None];
        assert!(columnwise::eval_f64(
            &Num::Col(0),
            &cols,
            2,
            &mut out,
            &mut spare
        ));
        assert_eq!(out, vec![1.0, 2.0]);
        assert!(!columnwise::eval_f64(
            &Num::I64(1),
            &cols,
            2,
            &mut out,
            &mut spare
        ));
        assert!(!columnwise::eval_f64(
            &Num::Col(1),
            &cols,
            2,
            &mut out,
            &mut spare
        ));
        assert!(!columnwise::eval_f64(
            &Num::Col(2),
            &cols,
            2,
            &mut out,
            &mut spare
        ));
        // Shorter than the rows asked for.
        assert!(!columnwise::eval_f64(
            &Num::Col(0),
            &cols,
            3,
            &mut out,
            &mut spare
        ));
        let sum = Num::Arith(
            ArithOp::ArithAdd,
            Box::new(Num::Col(0)),
            Box::new(Num::F64(0.5)),
        );
        assert!(columnwise::eval_f64(&sum, &cols, 2, &mut out, &mut spare));
        assert_eq!(out, vec![1.5, 2.5]);
        let (mut ints, mut spare_i) = (Vec::new(), Vec::new());
        let icols: [Option<&[i64]>; 1] = [Some(&[i64::MAX, 3])];
        let wrap = Num::Arith(
            ArithOp::ArithAdd,
            Box::new(Num::Col(0)),
            Box::new(Num::I64(1)),
        );
        assert!(columnwise::eval_i64(
            &wrap,
            &icols,
            2,
            &mut ints,
            &mut spare_i
        ));
        assert_eq!(ints, vec![i64::MIN, 4]);
        assert!(!columnwise::eval_i64(
            &Num::F64(1.0),
            &icols,
            2,
            &mut ints,
            &mut spare_i
        ));
    }
}
