//! `SealionScanExec`: the physical scan of one Sealion table. One output
//! partition per storage node asked, each an Arrow Flight `DoGet`.
//!
//! EXPLAIN shows what planning decided (partitions in the table, pruned by
//! time, pruned by tag filter, the nodes asked and what was pushed down);
//! EXPLAIN ANALYZE adds what each node reported after its last batch
//! (`ScanMetrics`): rows scanned and shipped, bytes shipped, row groups
//! skipped and pages decoded.

use std::fmt;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_flight::Ticket;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use sealion_common::local::ScanItem;
use sealion_common::proto::{ScanMetrics, ScanRequest};

use crate::router::StorageClients;

/// When the query a task context runs must have ended (see
/// [`crate::sql::SqlEngine::deadline`]), carried as an extension of the
/// context's session config so a scan can tell a storage node in this
/// process that runs it in place.
#[derive(Debug, Clone, Copy)]
pub struct QueryDeadline(pub std::time::Instant);

/// The deadline `context` carries, if any.
pub fn deadline_of(context: &TaskContext) -> Option<std::time::Instant> {
    context
        .session_config()
        .get_extension::<QueryDeadline>()
        .map(|d| d.0)
}

/// One storage node's share of a scan.
#[derive(Debug, Clone)]
pub struct NodeScan {
    pub node_id: u64,
    pub addr: String,
    pub ticket: ScanRequest,
}

/// How the node requests of a scan are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// All at once, one output partition per node.
    Parallel,
    /// For `ORDER BY time LIMIT n`: requests are grouped into steps of
    /// partitions that share a time range, steps ordered newest (or oldest)
    /// first; one output partition runs them step by step and stops once
    /// `limit` rows have arrived, since no later step can hold a row that
    /// comes before them.
    Ordered { limit: u64 },
}

/// What planning decided, for EXPLAIN.
#[derive(Debug, Clone, Default)]
pub struct ScanPlan {
    pub table: String,
    pub partitions_total: usize,
    pub pruned_by_time: usize,
    pub pruned_by_tag_filter: usize,
    /// What the nodes evaluate, in words.
    pub pushed: Vec<String>,
}

/// How a scan's requests group into steps of one time range each.
#[derive(Debug, Clone, Default)]
pub struct Steps {
    /// The step of each node request (ascending; all 0 for a scan that is
    /// not stepped).
    pub of_nodes: Vec<usize>,
    /// The time range `[start, end)` of each step's partitions, in step
    /// order (empty for a scan that is not stepped).
    pub ranges: Vec<(i64, i64)>,
}

pub struct SealionScanExec {
    schema: SchemaRef,
    /// Shared with the copies `reset_state` makes for runs of a kept plan.
    nodes: Arc<[NodeScan]>,
    steps: Steps,
    schedule: Schedule,
    plan: ScanPlan,
    storage: Arc<StorageClients>,
    metrics: ExecutionPlanMetricsSet,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for SealionScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SealionScanExec({}, {} nodes)",
            self.plan.table,
            self.nodes.len()
        )
    }
}

impl SealionScanExec {
    pub fn new(
        schema: SchemaRef,
        nodes: Vec<NodeScan>,
        plan: ScanPlan,
        storage: Arc<StorageClients>,
    ) -> Self {
        let steps = Steps {
            of_nodes: vec![0; nodes.len()],
            ranges: Vec::new(),
        };
        Self::with_schedule(schema, nodes, steps, Schedule::Parallel, plan, storage)
    }

    pub fn with_schedule(
        schema: SchemaRef,
        nodes: Vec<NodeScan>,
        steps: Steps,
        schedule: Schedule,
        plan: ScanPlan,
        storage: Arc<StorageClients>,
    ) -> Self {
        let partitions = match schedule {
            Schedule::Parallel => nodes.len().max(1),
            Schedule::Ordered { .. } => 1,
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        SealionScanExec {
            schema,
            nodes: nodes.into(),
            steps,
            schedule,
            plan,
            storage,
            metrics: ExecutionPlanMetricsSet::new(),
            properties: Arc::new(properties),
        }
    }

    /// Declares that the scan's one output partition comes in `time`
    /// order (newest first when `desc`) where that holds: an ordered
    /// schedule whose every step asks one node, and steps whose time
    /// ranges follow one another without overlap in the order they run.
    /// A node sends its first rows of a time-ordered request in that
    /// order, so the steps' answers one after another are ordered too, and
    /// DataFusion then needs no sort above the scan (its `EnforceSorting`
    /// puts a limit where the sort was). A step that asks several nodes
    /// interleaves their answers: the order is not declared and the sort
    /// stays.
    pub fn with_time_order(mut self, time: &str, desc: bool) -> Self {
        if !matches!(self.schedule, Schedule::Ordered { .. }) {
            return self;
        }
        let one_node_a_step = self.steps.of_nodes.windows(2).all(|w| w[0] != w[1]);
        let disjoint = self.steps.ranges.windows(2).all(|w| {
            if desc {
                w[1].1 <= w[0].0
            } else {
                w[0].1 <= w[1].0
            }
        });
        if !(one_node_a_step && disjoint) {
            return self;
        }
        let Ok(column) = datafusion::physical_expr::expressions::col(time, &self.schema) else {
            return self;
        };
        // DataFusion's defaults: ASC NULLS LAST, DESC NULLS FIRST (time is
        // never null, so either would hold).
        let options = arrow::compute::SortOptions {
            descending: desc,
            nulls_first: desc,
        };
        let ordering = [datafusion::physical_expr::PhysicalSortExpr::new(
            column, options,
        )];
        let properties = PlanProperties::new(
            EquivalenceProperties::new_with_orderings(self.schema.clone(), [ordering]),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        self.properties = Arc::new(properties);
        self
    }

    /// The time range `[start, end)` of each step's partitions, in the
    /// order the steps are meant to run; empty unless the scan was planned
    /// in steps.
    pub fn step_ranges(&self) -> &[(i64, i64)] {
        &self.steps.ranges
    }

    /// The answers to step `step`'s requests (all of them at once),
    /// counted in this scan's metrics as output partition 0.
    pub fn execute_step(&self, step: usize, context: &TaskContext) -> SendableRecordBatchStream {
        let counters = Arc::new(NodeCounters::new(&self.metrics, 0));
        let deadline = deadline_of(context);
        let streams: Vec<_> = self
            .nodes
            .iter()
            .zip(&self.steps.of_nodes)
            .filter(|&(_, &s)| s == step)
            .map(|(node, _)| node_stream(&self.storage, node.clone(), counters.clone(), deadline))
            .collect();
        Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::select_all(streams),
        ))
    }
}

impl DisplayAs for SealionScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| n.node_id.to_string()).collect();
        let partitions: usize = self
            .nodes
            .iter()
            .map(|n| n.ticket.partition_ids.len())
            .sum();
        let mut nodes = nodes;
        nodes.dedup();
        // What each node sends: the columns asked for, or an aggregate's
        // state columns.
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(
            f,
            "SealionScanExec: table={} partitions_total={} partitions_pruned_by_time={} partitions_pruned_by_tag_filter={} partitions_scanned={} nodes=[{}] columns=[{}] pushed=[{}]",
            self.plan.table,
            self.plan.partitions_total,
            self.plan.pruned_by_time,
            self.plan.pruned_by_tag_filter,
            partitions,
            nodes.join(","),
            columns.join(","),
            self.plan.pushed.join("; ")
        )?;
        if let Schedule::Ordered { limit } = self.schedule {
            write!(
                f,
                " schedule=ordered steps={} stop_after_rows={limit}",
                self.steps.of_nodes.last().map_or(0, |s| s + 1)
            )?;
        }
        Ok(())
    }
}

/// The counters one node's scan adds to the plan's metrics.
struct NodeCounters {
    rows_scanned: Count,
    rows_shipped: Count,
    bytes_shipped: Count,
    row_groups_skipped: Count,
    pages_decoded: Count,
    partitions_read: Count,
    scan_threads: Count,
    series_settled: Count,
}

impl NodeCounters {
    fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let c = |name: &'static str| MetricBuilder::new(set).counter(name, partition);
        NodeCounters {
            rows_scanned: c("rows_scanned"),
            rows_shipped: c("rows_shipped"),
            bytes_shipped: c("bytes_shipped"),
            row_groups_skipped: c("row_groups_skipped"),
            pages_decoded: c("pages_decoded"),
            partitions_read: c("partitions_read"),
            scan_threads: c("scan_threads"),
            series_settled: c("series_settled"),
        }
    }

    fn add(&self, m: &ScanMetrics) {
        self.rows_scanned.add(m.rows_scanned as usize);
        self.rows_shipped.add(m.rows_returned as usize);
        self.bytes_shipped.add(m.bytes_returned as usize);
        self.row_groups_skipped.add(m.row_groups_skipped as usize);
        self.pages_decoded.add(m.pages_decoded as usize);
        self.partitions_read.add(m.partitions_scanned as usize);
        self.scan_threads.add(m.scan_threads as usize);
        self.series_settled.add(m.series_settled_before as usize);
    }
}

impl ExecutionPlan for SealionScanExec {
    fn name(&self) -> &str {
        "SealionScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    /// A copy with counters of its own, for a run of a kept plan
    /// (`crate::plan_cache`): the counters are the only state a scan keeps.
    fn reset_state(self: Arc<Self>) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(SealionScanExec {
            schema: self.schema.clone(),
            nodes: Arc::clone(&self.nodes),
            steps: self.steps.clone(),
            schedule: self.schedule,
            plan: self.plan.clone(),
            storage: self.storage.clone(),
            metrics: ExecutionPlanMetricsSet::new(),
            properties: self.properties.clone(),
        }))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "SealionScanExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let counters = Arc::new(NodeCounters::new(&self.metrics, partition));
        let deadline = deadline_of(&context);
        let stream = match self.schedule {
            Schedule::Parallel => match self.nodes.get(partition).cloned() {
                Some(node) => node_stream(&self.storage, node, counters, deadline),
                None => futures::stream::empty().boxed(),
            },
            Schedule::Ordered { limit } => {
                // Each step's nodes by their index: a request is copied only
                // when its step runs (a scan that stops after the newest of
                // twelve steps copies one).
                let mut steps: Vec<Vec<usize>> = Vec::new();
                for (i, &step) in self
                    .steps
                    .of_nodes
                    .iter()
                    .enumerate()
                    .take(self.nodes.len())
                {
                    if steps.len() <= step {
                        steps.resize_with(step + 1, Vec::new);
                    }
                    steps[step].push(i);
                }
                let nodes = Arc::clone(&self.nodes);
                ordered_stream(
                    self.storage.clone(),
                    nodes,
                    steps,
                    limit,
                    counters,
                    deadline,
                )
                .boxed()
            }
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// One node's answer: its batches, with its counters taken from the
/// data-less last message (or, from a node in this process, the last
/// item). Either way the scan starts when the stream is first polled.
fn node_stream(
    storage: &StorageClients,
    node: NodeScan,
    counters: Arc<NodeCounters>,
    deadline: Option<std::time::Instant>,
) -> futures::stream::BoxStream<'static, DfResult<RecordBatch>> {
    let (node_id, addr) = (node.node_id, node.addr.clone());
    let unavailable = move |status: tonic::Status| {
        DataFusionError::External(Box::new(crate::Error::Unavailable(format!(
            "storage node {node_id} at {addr}: {}",
            status.message()
        ))))
    };
    let items = if let Some(local) = storage.local(&node.addr) {
        let scans = local.scans.clone();
        futures::stream::once(async move {
            let items = scans.scan(node.ticket, deadline).map_err(unavailable)?;
            Ok::<_, DataFusionError>(items.map_err(local_scan_error))
        })
        .try_flatten()
        .boxed()
    } else {
        let client = storage.flight(&node.addr);
        let ticket = Ticket {
            ticket: node.ticket.encode_to_vec().into(),
        };
        futures::stream::once(async move {
            let mut client = client.map_err(|e| DataFusionError::External(Box::new(e)))?;
            let response = client.do_get(ticket).await.map_err(unavailable)?;
            let flight = response
                .into_inner()
                .map_err(|s| FlightError::Tonic(Box::new(s)));
            let items = FlightDataDecoder::new(flight).filter_map(|item| {
                futures::future::ready(match item {
                    Err(e) => Some(Err(DataFusionError::External(Box::new(e)))),
                    Ok(d) => match d.payload {
                        DecodedPayload::RecordBatch(b) => Some(Ok(ScanItem::Batch(b))),
                        DecodedPayload::None => ScanMetrics::decode(d.inner.app_metadata.as_ref())
                            .ok()
                            .map(|m| Ok(ScanItem::Metrics(m))),
                        DecodedPayload::Schema(_) => None,
                    },
                })
            });
            Ok::<_, DataFusionError>(items)
        })
        .try_flatten()
        .boxed()
    };
    batches_of(items, counters, node.node_id, node.addr)
}

/// A node's answer as batches, its counters added to `counters`. A node
/// sends its counters only after its last batch of a scan that ran to the
/// end, so an answer that ends without them was cut short (the node's scan
/// failed or gave up on a reader too slow) and ends in an error here,
/// never as a shorter answer.
fn batches_of(
    items: futures::stream::BoxStream<'static, DfResult<ScanItem>>,
    counters: Arc<NodeCounters>,
    node_id: u64,
    addr: String,
) -> futures::stream::BoxStream<'static, DfResult<RecordBatch>> {
    futures::stream::unfold(Some((items, false)), move |state| {
        let counters = counters.clone();
        let addr = addr.clone();
        async move {
            let (mut items, mut counted) = state?;
            loop {
                match items.next().await {
                    Some(Ok(ScanItem::Batch(b))) => return Some((Ok(b), Some((items, counted)))),
                    Some(Ok(ScanItem::Metrics(m))) => {
                        counters.add(&m);
                        counted = true;
                    }
                    Some(Err(e)) => return Some((Err(e), None)),
                    None if counted => return None,
                    None => {
                        let e = crate::Error::Unavailable(format!(
                            "storage node {node_id} at {addr}: the scan ended before its last batch"
                        ));
                        return Some((Err(DataFusionError::External(Box::new(e))), None));
                    }
                }
            }
        }
    })
    .boxed()
}

/// An error a storage node in this process ended its scan with: a passed
/// deadline as the query's timeout (SQLSTATE 57014), the rest as a node's
/// errors over Flight.
fn local_scan_error(status: tonic::Status) -> DataFusionError {
    if status.code() == tonic::Code::DeadlineExceeded {
        return DataFusionError::External(Box::new(crate::sql::timed_out()));
    }
    DataFusionError::External(Box::new(FlightError::Tonic(Box::new(status))))
}

/// Steps run one after another (the requests within a step at once) until
/// `limit` rows have arrived.
fn ordered_stream(
    storage: Arc<StorageClients>,
    nodes: Arc<[NodeScan]>,
    steps: Vec<Vec<usize>>,
    limit: u64,
    counters: Arc<NodeCounters>,
    deadline: Option<std::time::Instant>,
) -> impl futures::Stream<Item = DfResult<RecordBatch>> + Send + 'static {
    let state = (steps.into_iter(), 0u64);
    futures::stream::unfold(state, move |(mut steps, rows)| {
        let storage = storage.clone();
        let nodes = Arc::clone(&nodes);
        let counters = counters.clone();
        async move {
            if rows >= limit {
                return None;
            }
            let step = steps.next()?;
            let streams: Vec<_> = step
                .into_iter()
                .map(|i| node_stream(&storage, nodes[i].clone(), counters.clone(), deadline))
                .collect();
            let batches: DfResult<Vec<RecordBatch>> =
                futures::stream::select_all(streams).try_collect().await;
            let (out, rows) = match batches {
                Ok(b) => {
                    let n: usize = b.iter().map(|b| b.num_rows()).sum();
                    (Ok(b), rows + n as u64)
                }
                // An error ends the scan after it is passed on.
                Err(e) => (Err(e), u64::MAX),
            };
            Some((out, (steps, rows)))
        }
    })
    .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
    .try_flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scan that a storage node in this process stopped at the query's
    /// deadline reaches the client as the statement timeout (57014, HTTP
    /// 504); its other errors stay what they were.
    #[test]
    fn a_local_scan_past_its_deadline_is_the_statement_timeout() {
        let e = crate::Error::from(local_scan_error(tonic::Status::deadline_exceeded("late")));
        assert_eq!(e.sqlstate(), "57014", "{e}");
        assert!(matches!(e, crate::Error::Timeout(_)), "{e}");
        let e = crate::Error::from(local_scan_error(tonic::Status::internal("disk")));
        assert!(!matches!(e, crate::Error::Timeout(_)), "{e}");
        assert!(e.to_string().contains("disk"), "{e}");
    }

    /// The deadline a query's task context carries reaches its scans.
    #[test]
    fn a_task_context_carries_the_query_deadline() {
        let at = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let config =
            datafusion::prelude::SessionConfig::new().with_extension(Arc::new(QueryDeadline(at)));
        let context = TaskContext::default().with_session_config(config);
        assert_eq!(deadline_of(&context), Some(at));
        assert_eq!(deadline_of(&TaskContext::default()), None);
    }
}
