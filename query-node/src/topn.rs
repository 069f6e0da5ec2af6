//! `ORDER BY time [DESC] LIMIT n` and last-point pushdown.
//!
//! [`LastPointPushdown`] reads only the newest row of each series under an
//! aggregate that wants each group's newest row (`DISTINCT ON (tags) ...
//! ORDER BY tags, time DESC`); see its documentation.
//!
//! [`TimeOrderPushdown`] is a logical optimizer rule. Under a `Sort` on the
//! time column alone with a fetch of `n` (what DataFusion makes of `ORDER
//! BY time LIMIT n`), it replaces `Filter?(TableScan(sealion table))`,
//! when every filter conjunct is one the nodes evaluate exactly, with a
//! leaf [`SealionRows`] that asks each node for its first `n` rows in that
//! order, reading partitions newest (or oldest) first and stopping once `n`
//! rows are in: a query with no time range reads one partition, not all of
//! them. The `Sort` stays above and merges the nodes' answers, unless every
//! step asks one node (one process, or partitions of a time range on one
//! node): the scan then declares its time order
//! (`SealionScanExec::with_time_order`) and DataFusion puts a limit where
//! the sort was.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchemaRef, ScalarValue};
use datafusion::datasource::{TableProvider, source_as_provider};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, Sort, UserDefinedLogicalNode};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};
use sealion_common::catalog::{arrow_schema, time_column};
use sealion_common::proto::{Column, ScanOrder};
use sealion_format::scan::MAX_ORDERED_LIMIT;

use crate::table::{ScanShape, SealionTable, is_time_column};

/// What the nodes are asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsMode {
    /// The first `limit` rows in time order.
    TimeOrder { desc: bool, limit: usize },
    /// The newest `rows` rows of each series.
    NewestPerSeries { rows: usize },
}

/// A table's rows as the nodes answer them in one of [`RowsMode`]'s
/// shapes.
#[derive(Clone)]
pub struct SealionRows {
    table: Arc<dyn TableProvider>,
    table_id: u64,
    columns: Vec<Column>,
    filters: Vec<Expr>,
    mode: RowsMode,
    schema: DFSchemaRef,
    text: String,
}

crate::leaf::leaf_scan_node!(SealionRows);

/// The optimizer rule; see the module documentation.
#[derive(Debug, Default)]
pub struct TimeOrderPushdown;

impl OptimizerRule for TimeOrderPushdown {
    fn name(&self) -> &str {
        "sealion_time_order_pushdown"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Sort(sort) = &plan else {
            return Ok(Transformed::no(plan));
        };
        match pushed(sort)? {
            Some(input) => Ok(Transformed::yes(LogicalPlan::Sort(Sort {
                expr: sort.expr.clone(),
                input: Arc::new(input),
                fetch: sort.fetch,
            }))),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// The sort's input with its scan replaced, when it can be.
fn pushed(sort: &Sort) -> DfResult<Option<LogicalPlan>> {
    let (Some(limit), [key]) = (sort.fetch, sort.expr.as_slice()) else {
        return Ok(None);
    };
    if limit == 0 || limit as u64 > MAX_ORDERED_LIMIT {
        return Ok(None);
    }
    replace_scan(
        sort.input.as_ref(),
        Some(&key.expr),
        RowsMode::TimeOrder {
            desc: !key.asc,
            limit,
        },
    )
}

/// Looks through projections of plain columns down to `Filter?(TableScan)`
/// and replaces that with a [`SealionRows`]. `key`, when given, must be the
/// table's time column.
fn replace_scan(
    plan: &LogicalPlan,
    key: Option<&Expr>,
    mode: RowsMode,
) -> DfResult<Option<LogicalPlan>> {
    if let LogicalPlan::Projection(p) = plan {
        if !p.expr.iter().all(|e| matches!(e, Expr::Column(_))) {
            return Ok(None);
        }
        return match replace_scan(&p.input, key, mode)? {
            Some(input) => Ok(Some(plan.with_new_exprs(p.expr.clone(), vec![input])?)),
            None => Ok(None),
        };
    }
    let Some(crate::aggregate::ExactScan {
        provider,
        table: t,
        scan,
        filters,
    }) = crate::aggregate::exact_scan(plan)
    else {
        return Ok(None);
    };
    let Some(time) = time_column(&t).map(|c| c.name.clone()) else {
        return Ok(None);
    };
    if key.is_some_and(|k| !is_time_column(k, &time)) {
        return Ok(None);
    }
    let columns: Vec<Column> = match &scan.projection {
        Some(p) => p.iter().map(|&i| t.columns[i].clone()).collect(),
        None => t.columns.clone(),
    };
    let mut text = match mode {
        RowsMode::TimeOrder { desc, limit } => format!(
            "table={} order=time {} limit={limit}",
            t.name,
            if desc { "DESC" } else { "ASC" }
        ),
        RowsMode::NewestPerSeries { rows: 1 } => {
            format!("table={} last row of each series", t.name)
        }
        RowsMode::NewestPerSeries { rows } => {
            format!("table={} newest {rows} rows of each series", t.name)
        }
    };
    if !filters.is_empty() {
        let f: Vec<String> = filters.iter().map(|f| f.to_string()).collect();
        text.push_str(&format!(" filter=[{}]", f.join(" AND ")));
    }
    Ok(Some(LogicalPlan::Extension(Extension {
        node: Arc::new(SealionRows {
            table: provider.clone(),
            table_id: t.id,
            columns,
            filters,
            mode,
            schema: plan.schema().clone(),
            text,
        }),
    })))
}

/// Last-point pushdown: `Aggregate` grouped by tags whose every aggregate
/// is the value of the newest row (`first_value(x ORDER BY time DESC)` or
/// `last_value(x ORDER BY time)`, NULLs respected: what DataFusion makes of
/// `SELECT DISTINCT ON (tags) ... ORDER BY tags, time DESC`) reads only the
/// newest row of each series: the newest row of a group is the newest row
/// of one of its series. The aggregate stays and picks among them.
#[derive(Debug, Default)]
pub struct LastPointPushdown;

impl OptimizerRule for LastPointPushdown {
    fn name(&self) -> &str {
        "sealion_last_point_pushdown"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(agg) = &plan else {
            return Ok(Transformed::no(plan));
        };
        if !newest_row_aggregate(agg) {
            return Ok(Transformed::no(plan));
        }
        match replace_scan(
            agg.input.as_ref(),
            None,
            RowsMode::NewestPerSeries { rows: 1 },
        )? {
            Some(input) => Ok(Transformed::yes(LogicalPlan::Aggregate(
                datafusion::logical_expr::Aggregate::try_new(
                    Arc::new(input),
                    agg.group_expr.clone(),
                    agg.aggr_expr.clone(),
                )?,
            ))),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// Series-limit pushdown: `Filter(rn <= n)` over a window whose only
/// function is `row_number() OVER (PARTITION BY tags ORDER BY time DESC, ...)`
/// (what `QUALIFY row_number() OVER (...) <= n`, or a subquery filtered on
/// its row number, becomes) reads only the newest `n` rows of each series:
/// a row among its group's newest `n` has fewer than `n` newer rows in the
/// group, so fewer than `n` in its series, and every row newer than it in
/// the group is kept for the same reason, so its row number is unchanged.
/// The window and the filter stay and number the rows.
#[derive(Debug, Default)]
pub struct SeriesLimitPushdown;

impl OptimizerRule for SeriesLimitPushdown {
    fn name(&self) -> &str {
        "sealion_series_limit_pushdown"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Filter(filter) = &plan else {
            return Ok(Transformed::no(plan));
        };
        let LogicalPlan::Window(window) = filter.input.as_ref() else {
            return Ok(Transformed::no(plan));
        };
        let Some(rows) = newest_rows_kept(filter, window) else {
            return Ok(Transformed::no(plan));
        };
        match replace_scan(
            window.input.as_ref(),
            None,
            RowsMode::NewestPerSeries { rows },
        )? {
            Some(input) => {
                let window = LogicalPlan::Window(datafusion::logical_expr::Window::try_new(
                    window.window_expr.clone(),
                    Arc::new(input),
                )?);
                Ok(Transformed::yes(LogicalPlan::Filter(
                    datafusion::logical_expr::Filter::try_new(
                        filter.predicate.clone(),
                        Arc::new(window),
                    )?,
                )))
            }
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// `n` when `window` numbers each tag group's rows newest first with
/// `row_number()` and one conjunct of `filter` keeps only numbers up to
/// `n` (at most [`MAX_ORDERED_LIMIT`]).
fn newest_rows_kept(
    filter: &datafusion::logical_expr::Filter,
    window: &datafusion::logical_expr::Window,
) -> Option<usize> {
    use datafusion::logical_expr::expr::{WindowFunction, WindowFunctionDefinition};
    use datafusion::logical_expr::{BinaryExpr, Operator};
    let table = base_table(window.input.as_ref())?;
    let time = time_column(&table)?.name.clone();
    let [e] = window.window_expr.as_slice() else {
        return None;
    };
    let mut inner = e;
    while let Expr::Alias(a) = inner {
        inner = a.expr.as_ref();
    }
    let Expr::WindowFunction(w) = inner else {
        return None;
    };
    let WindowFunction { fun, params } = w.as_ref();
    let WindowFunctionDefinition::WindowUDF(udf) = fun else {
        return None;
    };
    if udf.name() != "row_number"
        || !params.args.is_empty()
        || params.filter.is_some()
        || params.distinct
    {
        return None;
    }
    let tag = |e: &Expr| is_tag_column(&table, e);
    if !params.partition_by.iter().all(tag) {
        return None;
    }
    // Newest first; later keys only break ties between series (a series
    // has one row per time), so the argument above still holds.
    match params.order_by.first() {
        Some(s) if is_time_column(&s.expr, &time) && !s.asc => {}
        _ => return None,
    }
    // The row number's column, as the filter names it.
    let number = window.schema.field(window.schema.fields().len() - 1).name();
    let is_number = |e: &Expr| matches!(e, Expr::Column(c) if c.name == *number);
    let literal = |e: &Expr| match e {
        Expr::Literal(v, _) => match v {
            ScalarValue::UInt64(Some(n)) => i128::try_from(*n).ok(),
            ScalarValue::Int64(Some(n)) => Some(i128::from(*n)),
            ScalarValue::Int32(Some(n)) => Some(i128::from(*n)),
            _ => None,
        },
        _ => None,
    };
    let mut best: Option<i128> = None;
    for c in datafusion::logical_expr::utils::split_conjunction(&filter.predicate) {
        let Expr::BinaryExpr(BinaryExpr { left, op, right }) = c else {
            continue;
        };
        // `rn <= n`, `rn < n`, `rn = n` and their mirror images: every kept
        // number is at most `n`.
        let bound = match (
            is_number(left),
            literal(right),
            literal(left),
            is_number(right),
        ) {
            (true, Some(n), _, _) => match op {
                Operator::LtEq | Operator::Eq => n,
                Operator::Lt => n - 1,
                _ => continue,
            },
            (_, _, Some(n), true) => match op {
                Operator::GtEq | Operator::Eq => n,
                Operator::Gt => n - 1,
                _ => continue,
            },
            _ => continue,
        };
        best = Some(best.map_or(bound, |b| b.min(bound)));
    }
    let n = best?;
    if n < 1 || n > i128::from(MAX_ORDERED_LIMIT) {
        return None;
    }
    usize::try_from(n).ok()
}

/// Whether `agg` groups by tag columns only and every aggregate is the
/// value of the group's newest row.
fn newest_row_aggregate(agg: &datafusion::logical_expr::Aggregate) -> bool {
    use datafusion::functions_aggregate::first_last::{FirstValue, LastValue};
    use datafusion::logical_expr::expr::AggregateFunction;
    let Some(scan_table) = base_table(agg.input.as_ref()) else {
        return false;
    };
    let Some(time) = time_column(&scan_table).map(|c| c.name.clone()) else {
        return false;
    };
    let tag = |e: &Expr| is_tag_column(&scan_table, e);
    if agg.group_expr.is_empty() || !agg.group_expr.iter().all(tag) {
        return false;
    }
    !agg.aggr_expr.is_empty()
        && agg.aggr_expr.iter().all(|e| {
            let e = match e {
                Expr::Alias(a) => a.expr.as_ref(),
                e => e,
            };
            let Expr::AggregateFunction(AggregateFunction { func, params }) = e else {
                return false;
            };
            let inner = func.inner();
            // Sort keys that are group columns are constant in a group
            // (DISTINCT ON orders by them first).
            let keys: Vec<_> = params
                .order_by
                .iter()
                .filter(|s| !agg.group_expr.contains(&s.expr))
                .collect();
            let newest_first = match keys.as_slice() {
                [s] if is_time_column(&s.expr, &time) => !s.asc,
                _ => return false,
            };
            let wants_newest = (inner.is::<FirstValue>() && newest_first)
                || (inner.is::<LastValue>() && !newest_first);
            wants_newest
                && params.filter.is_none()
                && !params.distinct
                && params.null_treatment
                    != Some(datafusion::logical_expr::expr::NullTreatment::IgnoreNulls)
                && params.args.len() == 1
                && matches!(params.args[0], Expr::Column(_))
        })
}

/// Whether `e` is a tag column of `table`.
fn is_tag_column(table: &sealion_common::proto::Table, e: &Expr) -> bool {
    matches!(e, Expr::Column(c) if table.columns.iter().any(|col| {
        col.name == c.name && col.kind() == sealion_common::proto::ColumnKind::Tag
    }))
}

/// The Sealion table under projections and a filter, if that is what
/// `plan` is.
fn base_table(plan: &LogicalPlan) -> Option<sealion_common::proto::Table> {
    match plan {
        LogicalPlan::Projection(p) => base_table(&p.input),
        LogicalPlan::Filter(f) => base_table(&f.input),
        LogicalPlan::TableScan(s) => {
            let provider = source_as_provider(&s.source).ok()?;
            let table = provider.as_ref().downcast_ref::<SealionTable>()?;
            Some(table.table.clone())
        }
        _ => None,
    }
}

/// Plans [`SealionRows`] nodes.
pub struct RowsPlanner;

#[async_trait]
impl ExtensionPlanner for RowsPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        _physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<SealionRows>() else {
            return Ok(None);
        };
        let Some(table) = node.table.as_ref().downcast_ref::<SealionTable>() else {
            return Ok(None);
        };
        let (order, limit, per_series) = match node.mode {
            RowsMode::TimeOrder { desc: true, limit } => (ScanOrder::OrderTimeDesc, Some(limit), 0),
            RowsMode::TimeOrder { desc: false, limit } => (ScanOrder::OrderTimeAsc, Some(limit), 0),
            RowsMode::NewestPerSeries { rows } => (ScanOrder::OrderSeries, None, rows as u64),
        };
        let scan = table.plan_scan(ScanShape {
            projection: node.columns.clone(),
            schema: arrow_schema(&node.columns),
            filters: &node.filters,
            limit,
            aggregate: None,
            order,
            newest_per_series: per_series,
            steps: None,
        })?;
        Ok(Some(Arc::new(scan)))
    }
}
