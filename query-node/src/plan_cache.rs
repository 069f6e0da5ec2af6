//! Optimized plans of queries that repeat, kept for one catalog version.
//!
//! Planning a small query (SQL to a logical plan, then DataFusion's optimizer
//! with Sealion's rules) costs more than answering it from a sealed
//! directory, and dashboards send the same statements again and again. So
//! the optimized logical plan of a `SELECT` is kept, keyed by database and
//! statement, and reused while meta's state version is the one it was
//! planned under: any change to the catalog (a table, a column, a partition)
//! moves the version and empties the cache. Physical planning still happens
//! per query, and partition pruning reads the partition map then.
//!
//! A plan is kept only when reusing it gives the answer that planning again
//! would ([`reusable`]): every table it reads is a Sealion table (system
//! tables and `information_schema` show state the version does not cover,
//! such as node liveness), and it has no parameter placeholder and calls no
//! function that is not immutable (the optimizer folds `now()` to the
//! query's start time).

use std::collections::HashMap;
use std::sync::Mutex;

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};
use datafusion::sql::sqlparser::ast::Statement;

use crate::table::SealionTable;

/// Plans kept at most; a full cache is emptied before the next one goes in.
pub const MAX_PLANS: usize = 256;
/// Statements longer than this (as SQL text) are planned every time.
pub const MAX_STATEMENT_BYTES: usize = 64 * 1024;

#[derive(Default)]
pub struct PlanCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The meta state version every kept plan was made under.
    version: u64,
    len: usize,
    /// database → statement → optimized plan.
    plans: HashMap<String, HashMap<Statement, LogicalPlan>>,
}

impl Inner {
    /// Forgets every plan unless they were made under `version`.
    fn at(&mut self, version: u64) -> &mut Self {
        if self.version != version {
            self.plans.clear();
            self.len = 0;
            self.version = version;
        }
        self
    }
}

impl PlanCache {
    /// The plan kept for `stmt` in `db`, if it was made under `version`.
    pub fn get(&self, version: u64, db: &str, stmt: &Statement) -> Option<LogicalPlan> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.at(version).plans.get(db)?.get(stmt).cloned()
    }

    /// Keeps `plan` for `stmt` in `db`, made under `version` (read before
    /// planning began, so a plan made from a newer state is never served
    /// under an older version).
    pub fn put(&self, version: u64, db: &str, stmt: &Statement, plan: LogicalPlan) {
        if stmt.to_string().len() > MAX_STATEMENT_BYTES {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = inner.at(version);
        if inner.len >= MAX_PLANS {
            inner.plans.clear();
            inner.len = 0;
        }
        let previous = inner
            .plans
            .entry(db.to_string())
            .or_default()
            .insert(stmt.clone(), plan);
        if previous.is_none() {
            inner.len += 1;
        }
    }

    /// How many plans are kept.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the plan of `stmt` (before optimization) may be kept and reused:
/// a query that reads only Sealion tables, with no placeholder and only
/// immutable functions.
pub fn reusable(stmt: &Statement, plan: &LogicalPlan) -> bool {
    if !matches!(stmt, Statement::Query(_)) {
        return false;
    }
    if matches!(
        plan,
        LogicalPlan::Ddl(_)
            | LogicalPlan::Dml(_)
            | LogicalPlan::Statement(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::Explain(_)
            | LogicalPlan::Analyze(_)
            | LogicalPlan::DescribeTable(_)
    ) {
        return false;
    }
    let mut ok = true;
    let walked = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            let sealion = source_as_provider(&scan.source)
                .is_ok_and(|p| p.downcast_ref::<SealionTable>().is_some());
            if !sealion {
                ok = false;
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                let fixed = match e {
                    Expr::Placeholder(_) => false,
                    Expr::ScalarFunction(f) => {
                        f.func.signature().volatility == Volatility::Immutable
                    }
                    _ => true,
                };
                if fixed {
                    Ok(TreeNodeRecursion::Continue)
                } else {
                    ok = false;
                    Ok(TreeNodeRecursion::Stop)
                }
            })
        })
    });
    walked.is_ok() && ok
}
