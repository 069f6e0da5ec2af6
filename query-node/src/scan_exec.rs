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
use sealion_common::proto::{ScanMetrics, ScanRequest};

use crate::router::StorageClients;

/// One storage node's share of a scan.
#[derive(Debug, Clone)]
pub struct NodeScan {
    pub node_id: u64,
    pub addr: String,
    pub ticket: ScanRequest,
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

pub struct SealionScanExec {
    schema: SchemaRef,
    nodes: Vec<NodeScan>,
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
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(nodes.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        SealionScanExec {
            schema,
            nodes,
            plan,
            storage,
            metrics: ExecutionPlanMetricsSet::new(),
            properties: Arc::new(properties),
        }
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
        write!(
            f,
            "SealionScanExec: table={} partitions_total={} partitions_pruned_by_time={} partitions_pruned_by_tag_filter={} partitions_scanned={} nodes=[{}] pushed=[{}]",
            self.plan.table,
            self.plan.partitions_total,
            self.plan.pruned_by_time,
            self.plan.pruned_by_tag_filter,
            partitions,
            nodes.join(","),
            self.plan.pushed.join("; ")
        )
    }
}

/// The counters one node's scan adds to the plan's metrics.
struct NodeCounters {
    rows_scanned: Count,
    rows_shipped: Count,
    bytes_shipped: Count,
    row_groups_skipped: Count,
    pages_decoded: Count,
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
        }
    }

    fn add(&self, m: &ScanMetrics) {
        self.rows_scanned.add(m.rows_scanned as usize);
        self.rows_shipped.add(m.rows_returned as usize);
        self.bytes_shipped.add(m.bytes_returned as usize);
        self.row_groups_skipped.add(m.row_groups_skipped as usize);
        self.pages_decoded.add(m.pages_decoded as usize);
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
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let Some(node) = self.nodes.get(partition).cloned() else {
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                self.schema.clone(),
                futures::stream::empty(),
            )));
        };
        let counters = NodeCounters::new(&self.metrics, partition);
        let client = self.storage.flight(&node.addr);
        let ticket = Ticket {
            ticket: node.ticket.encode_to_vec().into(),
        };
        let (node_id, addr) = (node.node_id, node.addr.clone());
        let stream = futures::stream::once(async move {
            let mut client = client.map_err(|e| DataFusionError::External(Box::new(e)))?;
            let response = client.do_get(ticket).await.map_err(|status| {
                DataFusionError::External(Box::new(crate::Error::Unavailable(format!(
                    "storage node {node_id} at {addr}: {}",
                    status.message()
                ))))
            })?;
            let flight = response
                .into_inner()
                .map_err(|s| FlightError::Tonic(Box::new(s)));
            // Batches go on; the data-less last message carries the node's
            // counters.
            let batches = FlightDataDecoder::new(flight).filter_map(move |item| {
                let out = match item {
                    Err(e) => Some(Err(DataFusionError::External(Box::new(e)))),
                    Ok(d) => match d.payload {
                        DecodedPayload::RecordBatch(b) => Some(Ok(b)),
                        DecodedPayload::None => {
                            if let Ok(m) = ScanMetrics::decode(d.inner.app_metadata.as_ref()) {
                                counters.add(&m);
                            }
                            None
                        }
                        DecodedPayload::Schema(_) => None,
                    },
                };
                futures::future::ready(out)
            });
            Ok::<_, DataFusionError>(batches)
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream.boxed(),
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
