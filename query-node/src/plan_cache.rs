//! Optimized plans of queries that repeat, kept for one catalog version.
//!
//! Planning a small query (SQL to a logical plan, then DataFusion's optimizer
//! with Sealion's rules) costs more than answering it from a sealed
//! directory, and dashboards send the same statements again and again. So
//! the optimized logical plan of a `SELECT` is kept, keyed by database and
//! statement, and reused while meta's state version is the one it was
//! planned under: any change to the catalog (a table, a column, a partition)
//! moves the version and empties the cache.
//!
//! Beside it, once a kept plan has been planned physically in the session
//! state that kept plans run in, that physical plan is kept too (its
//! [`PhysicalSlot`]), and a repeated query runs a copy of it whose
//! operators' state is reset (`reset_plan_states`, fresh counters and
//! buffers) instead of planning again: the physical optimizer's passes cost
//! more than a small answer. The physical plan holds the partitions and
//! nodes read off the partition map when it was made, which the version
//! covers: a new partition, a seal or a node change moves it. Rows written
//! into a partition the plan already names are read when it runs.
//!
//! A plan is kept only when reusing it gives the answer that planning again
//! would ([`reusable`]): every table it reads is a Sealion table (system
//! tables and `information_schema` show state the version does not cover,
//! such as node liveness), and it has no parameter placeholder and calls no
//! function that is not immutable (the optimizer folds `now()` to the
//! query's start time).
//!
//! Before any of that, the HTTP API parses a SQL text it has seen before
//! from [`ParseCache`]: the statements of up to `MAX_PARSED` short texts,
//! keyed by the text (parsing was a tenth of a one-row answer's work).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::ast::Statement;

use crate::table::SealionTable;

/// Plans kept at most; a full cache is emptied before the next one goes in.
pub const MAX_PLANS: usize = 256;
/// SQL texts whose statements are kept at most (`ParseCache`); a full
/// cache is emptied before the next one goes in.
pub const MAX_PARSED: usize = 256;
/// SQL texts longer than this are parsed every time: with `MAX_PARSED`, it
/// bounds the texts and statements kept to a few megabytes.
pub const MAX_PARSED_BYTES: usize = 4 * 1024;
/// Statements longer than this (as SQL text) are planned every time.
pub const MAX_STATEMENT_BYTES: usize = 64 * 1024;

#[derive(Default)]
pub struct PlanCache {
    inner: Mutex<Inner>,
}

/// The physical plan of a kept plan, once made, and the session state it
/// was made in: it is reused only by a query that runs in that same state
/// (so the options it was planned with are the query's). It is a template
/// and is never run itself; each query runs a copy with fresh state.
#[derive(Default)]
pub struct PhysicalSlot {
    kept: Mutex<Option<(Arc<SessionState>, Arc<dyn ExecutionPlan>)>>,
}

impl PhysicalSlot {
    /// The kept physical plan, if it was made in `state`.
    pub fn get(&self, state: &Arc<SessionState>) -> Option<Arc<dyn ExecutionPlan>> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.as_ref()
            .filter(|(made_in, _)| Arc::ptr_eq(made_in, state))
            .map(|(_, plan)| Arc::clone(plan))
    }

    /// Keeps `plan`, made in `state` and not yet run.
    pub fn put(&self, state: Arc<SessionState>, plan: Arc<dyn ExecutionPlan>) {
        *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some((state, plan));
    }
}

struct Kept {
    plan: LogicalPlan,
    physical: Arc<PhysicalSlot>,
}

#[derive(Default)]
struct Inner {
    /// The meta state version every kept plan was made under.
    version: u64,
    len: usize,
    /// database → statement → optimized plan. Statements are hashed with
    /// Fx, not SipHash: hashing the whole syntax tree on every query was a
    /// few percent of a small answer's time, and with at most `MAX_PLANS`
    /// kept, colliding keys can cost no more than that many comparisons.
    plans: HashMap<String, FxHashMap<Statement, Kept>>,
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
    /// The plan kept for `stmt` in `db`, if it was made under `version`,
    /// and the slot of its physical plan.
    pub fn get(
        &self,
        version: u64,
        db: &str,
        stmt: &Statement,
    ) -> Option<(LogicalPlan, Arc<PhysicalSlot>)> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let kept = inner.at(version).plans.get(db)?.get(stmt)?;
        Some((kept.plan.clone(), Arc::clone(&kept.physical)))
    }

    /// Keeps `plan` for `stmt` in `db`, made under `version` (read before
    /// planning began, so a plan made from a newer state is never served
    /// under an older version). Returns the slot for its physical plan
    /// (`None` when the statement is too long to keep).
    pub fn put(
        &self,
        version: u64,
        db: &str,
        stmt: &Statement,
        plan: LogicalPlan,
    ) -> Option<Arc<PhysicalSlot>> {
        if stmt.to_string().len() > MAX_STATEMENT_BYTES {
            return None;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = inner.at(version);
        if inner.len >= MAX_PLANS {
            inner.plans.clear();
            inner.len = 0;
        }
        let physical = Arc::new(PhysicalSlot::default());
        let previous = inner.plans.entry(db.to_string()).or_default().insert(
            stmt.clone(),
            Kept {
                plan,
                physical: Arc::clone(&physical),
            },
        );
        if previous.is_none() {
            inner.len += 1;
        }
        Some(physical)
    }

    /// How many plans are kept.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The statements of SQL texts parsed before, keyed by the text itself.
/// Parsing depends on nothing but the text (PostgreSQL's dialect, fixed),
/// so a text seen again is answered from here whatever changed since; what
/// the statements mean is for planning, which `PlanCache` keys by the
/// statement. Only texts that parsed, and only short ones, are kept.
#[derive(Default)]
pub struct ParseCache {
    /// Texts hashed with Fx, as statements in `PlanCache`.
    kept: Mutex<FxHashMap<String, Arc<[Statement]>>>,
}

impl ParseCache {
    /// The statements of `sql`: kept ones when the same text was parsed
    /// before, else `parse(sql)` (kept when it succeeds and `sql` is short).
    pub fn get_or_parse(
        &self,
        sql: &str,
        parse: impl FnOnce(&str) -> crate::Result<Vec<Statement>>,
    ) -> crate::Result<Arc<[Statement]>> {
        if sql.len() > MAX_PARSED_BYTES {
            return parse(sql).map(Arc::from);
        }
        if let Some(kept) = self.lock().get(sql) {
            metrics::counter!("sealion_query_parses_reused_total").increment(1);
            return Ok(Arc::clone(kept));
        }
        let statements: Arc<[Statement]> = parse(sql)?.into();
        let mut kept = self.lock();
        if kept.len() >= MAX_PARSED {
            kept.clear();
        }
        kept.insert(sql.to_string(), Arc::clone(&statements));
        Ok(statements)
    }

    /// How many texts are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<String, Arc<[Statement]>>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(sql: &str) -> crate::Result<Vec<Statement>> {
        crate::sql::parse(sql)
    }

    #[test]
    fn a_text_parsed_before_gives_the_statements_a_fresh_parse_gives() {
        let cache = ParseCache::default();
        let sql = "SELECT host, max(usage) FROM cpu WHERE time > now() - INTERVAL '1 hour' GROUP BY host; SELECT 1";
        let first = cache.get_or_parse(sql, parse).unwrap();
        let again = cache
            .get_or_parse(sql, |_| panic!("a kept text is not parsed again"))
            .unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(&*again, parse(sql).unwrap().as_slice());
        assert_eq!(again.len(), 2);
        // Another text (if only by case) is parsed on its own.
        let other = cache.get_or_parse("select 1", parse).unwrap();
        assert_eq!(&*other, parse("select 1").unwrap().as_slice());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn errors_and_long_texts_are_not_kept_and_a_full_cache_starts_over() {
        let cache = ParseCache::default();
        let bad = "SELEC 1";
        assert!(cache.get_or_parse(bad, parse).is_err());
        assert!(cache.get_or_parse(bad, parse).is_err());
        assert!(cache.is_empty());
        let long = format!("SELECT 1 AS \"{}\"", "x".repeat(MAX_PARSED_BYTES));
        let mut parses = 0;
        for _ in 0..2 {
            cache
                .get_or_parse(&long, |s| {
                    parses += 1;
                    parse(s)
                })
                .unwrap();
        }
        assert_eq!(parses, 2);
        assert!(cache.is_empty());
        for i in 0..MAX_PARSED {
            cache.get_or_parse(&format!("SELECT {i}"), parse).unwrap();
        }
        assert_eq!(cache.len(), MAX_PARSED);
        cache.get_or_parse("SELECT 'one more'", parse).unwrap();
        assert_eq!(cache.len(), 1);
    }
}
