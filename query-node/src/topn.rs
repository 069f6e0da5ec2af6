//! `ORDER BY time [DESC] LIMIT n` pushdown.
//!
//! [`TimeOrderPushdown`] is a logical optimizer rule. Under a `Sort` on the
//! time column alone with a fetch of `n` (what DataFusion makes of `ORDER
//! BY time LIMIT n`), it replaces `Filter?(TableScan(sealion table))`,
//! when every filter conjunct is one the nodes evaluate exactly, with a
//! leaf [`SealionRows`] that asks each node for its first `n` rows in that
//! order, reading partitions newest (or oldest) first and stopping once `n`
//! rows are in: a query with no time range reads one partition, not all of
//! them. The `Sort` stays above and merges the nodes' answers.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::DFSchemaRef;
use datafusion::common::tree_node::Transformed;
use datafusion::datasource::{TableProvider, source_as_provider};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, Sort, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};
use sealion_common::catalog::{arrow_schema, time_column};
use sealion_common::proto::{Column, ScanOrder};
use sealion_format::scan::MAX_ORDERED_LIMIT;

use crate::table::{ScanShape, SealionTable, is_time_column};

/// A table's rows in time order, the first `limit` of them, as the nodes
/// answer them.
#[derive(Clone)]
pub struct SealionRows {
    table: Arc<dyn TableProvider>,
    table_id: u64,
    columns: Vec<Column>,
    filters: Vec<Expr>,
    desc: bool,
    limit: usize,
    schema: DFSchemaRef,
    text: String,
}

impl fmt::Debug for SealionRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SealionRows({})", self.text)
    }
}

impl PartialEq for SealionRows {
    fn eq(&self, other: &Self) -> bool {
        self.table_id == other.table_id
            && self.filters == other.filters
            && self.text == other.text
            && self.schema == other.schema
    }
}

impl Eq for SealionRows {}

impl Hash for SealionRows {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.table_id.hash(state);
        self.filters.hash(state);
        self.text.hash(state);
    }
}

impl PartialOrd for SealionRows {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        (self.table_id, &self.text).partial_cmp(&(other.table_id, &other.text))
    }
}

impl UserDefinedLogicalNodeCore for SealionRows {
    fn name(&self) -> &str {
        "SealionRows"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SealionRows: {}", self.text)
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        _inputs: Vec<LogicalPlan>,
    ) -> DfResult<Self> {
        Ok(self.clone())
    }
}

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
    replace_scan(sort.input.as_ref(), &key.expr, !key.asc, limit)
}

/// Looks through projections of plain columns down to `Filter?(TableScan)`
/// and replaces that with a [`SealionRows`].
fn replace_scan(
    plan: &LogicalPlan,
    key: &Expr,
    desc: bool,
    limit: usize,
) -> DfResult<Option<LogicalPlan>> {
    if let LogicalPlan::Projection(p) = plan {
        if !p.expr.iter().all(|e| matches!(e, Expr::Column(_))) {
            return Ok(None);
        }
        return match replace_scan(&p.input, key, desc, limit)? {
            Some(input) => Ok(Some(plan.with_new_exprs(p.expr.clone(), vec![input])?)),
            None => Ok(None),
        };
    }
    let (predicate, scan) = match plan {
        LogicalPlan::Filter(f) => match f.input.as_ref() {
            LogicalPlan::TableScan(s) => (Some(&f.predicate), s),
            _ => return Ok(None),
        },
        LogicalPlan::TableScan(s) => (None, s),
        _ => return Ok(None),
    };
    if scan.fetch.is_some() || (predicate.is_none() && !scan.filters.is_empty()) {
        return Ok(None);
    }
    let Ok(provider) = source_as_provider(&scan.source) else {
        return Ok(None);
    };
    let Some(table) = provider.as_ref().downcast_ref::<SealionTable>() else {
        return Ok(None);
    };
    let t = &table.table;
    let Some(time) = time_column(t).map(|c| c.name.clone()) else {
        return Ok(None);
    };
    if !is_time_column(key, &time) {
        return Ok(None);
    }
    let mut filters = Vec::new();
    if let Some(p) = predicate {
        for c in split_conjunction(p) {
            if !crate::aggregate::exact(t, &time, c) {
                return Ok(None);
            }
            filters.push(c.clone());
        }
    }
    let columns: Vec<Column> = match &scan.projection {
        Some(p) => p.iter().map(|&i| t.columns[i].clone()).collect(),
        None => t.columns.clone(),
    };
    let mut text = format!(
        "table={} order=time {} limit={}",
        t.name,
        if desc { "DESC" } else { "ASC" },
        limit
    );
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
            desc,
            limit,
            schema: plan.schema().clone(),
            text,
        }),
    })))
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
        let scan = table.plan_scan(ScanShape {
            projection: node.columns.clone(),
            schema: arrow_schema(&node.columns),
            filters: &node.filters,
            limit: Some(node.limit),
            aggregate: None,
            order: if node.desc {
                ScanOrder::OrderTimeDesc
            } else {
                ScanOrder::OrderTimeAsc
            },
        })?;
        Ok(Some(Arc::new(scan)))
    }
}
