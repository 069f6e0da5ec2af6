//! The as-of join: for each row of one table, the latest row of another at
//! or before its time with the same key.
//!
//! ```sql
//! SELECT * FROM asof_join('trades', 'quotes', 'host')
//! WHERE time >= '2024-01-01T00:00:00Z' AND host = 'a'
//! ```
//!
//! answers every row of `trades` (a left outer join: no match gives NULLs)
//! with the columns of the `quotes` row matched to it, named
//! `quotes_<column>` (`quotes_time` is the matched row's time); the key
//! columns (comma-separated in the third argument) appear once. When keys
//! do not name one series and right rows tie on time, the match is the one
//! whose other columns sort last.
//!
//! The left side is read and sorted by (key, time); the right side streams
//! by, each right row kept only while it is the best match of some left
//! row, so memory follows the left side however large the right. When
//! the left side is small (at most [`PROBE_MAX_LEFT_ROWS`] rows) and the
//! keys are tags of the right table, the right side is read only for the
//! keys the left side holds, which the storage nodes answer by series
//! lookup and the planner by tag-filter pruning: probes instead of a full
//! read. Either way nothing after the latest left time is read on the
//! right. Filters on the left table's columns go to its scan; filters on
//! the keys go to both; DataFusion applies every filter again above.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::compute::kernels::cast::cast;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit, TimestampNanosecondType};
use arrow::row::{RowConverter, SortField};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ScalarValue, plan_err};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::prelude::{col, lit};
use futures::{StreamExt, TryStreamExt};
use sealion_common::catalog::{arrow_schema, find_table, time_column};
use sealion_common::proto::{ColumnKind, ScanOrder, Table};

use crate::catalog::Shared;
use crate::table::{ScanShape, SealionTable};

/// Left sides of at most this many rows read the right side only for
/// their keys.
pub const PROBE_MAX_LEFT_ROWS: usize = 10_000;

/// Most distinct keys a probe asks for.
const PROBE_MAX_KEYS: usize = 1_000;

/// `asof_join(left, right, keys)`.
pub struct AsofJoinFunction {
    pub shared: Shared,
}

impl fmt::Debug for AsofJoinFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AsofJoinFunction")
    }
}

fn text_arg(e: &Expr, what: &str) -> DfResult<String> {
    match e {
        Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
            _,
        ) => Ok(s.clone()),
        other => plan_err!("asof_join: {what} must be a text literal, not {other}"),
    }
}

impl TableFunctionImpl for AsofJoinFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        if exprs.len() != 3 {
            return plan_err!(
                "asof_join(left_table, right_table, 'key[,key...]') takes three arguments"
            );
        }
        let default_db = args
            .session()
            .config_options()
            .catalog
            .default_schema
            .clone();
        let state = self.shared.meta.state();
        let resolve = |e: &Expr, what: &str| -> DfResult<Table> {
            let name = text_arg(e, what)?;
            let (db, table) = match name.split_once('.') {
                Some((d, t)) => (d.to_string(), t.to_string()),
                None => (default_db.clone(), name.clone()),
            };
            find_table(&state, &db, &table).cloned().ok_or_else(|| {
                DataFusionError::Plan(format!("table '{db}.{table}' does not exist"))
            })
        };
        let left = resolve(&exprs[0], "the left table")?;
        let right = resolve(&exprs[1], "the right table")?;
        let keys: Vec<String> = text_arg(&exprs[2], "the keys")?
            .split(',')
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect();
        if keys.is_empty() {
            return plan_err!("asof_join: name at least one key column");
        }
        for k in &keys {
            for t in [&left, &right] {
                match t.columns.iter().find(|c| &c.name == k) {
                    Some(c) if c.kind() != ColumnKind::Time => {}
                    _ => return plan_err!("asof_join: key {k:?} is not a column of {}", t.name),
                }
            }
        }
        if time_column(&left).is_none() || time_column(&right).is_none() {
            return plan_err!("asof_join: both tables need a time column");
        }
        let make = |t: Table| {
            Arc::new(SealionTable::new(
                t,
                self.shared.meta.clone(),
                self.shared.storage.clone(),
                self.shared.router.clone(),
            ))
        };
        let (left, right) = (make(left), make(right));
        let schema = output_schema(&left.table, &right.table, &keys)?;
        Ok(Arc::new(AsofTable {
            left,
            right,
            keys,
            schema,
        }))
    }
}

/// Left's columns, then right's non-key columns as `<right>_<name>`.
fn output_schema(left: &Table, right: &Table, keys: &[String]) -> DfResult<SchemaRef> {
    let mut fields: Vec<Field> = arrow_schema(&left.columns)
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    for f in arrow_schema(&right.columns).fields() {
        if keys.contains(f.name()) {
            continue;
        }
        let name = format!("{}_{}", right.name, f.name());
        if fields.iter().any(|x| x.name() == &name) {
            return plan_err!("asof_join: column {name} would appear twice");
        }
        fields.push(Field::new(name, f.data_type().clone(), true));
    }
    Ok(Arc::new(Schema::new(fields)))
}

#[derive(Debug)]
struct AsofTable {
    left: Arc<SealionTable>,
    right: Arc<SealionTable>,
    keys: Vec<String>,
    schema: SchemaRef,
}

/// The column names an expression reads.
fn columns_of(e: &Expr) -> Vec<String> {
    e.column_refs()
        .into_iter()
        .map(|c| c.name.clone())
        .collect()
}

#[async_trait]
impl TableProvider for AsofTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let left_names: Vec<&str> = self
            .left
            .table
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        // A left row is in the answer exactly when it passes the filters on
        // its own columns, so those can go to its scan; key filters hold on
        // both sides.
        let left_filters: Vec<Expr> = filters
            .iter()
            .filter(|f| {
                columns_of(f)
                    .iter()
                    .all(|c| left_names.contains(&c.as_str()))
            })
            .cloned()
            .collect();
        let key_filters: Vec<Expr> = filters
            .iter()
            .filter(|f| {
                let cols = columns_of(f);
                !cols.is_empty() && cols.iter().all(|c| self.keys.contains(c))
            })
            .cloned()
            .collect();
        let left_time = time_column(&self.left.table)
            .map(|c| c.name.clone())
            .unwrap_or_default();
        // Only the columns asked for are read, plus the keys and times the
        // merge needs.
        let wanted: Vec<usize> = projection
            .cloned()
            .unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        let wanted_names: Vec<String> = wanted
            .iter()
            .map(|&i| self.schema.field(i).name().clone())
            .collect();
        let left_cols: Vec<usize> = (0..self.left.table.columns.len())
            .filter(|&i| {
                let n = &self.left.table.columns[i].name;
                wanted.contains(&i) || self.keys.contains(n) || *n == left_time
            })
            .collect();
        let right_name = &self.right.table.name;
        let right_columns: Vec<sealion_common::proto::Column> = self
            .right
            .table
            .columns
            .iter()
            .filter(|c| {
                self.keys.contains(&c.name)
                    || c.kind() == ColumnKind::Time
                    || wanted_names.contains(&format!("{right_name}_{}", c.name))
            })
            .cloned()
            .collect();
        let mut left_table = self.left.table.clone();
        left_table.columns = left_cols
            .iter()
            .map(|&i| self.left.table.columns[i].clone())
            .collect();
        let mut right_table = self.right.table.clone();
        right_table.columns = right_columns.clone();
        let reduced = output_schema(&left_table, &right_table, &self.keys)?;
        let final_projection = wanted_names
            .iter()
            .map(|n| reduced.index_of(n))
            .collect::<Result<Vec<_>, _>>()?;
        let left = self
            .left
            .scan(state, Some(&left_cols), &left_filters, None)
            .await?;
        let exec = AsofExec::new(
            left,
            left_time,
            self.right.clone(),
            right_columns,
            self.keys.clone(),
            key_filters,
            reduced,
            Some(final_projection),
        );
        Ok(Arc::new(exec))
    }
}

#[derive(Debug)]
struct AsofExec {
    left: Arc<dyn ExecutionPlan>,
    left_time: String,
    right: Arc<SealionTable>,
    /// The right table's columns that are read.
    right_columns: Vec<sealion_common::proto::Column>,
    keys: Vec<String>,
    right_filters: Vec<Expr>,
    /// The full output schema, before projection.
    full_schema: SchemaRef,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    metrics: ExecutionPlanMetricsSet,
    properties: Arc<PlanProperties>,
}

impl AsofExec {
    #[allow(clippy::too_many_arguments)]
    fn new(
        left: Arc<dyn ExecutionPlan>,
        left_time: String,
        right: Arc<SealionTable>,
        right_columns: Vec<sealion_common::proto::Column>,
        keys: Vec<String>,
        right_filters: Vec<Expr>,
        full_schema: SchemaRef,
        projection: Option<Vec<usize>>,
    ) -> Self {
        let schema = match &projection {
            Some(p) => Arc::new(
                full_schema
                    .project(p)
                    .unwrap_or_else(|_| (*full_schema).clone()),
            ),
            None => full_schema.clone(),
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        AsofExec {
            left,
            left_time,
            right,
            right_columns,
            keys,
            right_filters,
            full_schema,
            projection,
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for AsofExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "AsofJoinExec: right={} keys=[{}] (merge in time order; right read only for the left's keys when the left has at most {PROBE_MAX_LEFT_ROWS} rows)",
            self.right.table.name,
            self.keys.join(",")
        )
    }
}

impl ExecutionPlan for AsofExec {
    fn name(&self) -> &str {
        "AsofJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.left]
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
        let left = crate::leaf::only_child(children, "AsofJoinExec")?;
        Ok(Arc::new(AsofExec::new(
            left,
            self.left_time.clone(),
            self.right.clone(),
            self.right_columns.clone(),
            self.keys.clone(),
            self.right_filters.clone(),
            self.full_schema.clone(),
            self.projection.clone(),
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        crate::leaf::only_partition(partition, "AsofJoinExec")?;
        let n = self.left.properties().partitioning.partition_count();
        let mut lefts = Vec::with_capacity(n);
        for i in 0..n {
            lefts.push(self.left.execute(i, context.clone())?);
        }
        let left_schema = self.left.schema();
        let left_time_name = self.left_time.clone();
        let right = self.right.clone();
        let right_columns = self.right_columns.clone();
        let keys = self.keys.clone();
        let right_filters = self.right_filters.clone();
        let full_schema = self.full_schema.clone();
        let projection = self.projection.clone();
        let schema = self.schema.clone();
        let probes = MetricBuilder::new(&self.metrics).counter("probe_regime", 0);
        let right_rows = MetricBuilder::new(&self.metrics).counter("right_rows", 0);
        let reservation = MemoryConsumer::new("AsofJoinExec").register(context.memory_pool());
        let stream = futures::stream::once(async move {
            let batches: Vec<RecordBatch> =
                futures::stream::select_all(lefts).try_collect().await?;
            for b in &batches {
                reservation.try_grow(b.get_array_memory_size())?;
            }
            let left = arrow::compute::concat_batches(&left_schema, &batches)?;
            drop(batches);
            let left_time = left.schema().index_of(&left_time_name)?;
            let left_times = times_of(left.column(left_time))?;
            // Nothing after the latest left time can match.
            let mut filters = right_filters;
            let rtime = time_column(&right.table)
                .map(|c| c.name.clone())
                .unwrap_or_default();
            if let Some(max) = left_times.iter().max() {
                filters.push(
                    col(rtime.as_str()).lt_eq(lit(ScalarValue::TimestampNanosecond(
                        Some(*max),
                        Some(sealion_common::catalog::TIME_ZONE.into()),
                    ))),
                );
            } else {
                // No left row: an empty answer.
                return Ok(RecordBatch::new_empty(schema));
            }
            let key_tags = keys.iter().all(|k| {
                right
                    .table
                    .columns
                    .iter()
                    .any(|c| &c.name == k && c.kind() == ColumnKind::Tag)
            });
            if left.num_rows() <= PROBE_MAX_LEFT_ROWS && key_tags {
                let mut probe = Vec::new();
                for k in &keys {
                    let i = left.schema().index_of(k)?;
                    let values = cast(left.column(i), &DataType::Utf8)?;
                    let values = values.as_string::<i32>();
                    let mut distinct: Vec<&str> = values.iter().flatten().collect();
                    distinct.sort_unstable();
                    distinct.dedup();
                    if distinct.len() > PROBE_MAX_KEYS {
                        probe.clear();
                        break;
                    }
                    probe.push(
                        col(k.as_str()).in_list(distinct.into_iter().map(lit).collect(), false),
                    );
                }
                if !probe.is_empty() {
                    probes.add(1);
                    filters.extend(probe);
                }
            }
            let right_schema = arrow_schema(&right_columns);
            let scan = right.plan_scan(ScanShape {
                projection: right_columns.clone(),
                schema: right_schema.clone(),
                filters: &filters,
                limit: None,
                aggregate: None,
                order: ScanOrder::OrderSeries,
                newest_per_series: 0,
                steps: None,
            })?;
            let scan: Arc<dyn ExecutionPlan> = Arc::new(scan);
            let mut parts = Vec::new();
            for i in 0..scan.properties().partitioning.partition_count() {
                parts.push(scan.execute(i, context.clone())?);
            }
            // The right side streams by: only the best row for each left
            // row is kept, so memory follows the left side, not the right.
            let mut matcher = Matcher::new(&left, left_time, &right_schema, &rtime, &keys)?;
            reservation.try_grow(matcher.base_bytes())?;
            let mut right_stream = futures::stream::select_all(parts);
            while let Some(batch) = right_stream.next().await {
                let batch = batch?;
                right_rows.add(batch.num_rows());
                let grown = matcher.add(&batch)?;
                reservation.try_grow(grown)?;
            }
            let out = matcher.finish(&left, &full_schema)?;
            reservation.free();
            match &projection {
                Some(p) => Ok(out.project(p)?),
                None => Ok(out),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream.boxed(),
        )))
    }
}

fn times_of(a: &ArrayRef) -> DfResult<Vec<i64>> {
    let t = cast(a, &DataType::Timestamp(TimeUnit::Nanosecond, None))?;
    let t = t.as_primitive::<TimestampNanosecondType>();
    Ok(t.values().to_vec())
}

/// Rows of `batch` sorted by (keys, time), and the comparable key rows.
fn sorted_by_key_time(
    converter: &RowConverter,
    batch: &RecordBatch,
    keys: &[String],
    times: &[i64],
) -> DfResult<(Vec<usize>, arrow::row::Rows)> {
    let mut cols = Vec::with_capacity(keys.len());
    for k in keys {
        // Keys are compared as text, so a tag and a text field match.
        cols.push(cast(
            batch.column(batch.schema().index_of(k)?),
            &DataType::Utf8,
        )?);
    }
    let rows = converter.convert_columns(&cols)?;
    let mut order: Vec<usize> = (0..batch.num_rows()).collect();
    order.sort_by(|&a, &b| rows.row(a).cmp(&rows.row(b)).then(times[a].cmp(&times[b])));
    Ok((order, rows))
}

/// The as-of match, right rows taken as they come.
///
/// The left rows are sorted by (key, time); position `p` in that order
/// stands for the left row there. A right row of a key belongs to the
/// first position of that key whose time is at or after its own: it is a
/// candidate for that left row and every later one of the key, and the
/// later positions' own right rows are newer than it. So each position
/// keeps only its best right row (latest time; among equal times, the one
/// whose other columns sort last), and a left row's match is the best row
/// of the nearest position at or before it that has one. A NULL key
/// matches nothing.
struct Matcher {
    keys: Vec<String>,
    right_time: String,
    converter: RowConverter,
    /// Encodes a right row's columns other than the keys: compared to
    /// break ties between rows of one time, and decoded at the end.
    others: RowConverter,
    others_at: Vec<usize>,
    /// Left rows in (key, time) order, and their times.
    order: Vec<usize>,
    times: Vec<i64>,
    /// Each non-NULL key's positions `[a, b)` in `order`.
    ranges: std::collections::HashMap<Vec<u8>, (usize, usize)>,
    /// Each position's best right row so far.
    best: Vec<Option<(i64, arrow::row::OwnedRow)>>,
}

impl Matcher {
    fn new(
        left: &RecordBatch,
        left_time: usize,
        right_schema: &SchemaRef,
        right_time: &str,
        keys: &[String],
    ) -> DfResult<Self> {
        let lt = times_of(left.column(left_time))?;
        let converter = RowConverter::new(vec![SortField::new(DataType::Utf8); keys.len()])?;
        let (order, lkeys) = sorted_by_key_time(&converter, left, keys, &lt)?;
        let mut ranges = std::collections::HashMap::new();
        let mut a = 0;
        while a < order.len() {
            let key = lkeys.row(order[a]);
            let mut b = a + 1;
            while b < order.len() && lkeys.row(order[b]) == key {
                b += 1;
            }
            if !has_null_key(left, keys, order[a])? {
                ranges.insert(key.as_ref().to_vec(), (a, b));
            }
            a = b;
        }
        let others_at: Vec<usize> = (0..right_schema.fields().len())
            .filter(|&i| !keys.contains(right_schema.field(i).name()))
            .collect();
        let others = RowConverter::new(
            others_at
                .iter()
                .map(|&i| SortField::new(right_schema.field(i).data_type().clone()))
                .collect(),
        )?;
        Ok(Matcher {
            keys: keys.to_vec(),
            right_time: right_time.to_string(),
            converter,
            others,
            others_at,
            times: order.iter().map(|&i| lt[i]).collect(),
            best: vec![None; order.len()],
            order,
            ranges,
        })
    }

    /// What the matcher holds before any right row: the order and times of
    /// the left rows, their keys, and a slot per left row.
    fn base_bytes(&self) -> usize {
        self.order.len() * (8 + 8 + 40) + self.ranges.keys().map(|k| k.len() + 48).sum::<usize>()
    }

    /// Takes one batch of right rows; returns roughly how many more bytes
    /// the kept rows take.
    fn add(&mut self, batch: &RecordBatch) -> DfResult<usize> {
        let mut cols = Vec::with_capacity(self.keys.len());
        for k in &self.keys {
            cols.push(cast(
                batch.column(batch.schema().index_of(k)?),
                &DataType::Utf8,
            )?);
        }
        // One key column (the usual case) is compared as text and encoded
        // for the lookup only where it changes; several are encoded whole.
        enum Keys<'a> {
            One(&'a arrow::array::StringArray),
            Rows(arrow::row::Rows),
        }
        let rkeys = match cols.as_slice() {
            [c] => Keys::One(c.as_string::<i32>()),
            _ => Keys::Rows(self.converter.convert_columns(&cols)?),
        };
        let rt = times_of(batch.column(batch.schema().index_of(&self.right_time)?))?;
        // This batch's best rows per position: the latest time, and every
        // row at that time (ties are settled on the other columns below).
        let mut touched: std::collections::HashMap<usize, (i64, Vec<u32>)> = Default::default();
        // Rows of one series come in time order, so runs of rows share a
        // position: a run's best rows are gathered here and go to `touched`
        // once, when the position changes.
        let mut pending: Option<(usize, i64, Vec<u32>)> = None;
        let settle = |touched: &mut std::collections::HashMap<usize, (i64, Vec<u32>)>,
                      (p, t, rows): (usize, i64, Vec<u32>)| {
            let e = touched.entry(p).or_insert((i64::MIN, Vec::new()));
            if t > e.0 {
                *e = (t, rows);
            } else if t == e.0 {
                e.1.extend(rows);
            }
        };
        let mut last: Option<(usize, Option<(usize, usize)>)> = None;
        for r in 0..batch.num_rows() {
            if cols.iter().any(|c| c.is_null(r)) {
                continue;
            }
            // Rows come series by series: the previous row's key usually
            // is this one's.
            let same = |prev: usize| match &rkeys {
                Keys::One(k) => k.value(prev) == k.value(r),
                Keys::Rows(rows) => rows.row(prev) == rows.row(r),
            };
            let range = match last {
                Some((prev, range)) if same(prev) => range,
                _ => match &rkeys {
                    Keys::Rows(rows) => self.ranges.get(rows.row(r).as_ref()).copied(),
                    Keys::One(_) => {
                        let one = self.converter.convert_columns(&[cols[0].slice(r, 1)])?;
                        self.ranges.get(one.row(0).as_ref()).copied()
                    }
                },
            };
            last = Some((r, range));
            let Some((a, b)) = range else {
                continue;
            };
            // The first position at or after the row's time; the run's
            // position again when the row still falls in its window.
            let p = match &pending {
                Some((q, ..))
                    if (a..b).contains(q)
                        && rt[r] <= self.times[*q]
                        && (*q == a || self.times[*q - 1] < rt[r]) =>
                {
                    *q
                }
                _ => a + self.times[a..b].partition_point(|&t| t < rt[r]),
            };
            if p == b {
                continue;
            }
            if self.best[p].as_ref().is_some_and(|(t, _)| *t > rt[r]) {
                continue;
            }
            match &mut pending {
                Some((q, t, rows)) if *q == p => {
                    if rt[r] > *t {
                        *t = rt[r];
                        rows.clear();
                        rows.push(r as u32);
                    } else if rt[r] == *t {
                        rows.push(r as u32);
                    }
                }
                _ => {
                    if let Some(done) = pending.replace((p, rt[r], vec![r as u32])) {
                        settle(&mut touched, done);
                    }
                }
            }
        }
        if let Some(done) = pending.take() {
            settle(&mut touched, done);
        }
        if touched.is_empty() {
            return Ok(0);
        }
        let candidates: Vec<u32> = touched
            .values()
            .flat_map(|(_, rows)| rows.iter().copied())
            .collect();
        let index = UInt32Array::from(candidates.clone());
        let columns = self
            .others_at
            .iter()
            .map(|&i| arrow::compute::take(batch.column(i).as_ref(), &index, None))
            .collect::<Result<Vec<_>, _>>()?;
        let encoded = self.others.convert_columns(&columns)?;
        let at: std::collections::HashMap<u32, usize> = candidates
            .iter()
            .enumerate()
            .map(|(i, &r)| (r, i))
            .collect();
        let mut grown = 0;
        for (p, (t, rows)) in touched {
            for r in rows {
                let row = encoded.row(at[&r]);
                let better = match &self.best[p] {
                    None => true,
                    Some((bt, brow)) => (t, row) > (*bt, brow.row()),
                };
                if better {
                    let owned = row.owned();
                    grown += owned.as_ref().len();
                    self.best[p] = Some((t, owned));
                }
            }
        }
        Ok(grown)
    }

    /// Every left row, in (key, time) order, beside its match.
    fn finish(self, left: &RecordBatch, schema: &SchemaRef) -> DfResult<RecordBatch> {
        // A position's match: its own best row or the nearest earlier one
        // of the same key.
        let mut matched: Vec<Option<u32>> = vec![None; self.order.len()];
        let mut rows = Vec::new();
        let mut slot_of = vec![None; self.order.len()];
        for &(a, b) in self.ranges.values() {
            let mut carry = None;
            for p in a..b {
                if self.best[p].is_some() {
                    carry = Some(p);
                }
                if let Some(q) = carry {
                    let slot = *slot_of[q].get_or_insert_with(|| {
                        rows.push(q);
                        (rows.len() - 1) as u32
                    });
                    matched[p] = Some(slot);
                }
            }
        }
        let kept = self.others.convert_rows(
            rows.iter()
                .filter_map(|&q| self.best[q].as_ref().map(|(_, r)| r.row())),
        )?;
        let left_idx = UInt32Array::from_iter_values(self.order.iter().map(|&i| i as u32));
        let right_idx = UInt32Array::from(matched);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for c in left.columns() {
            columns.push(arrow::compute::take(c.as_ref(), &left_idx, None)?);
        }
        for c in &kept {
            columns.push(arrow::compute::take(c.as_ref(), &right_idx, None)?);
        }
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

/// Whether row `i` of `batch` has a NULL in a key column.
fn has_null_key(batch: &RecordBatch, keys: &[String], i: usize) -> DfResult<bool> {
    for k in keys {
        if batch.column(batch.schema().index_of(k)?).is_null(i) {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int64Array, StringArray, TimestampNanosecondArray};
    use proptest::prelude::*;

    fn ts_field(name: &str, nullable: bool) -> Field {
        Field::new(
            name,
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            nullable,
        )
    }

    /// The key columns of `keys` (a NULL key is NULL in every column): one
    /// column `k`, or with `two` the pair `k` (key / 2) and `j` (key % 2),
    /// which name the same keys.
    fn key_columns(keys: &[Option<u8>], two: bool) -> Vec<(Field, ArrayRef)> {
        let text = |f: fn(u8) -> String| -> ArrayRef {
            Arc::new(StringArray::from_iter(keys.iter().map(|k| k.map(f))))
        };
        if two {
            vec![
                (
                    Field::new("k", DataType::Utf8, true),
                    text(|k| format!("k{}", k / 2)),
                ),
                (
                    Field::new("j", DataType::Utf8, true),
                    text(|k| format!("j{}", k % 2)),
                ),
            ]
        } else {
            vec![(
                Field::new("k", DataType::Utf8, true),
                text(|k| format!("k{k}")),
            )]
        }
    }

    fn key_names(two: bool) -> Vec<String> {
        if two {
            vec!["k".into(), "j".into()]
        } else {
            vec!["k".into()]
        }
    }

    /// A batch of the key columns, then `time`, then `v` when given.
    fn batch(keys: &[Option<u8>], times: &[i64], v: Option<&[i64]>, two: bool) -> RecordBatch {
        let (mut fields, mut cols): (Vec<Field>, Vec<ArrayRef>) =
            key_columns(keys, two).into_iter().unzip();
        fields.push(ts_field("time", false));
        cols.push(Arc::new(TimestampNanosecondArray::from_iter_values(
            times.iter().copied(),
        )));
        if let Some(v) = v {
            fields.push(Field::new("v", DataType::Int64, true));
            cols.push(Arc::new(Int64Array::from_iter_values(v.iter().copied())));
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
    }

    /// Right rows: a few keys (one NULL now and then), times on a coarse
    /// grid so rows of one key tie on time, runs of one key in time order
    /// as a series scan gives them, and sometimes shuffled.
    fn right_rows() -> impl Strategy<Value = Vec<Vec<(Option<u8>, i64, i64)>>> {
        let row = (prop::option::weighted(0.95, 0..4u8), 0..30i64, 0..5i64);
        let one =
            (prop::collection::vec(row, 0..60), any::<bool>()).prop_map(|(mut rows, sort)| {
                if sort {
                    rows.sort_by_key(|r| (r.0, r.1));
                }
                rows
            });
        prop::collection::vec(one, 0..4)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        /// Each left row's match is what a plain search of every right row
        /// gives: of the rows with its key at or before its time, the
        /// latest, ties broken by the other columns (here `v`), the
        /// largest; none for a NULL key. With one key column and with two.
        #[test]
        fn matches_are_the_latest_row_at_or_before_each_left_row(
            left in prop::collection::vec((prop::option::weighted(0.95, 0..5u8), 0..32i64), 0..40),
            right in right_rows(),
            two in any::<bool>(),
        ) {
            let lkeys: Vec<Option<u8>> = left.iter().map(|r| r.0).collect();
            let ltimes: Vec<i64> = left.iter().map(|r| r.1).collect();
            let lb = batch(&lkeys, &ltimes, None, two);
            let rs = batch(&[], &[], Some(&[]), two).schema();
            let keys = key_names(two);
            let lt = keys.len();
            let mut m = Matcher::new(&lb, lt, &rs, "time", &keys).unwrap();
            for rows in &right {
                let k: Vec<Option<u8>> = rows.iter().map(|r| r.0).collect();
                let t: Vec<i64> = rows.iter().map(|r| r.1).collect();
                let v: Vec<i64> = rows.iter().map(|r| r.2).collect();
                m.add(&batch(&k, &t, Some(&v), two)).unwrap();
            }
            let mut fields: Vec<Field> = lb.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(ts_field("r_time", true));
            fields.push(Field::new("r_v", DataType::Int64, true));
            let out = m.finish(&lb, &Arc::new(Schema::new(fields))).unwrap();
            let text = |c: usize, i: usize| {
                let a = out.column(c).as_string::<i32>();
                (!a.is_null(i)).then(|| a.value(i).to_string())
            };
            let ts = out.column(lt).as_primitive::<TimestampNanosecondType>();
            let rt = out.column(lt + 1).as_primitive::<TimestampNanosecondType>();
            let rv = out.column(lt + 2).as_primitive::<arrow::datatypes::Int64Type>();
            type Answer = (Vec<Option<String>>, i64, Option<(i64, i64)>);
            let mut got: Vec<Answer> = (0..out.num_rows())
                .map(|i| {
                    let k = (0..lt).map(|c| text(c, i)).collect();
                    let m = (!rt.is_null(i)).then(|| (rt.value(i), rv.value(i)));
                    (k, ts.value(i), m)
                })
                .collect();
            let mut want: Vec<Answer> = left
                .iter()
                .enumerate()
                .map(|(i, &(k, t))| {
                    let best = right
                        .iter()
                        .flatten()
                        .filter(|r| k.is_some() && r.0 == k && r.1 <= t)
                        .map(|r| (r.1, r.2))
                        .max();
                    let names = (0..lt).map(|c| {
                        let a = lb.column(c).as_string::<i32>();
                        (!a.is_null(i)).then(|| a.value(i).to_string())
                    });
                    (names.collect(), t, best)
                })
                .collect();
            got.sort();
            want.sort();
            prop_assert_eq!(got, want);
        }
    }
}
