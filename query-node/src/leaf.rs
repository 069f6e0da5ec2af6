//! What Sealion's own plan nodes share: the leaf logical nodes that stand
//! for pushed-down scans, and the single-child, single-partition execs.

/// Implements `Debug`, equality, hashing, ordering and
/// `UserDefinedLogicalNodeCore` for a leaf logical node whose identity is
/// its `table_id`, `filters`, `text` (what EXPLAIN prints) and `schema`.
macro_rules! leaf_scan_node {
    ($ty:ident) => {
        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}({})", stringify!($ty), self.text)
            }
        }

        impl PartialEq for $ty {
            fn eq(&self, other: &Self) -> bool {
                self.table_id == other.table_id
                    && self.filters == other.filters
                    && self.text == other.text
                    && self.schema == other.schema
            }
        }

        impl Eq for $ty {}

        impl ::std::hash::Hash for $ty {
            fn hash<H: ::std::hash::Hasher>(&self, state: &mut H) {
                ::std::hash::Hash::hash(&self.table_id, state);
                ::std::hash::Hash::hash(&self.filters, state);
                ::std::hash::Hash::hash(&self.text, state);
            }
        }

        impl PartialOrd for $ty {
            fn partial_cmp(&self, other: &Self) -> Option<::std::cmp::Ordering> {
                (self.table_id, &self.text).partial_cmp(&(other.table_id, &other.text))
            }
        }

        impl ::datafusion::logical_expr::UserDefinedLogicalNodeCore for $ty {
            fn name(&self) -> &str {
                stringify!($ty)
            }

            fn inputs(&self) -> Vec<&::datafusion::logical_expr::LogicalPlan> {
                vec![]
            }

            fn schema(&self) -> &::datafusion::common::DFSchemaRef {
                &self.schema
            }

            fn expressions(&self) -> Vec<::datafusion::logical_expr::Expr> {
                vec![]
            }

            fn fmt_for_explain(&self, f: &mut ::std::fmt::Formatter) -> ::std::fmt::Result {
                write!(f, "{}: {}", stringify!($ty), self.text)
            }

            fn with_exprs_and_inputs(
                &self,
                _exprs: Vec<::datafusion::logical_expr::Expr>,
                _inputs: Vec<::datafusion::logical_expr::LogicalPlan>,
            ) -> ::datafusion::error::Result<Self> {
                Ok(self.clone())
            }
        }
    };
}

pub(crate) use leaf_scan_node;

/// The one child of a single-child exec named `name`.
pub(crate) fn only_child(
    children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
    name: &str,
) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    let [child] = <[_; 1]>::try_from(children).map_err(|_| {
        datafusion::error::DataFusionError::Internal(format!("{name} has one child"))
    })?;
    Ok(child)
}

/// Fails unless `partition` is 0: exec `name` has one output partition.
pub(crate) fn only_partition(partition: usize, name: &str) -> datafusion::error::Result<()> {
    if partition != 0 {
        return Err(datafusion::error::DataFusionError::Internal(format!(
            "{name} has one partition, not {partition}"
        )));
    }
    Ok(())
}
