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
//! them. The `Sort` stays above and merges the nodes' answers.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::DFSchemaRef;
use datafusion::common::tree_node::Transformed;
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
    /// The newest row of each series.
    LastPerSeries,
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
        RowsMode::LastPerSeries => format!("table={} last row of each series", t.name),
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
        match replace_scan(agg.input.as_ref(), None, RowsMode::LastPerSeries)? {
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
    let tag = |e: &Expr| match e {
        Expr::Column(c) => scan_table
            .columns
            .iter()
            .any(|col| col.name == c.name && col.kind() == sealion_common::proto::ColumnKind::Tag),
        _ => false,
    };
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
        let (order, limit, last_per_series) = match node.mode {
            RowsMode::TimeOrder { desc: true, limit } => {
                (ScanOrder::OrderTimeDesc, Some(limit), false)
            }
            RowsMode::TimeOrder { desc: false, limit } => {
                (ScanOrder::OrderTimeAsc, Some(limit), false)
            }
            RowsMode::LastPerSeries => (ScanOrder::OrderSeries, None, true),
        };
        let scan = table.plan_scan(ScanShape {
            projection: node.columns.clone(),
            schema: arrow_schema(&node.columns),
            filters: &node.filters,
            limit,
            aggregate: None,
            order,
            last_per_series,
            steps: None,
        })?;
        Ok(Some(Arc::new(scan)))
    }
}
