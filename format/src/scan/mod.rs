//! What a storage node computes for one scan request, over any mix of open
//! partitions, sealed files, late rows and deletes.
//!
//! A request ([`ScanRequest`], proto) is compiled once into a [`Query`]:
//! time range, tag predicates, a field predicate, and one of four answers
//! ([`Mode`]): rows in series order (with an optional limit), the first
//! `limit` rows in time order, the newest row of each series, or partial
//! aggregate states per group. An [`Output`] collects the answer across the
//! partitions of the request and hands Arrow batches to the caller.
//!
//! There are two ways rows reach an `Output`:
//!
//! - the row path, [`scan_rows`]: rows one at a time in key order, as an open
//!   partition (or a sealed one merged with late rows and deletes) yields
//!   them. It decodes everything it is given and is the plain model every
//!   other path is tested against;
//! - the column paths over a sealed file (`crate::sealed::paths`), which use
//!   the directory to skip row groups and pages, decode filter columns first,
//!   fold page statistics into aggregates and answer last points without
//!   decoding a page.
//!
//! Both must give the same answer for the same rows; the differential tests
//! in `tests.rs` hold them to it.

mod groups;
pub mod predicate;
pub mod states;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use arrow::array::{ArrayRef, StringBuilder, TimestampNanosecondBuilder};
use arrow::datatypes::{DataType as ArrowType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use sealion_common::catalog::TIME_ZONE;
use sealion_common::proto::{
    AggregateFunction, Column, ColumnKind, DataType, ScanMetrics, ScanOrder, ScanRequest,
};
use sealion_partial::{AggregateKind, GroupStates, Value as PValue, ValueType};

use groups::{GroupIndex, GroupKey};

use self::predicate::{FieldFilter, TagPred, compile_tags};
use crate::rows::{BatchBuilder, SeriesTags, Value, decode_fields};
use crate::sealed::SortedRow;
use crate::{Error, Result, SCAN_BATCH_ROWS};

/// Most groups one aggregate scan may hold (a bound on the node's memory).
pub const MAX_GROUPS: usize = 1_000_000;
/// Most partial states (groups times calls) one aggregate scan may hold.
pub const MAX_GROUP_STATES: usize = 4_000_000;
/// Most sketch states (percentile, approx_distinct, count(DISTINCT)) one
/// aggregate scan may hold: a HyperLogLog is 16 KiB once dense, so this
/// bounds them to 1 GiB.
pub const MAX_SKETCH_STATES: usize = 65_536;

fn is_sketch(k: AggregateKind) -> bool {
    matches!(
        k,
        AggregateKind::Percentile | AggregateKind::ApproxDistinct | AggregateKind::ExactDistinct
    )
}

/// Largest limit of a time-ordered scan (the node keeps that many rows).
pub const MAX_ORDERED_LIMIT: u64 = 1_000_000;
/// Most aggregate calls and group tags in one request.
pub const MAX_CALLS: usize = 256;

/// Name of the bucket column of an aggregate answer.
pub const BUCKET_COLUMN: &str = "__bucket";

/// The name of the state column of call `i` of an aggregate answer.
pub fn state_column(i: usize) -> String {
    format!("__state_{i}")
}

/// The answer a query asks for.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Rows in (series, time) order, at most `limit`. (Within one scan
    /// part: a scan split across threads hands on each part's rows as they
    /// come, see `Query::splits`.)
    Rows,
    /// The first `limit` rows by time (newest first when `desc`), ties broken
    /// by series key.
    Ordered { desc: bool },
    /// The newest `rows` matching rows of each series.
    Last { rows: usize },
    /// Partial states per group.
    Aggregate(AggPlan),
}

/// Where an aggregate call's input comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum CallSource {
    /// `count(*)`: one value per row.
    Star,
    /// The time column (as nanoseconds).
    Time,
    /// A tag (as text; NULL where the series lacks it).
    Tag(String),
    /// A field column.
    Field(Column),
}

#[derive(Debug, Clone)]
pub struct Call {
    pub kind: AggregateKind,
    pub source: CallSource,
    pub input: ValueType,
}

#[derive(Debug, Clone)]
pub struct AggPlan {
    /// 0 when rows are not grouped by time.
    pub width_ns: i64,
    pub origin_ns: i64,
    pub group_tags: Vec<String>,
    pub calls: Vec<Call>,
    /// Count, min and max states go back as their answers (see [`states`]).
    pub states_as_answers: bool,
}

impl AggPlan {
    /// The start of the bucket holding `time_ns` (0 when not bucketed):
    /// `origin + floor((time - origin) / width) * width`, as `date_bin`.
    pub fn bucket(&self, time_ns: i64) -> Result<i64> {
        if self.width_ns <= 0 {
            return Ok(0);
        }
        let (o, w) = (self.origin_ns, self.width_ns);
        // In i64 when nothing overflows (nearly always); else in i128.
        if let Some(b) = time_ns
            .checked_sub(o)
            .and_then(|d| d.div_euclid(w).checked_mul(w))
            .and_then(|d| d.checked_add(o))
        {
            return Ok(b);
        }
        let (t, o, w) = (i128::from(time_ns), i128::from(o), i128::from(w));
        let b = o + (t - o).div_euclid(w) * w;
        i64::try_from(b).map_err(|_| {
            Error::Invalid(format!(
                "the time bucket of {time_ns} (width {}, origin {}) is out of range",
                self.width_ns, self.origin_ns
            ))
        })
    }
}

/// A compiled scan request.
#[derive(Debug, Clone)]
pub struct Query {
    pub start_ns: i64,
    pub end_ns: i64,
    pub tags: Vec<TagPred>,
    pub filter: Option<FieldFilter>,
    pub projection: Vec<Column>,
    /// `u64::MAX` when there is none.
    pub limit: u64,
    pub mode: Mode,
    /// The table's columns, which also name the fields of stored rows.
    pub table: Arc<[Column]>,
}

/// The partial-state kind a request's function names.
pub fn kind_of(f: AggregateFunction) -> Option<AggregateKind> {
    Some(match f {
        AggregateFunction::AggCount => AggregateKind::Count,
        AggregateFunction::AggSum => AggregateKind::Sum,
        AggregateFunction::AggMin => AggregateKind::Min,
        AggregateFunction::AggMax => AggregateKind::Max,
        AggregateFunction::AggAvg => AggregateKind::Avg,
        AggregateFunction::AggFirst => AggregateKind::First,
        AggregateFunction::AggLast => AggregateKind::Last,
        AggregateFunction::AggVariance => AggregateKind::Variance,
        AggregateFunction::AggPercentile => AggregateKind::Percentile,
        AggregateFunction::AggApproxDistinct => AggregateKind::ApproxDistinct,
        AggregateFunction::AggExactDistinct => AggregateKind::ExactDistinct,
        AggregateFunction::Unspecified => return None,
    })
}

/// The partial-state value type of a column type (time is nanoseconds).
pub fn value_type(t: DataType) -> ValueType {
    match t {
        DataType::Float64 => ValueType::F64,
        DataType::Int64 | DataType::Timestamp => ValueType::I64,
        DataType::Uint64 => ValueType::U64,
        DataType::Bool => ValueType::Bool,
        DataType::String | DataType::Unspecified => ValueType::Str,
    }
}

impl Query {
    /// Checks `req` against its table columns and compiles it. Every error is
    /// [`Error::Invalid`] with a message naming what is wrong.
    pub fn compile(req: &ScanRequest) -> Result<Query> {
        let table = req.table_columns.clone();
        let find = |name: &str| table.iter().find(|c| c.name == name);
        for c in &req.projection {
            if find(&c.name).is_none() {
                return Err(Error::Invalid(format!(
                    "projection names unknown column {:?}",
                    c.name
                )));
            }
        }
        let tags = compile_tags(&req.tag_predicates, &table)?;
        let filter = match &req.field_predicate {
            Some(p) => Some(FieldFilter::compile(p, &table)?),
            None => None,
        };
        let limit = if req.limit == 0 { u64::MAX } else { req.limit };
        let ordered = req.order();
        let mode = match (&req.aggregate, req.last_per_series, ordered) {
            (Some(_), true, _) => {
                return Err(Error::Invalid(
                    "a scan cannot both aggregate and ask for last points".into(),
                ));
            }
            (Some(spec), false, ScanOrder::OrderSeries) => {
                if req.limit != 0 {
                    return Err(Error::Invalid("an aggregate scan takes no limit".into()));
                }
                if spec.calls.len() > MAX_CALLS || spec.group_tags.len() > MAX_CALLS {
                    return Err(Error::Invalid(format!(
                        "an aggregate scan takes at most {MAX_CALLS} calls and {MAX_CALLS} group tags"
                    )));
                }
                if spec.bucket_width_ns < 0 {
                    return Err(Error::Invalid(
                        "a time bucket width must be positive".into(),
                    ));
                }
                for t in &spec.group_tags {
                    match find(t) {
                        Some(c) if c.kind() == ColumnKind::Tag => {}
                        Some(_) => {
                            return Err(Error::Invalid(format!("group by {t:?}: not a tag")));
                        }
                        None => {
                            return Err(Error::Invalid(format!("group by unknown column {t:?}")));
                        }
                    }
                }
                let mut calls = Vec::with_capacity(spec.calls.len());
                for c in &spec.calls {
                    let kind = kind_of(c.function()).ok_or_else(|| {
                        Error::Invalid("aggregate call without a function".into())
                    })?;
                    let (source, input) = if c.column.is_empty() {
                        if kind != AggregateKind::Count {
                            return Err(Error::Invalid(format!("{kind} needs a column")));
                        }
                        (CallSource::Star, ValueType::Bool)
                    } else {
                        let col = find(&c.column).ok_or_else(|| {
                            Error::Invalid(format!("aggregate over unknown column {:?}", c.column))
                        })?;
                        match col.kind() {
                            ColumnKind::Time => (CallSource::Time, ValueType::I64),
                            ColumnKind::Tag => (CallSource::Tag(col.name.clone()), ValueType::Str),
                            ColumnKind::Field | ColumnKind::Unspecified => {
                                (CallSource::Field(col.clone()), value_type(col.data_type()))
                            }
                        }
                    };
                    if !kind.accepts(input) {
                        return Err(Error::Invalid(format!(
                            "{kind} does not take column {:?} of type {input}",
                            c.column
                        )));
                    }
                    calls.push(Call {
                        kind,
                        source,
                        input,
                    });
                }
                Mode::Aggregate(AggPlan {
                    width_ns: spec.bucket_width_ns,
                    origin_ns: spec.bucket_origin_ns,
                    group_tags: spec.group_tags.clone(),
                    calls,
                    states_as_answers: spec.states_as_answers,
                })
            }
            (Some(_), false, _) => {
                return Err(Error::Invalid("an aggregate scan has no row order".into()));
            }
            (None, true, ScanOrder::OrderSeries) => {
                if req.limit != 0 {
                    return Err(Error::Invalid("a last-point scan takes no limit".into()));
                }
                if req.rows_per_series > MAX_ORDERED_LIMIT {
                    return Err(Error::Invalid(format!(
                        "a last-point scan keeps at most {MAX_ORDERED_LIMIT} rows per series"
                    )));
                }
                Mode::Last {
                    rows: req.rows_per_series.max(1) as usize,
                }
            }
            (None, true, _) => {
                return Err(Error::Invalid("a last-point scan has no row order".into()));
            }
            (None, false, _) if req.rows_per_series != 0 => {
                return Err(Error::Invalid(
                    "rows per series are asked of last-point scans only".into(),
                ));
            }
            (None, false, ScanOrder::OrderSeries) => Mode::Rows,
            (None, false, order) => {
                if req.limit == 0 || req.limit > MAX_ORDERED_LIMIT {
                    return Err(Error::Invalid(format!(
                        "a scan ordered by time needs a limit between 1 and {MAX_ORDERED_LIMIT}"
                    )));
                }
                Mode::Ordered {
                    desc: order == ScanOrder::OrderTimeDesc,
                }
            }
        };
        Ok(Query {
            start_ns: req.start_ns,
            end_ns: req.end_ns,
            tags,
            filter,
            projection: req.projection.clone(),
            limit,
            mode,
            table: table.into(),
        })
    }

    /// Whether the answer may be gathered in parts that each read a share of
    /// the rows and then stand side by side: rows without a limit (a row is
    /// in the answer whatever else is read) and aggregates (partial states of
    /// one group from two parts merge as states from two partitions do).
    /// Not a limit, the newest rows of a series or the first rows by time,
    /// which need every row seen by one collector.
    pub fn splits(&self) -> bool {
        match self.mode {
            Mode::Rows => self.limit == u64::MAX,
            Mode::Aggregate(_) => true,
            Mode::Ordered { .. } | Mode::Last { .. } => false,
        }
    }

    /// What one series contributes, worked out once per series; None when
    /// the key's layout is broken or a tag it needs is not UTF-8 (tags it
    /// does not need are not checked, see [`SeriesTags`]).
    pub fn series_ctx(&self, series: &[u8]) -> Option<SeriesCtx> {
        let tags = SeriesTags::of(series)?;
        let bad = Cell::new(false);
        let get = |name: &str| {
            tags.get(name).unwrap_or_else(|_| {
                bad.set(true);
                None
            })
        };
        let passes = self.tags.iter().all(|p| p.matches(get(&p.column)));
        let (group, call_tags) = match &self.mode {
            Mode::Aggregate(plan) => (
                plan.group_tags
                    .iter()
                    .map(|t| get(t).map(str::to_string))
                    .collect(),
                plan.calls
                    .iter()
                    .map(|c| match &c.source {
                        CallSource::Tag(t) => get(t).map(str::to_string),
                        _ => None,
                    })
                    .collect(),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        if bad.get() {
            return None;
        }
        Some(SeriesCtx {
            passes,
            group,
            call_tags,
            group_id: std::cell::OnceCell::new(),
        })
    }

    /// Whether rows' field values must be decoded for this query beyond the
    /// projection (filter or aggregate inputs).
    fn needs_fields(&self) -> bool {
        self.filter.is_some()
            || matches!(&self.mode, Mode::Aggregate(p) if p.calls.iter().any(|c| matches!(c.source, CallSource::Field(_))))
    }
}

/// What a query needs of one series.
#[derive(Debug, Clone, Default)]
pub struct SeriesCtx {
    /// The series passes the tag predicates.
    pub passes: bool,
    /// Values of the group tags.
    pub group: Vec<Option<String>>,
    /// Per aggregate call over a tag, the series' value of it.
    pub call_tags: Vec<Option<String>>,
    /// The interned id of `group`, set by the first row of the series.
    pub group_id: std::cell::OnceCell<u32>,
}

impl SeriesCtx {
    /// A series the tag predicates rule out.
    pub fn ruled_out() -> SeriesCtx {
        SeriesCtx::default()
    }
}

/// Counters of one scan (the proto's [`ScanMetrics`]).
#[derive(Debug, Default)]
pub struct Metrics {
    pub partitions_scanned: Cell<u64>,
    pub sealed_partitions_fast: Cell<u64>,
    pub sealed_partitions_merged: Cell<u64>,
    pub row_groups_total: Cell<u64>,
    pub row_groups_skipped: Cell<u64>,
    pub pages_decoded: Cell<u64>,
    pub pages_skipped: Cell<u64>,
    pub pages_from_stats: Cell<u64>,
    pub last_points_from_directory: Cell<u64>,
    pub series_settled_before: Cell<u64>,
    pub rows_scanned: Cell<u64>,
    pub rows_matched: Cell<u64>,
    pub rows_returned: Cell<u64>,
}

impl Metrics {
    pub fn add(c: &Cell<u64>, n: u64) {
        c.set(c.get().saturating_add(n));
    }

    /// Adds the counters of `part` (one part of a scan split across
    /// threads) to `into`.
    pub fn add_proto(into: &mut ScanMetrics, part: &ScanMetrics) {
        // Named one by one, so a new counter cannot be forgotten here.
        let ScanMetrics {
            partitions_scanned,
            sealed_partitions_fast,
            sealed_partitions_merged,
            row_groups_total,
            row_groups_skipped,
            pages_decoded,
            pages_skipped,
            pages_from_stats,
            last_points_from_directory,
            rows_scanned,
            rows_matched,
            rows_returned,
            bytes_returned,
            scan_threads,
            series_settled_before,
        } = *part;
        let add = |c: &mut u64, n: u64| *c = c.saturating_add(n);
        add(&mut into.partitions_scanned, partitions_scanned);
        add(&mut into.sealed_partitions_fast, sealed_partitions_fast);
        add(&mut into.sealed_partitions_merged, sealed_partitions_merged);
        add(&mut into.row_groups_total, row_groups_total);
        add(&mut into.row_groups_skipped, row_groups_skipped);
        add(&mut into.pages_decoded, pages_decoded);
        add(&mut into.pages_skipped, pages_skipped);
        add(&mut into.pages_from_stats, pages_from_stats);
        add(
            &mut into.last_points_from_directory,
            last_points_from_directory,
        );
        add(&mut into.rows_scanned, rows_scanned);
        add(&mut into.rows_matched, rows_matched);
        add(&mut into.rows_returned, rows_returned);
        add(&mut into.bytes_returned, bytes_returned);
        add(&mut into.scan_threads, scan_threads);
        add(&mut into.series_settled_before, series_settled_before);
    }

    pub fn to_proto(&self) -> ScanMetrics {
        ScanMetrics {
            partitions_scanned: self.partitions_scanned.get(),
            sealed_partitions_fast: self.sealed_partitions_fast.get(),
            sealed_partitions_merged: self.sealed_partitions_merged.get(),
            row_groups_total: self.row_groups_total.get(),
            row_groups_skipped: self.row_groups_skipped.get(),
            pages_decoded: self.pages_decoded.get(),
            pages_skipped: self.pages_skipped.get(),
            pages_from_stats: self.pages_from_stats.get(),
            last_points_from_directory: self.last_points_from_directory.get(),
            rows_scanned: self.rows_scanned.get(),
            rows_matched: self.rows_matched.get(),
            rows_returned: self.rows_returned.get(),
            bytes_returned: 0,
            scan_threads: 0,
            series_settled_before: self.series_settled_before.get(),
        }
    }
}

/// A row kept by a time-ordered scan or a last-point scan.
#[derive(Debug, Clone)]
struct Kept {
    time_ns: i64,
    series: Vec<u8>,
    partition_id: u64,
    value: Vec<u8>,
}

/// A kept row with its rank: smaller ranks come first in the answer.
#[derive(Debug)]
struct Ranked {
    desc: bool,
    row: Kept,
}

impl Ranked {
    fn key_cmp(&self, other: &Ranked) -> Ordering {
        let by_time = self.row.time_ns.cmp(&other.row.time_ns);
        let by_time = if self.desc {
            by_time.reverse()
        } else {
            by_time
        };
        by_time.then_with(|| self.row.series.cmp(&other.row.series))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.key_cmp(other) == Ordering::Equal
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key_cmp(other)
    }
}

enum Collector {
    Rows {
        builder: BatchBuilder,
    },
    Ordered {
        desc: bool,
        heap: BinaryHeap<Ranked>,
    },
    Last {
        /// How many of each series' newest rows are kept.
        rows: usize,
        /// Per series, its newest rows so far, newest first.
        best: HashMap<Vec<u8>, Vec<Kept>>,
    },
    Aggregate {
        plan: AggPlan,
        index: GroupIndex,
        /// The group found last, and its key.
        last: Option<(GroupKey, usize)>,
        keys: Vec<GroupKey>,
        /// Distinct group-tag values, by id, found by their encoding
        /// (`encode_group_tags`) so that values borrowed from a file's
        /// directory are looked up without being copied.
        tag_ids: HashMap<Box<[u8]>, u32>,
        tag_values: Vec<Vec<Option<String>>>,
        /// The encoding of the values being looked up.
        scratch: Vec<u8>,
        /// Per call, every group's state, in group order.
        states: Vec<GroupStates>,
    },
}

/// Collects the answer of one query across partitions and hands batches to
/// `emit` (which returns false to stop the scan).
pub struct Output<'a> {
    pub query: &'a Query,
    collector: Collector,
    emit: &'a mut dyn FnMut(RecordBatch) -> bool,
    /// Rows handed on (rows mode), against the limit.
    emitted: u64,
    stopped: bool,
    /// Asked now and then: true once whoever waits for the answer is gone.
    cancelled: Option<&'a dyn Fn() -> bool>,
    /// How many collectors (threads of one scan) share the node's group
    /// limits: each may hold this share of them.
    collectors: usize,
    pub metrics: Metrics,
}

impl<'a> Output<'a> {
    pub fn new(query: &'a Query, emit: &'a mut dyn FnMut(RecordBatch) -> bool) -> Output<'a> {
        let collector = match &query.mode {
            Mode::Rows => Collector::Rows {
                builder: BatchBuilder::new(query.projection.clone(), query.table.clone()),
            },
            Mode::Ordered { desc } => Collector::Ordered {
                desc: *desc,
                heap: BinaryHeap::new(),
            },
            Mode::Last { rows } => Collector::Last {
                rows: *rows,
                best: HashMap::new(),
            },
            Mode::Aggregate(plan) => Collector::Aggregate {
                plan: plan.clone(),
                index: GroupIndex::new(plan.width_ns),
                last: None,
                keys: Vec::new(),
                tag_ids: HashMap::new(),
                tag_values: Vec::new(),
                scratch: Vec::new(),
                // Compiling checked that each kind takes its input.
                states: plan
                    .calls
                    .iter()
                    .filter_map(|c| GroupStates::new(c.kind, c.input).ok())
                    .collect(),
            },
        };
        Output {
            query,
            collector,
            emit,
            emitted: 0,
            stopped: false,
            cancelled: None,
            collectors: 1,
            metrics: Metrics::default(),
        }
    }

    /// Stops the scan early once `cancelled` answers true (the caller's
    /// client went away), even in modes that answer only at the end.
    pub fn with_cancel(mut self, cancelled: &'a dyn Fn() -> bool) -> Self {
        self.cancelled = Some(cancelled);
        self
    }

    /// Makes this one of `n` collectors of one scan (a scan split across
    /// threads): from now on it may hold a `1/n` share of the node's group
    /// limits (`MAX_GROUPS`, `MAX_GROUP_STATES`, `MAX_SKETCH_STATES`), so
    /// that the scan as a whole stays within them.
    pub fn share_limits(&mut self, n: usize) {
        self.collectors = n.max(1);
    }

    /// True once no further row can change the answer: the consumer stopped,
    /// or a rows-mode limit was reached.
    pub fn done(&self) -> bool {
        self.stopped
            || self.cancelled.is_some_and(|c| c())
            || (matches!(self.collector, Collector::Rows { .. })
                && self.emitted >= self.query.limit)
    }

    /// Rows a rows-mode scan may still hand on.
    pub fn room(&self) -> u64 {
        self.query.limit.saturating_sub(self.emitted)
    }

    /// For a scan of each series' newest rows: true when `series` already
    /// holds all the rows it keeps and the oldest of them is no older than
    /// `newest_ns`. A row of the series at or before `newest_ns` then
    /// cannot enter the answer (a row as old as the oldest kept one does
    /// not replace it), so a part whose rows of the series all lie there
    /// (an older partition's file) need not be read for it.
    pub fn series_settled(&self, series: &[u8], newest_ns: i64) -> bool {
        match &self.collector {
            Collector::Last { rows, best } => best.get(series).is_some_and(|kept| {
                kept.len() >= *rows && kept.last().is_some_and(|o| o.time_ns >= newest_ns)
            }),
            _ => false,
        }
    }

    /// For a time-ordered scan whose heap is full, the time of the last row
    /// it keeps: a row strictly beyond it (later for ascending, earlier for
    /// descending) cannot enter the answer.
    pub fn ordered_cutoff(&self) -> Option<(bool, i64)> {
        match &self.collector {
            Collector::Ordered { desc, heap } if heap.len() as u64 >= self.query.limit => {
                heap.peek().map(|r| (*desc, r.row.time_ns))
            }
            _ => None,
        }
    }

    fn send(&mut self, batch: RecordBatch) {
        Metrics::add(&self.metrics.rows_returned, batch.num_rows() as u64);
        if !(self.emit)(batch) {
            self.stopped = true;
        }
    }

    /// Rows mode: hands on the rows collected so far as a batch. The
    /// engine calls it at the end of each partition read on the row path,
    /// so no batch holds rows of two partitions: one series' rows then
    /// come as batches each in time order whose time ranges do not
    /// overlap, which the query node passes on without sorting them
    /// (`SortedRunsExec`). Other modes: nothing.
    pub fn flush_rows(&mut self) -> Result<()> {
        if let Collector::Rows { builder } = &mut self.collector
            && builder.rows() > 0
        {
            let batch = builder.finish()?;
            self.send(batch);
        }
        Ok(())
    }

    /// Hands on a batch of projected rows built elsewhere (the sealed file's
    /// column path), after the rows collected so far. Rows mode only.
    pub fn emit_rows_batch(&mut self, batch: RecordBatch) -> Result<()> {
        self.flush_rows()?;
        self.emitted += batch.num_rows() as u64;
        self.send(batch);
        Ok(())
    }

    /// Takes one row that passed the time range and every predicate.
    /// `fields` is the row's decoded value when the caller has it.
    pub fn push_row(
        &mut self,
        partition_id: u64,
        series: &[u8],
        ctx: &SeriesCtx,
        time_ns: i64,
        value: &[u8],
        fields: Option<&[(&str, Value)]>,
    ) -> Result<()> {
        Metrics::add(&self.metrics.rows_matched, 1);
        match &mut self.collector {
            Collector::Rows { builder } => {
                builder.push(partition_id, series, time_ns, value)?;
                self.emitted += 1;
                if builder.rows() >= SCAN_BATCH_ROWS || self.emitted >= self.query.limit {
                    self.flush_rows()?;
                }
            }
            Collector::Ordered { desc, heap } => {
                let candidate = Ranked {
                    desc: *desc,
                    row: Kept {
                        time_ns,
                        series: series.to_vec(),
                        partition_id,
                        value: value.to_vec(),
                    },
                };
                if (heap.len() as u64) < self.query.limit {
                    heap.push(candidate);
                } else if heap.peek().is_some_and(|worst| candidate < *worst) {
                    heap.pop();
                    heap.push(candidate);
                }
            }
            Collector::Last { rows, best } => {
                // Each series' newest rows so far, newest first.
                let kept = match best.get_mut(series) {
                    Some(k) => k,
                    None => best.entry(series.to_vec()).or_default(),
                };
                let at = kept.partition_point(|k| k.time_ns > time_ns);
                let replaces = kept.get(at).is_some_and(|k| k.time_ns == time_ns);
                if at < *rows && !replaces {
                    if kept.len() == *rows {
                        kept.pop();
                    }
                    kept.insert(
                        at,
                        Kept {
                            time_ns,
                            series: series.to_vec(),
                            partition_id,
                            value: value.to_vec(),
                        },
                    );
                }
            }
            Collector::Aggregate { .. } => {
                let decoded;
                let fields = match fields {
                    Some(f) => f,
                    None => {
                        decoded = decode_fields(value, &self.query.table).ok_or_else(|| {
                            Error::Corrupt {
                                partition_id,
                                reason: "bad row value".into(),
                            }
                        })?;
                        &decoded[..]
                    }
                };
                let g = self.group(time_ns, ctx)?;
                let Collector::Aggregate { plan, states, .. } = &mut self.collector else {
                    return Err(Error::Internal("collector changed".into()));
                };
                for (i, call) in plan.calls.iter().enumerate() {
                    let v = match &call.source {
                        CallSource::Star => Some(PValue::Bool(true)),
                        CallSource::Time => Some(PValue::I64(time_ns)),
                        CallSource::Tag(_) => {
                            ctx.call_tags.get(i).cloned().flatten().map(PValue::Str)
                        }
                        CallSource::Field(c) => fields
                            .iter()
                            .find(|(n, _)| *n == c.name)
                            .map(|(_, v)| to_partial(v.clone())),
                    };
                    if let Some(v) = v {
                        let st = states.get_mut(i).ok_or_else(|| {
                            Error::Internal("aggregate states could not be made".into())
                        })?;
                        st.update(g, time_ns, &v).map_err(aggregate_error)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The index of the group of a row at `time_ns` of a series, created if
    /// new. Aggregate mode only.
    pub fn group(&mut self, time_ns: i64, ctx: &SeriesCtx) -> Result<usize> {
        let bucket = match &self.collector {
            Collector::Aggregate { plan, .. } => plan.bucket(time_ns)?,
            _ => return Err(Error::Internal("group() outside an aggregate scan".into())),
        };
        self.group_of_bucket(bucket, ctx)
    }

    /// Makes room for `n` more groups (capped at the limit), so that a scan
    /// that knows roughly how many it will make does not grow the tables
    /// step by step. Aggregate mode only; elsewhere nothing.
    pub fn reserve_groups(&mut self, n: usize) {
        if let Collector::Aggregate {
            plan, keys, states, ..
        } = &mut self.collector
        {
            let calls = plan.calls.len().max(1);
            let n = n
                .min((MAX_GROUPS / self.collectors).saturating_sub(keys.len()))
                .min((MAX_GROUP_STATES / calls / self.collectors).saturating_sub(keys.len()));
            keys.reserve(n);
            states.iter_mut().for_each(|s| s.reserve(n));
        }
    }

    /// The index of the group of bucket `bucket` (a bucket start, as
    /// `AggPlan::bucket` gives it; 0 when not bucketed) of a series, created
    /// if new. Aggregate mode only.
    pub fn group_of_bucket(&mut self, bucket: i64, ctx: &SeriesCtx) -> Result<usize> {
        // A series' group-tag values are interned once per series context.
        let tags = match ctx.group_id.get() {
            Some(id) => *id,
            None => {
                let id = self.tags_id(ctx.group.iter().map(Option::as_deref))?;
                let _ = ctx.group_id.set(id);
                id
            }
        };
        self.group_of_tags_id(bucket, tags)
    }

    /// The index of the group of bucket `bucket` whose group-tag values are
    /// `values` (in the plan's `group_tags` order), created if new; values
    /// already seen are not copied. Aggregate mode only.
    pub fn group_of_tags(&mut self, bucket: i64, values: &[Option<&str>]) -> Result<usize> {
        let tags = self.tags_id(values.iter().copied())?;
        self.group_of_tags_id(bucket, tags)
    }

    /// The id of a list of group-tag values, interned if new.
    fn tags_id<'v>(
        &mut self,
        values: impl Iterator<Item = Option<&'v str>> + Clone,
    ) -> Result<u32> {
        let Collector::Aggregate {
            tag_ids,
            tag_values,
            scratch,
            ..
        } = &mut self.collector
        else {
            return Err(Error::Internal("group() outside an aggregate scan".into()));
        };
        encode_group_tags(scratch, values.clone());
        if let Some(&id) = tag_ids.get(scratch.as_slice()) {
            return Ok(id);
        }
        let id = u32::try_from(tag_values.len())
            .map_err(|_| Error::Invalid("too many distinct group-tag values".into()))?;
        tag_ids.insert(scratch.as_slice().into(), id);
        tag_values.push(values.map(|v| v.map(str::to_string)).collect());
        Ok(id)
    }

    /// The index of the group of bucket `bucket` and interned group-tag
    /// values `tags`, created if new.
    fn group_of_tags_id(&mut self, bucket: i64, tags: u32) -> Result<usize> {
        let Collector::Aggregate {
            plan,
            index,
            last,
            keys,
            states,
            ..
        } = &mut self.collector
        else {
            return Err(Error::Internal("group() outside an aggregate scan".into()));
        };
        let key = (bucket, tags);
        // Runs of one group often come one after another (a bucket split by
        // a page boundary, rows of one series).
        if let Some((k, g)) = *last
            && k == key
        {
            return Ok(g);
        }
        if let Some(g) = index.get(key) {
            let g = g as usize;
            *last = Some((key, g));
            return Ok(g);
        }
        let sketches = plan.calls.iter().filter(|c| is_sketch(c.kind)).count();
        // This collector's part of the node's limits.
        let c = self.collectors;
        if keys.len() >= MAX_GROUPS / c
            || (keys.len() + 1) * plan.calls.len() > MAX_GROUP_STATES / c
            || (keys.len() + 1) * sketches > MAX_SKETCH_STATES / c
        {
            return Err(Error::TooManyGroups(format!(
                "the aggregate needs more than {} groups on one storage node (limits: {MAX_GROUPS} groups, {MAX_GROUP_STATES} states, {MAX_SKETCH_STATES} sketches, shared by the scan's {c} thread(s)); narrow the time range, widen the time bucket or group by fewer tags",
                keys.len() * c
            )));
        }
        if states.len() != plan.calls.len() {
            return Err(Error::Internal("aggregate states could not be made".into()));
        }
        let g = keys.len();
        // Below MAX_GROUPS, so it fits.
        index.insert(key, g as u32);
        keys.push(key);
        states.iter_mut().for_each(GroupStates::push_empty);
        *last = Some((key, g));
        Ok(g)
    }

    /// The states of call `call`, one per group (aggregate mode).
    pub fn call_states(&mut self, call: usize) -> Option<&mut GroupStates> {
        match &mut self.collector {
            Collector::Aggregate { states, .. } => states.get_mut(call),
            _ => None,
        }
    }

    /// Hands on what is left and returns the counters.
    pub fn finish(mut self) -> Result<ScanMetrics> {
        match std::mem::replace(
            &mut self.collector,
            Collector::Last {
                rows: 0,
                best: HashMap::new(),
            },
        ) {
            Collector::Rows { builder } => {
                self.collector = Collector::Rows { builder };
                if !self.stopped {
                    self.flush_rows()?;
                }
            }
            Collector::Ordered { heap, .. } => {
                let rows: Vec<Kept> = heap.into_sorted_vec().into_iter().map(|r| r.row).collect();
                self.send_kept(rows)?;
            }
            Collector::Last { best, .. } => {
                let mut rows: Vec<Kept> = best.into_values().flatten().collect();
                rows.sort_by(|a, b| (&a.series, a.time_ns).cmp(&(&b.series, b.time_ns)));
                self.send_kept(rows)?;
            }
            Collector::Aggregate {
                plan,
                keys,
                states,
                tag_values,
                ..
            } => {
                for (c, k) in keys.chunks(SCAN_BATCH_ROWS).enumerate() {
                    if self.stopped {
                        break;
                    }
                    let first = c * SCAN_BATCH_ROWS;
                    let groups = first..first + k.len();
                    let batch = aggregate_batch(&plan, k, &tag_values, &states, groups)?;
                    self.send(batch);
                }
            }
        }
        Ok(self.metrics.to_proto())
    }

    fn send_kept(&mut self, rows: Vec<Kept>) -> Result<()> {
        let room = rows.len().min(SCAN_BATCH_ROWS);
        let mut builder = BatchBuilder::with_capacity(
            self.query.projection.clone(),
            self.query.table.clone(),
            room,
        );
        for r in rows {
            if self.stopped {
                return Ok(());
            }
            builder.push(r.partition_id, &r.series, r.time_ns, &r.value)?;
            if builder.rows() >= SCAN_BATCH_ROWS {
                let b = builder.finish()?;
                self.send(b);
            }
        }
        if builder.rows() > 0 && !self.stopped {
            let b = builder.finish()?;
            self.send(b);
        }
        Ok(())
    }
}

/// Encodes a list of group-tag values as one byte string, the key they are
/// interned under: per value a 0 for NULL, or a 1, the length (8 bytes,
/// little-endian) and the bytes. Distinct lists encode differently.
fn encode_group_tags<'v>(buf: &mut Vec<u8>, values: impl Iterator<Item = Option<&'v str>>) {
    buf.clear();
    for v in values {
        match v {
            None => buf.push(0),
            Some(v) => {
                buf.push(1);
                buf.extend_from_slice(&(v.len() as u64).to_le_bytes());
                buf.extend_from_slice(v.as_bytes());
            }
        }
    }
}

/// The schema of an aggregate answer.
pub fn aggregate_schema(plan: &AggPlan) -> Arc<Schema> {
    let mut fields = Vec::new();
    if plan.width_ns > 0 {
        fields.push(Field::new(
            BUCKET_COLUMN,
            ArrowType::Timestamp(TimeUnit::Nanosecond, Some(TIME_ZONE.into())),
            false,
        ));
    }
    for t in &plan.group_tags {
        fields.push(Field::new(t, ArrowType::Utf8, true));
    }
    for (i, c) in plan.calls.iter().enumerate() {
        let (ty, nullable) = states::state_type(c.kind, c.input, plan.states_as_answers);
        fields.push(Field::new(state_column(i), ty, nullable));
    }
    Arc::new(Schema::new(fields))
}

fn aggregate_batch(
    plan: &AggPlan,
    keys: &[GroupKey],
    tag_values: &[Vec<Option<String>>],
    states: &[GroupStates],
    groups: std::ops::Range<usize>,
) -> Result<RecordBatch> {
    let mut arrays: Vec<ArrayRef> = Vec::new();
    if plan.width_ns > 0 {
        let mut b = TimestampNanosecondBuilder::with_capacity(keys.len());
        for (bucket, _) in keys {
            b.append_value(*bucket);
        }
        arrays.push(Arc::new(b.finish().with_timezone(TIME_ZONE)));
    }
    for t in 0..plan.group_tags.len() {
        let tag = |id: u32| {
            tag_values
                .get(id as usize)
                .and_then(|v| v.get(t))
                .and_then(Option::as_deref)
        };
        let bytes = keys
            .iter()
            .map(|(_, id)| tag(*id).map_or(0, str::len))
            .sum();
        let mut b = StringBuilder::with_capacity(keys.len(), bytes);
        for (_, id) in keys {
            b.append_option(tag(*id));
        }
        arrays.push(Arc::new(b.finish()));
    }
    for of_call in states {
        arrays.push(states::state_array(
            plan.states_as_answers,
            of_call,
            groups.clone(),
        )?);
    }
    // With no bucket, group tag or call, the batch has no column: only its
    // row count (the number of groups) says anything.
    let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(keys.len()));
    Ok(RecordBatch::try_new_with_options(
        aggregate_schema(plan),
        arrays,
        &options,
    )?)
}

pub fn to_partial(v: Value) -> PValue {
    match v {
        Value::F64(x) => PValue::F64(x),
        Value::I64(x) => PValue::I64(x),
        Value::U64(x) => PValue::U64(x),
        Value::Bool(x) => PValue::Bool(x),
        Value::Str(x) => PValue::Str(x),
    }
}

/// A partial state's refusal, as a scan reports it.
pub(crate) fn aggregate_error(e: sealion_partial::Error) -> Error {
    Error::Invalid(format!("aggregate: {e}"))
}

/// The values of the filter's columns in a decoded row, in filter order.
pub fn filter_values(filter: &FieldFilter, fields: &[(&str, Value)]) -> Vec<Option<Value>> {
    filter
        .columns
        .iter()
        .map(|c| {
            fields
                .iter()
                .find(|(n, _)| *n == c.name)
                .map(|(_, v)| v.clone())
        })
        .collect()
}

/// The row path: feeds `rows` (one partition's, in key order) through the
/// time range and predicates into `out`. Decodes every row it is given.
pub fn scan_rows(
    out: &mut Output<'_>,
    partition_id: u64,
    rows: impl Iterator<Item = Result<SortedRow>>,
) -> Result<()> {
    scan_rows_with(out, partition_id, rows, &mut |_| {})
}

/// [`scan_rows`], calling `on_match` with the series key of each row that
/// reaches the answer.
pub fn scan_rows_with(
    out: &mut Output<'_>,
    partition_id: u64,
    rows: impl Iterator<Item = Result<SortedRow>>,
    on_match: &mut dyn FnMut(&[u8]),
) -> Result<()> {
    let q = out.query;
    let needs_fields = q.needs_fields();
    let mut cached: Option<(Vec<u8>, SeriesCtx)> = None;
    for row in rows {
        if out.done() {
            break;
        }
        let row = row?;
        Metrics::add(&out.metrics.rows_scanned, 1);
        if row.time_ns < q.start_ns || row.time_ns >= q.end_ns {
            continue;
        }
        if let Some((cut_desc, cut)) = out.ordered_cutoff()
            && ((cut_desc && row.time_ns < cut) || (!cut_desc && row.time_ns > cut))
        {
            continue;
        }
        if cached.as_ref().is_none_or(|(k, _)| *k != row.series) {
            let ctx = q.series_ctx(&row.series).ok_or_else(|| Error::Corrupt {
                partition_id,
                reason: "bad series key".into(),
            })?;
            cached = Some((row.series.clone(), ctx));
        }
        let Some((_, ctx)) = &cached else { continue };
        if !ctx.passes {
            continue;
        }
        let fields = if needs_fields {
            Some(
                decode_fields(&row.value, &q.table).ok_or_else(|| Error::Corrupt {
                    partition_id,
                    reason: "bad row value".into(),
                })?,
            )
        } else {
            None
        };
        if let (Some(filter), Some(f)) = (&q.filter, &fields)
            && !filter.keeps(&filter_values(filter, f))
        {
            continue;
        }
        on_match(&row.series);
        out.push_row(
            partition_id,
            &row.series,
            ctx,
            row.time_ns,
            &row.value,
            fields.as_deref(),
        )?;
    }
    Ok(())
}
