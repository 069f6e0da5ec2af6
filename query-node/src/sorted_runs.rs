//! `ORDER BY` one time column above a Sealion scan, without sorting rows
//! that come sorted.
//!
//! A storage node answers a plain rows scan in (series, time) order within
//! each part it reads, and partitions cover disjoint time ranges: the rows
//! of one series (`WHERE hostname = 'h' ORDER BY time`, a lookup over all
//! history) arrive as batches that are each in time order and whose time
//! ranges do not overlap, only perhaps in another order (a scan split over
//! two threads hands its parts on as they come). DataFusion's `SortExec`
//! sorts them all the same: at 10M rows, one host's 100,000 rows took 5.0
//! ms with the sort and 2.4 ms without it.
//!
//! [`SortedRunsRule`] puts a [`SortedRunsExec`] where DataFusion planned a
//! `SortExec` with no fetch on one column of 64-bit integers or timestamps
//! directly above a `SealionScanExec` (through the `CooperativeExec`
//! DataFusion adds). It gathers its input as the sort would, under the
//! query's memory pool; when every batch is in order on the column, with no
//! NULL, and the batches' ranges do not overlap, it hands them on in order
//! of their ranges, none copied; when that holds in the opposite direction
//! (`ORDER BY time DESC` over one series), it hands them on in the opposite
//! order, each turned around (a copy, no sort); otherwise it gives the
//! gathered batches to the `SortExec` it replaced, so the answer is the
//! sort's in every case. Input beyond the query's memory pool goes to the
//! sort too (the gathered batches, then the rest), which spills to disk as
//! it would have.
//!
//! Batches that are each in order on the sort keys (or each in the
//! opposite order) but whose ranges overlap, on any sort keys, not only one
//! time column, are merged by DataFusion's streaming merge, the one a sort
//! ends with, instead of being sorted first (a batch in the opposite order
//! turned around), when they average [`MIN_RUN_ROWS`] rows or more and are
//! no more than [`MAX_RUNS`]: with the sort's comparisons on the same keys,
//! the answer is the sort's. Batches that each hold several series' rows
//! in order by time (`ORDER BY time` over many hosts, TSBS `high-cpu-all`'s
//! `ORDER BY time, hostname`) are not cut into their runs to be merged:
//! measured at 10M rows (`bench/results/ab-2026-12-06-merged-runs.md`),
//! `high-cpu-all` (45k rows in six batches, 100 runs) took 37.5 ms with
//! its runs merged and 32.7 with the sort, which sorts each batch and
//! merges six; 432k rows of all hosts `ORDER BY time` (53 batches, 151
//! runs) 42.1 and 42.3. The fan-in of the merge is its cost, and
//! cut into runs it is higher than the sort's. EXPLAIN ANALYZE counts
//! `batches_in_order`, `batches_turned`, `runs_merged`,
//! `rows_merged`, `rows_sorted` and `over_memory`.

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date64Type, Int64Type, SchemaRef, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::EmptyRecordBatchStream;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::streaming_merge::StreamingMergeBuilder;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{StreamExt, TryStreamExt};

use crate::scan_exec::SealionScanExec;

/// Replaces a `SortExec` with no fetch above a Sealion scan with a
/// [`SortedRunsExec`]; see the module documentation.
#[derive(Debug, Default)]
pub struct SortedRunsRule;

impl PhysicalOptimizerRule for SortedRunsRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|plan| {
            Ok(match SortedRunsExec::try_new(Arc::clone(&plan)) {
                Some(exec) => Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>),
                None => Transformed::no(plan),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "sealion_sorted_runs"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A sort that passes batches already in order on without sorting them;
/// see the module documentation.
#[derive(Debug)]
pub struct SortedRunsExec {
    /// The `SortExec` this stands for: its input is this exec's input, its
    /// properties this exec's, and it sorts whatever does not come in order.
    sort: Arc<dyn ExecutionPlan>,
    /// The sort's keys.
    ordering: LexOrdering,
    /// When the sort is on one column of 64-bit integers or timestamps:
    /// which, and whether descending (the batches may then pass whole).
    column: Option<(usize, bool)>,
    metrics: ExecutionPlanMetricsSet,
}

/// Runs shorter than this on average are not merged: the batches go to the
/// sort (a merge costs a comparison per row per level of its tree, and
/// each run a cursor).
pub const MIN_RUN_ROWS: usize = 16;
/// Runs merged at most; more go to the sort.
pub const MAX_RUNS: usize = 16_384;

impl SortedRunsExec {
    /// `plan` in a `SortedRunsExec` when it is a `SortExec` this can stand
    /// for: no fetch (a top-k keeps few rows anyway), a Sealion scan below.
    pub fn try_new(plan: Arc<dyn ExecutionPlan>) -> Option<SortedRunsExec> {
        let any: &dyn std::any::Any = plan.as_ref();
        let sort = any.downcast_ref::<SortExec>()?;
        if sort.fetch().is_some() {
            return None;
        }
        let input = sort.input();
        let any: &dyn std::any::Any = input.as_ref();
        let below = match any.downcast_ref::<CooperativeExec>() {
            Some(coop) => coop.input(),
            None => input,
        };
        let any: &dyn std::any::Any = below.as_ref();
        any.downcast_ref::<SealionScanExec>()?;
        Some(SortedRunsExec::over(plan.clone()))
    }

    /// Stands for `sort`, a `SortExec`.
    fn over(sort: Arc<dyn ExecutionPlan>) -> SortedRunsExec {
        let any: &dyn std::any::Any = sort.as_ref();
        let ordering = any
            .downcast_ref::<SortExec>()
            .expect("a SortedRunsExec stands for a SortExec")
            .expr()
            .clone();
        let column = one_i64_column(&ordering, &sort.children()[0].schema());
        SortedRunsExec {
            sort,
            ordering,
            column,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    fn input(&self) -> &Arc<dyn ExecutionPlan> {
        self.sort.children()[0]
    }
}

/// The column and direction of `ordering` when it is one column of 64-bit
/// integers or timestamps.
fn one_i64_column(ordering: &LexOrdering, schema: &SchemaRef) -> Option<(usize, bool)> {
    if ordering.len() != 1 {
        return None;
    }
    let key = ordering.first();
    let any: &dyn std::any::Any = key.expr.as_ref();
    let column = any.downcast_ref::<Column>()?.index();
    let field = schema.fields().get(column)?;
    is_i64(field.data_type()).then_some((column, key.options.descending))
}

/// Whether values of type `t` are 64-bit integers underneath.
fn is_i64(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int64 | DataType::Date64 | DataType::Timestamp(_, _)
    )
}

/// The values of `a` as 64-bit integers, if it is of such a type.
fn i64_values(a: &ArrayRef) -> Option<&[i64]> {
    Some(match a.data_type() {
        DataType::Int64 => a.as_primitive::<Int64Type>().values(),
        DataType::Date64 => a.as_primitive::<Date64Type>().values(),
        DataType::Timestamp(TimeUnit::Second, _) => {
            a.as_primitive::<TimestampSecondType>().values()
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            a.as_primitive::<TimestampMillisecondType>().values()
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            a.as_primitive::<TimestampMicrosecondType>().values()
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            a.as_primitive::<TimestampNanosecondType>().values()
        }
        _ => return None,
    })
}

/// The order in which `batches` stand sorted on `column` (ascending, or
/// descending when `descending`), if they do without moving a row: each
/// batch in order inside, no NULL, and no two batches' ranges overlapping
/// (equal ends may touch). Empty batches are left out.
pub fn order_of_runs(
    batches: &[RecordBatch],
    column: usize,
    descending: bool,
) -> Option<Vec<usize>> {
    // (first, last) of each non-empty batch, in the sort's direction.
    let mut runs: Vec<(i64, i64, usize)> = Vec::with_capacity(batches.len());
    for (i, b) in batches.iter().enumerate() {
        if b.num_rows() == 0 {
            continue;
        }
        let a = b.column(column);
        if a.null_count() > 0 {
            return None;
        }
        let v = i64_values(a)?;
        let in_order = if descending {
            v.windows(2).all(|w| w[0] >= w[1])
        } else {
            v.windows(2).all(|w| w[0] <= w[1])
        };
        if !in_order {
            return None;
        }
        runs.push((v[0], v[v.len() - 1], i));
    }
    // By first value, then last: of runs that start at one value, those
    // that are nothing else come first.
    if descending {
        runs.sort_unstable_by(|a, b| (b.0, b.1).cmp(&(a.0, a.1)));
    } else {
        runs.sort_unstable_by_key(|r| (r.0, r.1));
    }
    let touching = runs.windows(2).all(|w| {
        if descending {
            w[0].1 >= w[1].0
        } else {
            w[0].1 <= w[1].0
        }
    });
    touching.then(|| runs.into_iter().map(|r| r.2).collect())
}

/// `batches` as runs to merge on `ordering`: each batch whose rows stand
/// in order is one run as it is; one whose rows stand in the opposite
/// order is one run turned around (a copy). `None` as soon as a batch is
/// neither (it holds several runs: the sort, which merges no more streams
/// than there are batches, is cheaper than a merge of all those runs), or
/// when the runs would be more than [`MAX_RUNS`] or shorter than
/// [`MIN_RUN_ROWS`] on average.
pub fn runs_of(batches: &[RecordBatch], ordering: &LexOrdering) -> DfResult<Option<Runs>> {
    // First which way each batch stands.
    let mut turn: Vec<bool> = Vec::with_capacity(batches.len());
    let (mut count, mut rows) = (0usize, 0usize);
    for b in batches {
        let n = b.num_rows();
        if n == 0 {
            turn.push(false);
            continue;
        }
        count += 1;
        rows += n;
        if count > MAX_RUNS {
            return Ok(None);
        }
        let keys = ordering
            .iter()
            .map(|e| e.evaluate_to_sort_column(b))
            .collect::<DfResult<Vec<_>>>()?;
        let cmp = arrow::compute::LexicographicalComparator::try_new(&keys)?;
        // Whether some row stands above the next, and some below.
        let (mut up, mut down) = (false, false);
        for i in 1..n {
            match cmp.compare(i - 1, i) {
                std::cmp::Ordering::Greater => up = true,
                std::cmp::Ordering::Less => down = true,
                std::cmp::Ordering::Equal => {}
            }
            if up && down {
                return Ok(None);
            }
        }
        turn.push(up);
    }
    if count * MIN_RUN_ROWS > rows {
        return Ok(None);
    }
    let mut runs = Runs {
        batches: Vec::with_capacity(count),
        turned: 0,
        rows,
    };
    for (b, turn) in batches.iter().zip(turn) {
        if b.num_rows() == 0 {
            continue;
        }
        runs.batches.push(if turn {
            runs.turned += 1;
            turned_around(b)?
        } else {
            b.clone()
        });
    }
    Ok(Some(runs))
}

/// What [`runs_of`] found: the batches as runs to merge.
pub struct Runs {
    /// Each in order on the keys.
    pub batches: Vec<RecordBatch>,
    /// How many were turned around.
    pub turned: usize,
    /// Their rows.
    pub rows: usize,
}

/// `runs`, each in order on `ordering`, merged into one stream in that
/// order by DataFusion's streaming merge.
fn merged(
    runs: Vec<RecordBatch>,
    schema: SchemaRef,
    ordering: &LexOrdering,
    metrics: BaselineMetrics,
    context: &TaskContext,
) -> DfResult<SendableRecordBatchStream> {
    if runs.is_empty() {
        return Ok(Box::pin(EmptyRecordBatchStream::new(schema)));
    }
    let streams = runs
        .into_iter()
        .map(|run| {
            let one = futures::stream::iter([Ok(run)]);
            Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), one))
                as SendableRecordBatchStream
        })
        .collect();
    let reservation = MemoryConsumer::new("SortedRunsExec merge").register(context.memory_pool());
    StreamingMergeBuilder::new()
        .with_streams(streams)
        .with_schema(schema)
        .with_expressions(ordering)
        .with_metrics(metrics)
        .with_batch_size(context.session_config().batch_size())
        .with_fetch(None)
        .with_reservation(reservation)
        .build()
}

/// On one integer column: the order in which `batches` pass as they are
/// (in order as asked), or, failing that, in the opposite order (one series
/// asked newest first) with `true`: each batch then to be turned around (a
/// copy, but no sort).
fn passing_order(
    batches: &[RecordBatch],
    column: usize,
    descending: bool,
) -> (Option<Vec<usize>>, bool) {
    if let Some(order) = order_of_runs(batches, column, descending) {
        return (Some(order), false);
    }
    match order_of_runs(batches, column, !descending) {
        Some(mut order) => {
            order.reverse();
            (Some(order), true)
        }
        None => (None, false),
    }
}

/// `stream` holding `reservation` until it is dropped: the memory of
/// gathered batches it hands on (or merges) stays accounted for till then.
fn holding(
    stream: impl futures::Stream<Item = DfResult<RecordBatch>> + Send + 'static,
    reservation: datafusion::execution::memory_pool::MemoryReservation,
    schema: &SchemaRef,
) -> SendableRecordBatchStream {
    let held = stream.map(move |b| {
        let _ = &reservation;
        b
    });
    Box::pin(RecordBatchStreamAdapter::new(Arc::clone(schema), held))
}

/// One stream, handed out once: what the sort replaced reads, through a
/// `StreamingTableExec`, when the batches do not pass as they are.
struct OnceStream {
    schema: SchemaRef,
    stream: std::sync::Mutex<Option<SendableRecordBatchStream>>,
}

impl fmt::Debug for OnceStream {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("OnceStream")
    }
}

impl PartitionStream for OnceStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self.stream.lock().ok().and_then(|mut s| s.take());
        taken.unwrap_or_else(|| {
            let again = DataFusionError::Internal("a sorted-runs fallback runs once".into());
            Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                futures::stream::once(async move { Err(again) }),
            ))
        })
    }
}

/// `sort` (the `SortExec` replaced) run over `batches`: those gathered,
/// then whatever `rest` of the input is left.
fn sort_of(
    sort: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    rest: impl futures::Stream<Item = DfResult<RecordBatch>> + Send + 'static,
    context: Arc<TaskContext>,
) -> DfResult<SendableRecordBatchStream> {
    let all = futures::stream::iter(batches.into_iter().map(Ok)).chain(rest);
    let once = OnceStream {
        schema: Arc::clone(&schema),
        stream: std::sync::Mutex::new(Some(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&schema),
            all,
        )))),
    };
    let source = StreamingTableExec::try_new(schema, vec![Arc::new(once)], None, [], false, None)?;
    let children = vec![Arc::new(source) as Arc<dyn ExecutionPlan>];
    sort.replace_children(children, recompute())?
        .execute(0, context)
}

/// Children of other properties than before: a plan's own are worked out
/// again.
fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

/// `b` with its rows in the opposite order.
fn turned_around(b: &RecordBatch) -> DfResult<RecordBatch> {
    let n = b.num_rows() as u32;
    let indices = arrow::array::UInt32Array::from_iter_values((0..n).rev());
    Ok(arrow::compute::take_record_batch(b, &indices)?)
}

impl DisplayAs for SortedRunsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "SortedRunsExec: expr=[{}] (batches in order pass unsorted)",
            self.ordering
        )
    }
}

impl ExecutionPlan for SortedRunsExec {
    fn name(&self) -> &str {
        "SortedRunsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.sort.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        self.sort.apply_expressions(f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let sort = Arc::clone(&self.sort).replace_children(children, recompute())?;
        Ok(Arc::new(SortedRunsExec::over(sort)))
    }

    /// A fresh copy (its counters are its only state), for a run of a kept
    /// plan.
    fn reset_state(self: Arc<Self>) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(SortedRunsExec::over(Arc::clone(&self.sort))))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let mut input = self.input().execute(partition, Arc::clone(&context))?;
        let schema = self.schema();
        let sort = Arc::clone(&self.sort);
        let column = self.column;
        let ordering = self.ordering.clone();
        let in_order = MetricBuilder::new(&self.metrics).counter("batches_in_order", partition);
        let sorted = MetricBuilder::new(&self.metrics).counter("rows_sorted", partition);
        let turned = MetricBuilder::new(&self.metrics).counter("batches_turned", partition);
        let runs_merged = MetricBuilder::new(&self.metrics).counter("runs_merged", partition);
        let rows_merged = MetricBuilder::new(&self.metrics).counter("rows_merged", partition);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let reservation = MemoryConsumer::new(format!("SortedRunsExec[{partition}]"))
            .register(context.memory_pool());
        let out_schema = Arc::clone(&schema);
        let over = MetricBuilder::new(&self.metrics).counter("over_memory", partition);
        let stream = futures::stream::once(async move {
            let mut batches = Vec::new();
            while let Some(b) = input.next().await {
                let b = b?;
                let room = reservation.try_grow(b.get_array_memory_size());
                batches.push(b);
                if room.is_err() {
                    // More than the query's memory holds: the sort takes
                    // what was gathered and the rest of the input, and
                    // spills to disk as it must.
                    over.add(1);
                    drop(reservation);
                    return sort_of(sort, out_schema, batches, input, context);
                }
            }
            drop(input);
            let (order, turn) = match column {
                Some((column, descending)) => passing_order(&batches, column, descending),
                None => (None, false),
            };
            // Else the batches' runs merged, if they are long enough.
            let runs = match order {
                Some(_) => None,
                None => runs_of(&batches, &ordering)?,
            };
            Ok::<SendableRecordBatchStream, DataFusionError>(match (order, runs) {
                (None, Some(runs)) => {
                    runs_merged.add(runs.batches.len());
                    rows_merged.add(runs.rows);
                    turned.add(runs.turned);
                    // The runs are the gathered batches (shared, or
                    // copies turned around), held until the merge is done.
                    drop(batches);
                    let merge = merged(
                        runs.batches,
                        Arc::clone(&out_schema),
                        &ordering,
                        baseline,
                        &context,
                    )?;
                    holding(merge, reservation, &out_schema)
                }
                (Some(order), _) => {
                    in_order.add(order.len());
                    if turn {
                        turned.add(order.len());
                    }
                    let mut batches: Vec<Option<RecordBatch>> =
                        batches.into_iter().map(Some).collect();
                    let ordered: Vec<DfResult<RecordBatch>> = order
                        .into_iter()
                        .filter_map(|i| batches[i].take())
                        .map(|b| if turn { turned_around(&b) } else { Ok(b) })
                        .collect();
                    holding(futures::stream::iter(ordered), reservation, &out_schema)
                }
                (None, None) => {
                    sorted.add(batches.iter().map(|b| b.num_rows()).sum());
                    // The sort accounts for the rows as it takes them.
                    drop(reservation);
                    let none = futures::stream::empty();
                    sort_of(sort, out_schema, batches, none, context)?
                }
            })
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, TimestampNanosecondArray};
    use arrow::datatypes::{Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
    use datafusion::physical_plan::collect;
    use proptest::prelude::*;

    fn schema() -> arrow::datatypes::SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(
                "time",
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                true,
            ),
            Field::new("row", DataType::Int64, false),
        ]))
    }

    /// A batch for each chunk: the columns `keys` makes of it, then the
    /// row number, rows numbered across the chunks.
    fn numbered<T>(
        chunks: &[Vec<T>],
        schema: arrow::datatypes::SchemaRef,
        keys: impl Fn(&[T]) -> Vec<ArrayRef>,
    ) -> Vec<RecordBatch> {
        let mut row = 0i64;
        chunks
            .iter()
            .map(|c| {
                let rows: Vec<i64> = (row..row + c.len() as i64).collect();
                row += c.len() as i64;
                let mut columns = keys(c);
                columns.push(Arc::new(Int64Array::from(rows)));
                RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
            })
            .collect()
    }

    /// A batch of (time, row number) for each chunk.
    fn batches(chunks: &[Vec<Option<i64>>]) -> Vec<RecordBatch> {
        numbered(chunks, schema(), |c| {
            vec![Arc::new(TimestampNanosecondArray::from(c.to_vec()))]
        })
    }

    fn sort_exec(input: Vec<RecordBatch>, descending: bool) -> Arc<dyn ExecutionPlan> {
        let source = MemorySourceConfig::try_new_exec(&[input], schema(), None).unwrap();
        let key = PhysicalSortExpr::new(
            Arc::new(Column::new("time", 0)),
            arrow::compute::SortOptions {
                descending,
                nulls_first: false,
            },
        );
        Arc::new(SortExec::new(LexOrdering::new(vec![key]).unwrap(), source))
    }

    /// (time, row) pairs of `out`, in its order.
    fn pairs(out: &[RecordBatch]) -> Vec<(Option<i64>, i64)> {
        let mut v = Vec::new();
        for b in out {
            let t = b.column(0).as_primitive::<TimestampNanosecondType>();
            let r = b.column(1).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                v.push((t.is_valid(i).then(|| t.value(i)), r.value(i)));
            }
        }
        v
    }

    /// Runs `chunks` through a SortedRunsExec and through the plain sort;
    /// returns both answers and whether the batches passed unsorted.
    async fn both(
        chunks: &[Vec<Option<i64>>],
        descending: bool,
    ) -> (Vec<(Option<i64>, i64)>, Vec<(Option<i64>, i64)>, bool) {
        let ctx = Arc::new(TaskContext::default());
        let sort = sort_exec(batches(chunks), descending);
        let exec = Arc::new(SortedRunsExec::over(Arc::clone(&sort)));
        let got = pairs(&collect(exec.clone(), Arc::clone(&ctx)).await.unwrap());
        let want = pairs(&collect(sort, ctx).await.unwrap());
        let metrics = exec.metrics().unwrap();
        let passed = metrics
            .sum_by_name("batches_in_order")
            .map_or(0, |m| m.as_usize())
            > 0;
        let sorted = metrics
            .sum_by_name("rows_sorted")
            .map_or(0, |m| m.as_usize());
        assert!(!(passed && sorted > 0), "both paths taken");
        (got, want, passed)
    }

    /// The answers agree: the same times in the same order, and the same
    /// rows (ties may stand in another order).
    fn agree(got: &[(Option<i64>, i64)], want: &[(Option<i64>, i64)]) {
        let times = |v: &[(Option<i64>, i64)]| v.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(times(got), times(want));
        let (mut a, mut b) = (got.to_vec(), want.to_vec());
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }

    /// The plain model of when the batches pass unsorted: no NULL, and some
    /// order of the non-empty batches reads, end to end, sorted as asked or
    /// sorted the opposite way (every order tried).
    fn passes_model(chunks: &[Vec<Option<i64>>]) -> bool {
        let runs: Vec<&Vec<Option<i64>>> = chunks.iter().filter(|c| !c.is_empty()).collect();
        // (No batch with a row: none passes, none is sorted.)
        if runs.is_empty() || runs.iter().any(|c| c.contains(&None)) {
            return false;
        }
        fn orders(n: usize) -> Vec<Vec<usize>> {
            if n == 0 {
                return vec![vec![]];
            }
            let mut all = Vec::new();
            for o in orders(n - 1) {
                for at in 0..=o.len() {
                    let mut o = o.clone();
                    o.insert(at, n - 1);
                    all.push(o);
                }
            }
            all
        }
        orders(runs.len()).into_iter().any(|o| {
            let v: Vec<i64> = o
                .iter()
                .flat_map(|&i| runs[i].iter().flatten().copied())
                .collect();
            v.windows(2).all(|w| w[0] <= w[1]) || v.windows(2).all(|w| w[0] >= w[1])
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Sorted runs cut from one sorted sequence, handed on in any order
        /// (and sometimes spoilt: a swap inside a run, a NULL, a run
        /// stretched over the others), answer as the sort does; they pass
        /// unsorted when they were not spoilt, and exactly when the plain
        /// model (`passes_model`) says they can.
        #[test]
        fn answers_as_the_sort_does(
            mut times in proptest::collection::vec(-50i64..50, 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..5),
            order_seed in any::<u64>(),
            spoil in 0u8..4,
            descending in any::<bool>(),
        ) {
            times.sort_unstable();
            if descending {
                times.reverse();
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(times.len())).collect();
            cuts.push(0);
            cuts.push(times.len());
            cuts.sort_unstable();
            let mut chunks: Vec<Vec<Option<i64>>> = cuts
                .windows(2)
                .map(|w| times[w[0]..w[1]].iter().copied().map(Some).collect())
                .collect();
            // Hand the runs on in another order.
            let mut k = order_seed;
            for i in (1..chunks.len()).rev() {
                k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                chunks.swap(i, (k >> 33) as usize % (i + 1));
            }
            let spoilt = match spoil {
                // A swap of two different values inside a run.
                1 => chunks.iter_mut().find_map(|c| {
                    let i = (1..c.len()).find(|&i| c[i] != c[i - 1])?;
                    c.swap(i - 1, i);
                    Some(())
                }).is_some(),
                // A NULL.
                2 => chunks.iter_mut().find(|c| !c.is_empty()).map(|c| c[0] = None).is_some(),
                // A run stretched to both ends of the whole range (still
                // in order inside), so it may overlap the others.
                3 => {
                    let (first, last) = (times.first().copied(), times.last().copied());
                    match (first, last, chunks.iter_mut().find(|c| !c.is_empty())) {
                        (Some(first), Some(last), Some(c)) => {
                            c.insert(0, Some(first));
                            c.push(Some(last));
                            true
                        }
                        _ => false,
                    }
                }
                _ => false,
            };
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (got, want, passed) = rt.block_on(both(&chunks, descending));
            agree(&got, &want);
            if !spoilt && !times.is_empty() {
                prop_assert!(passed, "runs in order were sorted: {chunks:?}");
            }
            prop_assert_eq!(passed, passes_model(&chunks), "{:?}", chunks);
        }
    }

    #[tokio::test]
    async fn input_beyond_the_memory_pool_goes_to_the_sort_which_spills() {
        // 40 runs in order, handed on in reverse: about 40 x 16 KB.
        let chunks: Vec<Vec<Option<i64>>> = (0..40i64)
            .rev()
            .map(|r| (r * 1000..(r + 1) * 1000).map(Some).collect())
            .collect();
        let input = batches(&chunks);
        let size: usize = input.iter().map(|b| b.get_array_memory_size()).sum();
        let limited = || {
            let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
                .with_memory_limit(size / 3, 1.0)
                .build_arc()
                .unwrap();
            let config = datafusion::prelude::SessionConfig::new()
                .with_sort_spill_reservation_bytes(size / 20);
            Arc::new(
                TaskContext::default()
                    .with_session_config(config)
                    .with_runtime(runtime),
            )
        };
        let sort = sort_exec(input, false);
        let exec = Arc::new(SortedRunsExec::over(Arc::clone(&sort)));
        let got = pairs(&collect(exec.clone(), limited()).await.unwrap());
        let want = pairs(
            &collect(sort, Arc::new(TaskContext::default()))
                .await
                .unwrap(),
        );
        agree(&got, &want);
        assert_eq!(got.len(), 40_000);
        let metrics = exec.metrics().unwrap();
        let count = |name: &str| metrics.sum_by_name(name).map_or(0, |m| m.as_usize());
        assert_eq!(count("over_memory"), 1);
        assert_eq!(count("batches_in_order"), 0);
    }

    #[tokio::test]
    async fn runs_out_of_order_pass_reordered_and_mixed_runs_are_sorted() {
        // Three runs, handed on newest first.
        let chunks = vec![
            vec![Some(7), Some(8), Some(9)],
            vec![Some(1), Some(2), Some(3)],
            vec![Some(4), Some(5), Some(7)],
        ];
        let (got, want, passed) = both(&chunks, false).await;
        assert!(passed);
        agree(&got, &want);
        assert_eq!(
            got.iter().map(|p| p.1).collect::<Vec<_>>(),
            vec![3, 4, 5, 6, 7, 8, 0, 1, 2]
        );
        // Two series' rows in one batch, runs of two: sorted by the plain
        // sort.
        let chunks = vec![vec![Some(1), Some(5), Some(2), Some(6)]];
        let (got, want, passed) = both(&chunks, false).await;
        assert!(!passed);
        agree(&got, &want);
    }

    // Several series: rows of (time, host, row number), sorted on (time,
    // host) or (time DESC, host).

    fn series_schema() -> arrow::datatypes::SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("time", DataType::Int64, false),
            Field::new("host", DataType::Utf8, true),
            Field::new("row", DataType::Int64, false),
        ]))
    }

    type Row = (i64, Option<String>, i64);

    fn series_batches(chunks: &[Vec<(i64, Option<String>)>]) -> Vec<RecordBatch> {
        numbered(chunks, series_schema(), |c| {
            vec![
                Arc::new(Int64Array::from_iter_values(c.iter().map(|r| r.0))),
                Arc::new(arrow::array::StringArray::from_iter(
                    c.iter().map(|r| r.1.clone()),
                )),
            ]
        })
    }

    fn series_rows(out: &[RecordBatch]) -> Vec<Row> {
        let mut v = Vec::new();
        for b in out {
            let t = b.column(0).as_primitive::<Int64Type>();
            let h = b.column(1).as_string::<i32>();
            let r = b.column(2).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                let host = h.is_valid(i).then(|| h.value(i).to_string());
                v.push((t.value(i), host, r.value(i)));
            }
        }
        v
    }

    /// The order the sort is asked for, as a plain comparison of rows:
    /// time (descending if asked), then host with NULL last.
    fn model_cmp(a: &Row, b: &Row, descending: bool) -> std::cmp::Ordering {
        let t = if descending {
            b.0.cmp(&a.0)
        } else {
            a.0.cmp(&b.0)
        };
        let h = match (&a.1, &b.1) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        };
        t.then(h)
    }

    /// The plain model of when runs are merged: every non-empty batch one
    /// run, its rows never going both ways on the keys; merged unless the
    /// batches are more than MAX_RUNS or shorter than MIN_RUN_ROWS on
    /// average.
    fn merges_model(chunks: &[Vec<(i64, Option<String>)>], descending: bool) -> bool {
        let (mut runs, mut rows) = (0usize, 0usize);
        for c in chunks.iter().filter(|c| !c.is_empty()) {
            let rows_of: Vec<Row> = c.iter().map(|r| (r.0, r.1.clone(), 0)).collect();
            let up = rows_of
                .windows(2)
                .filter(|w| model_cmp(&w[0], &w[1], descending).is_gt())
                .count();
            let down = rows_of
                .windows(2)
                .filter(|w| model_cmp(&w[0], &w[1], descending).is_lt())
                .count();
            if up > 0 && down > 0 {
                // Several runs in one batch: sorted.
                return false;
            }
            runs += 1;
            rows += c.len();
        }
        runs <= MAX_RUNS && runs * MIN_RUN_ROWS <= rows
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(150))]

        /// Several series, each in time order, their stretches packed
        /// into batches in any order (some batches turned around, some
        /// rows swapped), sorted on (time, host) or (time DESC, host):
        /// the rows come out in the sort's order and are the sort's rows,
        /// and they are merged exactly when the plain model says.
        #[test]
        fn several_series_answer_as_the_sort_does(
            series in proptest::collection::vec(proptest::collection::vec(0i64..60, 0..80), 1..8),
            per_batch in 1usize..4,
            turn_seed in any::<u64>(),
            swaps in 0usize..3,
            descending in any::<bool>(),
        ) {
            // Each series' times in order; host NULL for the eighth.
            let mut stretches: Vec<Vec<(i64, Option<String>)>> = series
                .into_iter()
                .enumerate()
                .map(|(i, mut times)| {
                    times.sort_unstable();
                    let host = (i != 7).then(|| format!("h{}", i % 3));
                    times.into_iter().map(|t| (t, host.clone())).collect()
                })
                .collect();
            let mut k = turn_seed;
            let mut next = || {
                k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                k >> 33
            };
            for s in stretches.iter_mut() {
                if next() % 3 == 0 {
                    s.reverse();
                }
            }
            let mut chunks: Vec<Vec<(i64, Option<String>)>> = stretches
                .chunks(per_batch)
                .map(|c| c.concat())
                .collect();
            for _ in 0..swaps {
                let c = next() as usize % chunks.len();
                let n = chunks[c].len();
                if n > 1 {
                    let i = next() as usize % (n - 1);
                    chunks[c].swap(i, i + 1);
                }
            }
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (got, want, merged, sorted) = rt.block_on(both_series(&chunks, descending));
            let keys = |v: &[Row]| v.iter().map(|r| (r.0, r.1.clone())).collect::<Vec<_>>();
            prop_assert_eq!(keys(&got), keys(&want));
            let (mut a, mut b) = (got.clone(), want.clone());
            a.sort();
            b.sort();
            prop_assert_eq!(a, b);
            let rows: usize = chunks.iter().map(|c| c.len()).sum();
            if rows > 0 {
                prop_assert_eq!(merged, merges_model(&chunks, descending), "{:?}", chunks);
                prop_assert_eq!(sorted, !merged);
            }
        }
    }

    /// Runs `chunks` through a SortedRunsExec and the plain sort on (time,
    /// host); returns both answers and whether the runs were merged or the
    /// rows sorted.
    async fn both_series(
        chunks: &[Vec<(i64, Option<String>)>],
        descending: bool,
    ) -> (Vec<Row>, Vec<Row>, bool, bool) {
        let ctx = Arc::new(TaskContext::default());
        let input = series_batches(chunks);
        let source = MemorySourceConfig::try_new_exec(&[input], series_schema(), None).unwrap();
        let options = |descending| arrow::compute::SortOptions {
            descending,
            nulls_first: false,
        };
        let keys = vec![
            PhysicalSortExpr::new(Arc::new(Column::new("time", 0)), options(descending)),
            PhysicalSortExpr::new(Arc::new(Column::new("host", 1)), options(false)),
        ];
        let sort: Arc<dyn ExecutionPlan> =
            Arc::new(SortExec::new(LexOrdering::new(keys).unwrap(), source));
        let exec = Arc::new(SortedRunsExec::over(Arc::clone(&sort)));
        let got = series_rows(&collect(exec.clone(), Arc::clone(&ctx)).await.unwrap());
        let want = series_rows(&collect(sort, ctx).await.unwrap());
        let metrics = exec.metrics().unwrap();
        let count = |name: &str| metrics.sum_by_name(name).map_or(0, |m| m.as_usize());
        assert_eq!(count("batches_in_order"), 0, "not one integer key");
        if count("runs_merged") > 0 {
            assert_eq!(count("rows_merged"), got.len());
        }
        (
            got,
            want,
            count("runs_merged") > 0,
            count("rows_sorted") > 0,
        )
    }

    #[tokio::test]
    async fn batches_each_in_order_are_merged_and_batches_of_several_runs_sorted() {
        // ORDER BY time over three series, each a batch of 40 rows in time
        // order (one newest first), their times interleaved: merged.
        let stretch = |host: &str, from: i64| -> Vec<(i64, Option<String>)> {
            (0..40)
                .map(|i| (from + 3 * i, Some(host.to_string())))
                .collect()
        };
        let mut newest_first = stretch("c", 2);
        newest_first.reverse();
        let chunks = vec![stretch("a", 0), stretch("b", 1), newest_first];
        let (got, want, merged, sorted) = both_series(&chunks, false).await;
        assert!(merged && !sorted);
        assert_eq!(got, want, "no two rows tie on (time, host)");
        assert_eq!(got.len(), 120);
        // The same rows with two series in one batch (two runs): sorted,
        // as the sort merges no more streams than there are batches.
        let chunks = vec![stretch("a", 0), [stretch("b", 1), stretch("c", 2)].concat()];
        let (got, want, merged, sorted) = both_series(&chunks, false).await;
        assert!(!merged && sorted);
        assert_eq!(got, want);
        // Rows in no order: sorted.
        let shuffled: Vec<(i64, Option<String>)> = (0..100)
            .map(|i| ((i * 37) % 101, Some("a".into())))
            .collect();
        let (got, want, merged, sorted) = both_series(&[shuffled], false).await;
        assert!(!merged && sorted);
        assert_eq!(got, want);
    }
}
