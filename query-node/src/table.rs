//! A Sealion table as DataFusion sees it.
//!
//! `scan` works out which partitions can hold rows of the query's time range
//! (from the filters DataFusion hands it), groups them by the storage node
//! that holds them and streams each node's rows over Arrow Flight, one
//! DataFusion partition per node, so nodes are read in parallel.
//! `insert_into` sends rows through the write router.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::DFSchema;
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::filter::FilterExecBuilder;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;
use sealion_common::catalog::{arrow_schema, partitions_overlapping, time_column};
use sealion_common::proto::{
    AggregateSpec, Column, DeletePredicate, DeleteRequest, ScanOrder, ScanRequest, Table, TagMatch,
};

use crate::router::{StorageClients, WriteRouter};
use crate::scan_exec::{NodeScan, ScanPlan, Schedule, SealionScanExec, Steps};

/// A table's time range of interest, `[start_ns, end_ns)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    pub start_ns: i64,
    pub end_ns: i64,
}

impl TimeRange {
    pub const ALL: TimeRange = TimeRange {
        start_ns: i64::MIN,
        end_ns: i64::MAX,
    };

    pub fn intersect(self, other: TimeRange) -> TimeRange {
        TimeRange {
            start_ns: self.start_ns.max(other.start_ns),
            end_ns: self.end_ns.min(other.end_ns),
        }
    }
}

/// Nanoseconds of a timestamp literal, if `v` is one.
fn timestamp_ns(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::TimestampNanosecond(Some(x), _) => Some(*x),
        ScalarValue::TimestampMicrosecond(Some(x), _) => x.checked_mul(1_000),
        ScalarValue::TimestampMillisecond(Some(x), _) => x.checked_mul(1_000_000),
        ScalarValue::TimestampSecond(Some(x), _) => x.checked_mul(1_000_000_000),
        _ => None,
    }
}

pub(crate) fn is_time_column(e: &Expr, time: &str) -> bool {
    matches!(e, Expr::Column(c) if c.name == time)
}

pub(crate) fn literal_ns(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(v, _) => timestamp_ns(v),
        _ => None,
    }
}

/// The range of `time` that a conjunction of `filters` allows. Filters that
/// do not bound time (or that this function does not understand) leave the
/// range as it is: the answer is a superset, never a subset, of the rows
/// the filters accept.
pub fn time_range_of(filters: &[Expr], time: &str) -> TimeRange {
    let mut range = TimeRange::ALL;
    for f in filters {
        range = range.intersect(bound_of(f, time));
    }
    range
}

fn bound_of(e: &Expr, time: &str) -> TimeRange {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            if *op == Operator::And {
                return bound_of(left, time).intersect(bound_of(right, time));
            }
            if *op == Operator::Or {
                let (a, b) = (bound_of(left, time), bound_of(right, time));
                return TimeRange {
                    start_ns: a.start_ns.min(b.start_ns),
                    end_ns: a.end_ns.max(b.end_ns),
                };
            }
            // `date_trunc(unit, time) op literal` bounds time too: the
            // truncated time is at most `time`, and `time` is less than it
            // plus the unit's longest length.
            if let Some(unit_ns) = truncated_time(left, time) {
                return match (literal_ns(right), *op) {
                    (Some(v), op) => truncated_bound(op, v, unit_ns),
                    _ => TimeRange::ALL,
                };
            }
            if let Some(unit_ns) = truncated_time(right, time) {
                return match (literal_ns(left), op.swap()) {
                    (Some(v), Some(op)) => truncated_bound(op, v, unit_ns),
                    _ => TimeRange::ALL,
                };
            }
            let (op, v) = if is_time_column(left, time) {
                match literal_ns(right) {
                    Some(v) => (*op, v),
                    None => return TimeRange::ALL,
                }
            } else if is_time_column(right, time) {
                match (literal_ns(left), op.swap()) {
                    (Some(v), Some(op)) => (op, v),
                    _ => return TimeRange::ALL,
                }
            } else {
                return TimeRange::ALL;
            };
            match op {
                Operator::Eq => TimeRange {
                    start_ns: v,
                    end_ns: v.saturating_add(1),
                },
                Operator::Gt => TimeRange {
                    start_ns: v.saturating_add(1),
                    end_ns: i64::MAX,
                },
                Operator::GtEq => TimeRange {
                    start_ns: v,
                    end_ns: i64::MAX,
                },
                Operator::Lt => TimeRange {
                    start_ns: i64::MIN,
                    end_ns: v,
                },
                Operator::LtEq => TimeRange {
                    start_ns: i64::MIN,
                    end_ns: v.saturating_add(1),
                },
                _ => TimeRange::ALL,
            }
        }
        Expr::Between(b) if !b.negated && is_time_column(&b.expr, time) => {
            match (literal_ns(&b.low), literal_ns(&b.high)) {
                (Some(lo), Some(hi)) => TimeRange {
                    start_ns: lo,
                    end_ns: hi.saturating_add(1),
                },
                _ => TimeRange::ALL,
            }
        }
        _ => TimeRange::ALL,
    }
}

/// Whether every row a node sends for a scan with filter `e` passes `e`:
/// a tag predicate the nodes are sent (see [`crate::pushdown::push`]) or
/// a bound on the time column (`time` names it) that the scan's time range
/// holds exactly.
pub(crate) fn applied_exactly(table: &Table, time: Option<&str>, e: &Expr) -> bool {
    if let Some(p) = crate::pushdown::tag_predicate(table, e) {
        return p.values.len() <= crate::pushdown::MAX_PUSHED_IN_VALUES;
    }
    time.is_some_and(|t| exact_time_bound(e, t))
}

/// Whether `e` compares the time column itself with a time literal (`=`,
/// `<`, `<=`, `>`, `>=`, or BETWEEN): a bound that is exact, not a superset.
pub(crate) fn exact_time_bound(e: &Expr, time: &str) -> bool {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            matches!(
                op,
                Operator::Eq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
            ) && ((is_time_column(left, time) && literal_ns(right).is_some())
                || (is_time_column(right, time) && literal_ns(left).is_some()))
        }
        Expr::Between(b) => {
            !b.negated
                && is_time_column(&b.expr, time)
                && literal_ns(&b.low).is_some()
                && literal_ns(&b.high).is_some()
        }
        _ => false,
    }
}

/// For `date_trunc('unit', time)`: the longest length of the unit in
/// nanoseconds (a month is at most 31 days, whatever the zone).
fn truncated_time(e: &Expr, time: &str) -> Option<i64> {
    let Expr::ScalarFunction(f) = e else {
        return None;
    };
    if !f
        .func
        .inner()
        .is::<datafusion::functions::datetime::date_trunc::DateTruncFunc>()
    {
        return None;
    }
    let [unit, arg] = f.args.as_slice() else {
        return None;
    };
    if !is_time_column(arg, time) {
        return None;
    }
    const SECOND: i64 = 1_000_000_000;
    const DAY: i64 = 86_400 * SECOND;
    Some(match crate::pushdown::text(unit)?.to_lowercase().as_str() {
        "microsecond" => 1_000,
        "millisecond" => 1_000_000,
        "second" => SECOND,
        "minute" => 60 * SECOND,
        // An hour or a day can be longer across a zone's clock change.
        "hour" => 2 * 3_600 * SECOND,
        "day" => DAY + 3_600 * SECOND,
        "week" => 7 * DAY + 3_600 * SECOND,
        "month" => 32 * DAY,
        "quarter" => 93 * DAY,
        "year" => 367 * DAY,
        _ => return None,
    })
}

/// Bounds on time from `date_trunc(unit, time) op v`, a superset of the
/// times that satisfy it: `trunc(t) <= t < trunc(t) + unit`.
fn truncated_bound(op: Operator, v: i64, unit_ns: i64) -> TimeRange {
    let at_most = |end: i64| TimeRange {
        start_ns: i64::MIN,
        end_ns: end,
    };
    let at_least = |start: i64| TimeRange {
        start_ns: start,
        end_ns: i64::MAX,
    };
    match op {
        Operator::Eq => TimeRange {
            start_ns: v,
            end_ns: v.saturating_add(unit_ns),
        },
        Operator::GtEq => at_least(v),
        Operator::Gt => at_least(v.saturating_add(1)),
        Operator::Lt => at_most(v.saturating_add(unit_ns)),
        Operator::LtEq => at_most(v.saturating_add(unit_ns).saturating_add(1)),
        _ => TimeRange::ALL,
    }
}

pub struct SealionTable {
    pub table: Table,
    pub schema: SchemaRef,
    pub meta: Arc<sealion_common::meta_client::MetaClient>,
    pub storage: Arc<StorageClients>,
    pub router: Arc<WriteRouter>,
}

impl fmt::Debug for SealionTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SealionTable({}.{})",
            self.table.database, self.table.name
        )
    }
}

impl SealionTable {
    pub fn new(
        table: Table,
        meta: Arc<sealion_common::meta_client::MetaClient>,
        storage: Arc<StorageClients>,
        router: Arc<WriteRouter>,
    ) -> Self {
        let schema = arrow_schema(&table.columns);
        SealionTable {
            table,
            schema,
            meta,
            storage,
            router,
        }
    }

    /// Plans the scan of this table for `shape`: which partitions can hold
    /// rows (time range, then published tag filters), which node is asked
    /// for each, and the request each node gets.
    pub fn plan_scan(&self, shape: ScanShape<'_>) -> DfResult<SealionScanExec> {
        let time = time_column(&self.table)
            .map(|c| c.name.clone())
            .unwrap_or_default();
        let range = time_range_of(shape.filters, &time);
        let state = self.meta.state();
        let pushed = crate::pushdown::push(&self.table, shape.filters);
        let overlapping = if range.start_ns < range.end_ns {
            partitions_overlapping(&state, self.table.id, range.start_ns, range.end_ns)
        } else {
            Vec::new()
        };
        let total = overlapping.len();
        let in_table = state
            .partitions
            .iter()
            .filter(|p| p.table_id == self.table.id)
            .count();
        // Sealed partitions whose published tag filters cannot hold the
        // values asked for are never contacted.
        let parts: Vec<_> = overlapping
            .into_iter()
            .filter(|p| !crate::pushdown::ruled_out_by_tags(p, &pushed.tag_sets))
            .collect();
        metrics::counter!("sealion_query_partitions_pruned_by_tag_filter_total")
            .increment((total - parts.len()) as u64);
        metrics::counter!("sealion_query_partitions_scanned_total").increment(parts.len() as u64);
        let parts_scanned = parts.len();
        tracing::debug!(
            table = %self.table.name,
            partitions = total,
            pruned_by_tag_filter = total - parts.len(),
            "scan planned"
        );
        // A parallel scan asks every node once, for all of its partitions.
        // An ordered one asks step by step, a step being the partitions of
        // one time range, newest (or oldest) first, one request per node.
        let newest_first = match shape.order {
            ScanOrder::OrderTimeDesc => Some(true),
            ScanOrder::OrderTimeAsc => Some(false),
            ScanOrder::OrderSeries => shape.steps,
        };
        let ordered = newest_first.is_some();
        let mut requests: std::collections::BTreeMap<(usize, u64), Vec<u64>> = Default::default();
        let mut ranges: Vec<(i64, i64)> = parts.iter().map(|p| (p.start_ns, p.end_ns)).collect();
        ranges.sort_unstable();
        ranges.dedup();
        if newest_first == Some(true) {
            ranges.reverse();
        }
        for p in parts {
            let Some(&primary) = p.replicas.first() else {
                continue;
            };
            let step = if ordered {
                ranges
                    .iter()
                    .position(|r| *r == (p.start_ns, p.end_ns))
                    .unwrap_or(0)
            } else {
                0
            };
            requests.entry((step, primary)).or_default().push(p.id);
        }
        // No node to ask still plans a scan (of nothing), so EXPLAIN shows
        // what was pruned.
        let field_predicate = pushed.field.clone();
        let mut nodes: Vec<NodeScan> = Vec::with_capacity(requests.len());
        let mut steps = Vec::with_capacity(requests.len());
        for ((step, node_id), partition_ids) in requests {
            steps.push(step);
            let addr = sealion_common::catalog::node(&state, node_id)
                .map(|n| n.addr.clone())
                .ok_or_else(|| {
                    DataFusionError::Execution(format!(
                        "storage node {node_id} is not in the cluster state"
                    ))
                })?;
            let ticket = ScanRequest {
                table_id: self.table.id,
                partition_ids,
                start_ns: range.start_ns,
                end_ns: range.end_ns,
                projection: shape.projection.clone(),
                table_columns: self.table.columns.clone(),
                limit: shape.limit.map_or(0, |l| l as u64),
                tag_predicates: pushed.tags.clone(),
                field_predicate: field_predicate.clone(),
                aggregate: shape.aggregate.clone(),
                order: shape.order as i32,
                last_per_series: shape.newest_per_series > 0,
                rows_per_series: shape.newest_per_series,
                ..Default::default()
            };
            nodes.push(NodeScan {
                node_id,
                addr,
                ticket,
            });
        }
        let mut described: Vec<String> = pushed
            .tags
            .iter()
            .map(|t| format!("{} {} {:?}", t.column, t.op().as_str_name(), t.values))
            .collect();
        if let Some(f) = &field_predicate {
            described.push(format!(
                "field filter {}",
                crate::pushdown::describe_field(f)
            ));
        }
        match shape.order {
            ScanOrder::OrderSeries => {}
            ScanOrder::OrderTimeAsc => described.push("order time ASC".into()),
            ScanOrder::OrderTimeDesc => described.push("order time DESC".into()),
        }
        if let Some(l) = shape.limit {
            described.push(format!("limit {l}"));
        }
        match shape.newest_per_series {
            0 => {}
            1 => described.push("last row of each series".into()),
            n => described.push(format!("newest {n} rows of each series")),
        }
        if let Some(a) = &shape.aggregate {
            described.push(crate::aggregate::describe_spec(a));
        }
        let plan = ScanPlan {
            table: self.table.name.clone(),
            partitions_total: in_table,
            pruned_by_time: in_table - total,
            pruned_by_tag_filter: total - parts_scanned,
            pushed: described,
        };
        let schedule = match (ordered, shape.limit) {
            (true, Some(limit)) => Schedule::Ordered {
                limit: limit as u64,
            },
            _ => Schedule::Parallel,
        };
        if !ordered {
            ranges.clear();
        }
        let scan = SealionScanExec::with_schedule(
            shape.schema,
            nodes,
            Steps {
                of_nodes: steps,
                ranges,
            },
            schedule,
            plan,
            self.storage.clone(),
        );
        Ok(match shape.order {
            ScanOrder::OrderTimeDesc => scan.with_time_order(&time, true),
            ScanOrder::OrderTimeAsc => scan.with_time_order(&time, false),
            ScanOrder::OrderSeries => scan,
        })
    }
}

/// `e` with its columns named without the table, as the scan's own
/// schema names them.
fn unqualified(e: Expr) -> DfResult<Expr> {
    e.transform(|e| {
        Ok(match e {
            Expr::Column(c) if c.relation.is_some() => Transformed::yes(Expr::Column(
                datafusion::common::Column::new_unqualified(c.name),
            )),
            e => Transformed::no(e),
        })
    })
    .map(|t| t.data)
}

/// What a scan asks of the storage nodes.
pub struct ScanShape<'a> {
    /// Columns returned (row scans).
    pub projection: Vec<Column>,
    /// Schema of the batches the nodes send.
    pub schema: SchemaRef,
    /// Conjuncts of the query's filter: they bound time, prune partitions
    /// and are pushed where the nodes can evaluate them.
    pub filters: &'a [Expr],
    pub limit: Option<usize>,
    /// Partial aggregation instead of rows.
    pub aggregate: Option<AggregateSpec>,
    /// Rows in time order (with `limit`): each node answers its first
    /// `limit` rows in that order, and partitions are read in that order
    /// until `limit` rows are in.
    pub order: ScanOrder,
    /// Only the newest this many rows of each series (0: every row; one
    /// comes from sealed directories where the node can).
    pub newest_per_series: u64,
    /// With `order` `OrderSeries`: group the requests into steps by time
    /// range all the same, newest first when `Some(true)` and oldest first
    /// when `Some(false)`, for a consumer that runs the steps one at a time
    /// ([`SealionScanExec::execute_step`]).
    pub steps: Option<bool>,
}

#[async_trait]
impl TableProvider for SealionTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Tag predicates the nodes take (`=`, `<>`, `IN`, `NOT IN`, `IS
    /// [NOT] NULL` with at most [`crate::pushdown::MAX_PUSHED_IN_VALUES`]
    /// values), comparisons of the time column with a time literal and
    /// field comparisons the nodes evaluate ([`crate::pushdown::field_predicate`])
    /// are `Exact`: DataFusion neither applies them again nor reads their
    /// columns for them. Each is judged alone, so the answer does not depend
    /// on which other filters come with it; a set of field comparisons that
    /// together pass the nodes' limits is applied by [`SealionTable::scan`]
    /// itself. Everything else is `Inexact`: used to prune partitions and
    /// applied again by DataFusion.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        let time = time_column(&self.table).map(|c| c.name.as_str());
        Ok(filters
            .iter()
            .map(|f| {
                if applied_exactly(&self.table, time, f)
                    || crate::pushdown::field_predicate(&self.table, f).is_some()
                {
                    TableProviderFilterPushDown::Exact
                } else {
                    TableProviderFilterPushDown::Inexact
                }
            })
            .collect())
    }

    /// A scan of the nodes. When the field comparisons among `filters`
    /// together pass the nodes' limits, none is sent
    /// ([`crate::pushdown::Pushed::field_over_limits`]); they were reported
    /// `Exact`, so a `FilterExec` here applies them to the nodes' rows
    /// (which then also carry the columns they read) and projects those
    /// columns away again, and the nodes get no limit.
    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut indices: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.table.columns.len()).collect(),
        };
        let asked = indices.len();
        let time = time_column(&self.table)
            .map(|c| c.name.clone())
            .unwrap_or_default();
        let range = time_range_of(filters, &time);
        if range.start_ns >= range.end_ns {
            let columns: Vec<Column> = indices
                .iter()
                .map(|&i| self.table.columns[i].clone())
                .collect();
            return Ok(Arc::new(EmptyExec::new(arrow_schema(&columns))));
        }
        let here: Vec<Expr> = if crate::pushdown::push(&self.table, filters).field_over_limits {
            filters
                .iter()
                .flat_map(|f| split_conjunction(f))
                .filter(|e| crate::pushdown::field_predicate(&self.table, e).is_some())
                .map(|e| unqualified(e.clone()))
                .collect::<DfResult<_>>()?
        } else {
            Vec::new()
        };
        for e in &here {
            for c in e.column_refs() {
                let i = self.table.columns.iter().position(|x| x.name == c.name);
                if let Some(i) = i
                    && !indices.contains(&i)
                {
                    indices.push(i);
                }
            }
        }
        let columns: Vec<Column> = indices
            .iter()
            .map(|&i| self.table.columns[i].clone())
            .collect();
        let schema = arrow_schema(&columns);
        let scan = Arc::new(self.plan_scan(ScanShape {
            projection: columns,
            schema: schema.clone(),
            filters,
            limit: if here.is_empty() { limit } else { None },
            aggregate: None,
            order: ScanOrder::OrderSeries,
            newest_per_series: 0,
            steps: None,
        })?);
        let Some(predicate) = conjunction(here) else {
            return Ok(scan);
        };
        let predicate = state.create_physical_expr(predicate, &DFSchema::try_from(schema)?)?;
        let filter = FilterExecBuilder::new(predicate, scan)
            .apply_projection(Some((0..asked).collect()))?
            .with_fetch(limit)
            .build()?;
        Ok(Arc::new(filter))
    }

    /// `DELETE FROM t WHERE ...` with conditions the storage nodes apply
    /// exactly: tag `=` and `IN`, and comparisons of the time column with
    /// time literals. Anything else is refused with an error naming it,
    /// rather than deleting more or fewer rows than asked.
    async fn delete_from(
        &self,
        _state: &dyn Session,
        filters: Vec<Expr>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let time = time_column(&self.table)
            .map(|c| c.name.clone())
            .unwrap_or_default();
        let predicate =
            delete_predicate(&self.table, &time, &filters).map_err(|e| e.into_datafusion())?;
        let state = self.meta.state();
        let parts =
            partitions_overlapping(&state, self.table.id, predicate.start_ns, predicate.end_ns);
        let mut by_node: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
        for p in parts {
            if let Some(&primary) = p.replicas.first() {
                by_node.entry(primary).or_default().push(p.id);
            }
        }
        let mut targets = Vec::new();
        for (node_id, ids) in by_node {
            let addr = sealion_common::catalog::node(&state, node_id)
                .map(|n| n.addr.clone())
                .ok_or_else(|| {
                    DataFusionError::Execution(format!("storage node {node_id} is unknown"))
                })?;
            targets.push((node_id, addr, ids));
        }
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("count", arrow::datatypes::DataType::UInt64, false),
        ]));
        let stream = DeleteStream {
            schema: schema.clone(),
            table_id: self.table.id,
            predicate,
            targets,
            storage: self.storage.clone(),
        };
        Ok(Arc::new(StreamingTableExec::try_new(
            schema,
            vec![Arc::new(stream)],
            None,
            Vec::new(),
            false,
            None,
        )?))
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if insert_op != InsertOp::Append {
            return Err(DataFusionError::NotImplemented(format!(
                "{insert_op} into a Sealion table; rows are appended (a row with the same series and time replaces the old one)"
            )));
        }
        let sink = TableSink {
            table: self.table.clone(),
            schema: self.schema.clone(),
            router: self.router.clone(),
        };
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }
}

/// Turns the conjuncts of a DELETE's WHERE into a storage predicate.
pub fn delete_predicate(
    table: &Table,
    time: &str,
    filters: &[Expr],
) -> crate::Result<DeletePredicate> {
    let mut pred = DeletePredicate {
        start_ns: i64::MIN,
        end_ns: i64::MAX,
        tags: vec![],
    };
    let refuse = |e: &Expr| {
        crate::Error::NotSupported(format!(
            "DELETE condition {e}: use tag = 'v', tag IN (...) and comparisons of {time} with time literals, joined by AND"
        ))
    };
    let mut add_tag = |name: String, values: Vec<String>| {
        match pred.tags.iter_mut().find(|m| m.name == name) {
            // Two conditions on one tag: a row must meet both.
            Some(m) => m.values.retain(|v| values.contains(v)),
            None => pred.tags.push(TagMatch { name, values }),
        }
    };
    let mut range = TimeRange::ALL;
    for f in filters {
        match f {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::And,
                right,
            }) => {
                let inner = delete_predicate(table, time, &[(**left).clone(), (**right).clone()])?;
                range = range.intersect(TimeRange {
                    start_ns: inner.start_ns,
                    end_ns: inner.end_ns,
                });
                for m in inner.tags {
                    add_tag(m.name, m.values);
                }
            }
            e if crate::pushdown::tag_in(table, e).is_some() => {
                if let Some((t, v)) = crate::pushdown::tag_in(table, e) {
                    add_tag(t, v);
                }
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right })
                if matches!(
                    op,
                    Operator::Eq | Operator::Gt | Operator::GtEq | Operator::Lt | Operator::LtEq
                ) && ((is_time_column(left, time) && literal_ns(right).is_some())
                    || (is_time_column(right, time) && literal_ns(left).is_some())) =>
            {
                range = range.intersect(bound_of(f, time));
            }
            Expr::Between(b)
                if !b.negated
                    && is_time_column(&b.expr, time)
                    && literal_ns(&b.low).is_some()
                    && literal_ns(&b.high).is_some() =>
            {
                range = range.intersect(bound_of(f, time));
            }
            other => return Err(refuse(other)),
        }
    }
    pred.start_ns = range.start_ns;
    pred.end_ns = range.end_ns;
    Ok(pred)
}

/// Carries out a DELETE when DataFusion runs the plan, and yields the count.
struct DeleteStream {
    schema: SchemaRef,
    table_id: u64,
    predicate: DeletePredicate,
    targets: Vec<(u64, String, Vec<u64>)>,
    storage: Arc<StorageClients>,
}

impl fmt::Debug for DeleteStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeleteStream(table={} predicate={:?})",
            self.table_id, self.predicate
        )
    }
}

impl PartitionStream for DeleteStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let targets = self.targets.clone();
        let storage = self.storage.clone();
        let predicate = self.predicate.clone();
        let table_id = self.table_id;
        let out_schema = schema.clone();
        let stream = futures::stream::once(async move {
            let mut calls = Vec::new();
            for (node_id, addr, ids) in targets {
                let client = storage.storage(&addr);
                let predicate = predicate.clone();
                calls.push(async move {
                    let mut client = client.map_err(|e| e.into_datafusion())?;
                    let reply = client
                        .delete(DeleteRequest {
                            table_id,
                            partition_ids: ids,
                            predicate: Some(predicate),
                            replicated: false,
                            epochs: Vec::new(),
                        })
                        .await
                        .map_err(|s| {
                            crate::Error::Unavailable(format!(
                                "storage node {node_id} at {addr}: {}",
                                s.message()
                            ))
                            .into_datafusion()
                        })?;
                    Ok::<u64, DataFusionError>(reply.into_inner().rows_deleted)
                });
            }
            let mut total = 0u64;
            for r in futures::future::join_all(calls).await {
                total += r?;
            }
            let batch = arrow::record_batch::RecordBatch::try_new(
                out_schema,
                vec![Arc::new(arrow::array::UInt64Array::from(vec![total]))],
            )?;
            Ok::<_, DataFusionError>(batch)
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream.boxed()))
    }
}

/// Where `INSERT` rows go: the write router.
struct TableSink {
    table: Table,
    schema: SchemaRef,
    router: Arc<WriteRouter>,
}

impl fmt::Debug for TableSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableSink({}.{})", self.table.database, self.table.name)
    }
}

impl DisplayAs for TableSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SealionSink: table={}.{}",
            self.table.database, self.table.name
        )
    }
}

#[async_trait]
impl DataSink for TableSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> DfResult<u64> {
        let mut rows = 0u64;
        while let Some(batch) = data.next().await {
            let batch = batch?;
            rows += self
                .router
                .write(&self.table, batch)
                .await
                .map_err(|e| e.into_datafusion())?;
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};

    fn ts(v: i64) -> Expr {
        lit(ScalarValue::TimestampNanosecond(
            Some(v),
            Some("UTC".into()),
        ))
    }

    #[test]
    fn time_bounds_come_from_comparisons_between_and_or() {
        let f = vec![col("time").gt_eq(ts(10)), col("time").lt(ts(20))];
        assert_eq!(
            time_range_of(&f, "time"),
            TimeRange {
                start_ns: 10,
                end_ns: 20
            }
        );
        let f = vec![ts(10).lt(col("time"))];
        assert_eq!(
            time_range_of(&f, "time"),
            TimeRange {
                start_ns: 11,
                end_ns: i64::MAX
            }
        );
        let f = vec![col("time").between(ts(5), ts(7))];
        assert_eq!(
            time_range_of(&f, "time"),
            TimeRange {
                start_ns: 5,
                end_ns: 8
            }
        );
        let f = vec![col("time").eq(ts(3)).or(col("time").eq(ts(9)))];
        assert_eq!(
            time_range_of(&f, "time"),
            TimeRange {
                start_ns: 3,
                end_ns: 10
            }
        );
    }

    #[test]
    fn date_trunc_comparisons_bound_time_by_a_superset() {
        let trunc = |unit: &str| {
            datafusion::functions::datetime::expr_fn::date_trunc(lit(unit), col("time"))
        };
        const H: i64 = 3_600_000_000_000;
        let day = 24 * H;
        // A day is 2024-01-02 in UTC: every zone's day that starts then
        // ends within 25 hours.
        let f = vec![trunc("day").eq(ts(10 * day))];
        assert_eq!(
            time_range_of(&f, "time"),
            TimeRange {
                start_ns: 10 * day,
                end_ns: 11 * day + H
            }
        );
        let f = vec![trunc("hour").gt_eq(ts(5 * H)), trunc("hour").lt(ts(9 * H))];
        assert_eq!(
            time_range_of(&f, "time"),
            TimeRange {
                start_ns: 5 * H,
                end_ns: 11 * H
            }
        );
        // Every time the bounds drop fails the filter.
        for t in [5 * H - 1, 11 * H] {
            let truncated = t - t.rem_euclid(H);
            assert!(!(truncated >= 5 * H && truncated < 9 * H));
        }
        // An unknown unit bounds nothing.
        let f = vec![trunc("fortnight").eq(ts(3))];
        assert_eq!(time_range_of(&f, "time"), TimeRange::ALL);
    }

    #[test]
    fn filters_that_do_not_bound_time_keep_every_partition() {
        let f = vec![col("host").eq(lit("a")), col("time").not_eq(ts(3))];
        assert_eq!(time_range_of(&f, "time"), TimeRange::ALL);
        let f = vec![col("time").gt(ts(3)).or(col("host").eq(lit("a")))];
        assert_eq!(time_range_of(&f, "time"), TimeRange::ALL);
    }
}
