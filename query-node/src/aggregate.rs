//! Aggregate pushdown: the first half of an aggregation runs on the storage
//! nodes, the query node merges their partial states and finalizes.
//!
//! [`AggregatePushdown`] is a logical optimizer rule. It replaces
//! `Aggregate(Filter?(TableScan(sealion table)))` with a leaf
//! [`SealionAggregate`] node when every part of it has an exact meaning on
//! the storage nodes:
//!
//! - every conjunct of the filter is a time comparison with a literal, a tag
//!   predicate or a field predicate that the nodes evaluate exactly (the
//!   same rules as [`crate::pushdown`]);
//! - every group expression is a tag column, or one time bucket:
//!   `date_bin(interval, time[, origin])` (`time_bucket` is its alias) or
//!   `date_trunc` to a unit of fixed length (second to week);
//! - every aggregate is one the partial states compute (count, count
//!   DISTINCT, sum, min, max, avg, var/stddev in both forms,
//!   approx_distinct, approx_percentile_cont, first_value/last_value
//!   ordered by time with IGNORE NULLS), with no FILTER clause.
//!
//! Anything else is left as it is, and DataFusion aggregates the rows the
//! nodes ship. The answer of a pushed aggregate must equal the answer of
//! the plan it replaces; the tests hold it to DataFusion over the same rows.
//!
//! [`SealionAggregateExec`] asks every node at once (one child partition
//! each), merges states group by group under the query's memory pool, and
//! emits the aggregate's schema exactly, so the plan above is unchanged.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::array::{RecordBatchOptions, TimestampNanosecondArray};
use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::common::{DFSchemaRef, ScalarValue};
use datafusion::datasource::source_as_provider;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::functions::datetime::date_bin::DateBinFunc;
use datafusion::functions::datetime::date_trunc::DateTruncFunc;
use datafusion::functions_aggregate::approx_distinct::ApproxDistinct;
use datafusion::functions_aggregate::approx_percentile_cont::ApproxPercentileCont;
use datafusion::functions_aggregate::average::Avg;
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::first_last::{FirstValue, LastValue};
use datafusion::functions_aggregate::min_max::{Max, Min};
use datafusion::functions_aggregate::stddev::{Stddev, StddevPop};
use datafusion::functions_aggregate::sum::Sum;
use datafusion::functions_aggregate::variance::{VariancePopulation, VarianceSample};
use datafusion::logical_expr::expr::{AggregateFunction as AggExpr, NullTreatment, ScalarFunction};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    Aggregate, Expr, Extension, LogicalPlan, ScalarUDF, UserDefinedLogicalNode,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::{StreamExt, TryStreamExt};
use sealion_common::catalog::{column, time_column};
use sealion_common::proto::{AggregateCall, AggregateFunction, AggregateSpec, ColumnKind, Table};
use sealion_format::scan::states::{StateColumn, final_array, state_type};
use sealion_format::scan::{BUCKET_COLUMN, kind_of, state_column, value_type};
use sealion_partial::{Finalize, GroupStates, ValueType};

use crate::scan_exec::SealionScanExec;
use crate::table::{ScanShape, SealionTable, is_time_column, literal_ns};

/// One aggregate call as the nodes compute it and the query node finishes
/// it.
#[derive(Debug, Clone, PartialEq)]
pub struct PushedCall {
    pub function: AggregateFunction,
    /// Empty for `count(*)`.
    pub column: String,
    /// What the state is fed (for the empty state of a global aggregate).
    pub input: ValueType,
    pub finalize: Finalize,
}

/// Where each output group column comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum GroupOut {
    Bucket,
    /// Index into `group_tags`.
    Tag(usize),
}

/// An aggregation the nodes can carry out.
#[derive(Debug, Clone, PartialEq)]
pub struct PushedAggregate {
    pub width_ns: i64,
    pub origin_ns: i64,
    pub group_tags: Vec<String>,
    groups: Vec<GroupOut>,
    pub calls: Vec<PushedCall>,
}

impl PushedAggregate {
    pub fn spec(&self) -> AggregateSpec {
        AggregateSpec {
            bucket_width_ns: self.width_ns,
            bucket_origin_ns: self.origin_ns,
            group_tags: self.group_tags.clone(),
            calls: self
                .calls
                .iter()
                .map(|c| AggregateCall {
                    function: c.function as i32,
                    column: c.column.clone(),
                })
                .collect(),
            states_as_answers: true,
        }
    }
}

/// A pushed aggregate in words, for EXPLAIN.
pub fn describe_spec(spec: &AggregateSpec) -> String {
    let calls: Vec<String> = spec
        .calls
        .iter()
        .map(|c| {
            let f = c
                .function()
                .as_str_name()
                .trim_start_matches("AGG_")
                .to_lowercase();
            let col = if c.column.is_empty() { "*" } else { &c.column };
            format!("{f}({col})")
        })
        .collect();
    let mut text = String::from("partial aggregate");
    if spec.bucket_width_ns > 0 {
        text.push_str(&format!(
            " bucket={}ns origin={}",
            spec.bucket_width_ns, spec.bucket_origin_ns
        ));
    }
    if !spec.group_tags.is_empty() {
        text.push_str(&format!(" group_by=[{}]", spec.group_tags.join(",")));
    }
    text.push_str(&format!(" calls=[{}]", calls.join(",")));
    text
}

/// `ORDER BY <bucket> [DESC] LIMIT n` above a pushed aggregate: only the
/// groups of the newest (oldest) buckets are wanted, so partitions are read
/// one time range at a time from that end, and reading stops once `groups`
/// groups are complete, that is, lie in buckets no partition left to read
/// can reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketLimit {
    pub newest_first: bool,
    pub groups: usize,
}

/// The logical node that replaces a pushed aggregate. It is a leaf: the scan
/// it stands for is planned by the table when the node is made physical.
#[derive(Clone)]
pub struct SealionAggregate {
    table: Arc<dyn datafusion::datasource::TableProvider>,
    table_id: u64,
    filters: Vec<Expr>,
    agg: PushedAggregate,
    bucket_limit: Option<BucketLimit>,
    /// The aggregate this node replaced: planned and run instead when a
    /// storage node would need more groups than it keeps.
    original: Arc<LogicalPlan>,
    schema: DFSchemaRef,
    /// What EXPLAIN prints: `base_text` and the bucket limit, if any.
    text: String,
    base_text: String,
}

impl SealionAggregate {
    fn with_bucket_limit(&self, limit: BucketLimit) -> Self {
        let mut node = self.clone();
        node.bucket_limit = Some(limit);
        node.text = format!(
            "{} then {} buckets first, stop after {} complete groups",
            self.base_text,
            if limit.newest_first {
                "newest"
            } else {
                "oldest"
            },
            limit.groups
        );
        node
    }
}

crate::leaf::leaf_scan_node!(SealionAggregate);

/// The optimizer rule; see the module documentation.
#[derive(Debug, Default)]
pub struct AggregatePushdown;

impl OptimizerRule for AggregatePushdown {
    fn name(&self) -> &str {
        "sealion_aggregate_pushdown"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(agg) = &plan else {
            return Ok(Transformed::no(plan));
        };
        match pushable(agg, &plan) {
            Some(node) => Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                node: Arc::new(node),
            }))),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// The pushed form of `agg`, when all of it can be pushed.
fn pushable(agg: &Aggregate, plan: &LogicalPlan) -> Option<SealionAggregate> {
    // Projections of plain columns rename nothing: they can be looked
    // through.
    let mut input = agg.input.as_ref();
    while let LogicalPlan::Projection(p) = input {
        if !p.expr.iter().all(|e| matches!(e, Expr::Column(_))) {
            return None;
        }
        input = p.input.as_ref();
    }
    let ExactScan {
        provider,
        table,
        filters,
        ..
    } = exact_scan(input)?;
    let t = &table;
    let time = time_column(t)?.name.clone();
    let mut pushed = PushedAggregate {
        width_ns: 0,
        origin_ns: 0,
        group_tags: Vec::new(),
        groups: Vec::new(),
        calls: Vec::new(),
    };
    for g in &agg.group_expr {
        // `time_bucket(...)` arrives as `date_bin(...) AS time_bucket(...)`;
        // the output name is the aggregate schema's either way.
        let mut g = g;
        while let Expr::Alias(a) = g {
            g = a.expr.as_ref();
        }
        match g {
            Expr::Column(c) => {
                let col = column(t, &c.name)?;
                if col.kind() != ColumnKind::Tag || pushed.group_tags.contains(&col.name) {
                    return None;
                }
                pushed.groups.push(GroupOut::Tag(pushed.group_tags.len()));
                pushed.group_tags.push(col.name.clone());
            }
            Expr::ScalarFunction(f) => {
                if pushed.width_ns > 0 {
                    return None;
                }
                let (width, origin) = bucket_of(f, &time)?;
                pushed.width_ns = width;
                pushed.origin_ns = origin;
                pushed.groups.push(GroupOut::Bucket);
            }
            _ => return None,
        }
    }
    for e in &agg.aggr_expr {
        pushed.calls.push(call_of(t, &time, e)?);
    }
    let spec = pushed.spec();
    let mut text = format!("table={} {}", t.name, describe_spec(&spec));
    if !filters.is_empty() {
        let f: Vec<String> = filters.iter().map(|f| f.to_string()).collect();
        text.push_str(&format!(" filter=[{}]", f.join(" AND ")));
    }
    Some(SealionAggregate {
        table: provider.clone(),
        table_id: t.id,
        filters,
        agg: pushed,
        bucket_limit: None,
        original: Arc::new(plan.clone()),
        schema: agg.schema.clone(),
        base_text: text.clone(),
        text,
    })
}

/// Bucket-limit pushdown: a `Sort` with a fetch of `n` whose first key is
/// the time bucket of a pushed aggregate below it (through projections that
/// only rename) gives that aggregate a [`BucketLimit`] of `n` groups. The
/// `Sort` stays: the aggregate then answers only complete groups, at least
/// `n` of them, all in buckets ahead of any group it did not finish, so the
/// sort's first `n` rows are the ones it would pick from every group.
#[derive(Debug, Default)]
pub struct BucketLimitPushdown;

impl OptimizerRule for BucketLimitPushdown {
    fn name(&self) -> &str {
        "sealion_bucket_limit_pushdown"
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
        let (Some(fetch), Some(first)) = (sort.fetch, sort.expr.first()) else {
            return Ok(Transformed::no(plan));
        };
        let Expr::Column(key) = &first.expr else {
            return Ok(Transformed::no(plan));
        };
        if fetch == 0 {
            return Ok(Transformed::no(plan));
        }
        let limit = BucketLimit {
            newest_first: !first.asc,
            groups: fetch,
        };
        match bucket_limited(sort.input.as_ref(), key, limit)? {
            Some(input) => Ok(Transformed::yes(LogicalPlan::Sort(
                datafusion::logical_expr::Sort {
                    expr: sort.expr.clone(),
                    input: Arc::new(input),
                    fetch: sort.fetch,
                },
            ))),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// `plan` with the pushed aggregate whose bucket column `key` names given
/// `limit`, looking through projections that rename columns.
fn bucket_limited(
    plan: &LogicalPlan,
    key: &datafusion::common::Column,
    limit: BucketLimit,
) -> DfResult<Option<LogicalPlan>> {
    match plan {
        LogicalPlan::Projection(p) => {
            let Ok(i) = p.schema.index_of_column(key) else {
                return Ok(None);
            };
            let mut e = &p.expr[i];
            while let Expr::Alias(a) = e {
                e = a.expr.as_ref();
            }
            let Expr::Column(inner) = e else {
                return Ok(None);
            };
            match bucket_limited(&p.input, inner, limit)? {
                Some(input) => Ok(Some(plan.with_new_exprs(p.expr.clone(), vec![input])?)),
                None => Ok(None),
            }
        }
        LogicalPlan::Extension(ext) => {
            let Some(node) = ext.node.as_any().downcast_ref::<SealionAggregate>() else {
                return Ok(None);
            };
            let Ok(i) = node.schema.index_of_column(key) else {
                return Ok(None);
            };
            if node.agg.groups.get(i) != Some(&GroupOut::Bucket) {
                return Ok(None);
            }
            // Set once; a later, larger fetch (it does not happen, but a
            // smaller limit would then be wrong) replaces it.
            if let Some(old) = node.bucket_limit
                && old.newest_first == limit.newest_first
                && old.groups >= limit.groups
            {
                return Ok(None);
            }
            Ok(Some(LogicalPlan::Extension(Extension {
                node: Arc::new(node.with_bucket_limit(limit)),
            })))
        }
        _ => Ok(None),
    }
}

/// A scan of a Sealion table whose every filter conjunct the nodes
/// evaluate exactly.
pub(crate) struct ExactScan<'a> {
    pub provider: Arc<dyn datafusion::datasource::TableProvider>,
    pub table: Table,
    pub scan: &'a datafusion::logical_expr::TableScan,
    /// The filter's conjuncts.
    pub filters: Vec<Expr>,
}

/// `Filter?(TableScan(sealion table))` at `plan` with no fetch on the scan,
/// when every filter of the scan and every conjunct of the filter above it
/// is [`exact`]. The scan holds the filters DataFusion left to the table
/// alone (`Exact`, see `SealionTable::supports_filters_pushdown`) and those
/// it applies again above (`Inexact`, also in the filter).
pub(crate) fn exact_scan(plan: &LogicalPlan) -> Option<ExactScan<'_>> {
    let (predicate, scan) = match plan {
        LogicalPlan::Filter(f) => match f.input.as_ref() {
            LogicalPlan::TableScan(s) => (Some(&f.predicate), s),
            _ => return None,
        },
        LogicalPlan::TableScan(s) => (None, s),
        _ => return None,
    };
    if scan.fetch.is_some() {
        return None;
    }
    let provider = source_as_provider(&scan.source).ok()?;
    let table = provider
        .as_ref()
        .downcast_ref::<SealionTable>()?
        .table
        .clone();
    let time = time_column(&table)?.name.clone();
    let mut filters: Vec<Expr> = Vec::new();
    let above = predicate.map(split_conjunction).unwrap_or_default();
    for c in scan.filters.iter().flat_map(split_conjunction).chain(above) {
        if !exact(&table, &time, c) {
            return None;
        }
        if !filters.contains(c) {
            filters.push(c.clone());
        }
    }
    // Conjuncts within the nodes' limits one by one may pass them together,
    // and then none of them is pushed.
    if crate::pushdown::push(&table, &filters).field_over_limits {
        return None;
    }
    Some(ExactScan {
        provider,
        table,
        scan,
        filters,
    })
}

/// Whether the nodes evaluate conjunct `e` exactly.
pub(crate) fn exact(table: &Table, time: &str, e: &Expr) -> bool {
    crate::table::applied_exactly(table, Some(time), e)
        || crate::pushdown::field_predicate(table, e).is_some()
}

const NS_PER_SECOND: i64 = 1_000_000_000;

/// `date_bin`, also named `time_bucket` as TimescaleDB users know it. The
/// session registers this one, so the rule knows it when it sees it.
pub fn date_bin_udf() -> Arc<ScalarUDF> {
    static UDF: std::sync::OnceLock<Arc<ScalarUDF>> = std::sync::OnceLock::new();
    UDF.get_or_init(|| {
        Arc::new(
            datafusion::functions::datetime::date_bin()
                .as_ref()
                .clone()
                .with_aliases(["time_bucket"]),
        )
    })
    .clone()
}

/// `(width, origin)` of `date_bin` arguments `(interval, time[, origin])`
/// when the interval has a fixed length and the origin is a literal.
pub(crate) fn bucket_args(args: &[Expr]) -> Option<(i64, i64)> {
    let width = match args.first()? {
        Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(v)), _) if v.months == 0 => {
            i64::from(v.days)
                .checked_mul(86_400 * NS_PER_SECOND)?
                .checked_add(v.nanoseconds)?
        }
        Expr::Literal(ScalarValue::IntervalDayTime(Some(v)), _) => i64::from(v.days)
            .checked_mul(86_400 * NS_PER_SECOND)?
            .checked_add(i64::from(v.milliseconds).checked_mul(1_000_000)?)?,
        _ => return None,
    };
    if width <= 0 || args.len() < 2 || args.len() > 3 {
        return None;
    }
    let origin = match args.get(2) {
        None => 0,
        Some(e) => literal_ns(e)?,
    };
    Some((width, origin))
}

/// `(width, origin)` of a time bucket group expression over `time`.
fn bucket_of(f: &ScalarFunction, time: &str) -> Option<(i64, i64)> {
    let inner = f.func.inner();
    if inner.is::<DateBinFunc>() || *f.func == *date_bin_udf() {
        if !is_time_column(f.args.get(1)?, time) {
            return None;
        }
        return bucket_args(&f.args);
    }
    if inner.is::<DateTruncFunc>() {
        // The time column is in UTC, where these units have fixed lengths.
        let unit = crate::pushdown::text(f.args.first()?)?.to_lowercase();
        if f.args.len() != 2 || !is_time_column(&f.args[1], time) {
            return None;
        }
        return Some(match unit.as_str() {
            "microsecond" => (1_000, 0),
            "millisecond" => (1_000_000, 0),
            "second" => (NS_PER_SECOND, 0),
            "minute" => (60 * NS_PER_SECOND, 0),
            "hour" => (3_600 * NS_PER_SECOND, 0),
            "day" => (86_400 * NS_PER_SECOND, 0),
            // Weeks start on Monday; 1970-01-05 was one.
            "week" => (7 * 86_400 * NS_PER_SECOND, 4 * 86_400 * NS_PER_SECOND),
            _ => return None,
        });
    }
    None
}

/// The pushed form of one aggregate expression.
fn call_of(table: &Table, time: &str, e: &Expr) -> Option<PushedCall> {
    let e = match e {
        Expr::Alias(a) => a.expr.as_ref(),
        e => e,
    };
    let Expr::AggregateFunction(AggExpr { func, params }) = e else {
        return None;
    };
    if params.filter.is_some() {
        return None;
    }
    let inner = func.inner();
    // A column, or an integer column cast to a float (what type coercion
    // makes of `var(int_column)`): the states take integers exactly, and
    // the cast is monotonic, so min, max, first and last commute with it.
    let arg_column = |i: usize| match params.args.get(i) {
        Some(Expr::Column(c)) => column(table, &c.name),
        Some(Expr::Cast(cast))
            if *cast.field.data_type() == ArrowType::Float64 && !params.distinct =>
        {
            match cast.expr.as_ref() {
                Expr::Column(c) => column(table, &c.name).filter(|c| {
                    matches!(
                        c.data_type(),
                        sealion_common::proto::DataType::Int64
                            | sealion_common::proto::DataType::Uint64
                    )
                }),
                _ => None,
            }
        }
        _ => None,
    };
    let input_of = |c: &sealion_common::proto::Column| value_type(c.data_type());
    let plain = |function: AggregateFunction, finalize: Finalize| {
        if params.args.len() != 1 || !params.order_by.is_empty() {
            return None;
        }
        let c = arg_column(0)?;
        Some(PushedCall {
            function,
            column: c.name.clone(),
            input: input_of(c),
            finalize,
        })
    };
    use AggregateFunction as F;
    let call = if inner.is::<Count>() {
        if params.distinct {
            let call = plain(F::AggExactDistinct, Finalize::Natural)?;
            // DataFusion counts floats as distinct by their bits (-0.0 and
            // 0.0 are two values); the state counts SQL-equal values once.
            if call.input == ValueType::F64 {
                return None;
            }
            call
        } else if let Some(Expr::Literal(v, _)) = params.args.first() {
            if params.args.len() != 1 || v.is_null() || !params.order_by.is_empty() {
                return None;
            }
            PushedCall {
                function: F::AggCount,
                column: String::new(),
                input: ValueType::Bool,
                finalize: Finalize::Natural,
            }
        } else {
            plain(F::AggCount, Finalize::Natural)?
        }
    } else if params.distinct && !(inner.is::<Min>() || inner.is::<Max>()) {
        // DISTINCT changes nothing for min and max; for the rest there is
        // no state that keeps it.
        return None;
    } else if inner.is::<Sum>() {
        // A sum of integers cast to floats is a float sum in DataFusion
        // (rounding, no overflow); the state would sum exactly.
        if matches!(params.args.first(), Some(Expr::Cast(_))) {
            return None;
        }
        plain(F::AggSum, Finalize::Natural)?
    } else if inner.is::<Min>() {
        plain(F::AggMin, Finalize::Natural)?
    } else if inner.is::<Max>() {
        plain(F::AggMax, Finalize::Natural)?
    } else if inner.is::<Avg>() {
        plain(F::AggAvg, Finalize::Natural)?
    } else if inner.is::<VarianceSample>() {
        plain(F::AggVariance, Finalize::VarSamp)?
    } else if inner.is::<VariancePopulation>() {
        plain(F::AggVariance, Finalize::VarPop)?
    } else if inner.is::<Stddev>() {
        plain(F::AggVariance, Finalize::StddevSamp)?
    } else if inner.is::<StddevPop>() {
        plain(F::AggVariance, Finalize::StddevPop)?
    } else if inner.is::<ApproxDistinct>() {
        plain(F::AggApproxDistinct, Finalize::Natural)?
    } else if inner.is::<ApproxPercentileCont>() {
        // approx_percentile_cont(q) WITHIN GROUP (ORDER BY x): args are
        // (x, q); a descending order asks for 1 - q. A centroid count is
        // not pushed: the nodes' digest has its own fixed size.
        if params.args.len() != 2 {
            return None;
        }
        let c = arg_column(0)?;
        let q = match &params.args[1] {
            Expr::Literal(ScalarValue::Float64(Some(q)), _) => *q,
            _ => return None,
        };
        let descending = match params.order_by.as_slice() {
            [] => false,
            [s] if matches!(&s.expr, Expr::Column(o) if o.name == c.name) => !s.asc,
            _ => return None,
        };
        if !(0.0..=1.0).contains(&q) {
            return None;
        }
        PushedCall {
            function: F::AggPercentile,
            column: c.name.clone(),
            input: input_of(c),
            finalize: Finalize::Quantile(if descending { 1.0 - q } else { q }),
        }
    } else if let Some(f) = inner.downcast_ref::<crate::functions::FirstLast>() {
        // first(value, time) / last(value, time): the states' own meaning.
        if params.args.len() != 2 || !params.order_by.is_empty() || params.distinct {
            return None;
        }
        if !is_time_column(&params.args[1], time) {
            return None;
        }
        let c = arg_column(0)?;
        PushedCall {
            function: if f.is_last() { F::AggLast } else { F::AggFirst },
            column: c.name.clone(),
            input: input_of(c),
            finalize: Finalize::Natural,
        }
    } else if inner.is::<FirstValue>() || inner.is::<LastValue>() {
        // Only with IGNORE NULLS: the states keep the value of the first or
        // last row that has one.
        if params.null_treatment != Some(NullTreatment::IgnoreNulls) || params.args.len() != 1 {
            return None;
        }
        let c = arg_column(0)?;
        let asc = match params.order_by.as_slice() {
            [s] if is_time_column(&s.expr, time) => s.asc,
            _ => return None,
        };
        let first = inner.is::<FirstValue>() == asc;
        PushedCall {
            function: if first { F::AggFirst } else { F::AggLast },
            column: c.name.clone(),
            input: input_of(c),
            finalize: Finalize::Natural,
        }
    } else {
        return None;
    };
    let kind = kind_of(call.function)?;
    kind.accepts(call.input).then_some(call)
}

/// Plans [`SealionAggregate`] nodes, and everything else as DataFusion does.
#[derive(Debug, Default)]
pub struct SealionQueryPlanner;

#[async_trait]
impl QueryPlanner for SealionQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![
            Arc::new(AggregatePlanner),
            Arc::new(crate::topn::RowsPlanner),
            Arc::new(crate::gapfill::GapFillPlanner),
        ])
        .create_physical_plan(logical_plan, session)
        .await
    }
}

struct AggregatePlanner;

#[async_trait]
impl ExtensionPlanner for AggregatePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        _physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<SealionAggregate>() else {
            return Ok(None);
        };
        let Some(table) = node.table.as_ref().downcast_ref::<SealionTable>() else {
            return Err(DataFusionError::Internal(
                "a SealionAggregate over a table that is not Sealion's".into(),
            ));
        };
        let spec = node.agg.spec();
        let scan = table.plan_scan(ScanShape {
            projection: Vec::new(),
            schema: state_schema(&node.agg),
            filters: &node.filters,
            limit: None,
            aggregate: Some(spec),
            order: sealion_common::proto::ScanOrder::OrderSeries,
            newest_per_series: 0,
            steps: node.bucket_limit.map(|l| l.newest_first),
        })?;
        let schema = Arc::new(node.schema.as_arrow().clone());
        Ok(Some(Arc::new(SealionAggregateExec::new(
            Arc::new(scan),
            node.agg.clone(),
            node.bucket_limit,
            node.original.clone(),
            schema,
        ))))
    }
}

/// The schema of the nodes' answers (see `AggregateSpec` in proto).
fn state_schema(agg: &PushedAggregate) -> SchemaRef {
    let mut fields = Vec::new();
    if agg.width_ns > 0 {
        fields.push(Field::new(
            BUCKET_COLUMN,
            ArrowType::Timestamp(
                TimeUnit::Nanosecond,
                Some(sealion_common::catalog::TIME_ZONE.into()),
            ),
            false,
        ));
    }
    for t in &agg.group_tags {
        fields.push(Field::new(t, ArrowType::Utf8, true));
    }
    for (i, c) in agg.calls.iter().enumerate() {
        let (ty, nullable) = match kind_of(c.function) {
            Some(kind) => state_type(kind, c.input, true),
            None => (ArrowType::Binary, false),
        };
        fields.push(Field::new(state_column(i), ty, nullable));
    }
    Arc::new(Schema::new(fields))
}

/// Merges the nodes' partial states and finalizes them.
pub struct SealionAggregateExec {
    input: Arc<dyn ExecutionPlan>,
    agg: PushedAggregate,
    bucket_limit: Option<BucketLimit>,
    original: Arc<LogicalPlan>,
    metrics: ExecutionPlanMetricsSet,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for SealionAggregateExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SealionAggregateExec")
    }
}

impl SealionAggregateExec {
    fn new(
        input: Arc<dyn ExecutionPlan>,
        agg: PushedAggregate,
        bucket_limit: Option<BucketLimit>,
        original: Arc<LogicalPlan>,
        schema: SchemaRef,
    ) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        SealionAggregateExec {
            input,
            agg,
            bucket_limit,
            original,
            metrics: ExecutionPlanMetricsSet::new(),
            schema,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for SealionAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let finals: Vec<String> = self
            .agg
            .calls
            .iter()
            .map(|c| format!("{}", c.finalize))
            .collect();
        write!(
            f,
            "SealionAggregateExec: merge partial states, finalize=[{}] (rows aggregated here instead past a node's group limits)",
            finals.join(", ")
        )?;
        if let Some(l) = self.bucket_limit {
            write!(
                f,
                ", partitions {} first until {} groups are complete",
                if l.newest_first { "newest" } else { "oldest" },
                l.groups
            )?;
        }
        Ok(())
    }
}

impl ExecutionPlan for SealionAggregateExec {
    fn name(&self) -> &str {
        "SealionAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = crate::leaf::only_child(children, "SealionAggregateExec")?;
        Ok(Arc::new(SealionAggregateExec::new(
            input,
            self.agg.clone(),
            self.bucket_limit,
            self.original.clone(),
            self.schema.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        crate::leaf::only_partition(partition, "SealionAggregateExec")?;
        let reservation =
            MemoryConsumer::new("SealionAggregateExec").register(context.memory_pool());
        let mut merger = Merger::new(self.agg.clone(), self.schema.clone(), reservation)?;
        let schema = self.schema.clone();
        let fell_back = MetricBuilder::new(&self.metrics).counter("groups_over_node_limit", 0);
        let original = self.original.clone();
        let stepped = match self.bucket_limit {
            Some(limit) => stepped_scan(&self.input)
                .filter(|s| !s.step_ranges().is_empty())
                .map(|s| (limit, s)),
            None => None,
        };
        let mut inputs = Vec::new();
        if stepped.is_none() {
            let n = self.input.properties().partitioning.partition_count();
            for i in 0..n {
                inputs.push(self.input.execute(i, context.clone())?);
            }
        }
        let stream = futures::stream::once(async move {
            let merged = async {
                match stepped {
                    Some((limit, scan)) => {
                        merge_in_steps(&scan, limit, &mut merger, &context).await?
                    }
                    None => {
                        let mut all = futures::stream::select_all(inputs);
                        while let Some(batch) = all.next().await {
                            merger.add(&batch?)?;
                        }
                    }
                }
                merger.finish()
            }
            .await;
            match merged {
                Ok(batch) => Ok(futures::stream::once(futures::future::ready(Ok(batch))).boxed()),
                // A node would need more groups than it keeps: the rows come
                // to this node and DataFusion aggregates them, as it would
                // have without the pushdown.
                Err(e) if over_group_limits(&e) => {
                    fell_back.add(1);
                    tracing::debug!("pushed aggregate over a node's group limits: {e}");
                    let plan = plain_plan(&original, &context).await?;
                    Ok(datafusion::physical_plan::execute_stream(plan, context)?.boxed())
                }
                Err(e) => Err(e),
            }
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// Whether `e` is a storage node refusing a pushed aggregate for its group
/// limits (`ResourceExhausted`).
fn over_group_limits(e: &DataFusionError) -> bool {
    match e {
        DataFusionError::External(inner) => matches!(
            inner.downcast_ref::<arrow_flight::error::FlightError>(),
            Some(arrow_flight::error::FlightError::Tonic(s))
                if s.code() == tonic::Code::ResourceExhausted
        ),
        DataFusionError::Context(_, inner) => over_group_limits(inner),
        DataFusionError::Shared(inner) => over_group_limits(inner),
        _ => false,
    }
}

/// The physical plan of the aggregate a pushed one replaced (its tables
/// are resolved already, so no catalog is needed), under the query's own
/// configuration and memory pool.
async fn plain_plan(
    original: &LogicalPlan,
    context: &TaskContext,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let state = datafusion::execution::SessionStateBuilder::new()
        .with_config(context.session_config().clone())
        .with_runtime_env(context.runtime_env())
        .with_default_features()
        .build();
    state.create_physical_plan(original).await
}

/// The scan under `plan` when it is a [`SealionScanExec`] planned in
/// steps, looking through the `CooperativeExec` DataFusion puts above
/// leaves (the steps' streams run in this exec's own stream, which yields
/// between batches all the same).
fn stepped_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<SealionScanExec>> {
    let mut plan = plan.clone();
    loop {
        let any: Arc<dyn std::any::Any + Send + Sync> = plan.clone();
        if let Ok(scan) = any.downcast::<SealionScanExec>() {
            return Some(scan);
        }
        let any: &dyn std::any::Any = plan.as_ref();
        let coop = any.downcast_ref::<datafusion::physical_plan::coop::CooperativeExec>()?;
        plan = coop.input().clone();
    }
}

/// Runs `scan`'s steps one after another into `merger` until `limit`
/// groups are complete, then keeps only the complete groups.
///
/// A step's partitions hold rows of their time range only. After a step,
/// the rows still to come lie before the latest end (after the earliest
/// start) of the steps left, so they can reach no bucket after (before)
/// that time's bucket: groups in those buckets are complete.
async fn merge_in_steps(
    scan: &SealionScanExec,
    limit: BucketLimit,
    merger: &mut Merger,
    context: &TaskContext,
) -> DfResult<()> {
    let ranges = scan.step_ranges();
    let plan = sealion_format::scan::AggPlan {
        width_ns: merger.agg.width_ns,
        origin_ns: merger.agg.origin_ns,
        group_tags: Vec::new(),
        calls: Vec::new(),
        states_as_answers: false,
    };
    for step in 0..ranges.len() {
        let mut answers = scan.execute_step(step, context);
        while let Some(batch) = answers.next().await {
            merger.add(&batch?)?;
        }
        let rest = &ranges[step + 1..];
        let edge = if limit.newest_first {
            rest.iter().map(|r| r.1.saturating_sub(1)).max()
        } else {
            rest.iter().map(|r| r.0).min()
        };
        // A bucket out of i64's range (an error) is no reason to stop.
        let Some(Ok(edge)) = edge.map(|t| plan.bucket(t)) else {
            continue;
        };
        let complete = |bucket: i64| {
            if limit.newest_first {
                bucket > edge
            } else {
                bucket < edge
            }
        };
        if merger
            .keys
            .iter()
            .filter(|k| complete(Merger::bucket(k)))
            .count()
            >= limit.groups
        {
            merger.retain(complete);
            break;
        }
    }
    Ok(())
}

/// A group: its bucket, then each group tag's value id in
/// [`Merger::tag_values`] ([`NULL_TAG`] for NULL).
type GroupKey = Box<[u64]>;

/// The id of a NULL group-tag value.
const NULL_TAG: u64 = u64::MAX;

/// Partial states by group, merged as node answers arrive.
struct Merger {
    agg: PushedAggregate,
    schema: SchemaRef,
    /// Per group tag, its values by id and the id of each value: a row's
    /// key is found without building a string.
    tag_values: Vec<Vec<String>>,
    tag_ids: Vec<HashMap<String, u64>>,
    /// Bytes of tag values interned since the last group was counted
    /// against the reservation (a new value comes with a new group).
    new_tag_bytes: usize,
    index: HashMap<GroupKey, usize>,
    keys: Vec<GroupKey>,
    /// Per call, one state per group.
    states: Vec<GroupStates>,
    reservation: MemoryReservation,
}

impl Merger {
    fn new(
        agg: PushedAggregate,
        schema: SchemaRef,
        reservation: MemoryReservation,
    ) -> DfResult<Self> {
        let ntags = agg.group_tags.len();
        let states = agg
            .calls
            .iter()
            .map(|c| {
                let kind = kind_of(c.function).ok_or_else(|| {
                    DataFusionError::Internal("a pushed call without a function".into())
                })?;
                GroupStates::new(kind, c.input)
                    .map_err(|e| DataFusionError::Internal(format!("aggregate: {e}")))
            })
            .collect::<DfResult<Vec<_>>>()?;
        Ok(Merger {
            agg,
            schema,
            tag_values: vec![Vec::new(); ntags],
            tag_ids: vec![HashMap::new(); ntags],
            new_tag_bytes: 0,
            index: HashMap::new(),
            keys: Vec::new(),
            states,
            reservation,
        })
    }

    /// A group's bucket.
    fn bucket(key: &[u64]) -> i64 {
        key[0] as i64
    }

    /// The id of value `v` of group tag `t`, given an id when new.
    fn tag_id(&mut self, t: usize, v: &str) -> u64 {
        if let Some(&id) = self.tag_ids[t].get(v) {
            return id;
        }
        let id = self.tag_values[t].len() as u64;
        self.tag_values[t].push(v.to_string());
        self.tag_ids[t].insert(v.to_string(), id);
        self.new_tag_bytes += 2 * v.len() + 64;
        id
    }

    fn add(&mut self, batch: &RecordBatch) -> DfResult<()> {
        let bad = |what: &str| {
            DataFusionError::Execution(format!("a storage node's aggregate answer: {what}"))
        };
        let mut next = 0;
        let buckets = if self.agg.width_ns > 0 {
            next = 1;
            Some(
                batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<TimestampNanosecondArray>()
                    .ok_or_else(|| bad("the bucket column is not a timestamp"))?,
            )
        } else {
            None
        };
        let ntags = self.agg.group_tags.len();
        let mut tags = Vec::with_capacity(ntags);
        for i in 0..ntags {
            tags.push(
                batch
                    .column(next + i)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .ok_or_else(|| bad("a group tag column is not text"))?,
            );
        }
        next += ntags;
        let ncalls = self.agg.calls.len();
        let mut states = Vec::with_capacity(ncalls);
        for (i, call) in self.agg.calls.iter().enumerate() {
            let kind = kind_of(call.function).ok_or_else(|| bad("a call without a function"))?;
            // Bytes, or answers for count, min and max.
            let column = StateColumn::new(batch.column(next + i).as_ref(), kind, call.input)
                .map_err(|e| bad(&e.to_string()))?;
            states.push(column);
        }
        // The previous row's tag values and ids: a node sends a series'
        // groups together, so most rows repeat them.
        let mut last: Vec<Option<(usize, u64)>> = vec![None; ntags];
        let mut key: Vec<u64> = Vec::with_capacity(1 + ntags);
        for row in 0..batch.num_rows() {
            key.clear();
            key.push(buckets.map_or(0, |b| b.value(row)) as u64);
            for (t, col) in tags.iter().enumerate() {
                if col.is_null(row) {
                    key.push(NULL_TAG);
                    continue;
                }
                let id = match last[t] {
                    Some((prev, id)) if col.value(prev) == col.value(row) => id,
                    _ => self.tag_id(t, col.value(row)),
                };
                last[t] = Some((row, id));
                key.push(id);
            }
            match self.index.get(key.as_slice()) {
                Some(&g) => {
                    for (col, into) in states.iter().zip(&mut self.states) {
                        col.merge_into(row, into, g)
                            .map_err(|e| bad(&e.to_string()))?;
                    }
                }
                None => {
                    // A group costs its key, its index entry and its states
                    // (about their encoded size; sketches grow on merge).
                    let mut bytes = 64 + 16 * key.len() + std::mem::take(&mut self.new_tag_bytes);
                    for col in &states {
                        bytes += 2 * col.encoded_bytes(row) + 32;
                    }
                    self.reservation.try_grow(bytes)?;
                    let g = self.keys.len();
                    for (col, into) in states.iter().zip(&mut self.states) {
                        into.push_empty();
                        col.merge_into(row, into, g)
                            .map_err(|e| bad(&e.to_string()))?;
                    }
                    let key: GroupKey = key.as_slice().into();
                    self.index.insert(key.clone(), g);
                    self.keys.push(key);
                }
            }
        }
        Ok(())
    }

    /// Drops the groups whose bucket `keep` refuses.
    fn retain(&mut self, keep: impl Fn(i64) -> bool) {
        let kept: Vec<bool> = self.keys.iter().map(|k| keep(Merger::bucket(k))).collect();
        for states in &mut self.states {
            states.retain(|g| kept[g]);
        }
        let keys = std::mem::take(&mut self.keys);
        self.index.clear();
        for (key, kept) in keys.into_iter().zip(kept) {
            if kept {
                self.index.insert(key.clone(), self.keys.len());
                self.keys.push(key);
            }
        }
    }

    /// The finalized groups in the aggregate's schema.
    fn finish(mut self) -> DfResult<RecordBatch> {
        // A global aggregate answers one row even when no row matched.
        if self.agg.groups.is_empty() && self.keys.is_empty() {
            self.keys.push(Box::new([0]));
            self.states.iter_mut().for_each(GroupStates::push_empty);
        }
        let fields = self.schema.fields().clone();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.len());
        for (g, out) in self.agg.groups.iter().enumerate() {
            let array: ArrayRef = match out {
                GroupOut::Bucket => Arc::new(
                    TimestampNanosecondArray::from_iter_values(
                        self.keys.iter().map(|k| Merger::bucket(k)),
                    )
                    .with_timezone(sealion_common::catalog::TIME_ZONE),
                ),
                GroupOut::Tag(t) => {
                    let values = &self.tag_values[*t];
                    Arc::new(StringArray::from_iter(self.keys.iter().map(|k| {
                        values
                            .get(usize::try_from(k[1 + t]).ok()?)
                            .map(String::as_str)
                    })))
                }
            };
            columns.push(arrow::compute::cast(&array, fields[g].data_type())?);
        }
        let ngroups = self.agg.groups.len();
        for (i, (call, states)) in self.agg.calls.iter().zip(&self.states).enumerate() {
            let array = final_array(states, 0..self.keys.len(), call.finalize).map_err(|e| {
                DataFusionError::Execution(match e {
                    // "aggregate: sum overflows BIGINT", as the user sees it.
                    sealion_format::Error::Invalid(message) => message,
                    other => other.to_string(),
                })
            })?;
            columns.push(arrow::compute::cast(
                &array,
                fields[ngroups + i].data_type(),
            )?);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(self.keys.len()));
        self.reservation.free();
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &options,
        )?)
    }
}
