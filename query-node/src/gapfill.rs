//! Gap filling: `date_bin_gapfill`, `locf` and `interpolate`.
//!
//! ```sql
//! SELECT date_bin_gapfill(INTERVAL '1 minute', time) AS m, host,
//!        avg(usage), locf(max(usage)), interpolate(min(n))
//! FROM cpu WHERE time >= '2024-01-01T00:00:00Z' AND time < '2024-01-01T01:00:00Z'
//! GROUP BY m, host
//! ```
//!
//! answers one row per bucket of the WHERE clause's time range for every
//! group (the other GROUP BY columns) that has at least one row: buckets
//! with no rows get NULL aggregates. `locf(agg)` replaces every NULL of the
//! aggregate (a missing bucket, or a bucket whose aggregate is NULL) with
//! the group's last non-NULL value before it; `interpolate(agg)` with the
//! value on the straight line between the neighbouring non-NULL values (no
//! value before the first or after the last); known values are kept as
//! they are. The WHERE clause must bound the time column on both sides
//! with comparisons to literals.
//!
//! [`GapFillRule`] rewrites `Projection(Aggregate)` with a
//! `date_bin_gapfill` group into `Projection(GapFill(Aggregate))` with a
//! plain `date_bin`, so the aggregation below can still be pushed to the
//! storage nodes; [`GapFillExec`] fills the aggregated rows.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, TimestampNanosecondArray, UInt32Array};
use arrow::compute::kernels::cast::cast;
use arrow::datatypes::{DataType, Float64Type, SchemaRef};
use arrow::row::{RowConverter, SortField};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::common::{DFSchema, DFSchemaRef, plan_err};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    Aggregate, ColumnarValue, Expr, Extension, LogicalPlan, Projection, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
    Volatility,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};
use futures::StreamExt;

use crate::aggregate::date_bin_udf;

/// Most rows one gap-filling query may produce.
pub const MAX_FILLED_ROWS: usize = 10_000_000;

/// `date_bin_gapfill(interval, time[, origin])`: `date_bin` that also asks
/// for the missing buckets. Only meaningful as a GROUP BY expression.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DateBinGapfill {
    date_bin: Arc<ScalarUDF>,
}

/// `locf(x)` or `interpolate(x)` around an aggregate of a gap-filling
/// query.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FillFunction {
    interpolate: bool,
    signature: Signature,
}

/// The three functions, to register with a session.
pub fn udfs() -> [ScalarUDF; 3] {
    [
        ScalarUDF::from(DateBinGapfill {
            date_bin: date_bin_udf(),
        }),
        ScalarUDF::from(FillFunction {
            interpolate: false,
            signature: Signature::any(1, Volatility::Immutable),
        }),
        ScalarUDF::from(FillFunction {
            interpolate: true,
            signature: Signature::any(1, Volatility::Immutable),
        }),
    ]
}

impl ScalarUDFImpl for DateBinGapfill {
    fn name(&self) -> &str {
        "date_bin_gapfill"
    }

    fn signature(&self) -> &Signature {
        self.date_bin.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.date_bin.return_type(arg_types)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.date_bin.coerce_types(arg_types)
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        Err(DataFusionError::Plan(
            "date_bin_gapfill is only allowed as a GROUP BY expression of a query whose WHERE bounds time on both sides".into(),
        ))
    }
}

impl ScalarUDFImpl for FillFunction {
    fn name(&self) -> &str {
        if self.interpolate {
            "interpolate"
        } else {
            "locf"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        match arg_types {
            [t] => Ok(t.clone()),
            _ => plan_err!("{}(x) takes one argument", self.name()),
        }
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        Err(DataFusionError::Plan(format!(
            "{}() is only allowed around an aggregate of a query grouped by date_bin_gapfill",
            self.name()
        )))
    }
}

/// How the value columns of missing buckets are filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum Fill {
    Null,
    Locf,
    Interpolate,
}

/// What [`GapFillExec`] needs to know.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct GapFillParams {
    /// Index of the bucket column in the aggregate's output.
    time: usize,
    /// The other group columns.
    groups: Vec<usize>,
    stride_ns: i64,
    origin_ns: i64,
    /// `[start_ns, end_ns)` from the WHERE clause.
    start_ns: i64,
    end_ns: i64,
    /// Filled copies of aggregate columns, appended after the input's
    /// columns (which keep NULL in missing buckets): (input column, fill).
    fills: Vec<(usize, Fill)>,
}

/// The logical node: fills the gaps of its input (an aggregate).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GapFill {
    input: LogicalPlan,
    params: GapFillParams,
    schema: DFSchemaRef,
}

impl PartialOrd for GapFill {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match (&self.input, &self.params).partial_cmp(&(&other.input, &other.params)) {
            // Equal inputs and parameters give equal schemas.
            Some(Ordering::Equal) if self != other => None,
            o => o,
        }
    }
}

impl UserDefinedLogicalNodeCore for GapFill {
    fn name(&self) -> &str {
        "GapFill"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "GapFill: stride={}ns origin={} range=[{}, {}) fills={:?}",
            self.params.stride_ns,
            self.params.origin_ns,
            self.params.start_ns,
            self.params.end_ns,
            self.params.fills
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> DfResult<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("GapFill has one input".into()))?;
        Ok(GapFill {
            input,
            params: self.params.clone(),
            schema: self.schema.clone(),
        })
    }

    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        // Every column is needed: the group columns say what a gap is.
        let _ = output_columns;
        Some(vec![(0..self.input.schema().fields().len()).collect()])
    }
}

fn is_gapfill(f: &ScalarFunction) -> bool {
    f.func.inner().is::<DateBinGapfill>()
}

fn fill_of(e: &Expr) -> Option<(Fill, &Expr)> {
    match e {
        Expr::ScalarFunction(f) => {
            let fill = f.func.inner().downcast_ref::<FillFunction>()?;
            let [arg] = f.args.as_slice() else {
                return None;
            };
            Some((
                if fill.interpolate {
                    Fill::Interpolate
                } else {
                    Fill::Locf
                },
                arg,
            ))
        }
        _ => None,
    }
}

/// The optimizer rule; see the module documentation.
#[derive(Debug, Default)]
pub struct GapFillRule;

impl OptimizerRule for GapFillRule {
    fn name(&self) -> &str {
        "sealion_gap_fill"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Projection(p) = &plan else {
            return Ok(Transformed::no(plan));
        };
        let LogicalPlan::Aggregate(agg) = p.input.as_ref() else {
            return Ok(Transformed::no(plan));
        };
        let bucket_at = agg.group_expr.iter().position(|g| {
            let mut g = g;
            while let Expr::Alias(a) = g {
                g = &a.expr;
            }
            matches!(g, Expr::ScalarFunction(f) if is_gapfill(f))
        });
        let Some(time) = bucket_at else {
            return Ok(Transformed::no(plan));
        };
        rewrite(p, agg, time).map(Transformed::yes)
    }
}

/// `Projection(Aggregate)` with the gap-filling group at `time` into
/// `Projection(GapFill(Aggregate))`.
fn rewrite(p: &Projection, agg: &Aggregate, time: usize) -> DfResult<LogicalPlan> {
    // The bucket becomes a plain date_bin, named as before.
    let mut group_expr = agg.group_expr.clone();
    let original = group_expr[time].clone();
    let mut inner = &original;
    while let Expr::Alias(a) = inner {
        inner = &a.expr;
    }
    let Expr::ScalarFunction(f) = inner else {
        return Err(DataFusionError::Internal("gap-fill bucket moved".into()));
    };
    let (stride_ns, origin_ns) = crate::aggregate::bucket_args(&f.args).ok_or_else(|| {
        DataFusionError::Plan(
            "date_bin_gapfill(interval, time[, origin]) needs a fixed interval (no months) and a literal origin".into(),
        )
    })?;
    // The range comes from the WHERE clause below the aggregate.
    let (start_ns, end_ns, time_name) = time_bounds(&agg.input).ok_or_else(|| {
        DataFusionError::Plan(
            "date_bin_gapfill needs the WHERE clause to bound time on both sides (time >= ... AND time < ...)".into(),
        )
    })?;
    if !f
        .args
        .get(1)
        .is_some_and(|a| crate::table::is_time_column(a, &time_name))
    {
        return plan_err!("date_bin_gapfill buckets the table's time column ({time_name})");
    }
    let plain = Expr::ScalarFunction(ScalarFunction::new_udf(date_bin_udf(), f.args.clone()));
    group_expr[time] = plain.alias(original.schema_name().to_string());
    let new_agg = LogicalPlan::Aggregate(Aggregate::try_new(
        agg.input.clone(),
        group_expr,
        agg.aggr_expr.clone(),
    )?);
    let mut fills: Vec<(usize, Fill)> = Vec::new();
    let mut extra_fields = Vec::new();
    let mut exprs = Vec::with_capacity(p.expr.len());
    for e in &p.expr {
        let (name, body) = match e {
            Expr::Alias(a) => (Some(a.name.clone()), a.expr.as_ref()),
            e => (None, e),
        };
        match fill_of(body) {
            Some((fill, arg)) => {
                let mut arg = arg;
                while let Expr::Alias(a) = arg {
                    arg = &a.expr;
                }
                let Expr::Column(c) = arg else {
                    return plan_err!("{e}: locf and interpolate take an aggregate");
                };
                let i = new_agg.schema().index_of_column(c)?;
                if i < agg.group_expr.len() {
                    return plan_err!("{e}: locf and interpolate take an aggregate, not a group");
                }
                // The filled copy is a column of its own, so the same
                // aggregate can also be asked for unfilled.
                let column = format!("__gapfill_{}", fills.len());
                let field = new_agg.schema().field(i).as_ref().clone();
                extra_fields.push((None, Arc::new(field.with_name(&column).with_nullable(true))));
                fills.push((i, fill));
                let name = name.unwrap_or_else(|| body.schema_name().to_string());
                exprs.push(Expr::Column(datafusion::common::Column::from_name(column)).alias(name));
            }
            None => exprs.push(e.clone()),
        }
    }
    let groups: Vec<usize> = (0..agg.group_expr.len()).filter(|&i| i != time).collect();
    // Gap rows have NULL aggregates.
    let input_schema = new_agg.schema();
    let mut fields: Vec<_> = input_schema
        .iter()
        .enumerate()
        .map(|(i, (q, f))| {
            let nullable = f.is_nullable() || i >= agg.group_expr.len();
            (
                q.cloned(),
                Arc::new(f.as_ref().clone().with_nullable(nullable)),
            )
        })
        .collect();
    fields.extend(extra_fields);
    let schema = Arc::new(DFSchema::new_with_metadata(
        fields,
        input_schema.metadata().clone(),
    )?);
    let fill = LogicalPlan::Extension(Extension {
        node: Arc::new(GapFill {
            input: new_agg,
            params: GapFillParams {
                time,
                groups,
                stride_ns,
                origin_ns,
                start_ns,
                end_ns,
                fills,
            },
            schema,
        }),
    });
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(fill),
    )?))
}

/// `[start, end)` of time from the filter under an aggregate, when both
/// ends are bounded, and the name of the time column. Only conjuncts that
/// compare the time column itself with a literal count: the range says
/// which buckets exist, so it must be exact (pruning's wider bounds from
/// `date_trunc` or OR would invent buckets the filter excludes).
fn time_bounds(plan: &LogicalPlan) -> Option<(i64, i64, String)> {
    let mut plan = plan;
    let mut above: Vec<&Expr> = Vec::new();
    let scan = loop {
        match plan {
            LogicalPlan::Projection(p) => plan = &p.input,
            LogicalPlan::Filter(f) => {
                above = split_conjunction(&f.predicate);
                match f.input.as_ref() {
                    LogicalPlan::TableScan(s) => break s,
                    _ => return None,
                }
            }
            LogicalPlan::TableScan(s) => break s,
            _ => return None,
        }
    };
    let provider = datafusion::datasource::source_as_provider(&scan.source).ok()?;
    let table = provider
        .as_ref()
        .downcast_ref::<crate::table::SealionTable>()?;
    let time = sealion_common::catalog::time_column(&table.table)?
        .name
        .clone();
    // The time bounds sit in the scan's filters (the table applies them
    // exactly, so no filter above repeats them); the filter above is read
    // too, for conjuncts DataFusion left there.
    let conjuncts: Vec<Expr> = scan
        .filters
        .iter()
        .flat_map(split_conjunction)
        .chain(above)
        .filter(|c| crate::table::exact_time_bound(c, &time))
        .cloned()
        .collect();
    let r = crate::table::time_range_of(&conjuncts, &time);
    (r.start_ns > i64::MIN && r.end_ns < i64::MAX && r.start_ns < r.end_ns)
        .then_some((r.start_ns, r.end_ns, time))
}

/// Plans [`GapFill`] nodes.
pub struct GapFillPlanner;

#[async_trait]
impl ExtensionPlanner for GapFillPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<GapFill>() else {
            return Ok(None);
        };
        let [input] = physical_inputs else {
            return Err(DataFusionError::Internal("GapFill has one input".into()));
        };
        Ok(Some(Arc::new(GapFillExec::new(
            input.clone(),
            node.params.clone(),
            Arc::new(node.schema.as_arrow().clone()),
        ))))
    }
}

/// Fills the gaps of its (single-partition) input.
#[derive(Debug)]
pub struct GapFillExec {
    input: Arc<dyn ExecutionPlan>,
    params: GapFillParams,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl GapFillExec {
    fn new(input: Arc<dyn ExecutionPlan>, params: GapFillParams, schema: SchemaRef) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        GapFillExec {
            input,
            params,
            schema,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for GapFillExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "GapFillExec: stride={}ns range=[{}, {}) fills={:?}",
            self.params.stride_ns, self.params.start_ns, self.params.end_ns, self.params.fills
        )
    }
}

impl ExecutionPlan for GapFillExec {
    fn name(&self) -> &str {
        "GapFillExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
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
        let input = crate::leaf::only_child(children, "GapFillExec")?;
        Ok(Arc::new(GapFillExec::new(
            input,
            self.params.clone(),
            self.schema.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        crate::leaf::only_partition(partition, "GapFillExec")?;
        let mut input = self.input.execute(0, context.clone())?;
        let params = self.params.clone();
        let schema = self.schema.clone();
        let out_schema = schema.clone();
        let reservation = MemoryConsumer::new("GapFillExec").register(context.memory_pool());
        let stream = futures::stream::once(async move {
            let mut batches = Vec::new();
            while let Some(b) = input.next().await {
                let b = b?;
                reservation.try_grow(b.get_array_memory_size())?;
                batches.push(b);
            }
            let input_schema = match batches.first() {
                Some(b) => b.schema(),
                None => return Ok(RecordBatch::new_empty(out_schema)),
            };
            let all = arrow::compute::concat_batches(&input_schema, &batches)?;
            drop(batches);
            let out = fill_batch(&all, &params, &out_schema)?;
            reservation.free();
            Ok(out)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// First bucket start at or below `t`, as date_bin computes it.
fn bucket(t: i64, stride: i64, origin: i64) -> i64 {
    let d = t.wrapping_sub(origin);
    origin.wrapping_add(d.div_euclid(stride) * stride)
}

/// One output row: the group's representative input row, the bucket, and
/// the input row of that bucket if there is one.
#[derive(Debug, Clone, Copy, PartialEq)]
struct OutRow {
    rep: usize,
    bucket: i64,
    row: Option<usize>,
}

/// The output rows for input rows in `order` (sorted by group, then time),
/// `same_group(a, b)` telling whether two input rows share a group.
fn plan_rows(
    order: &[usize],
    times: &[i64],
    same_group: impl Fn(usize, usize) -> bool,
    p: &GapFillParams,
) -> DfResult<Vec<OutRow>> {
    let first = bucket(p.start_ns, p.stride_ns, p.origin_ns);
    let mut out = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let rep = order[i];
        let mut j = i;
        while j < order.len() && same_group(rep, order[j]) {
            j += 1;
        }
        let rows = &order[i..j];
        let mut k = 0;
        let mut b = first;
        while b < p.end_ns {
            // Rows before this bucket (outside the range) are kept as they are.
            while k < rows.len() && times[rows[k]] < b {
                out.push(OutRow {
                    rep,
                    bucket: times[rows[k]],
                    row: Some(rows[k]),
                });
                k += 1;
            }
            if k < rows.len() && times[rows[k]] == b {
                out.push(OutRow {
                    rep,
                    bucket: b,
                    row: Some(rows[k]),
                });
                k += 1;
            } else {
                out.push(OutRow {
                    rep,
                    bucket: b,
                    row: None,
                });
            }
            if out.len() > MAX_FILLED_ROWS {
                return Err(DataFusionError::ResourcesExhausted(format!(
                    "gap filling would produce more than {MAX_FILLED_ROWS} rows; widen the bucket or narrow the time range"
                )));
            }
            b = match b.checked_add(p.stride_ns) {
                Some(b) => b,
                None => break,
            };
        }
        for &r in &rows[k..] {
            out.push(OutRow {
                rep,
                bucket: times[r],
                row: Some(r),
            });
        }
        i = j;
    }
    Ok(out)
}

/// For column `values` over `rows` (one group's output rows in time
/// order): the input row each output row takes its value from under
/// `locf`, or None.
fn locf_sources(rows: &[OutRow], values: &dyn Array) -> Vec<Option<usize>> {
    let mut last = None;
    rows.iter()
        .map(|r| {
            if let Some(i) = r.row.filter(|&i| values.is_valid(i)) {
                last = Some(i);
            }
            last
        })
        .collect()
}

/// Linear interpolation of `values` (as f64) over one group's output rows;
/// None outside the first and last known values.
fn interpolated(rows: &[OutRow], values: &[Option<f64>]) -> Vec<Option<f64>> {
    let known: Vec<(usize, i64, f64)> = rows
        .iter()
        .enumerate()
        .filter_map(|(k, r)| r.row.and_then(|i| values[i]).map(|v| (k, r.bucket, v)))
        .collect();
    let mut out = vec![None; rows.len()];
    for &(k, _, v) in &known {
        out[k] = Some(v);
    }
    for w in known.windows(2) {
        let ((ka, ta, va), (kb, tb, vb)) = (w[0], w[1]);
        for (k, slot) in out.iter_mut().enumerate().take(kb).skip(ka + 1) {
            let t = rows[k].bucket;
            let f = (t - ta) as f64 / (tb - ta) as f64;
            *slot = Some(va + (vb - va) * f);
        }
    }
    out
}

fn fill_batch(input: &RecordBatch, p: &GapFillParams, schema: &SchemaRef) -> DfResult<RecordBatch> {
    let n = input.num_rows();
    let time_col = cast(
        input.column(p.time),
        &DataType::Timestamp(arrow::datatypes::TimeUnit::Nanosecond, None),
    )?;
    let times_arr = time_col.as_primitive::<arrow::datatypes::TimestampNanosecondType>();
    let times: Vec<i64> = (0..n).map(|i| times_arr.value(i)).collect();
    // Group keys as comparable rows.
    // With no group besides the bucket, every row is in one group.
    if p.groups.is_empty() {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| times[i]);
        let rows = plan_rows(&order, &times, |_, _| true, p)?;
        return build_output(input, p, schema, &times, rows);
    }
    let converter = RowConverter::new(
        p.groups
            .iter()
            .map(|&g| SortField::new(input.column(g).data_type().clone()))
            .collect(),
    )?;
    let group_cols: Vec<ArrayRef> = p.groups.iter().map(|&g| input.column(g).clone()).collect();
    let keys = converter.convert_columns(&group_cols)?;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| match keys.row(a).cmp(&keys.row(b)) {
        Ordering::Equal => times[a].cmp(&times[b]),
        o => o,
    });
    let rows = plan_rows(&order, &times, |a, b| keys.row(a) == keys.row(b), p)?;
    build_output(input, p, schema, &times, rows)
}

/// The output batch for `rows` (see [`plan_rows`]).
fn build_output(
    input: &RecordBatch,
    p: &GapFillParams,
    schema: &SchemaRef,
    times: &[i64],
    rows: Vec<OutRow>,
) -> DfResult<RecordBatch> {
    let n = times.len();
    // Per group, the span of its output rows (for locf and interpolate).
    let mut spans = Vec::new();
    let mut s = 0;
    for k in 1..=rows.len() {
        if k == rows.len() || rows[k].rep != rows[s].rep {
            spans.push(s..k);
            s = k;
        }
    }
    let fields = schema.fields();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.len());
    for (c, col) in input.columns().iter().enumerate() {
        let array: ArrayRef = if c == p.time {
            let b = TimestampNanosecondArray::from_iter_values(rows.iter().map(|r| r.bucket));
            cast(&b, fields[c].data_type())?
        } else if p.groups.contains(&c) {
            let idx = UInt32Array::from_iter_values(rows.iter().map(|r| r.rep as u32));
            arrow::compute::take(col.as_ref(), &idx, None)?
        } else {
            let idx = UInt32Array::from_iter(rows.iter().map(|r| r.row.map(|i| i as u32)));
            arrow::compute::take(col.as_ref(), &idx, None)?
        };
        columns.push(array);
    }
    for (k, &(c, fill)) in p.fills.iter().enumerate() {
        let col = input.column(c);
        let field = &fields[input.num_columns() + k];
        let array: ArrayRef = match fill {
            Fill::Null => {
                let idx = UInt32Array::from_iter(rows.iter().map(|r| r.row.map(|i| i as u32)));
                arrow::compute::take(col.as_ref(), &idx, None)?
            }
            Fill::Locf => {
                let mut src = Vec::with_capacity(rows.len());
                for span in &spans {
                    src.extend(locf_sources(&rows[span.clone()], col.as_ref()));
                }
                let idx = UInt32Array::from_iter(src.into_iter().map(|i| i.map(|i| i as u32)));
                arrow::compute::take(col.as_ref(), &idx, None)?
            }
            Fill::Interpolate => {
                if !col.data_type().is_numeric() {
                    return Err(DataFusionError::Plan(format!(
                        "interpolate() takes a number, not {}",
                        col.data_type()
                    )));
                }
                let f = cast(col, &DataType::Float64)?;
                let f = f.as_primitive::<Float64Type>();
                let values: Vec<Option<f64>> =
                    (0..n).map(|i| f.is_valid(i).then(|| f.value(i))).collect();
                let mut out = Vec::with_capacity(rows.len());
                for span in &spans {
                    out.extend(interpolated(&rows[span.clone()], &values));
                }
                let arr = arrow::array::Float64Array::from(out);
                // Integers are rounded to the nearest.
                let arr = if col.data_type().is_integer() {
                    arr.unary::<_, Float64Type>(f64::round)
                } else {
                    arr
                };
                let arr: ArrayRef = Arc::new(arr);
                let filled = cast(&arr, field.data_type())?;
                // Known values come from the input itself, not through f64.
                let idx = UInt32Array::from_iter(rows.iter().map(|r| r.row.map(|i| i as u32)));
                let known = arrow::compute::take(col.as_ref(), &idx, None)?;
                let known = cast(&known, field.data_type())?;
                let mask = arrow::compute::is_not_null(&known)?;
                arrow::compute::kernels::zip::zip(&mask, &known, &filled)?
            }
        };
        columns.push(array);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(stride: i64, start: i64, end: i64) -> GapFillParams {
        GapFillParams {
            time: 0,
            groups: vec![1],
            stride_ns: stride,
            origin_ns: 0,
            start_ns: start,
            end_ns: end,
            fills: vec![],
        }
    }

    #[test]
    fn every_bucket_of_the_range_appears_once_per_group() {
        // Group 0 has rows at 10 and 30; group 1 at 20. Stride 10 over [5, 40).
        let times = vec![10, 30, 20];
        let group = [0, 0, 1];
        let order = vec![0, 1, 2];
        let rows = plan_rows(
            &order,
            &times,
            |a, b| group[a] == group[b],
            &params(10, 5, 40),
        )
        .unwrap();
        let got: Vec<(usize, i64, Option<usize>)> =
            rows.iter().map(|r| (r.rep, r.bucket, r.row)).collect();
        assert_eq!(
            got,
            vec![
                (0, 0, None),
                (0, 10, Some(0)),
                (0, 20, None),
                (0, 30, Some(1)),
                (2, 0, None),
                (2, 10, None),
                (2, 20, Some(2)),
                (2, 30, None),
            ]
        );
    }

    #[test]
    fn locf_carries_the_last_value_and_interpolation_draws_lines() {
        let rows: Vec<OutRow> = [Some(0), None, None, Some(1), None]
            .iter()
            .enumerate()
            .map(|(k, r)| OutRow {
                rep: 0,
                bucket: 10 * k as i64,
                row: *r,
            })
            .collect();
        let values = arrow::array::Float64Array::from(vec![Some(1.0), Some(7.0)]);
        assert_eq!(
            locf_sources(&rows, &values),
            vec![Some(0), Some(0), Some(0), Some(1), Some(1)]
        );
        assert_eq!(
            interpolated(&rows, &[Some(1.0), Some(7.0)]),
            vec![Some(1.0), Some(3.0), Some(5.0), Some(7.0), None]
        );
    }
}
