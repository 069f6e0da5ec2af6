//! The one place that sets up logging and metrics for a process.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// Installs the tracing subscriber once; later calls do nothing. The filter
/// comes from `RUST_LOG`, else `default_filter`.
pub fn init_logging(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

static PROMETHEUS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder once and returns its handle
/// for rendering `/metrics`. `None` if another recorder was installed first.
pub fn prometheus() -> Option<PrometheusHandle> {
    PROMETHEUS
        .get_or_init(|| PrometheusBuilder::new().install_recorder().ok())
        .clone()
}
