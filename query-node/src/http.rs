//! The HTTP API: line-protocol writes, SQL, health and metrics.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{
    DataType as ArrowType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    SchemaRef, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value as Json, json};

use crate::lineproto::{self, Precision};
use crate::sql::Output;
use crate::{Error, QueryContext};

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 32 << 20;
/// Most rows one SQL answer over HTTP may carry.
pub const MAX_RESULT_ROWS: usize = 10_000_000;

pub fn router(ctx: Arc<QueryContext>) -> Router {
    Router::new()
        .route("/api/v1/write", axum::routing::post(write))
        .route("/api/v1/sql", get(sql).post(sql))
        .route("/api/v1/admin/seal", axum::routing::post(admin_seal))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(ctx)
}

fn error_response(e: &Error) -> Response {
    let status = e.http_status();
    if status.is_server_error() {
        tracing::warn!(error = %e, "request failed");
    }
    (
        status,
        axum::Json(json!({ "error": e.to_string(), "sqlstate": e.sqlstate() })),
    )
        .into_response()
}

fn database(params: &HashMap<String, String>) -> String {
    params
        .get("db")
        .filter(|s| !s.is_empty())
        .cloned()
        .unwrap_or_else(|| sealion_common::catalog::DEFAULT_DATABASE.to_string())
}

/// Longest `?batch_id=` of a write (storage nodes hold the same limit).
const MAX_BATCH_ID_BYTES: usize = 128;

async fn write(
    State(ctx): State<Arc<QueryContext>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    metrics::counter!("sealion_http_write_requests_total").increment(1);
    let precision = match Precision::parse(params.get("precision").map_or("ns", |s| s.as_str())) {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    let db = database(&params);
    if let Err(e) = sealion_common::catalog::validate_name("database", &db) {
        return error_response(&e.into());
    }
    let batch_id = params.get("batch_id").map_or("", |s| s.as_str());
    if batch_id.len() > MAX_BATCH_ID_BYTES {
        return error_response(&Error::Invalid(format!(
            "batch_id of {} bytes is over the limit of {MAX_BATCH_ID_BYTES}",
            batch_id.len()
        )));
    }
    match lineproto::write(&ctx.shared, &db, body, precision, batch_id.as_bytes()).await {
        Ok(outcome) if outcome.rejected.is_empty() => StatusCode::NO_CONTENT.into_response(),
        Ok(outcome) => {
            metrics::counter!("sealion_http_lines_rejected_total")
                .increment(outcome.rejected.len() as u64);
            (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({
                    "error": format!("{} line(s) rejected; the other lines were stored", outcome.rejected.len()),
                    "rows_written": outcome.rows_written,
                    "rejected": outcome.rejected,
                })),
            )
                .into_response()
        }
        Err(e) => error_response(&e),
    }
}

async fn sql(
    State(ctx): State<Arc<QueryContext>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    metrics::counter!("sealion_http_sql_requests_total").increment(1);
    let text = match params.get("q") {
        Some(q) => q.clone(),
        None => match std::str::from_utf8(&body) {
            Ok(s) if !s.trim().is_empty() => s.to_string(),
            _ => {
                return error_response(&Error::Invalid(
                    "give the SQL as ?q= or as the request body".into(),
                ));
            }
        },
    };
    let format = params
        .get("format")
        .map_or("json", |s| s.as_str())
        .to_string();
    if !matches!(format.as_str(), "json" | "jsonl" | "csv" | "arrow") {
        return error_response(&Error::Invalid(format!(
            "format {format:?}: use json, jsonl, csv or arrow"
        )));
    }
    let db = database(&params);
    match run_sql(&ctx, &db, &text).await {
        Ok(SqlAnswer::Rows(schema, batches)) => render(&format, &ctx.schemas, schema, &batches),
        Ok(SqlAnswer::Affected(tag, rows)) => (
            StatusCode::OK,
            axum::Json(json!({ "columns": [], "rows": [], "command": tag, "rows_affected": rows })),
        )
            .into_response(),
        Err(e) => error_response(&e),
    }
}

enum SqlAnswer {
    Rows(SchemaRef, Vec<RecordBatch>),
    Affected(String, u64),
}

async fn run_sql(ctx: &QueryContext, db: &str, text: &str) -> crate::Result<SqlAnswer> {
    let statements = ctx.sql.parsed.get_or_parse(text, crate::sql::parse)?;
    if statements.is_empty() {
        return Err(Error::Invalid("no SQL statement given".into()));
    }
    let mut last = SqlAnswer::Affected("EMPTY".into(), 0);
    for stmt in statements.iter() {
        let deadline = ctx.sql.deadline(None);
        last = match ctx.sql.execute(db, stmt).await? {
            Output::Rows(rows) => {
                let schema: SchemaRef = rows.schema();
                let batches = rows.collect_by(deadline).await?;
                let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
                if rows > MAX_RESULT_ROWS {
                    return Err(Error::TooLarge(format!(
                        "answer of {rows} rows is over the limit of {MAX_RESULT_ROWS}; add LIMIT or use the PostgreSQL protocol"
                    )));
                }
                SqlAnswer::Rows(schema, batches)
            }
            Output::Affected { tag, rows } => SqlAnswer::Affected(tag, rows),
        };
    }
    Ok(last)
}

/// The SQL type name of an Arrow type, as Sealion prints it.
pub fn sql_type_name(t: &ArrowType) -> String {
    match t {
        ArrowType::Utf8 | ArrowType::LargeUtf8 | ArrowType::Utf8View => "TEXT".into(),
        ArrowType::Float64 | ArrowType::Float32 => "DOUBLE".into(),
        ArrowType::Int64 | ArrowType::Int32 | ArrowType::Int16 | ArrowType::Int8 => "BIGINT".into(),
        ArrowType::UInt64 | ArrowType::UInt32 | ArrowType::UInt16 | ArrowType::UInt8 => {
            "BIGINT UNSIGNED".into()
        }
        ArrowType::Boolean => "BOOLEAN".into(),
        ArrowType::Timestamp(_, _) => "TIMESTAMP".into(),
        ArrowType::Null => "NULL".into(),
        other => other.to_string(),
    }
}

fn float_json(v: f64) -> Json {
    serde_json::Number::from_f64(v).map_or_else(|| Json::String(v.to_string()), Json::Number)
}

/// One cell as JSON: numbers and booleans as themselves, timestamps as
/// RFC 3339 text, everything else as its display text.
fn cell(array: &dyn Array, formatter: &ArrayFormatter, row: usize) -> Json {
    if array.is_null(row) {
        return Json::Null;
    }
    match array.data_type() {
        ArrowType::Int8 => json!(array.as_primitive::<Int8Type>().value(row)),
        ArrowType::Int16 => json!(array.as_primitive::<Int16Type>().value(row)),
        ArrowType::Int32 => json!(array.as_primitive::<Int32Type>().value(row)),
        ArrowType::Int64 => json!(array.as_primitive::<Int64Type>().value(row)),
        ArrowType::UInt8 => json!(array.as_primitive::<UInt8Type>().value(row)),
        ArrowType::UInt16 => json!(array.as_primitive::<UInt16Type>().value(row)),
        ArrowType::UInt32 => json!(array.as_primitive::<UInt32Type>().value(row)),
        ArrowType::UInt64 => json!(array.as_primitive::<UInt64Type>().value(row)),
        ArrowType::Float32 => float_json(array.as_primitive::<Float32Type>().value(row) as f64),
        ArrowType::Float64 => float_json(array.as_primitive::<Float64Type>().value(row)),
        ArrowType::Boolean => json!(array.as_boolean().value(row)),
        ArrowType::Utf8 => json!(array.as_string::<i32>().value(row)),
        _ => Json::String(formatter.value(row).to_string()),
    }
}

/// Rows of `batches` as the JSON answer gives them.
pub fn json_rows(batches: &[RecordBatch]) -> Result<Vec<Vec<Json>>, Error> {
    let options = FormatOptions::default().with_null("");
    let mut rows = Vec::new();
    for b in batches {
        let formatters = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        for r in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .zip(&formatters)
                    .map(|(c, f)| cell(c.as_ref(), f, r))
                    .collect(),
            );
        }
    }
    Ok(rows)
}

fn render(
    format: &str,
    schemas: &crate::ipc::SchemaMessages,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Response {
    let result: Result<Response, Error> = (|| match format {
        "json" => {
            let columns: Vec<Json> = schema
                .fields()
                .iter()
                .map(|f| json!({ "name": f.name(), "type": sql_type_name(f.data_type()) }))
                .collect();
            Ok(
                axum::Json(json!({ "columns": columns, "rows": json_rows(batches)? }))
                    .into_response(),
            )
        }
        "jsonl" => {
            let names: Vec<&String> = schema.fields().iter().map(|f| f.name()).collect();
            let mut out = String::new();
            for row in json_rows(batches)? {
                let obj: serde_json::Map<String, Json> =
                    names.iter().map(|n| n.to_string()).zip(row).collect();
                out.push_str(&Json::Object(obj).to_string());
                out.push('\n');
            }
            Ok((
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/x-ndjson"),
                )],
                out,
            )
                .into_response())
        }
        "csv" => {
            let mut buf = Vec::new();
            {
                let mut w = arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut buf);
                if batches.is_empty() {
                    w.write(&RecordBatch::new_empty(schema.clone()))?;
                }
                for b in batches {
                    w.write(b)?;
                }
            }
            Ok((
                [(header::CONTENT_TYPE, HeaderValue::from_static("text/csv"))],
                buf,
            )
                .into_response())
        }
        _ => {
            let buf = schemas.stream(&schema, batches)?;
            Ok((
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/vnd.apache.arrow.stream"),
                )],
                buf,
            )
                .into_response())
        }
    })();
    result.unwrap_or_else(|e| error_response(&e))
}

async fn health(State(ctx): State<Arc<QueryContext>>) -> Response {
    let state = ctx.shared.meta.state();
    if state.version == 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "no cluster state from meta yet" })),
        )
            .into_response();
    }
    axum::Json(json!({ "status": "ok", "meta_version": state.version, "storage_nodes": state.nodes.len() }))
        .into_response()
}

async fn metrics_text() -> Response {
    match sealion_common::telemetry::prometheus() {
        Some(handle) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            )],
            handle.render(),
        )
            .into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder not installed",
        )
            .into_response(),
    }
}

/// Seals every partition of `?table=` (in `?db=`) whose end has passed,
/// whatever its idle time, and answers with what each node did.
async fn admin_seal(
    State(ctx): State<Arc<QueryContext>>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let db = database(&params);
    let Some(table_name) = params.get("table").filter(|t| !t.is_empty()) else {
        return error_response(&Error::Invalid("name the table with ?table=".into()));
    };
    let state = ctx.shared.meta.state();
    let Some(table) = sealion_common::catalog::find_table(&state, &db, table_name) else {
        return error_response(&Error::TableNotFound(format!("{db}.{table_name}")));
    };
    let now_ns = sealion_common::time::now_ms().saturating_mul(1_000_000);
    let mut by_node: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for p in state
        .partitions
        .iter()
        .filter(|p| p.table_id == table.id && p.end_ns <= now_ns)
    {
        if let Some(n) = p.replicas.first() {
            by_node.entry(*n).or_default().push(p.id);
        }
    }
    let mut results = Vec::new();
    for (node_id, ids) in by_node {
        let Some(addr) = sealion_common::catalog::node(&state, node_id).map(|n| n.addr.clone())
        else {
            return error_response(&Error::Unavailable(format!(
                "storage node {node_id} is unknown"
            )));
        };
        let reply = match ctx.shared.storage.storage(&addr) {
            Ok(mut c) => c
                .seal(sealion_common::proto::SealRequest {
                    partition_ids: ids,
                    ignore_idle: true,
                    ..Default::default()
                })
                .await
                .map_err(|s| {
                    Error::Unavailable(format!("storage node {node_id} at {addr}: {}", s.message()))
                }),
            Err(e) => Err(e),
        };
        match reply {
            Ok(r) => {
                for x in r.into_inner().results {
                    let p = state.partitions.iter().find(|p| p.id == x.partition_id);
                    results.push(json!({
                        "partition_id": x.partition_id,
                        "node_id": node_id,
                        "start_ns": p.map(|p| p.start_ns),
                        "end_ns": p.map(|p| p.end_ns),
                        "outcome": x.outcome,
                        "rows": x.rows,
                        "bytes": x.bytes,
                    }));
                }
            }
            Err(e) => return error_response(&e),
        }
    }
    axum::Json(json!({ "database": db, "table": table_name, "partitions": results }))
        .into_response()
}
