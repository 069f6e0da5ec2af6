//! Read-path benchmark: a sealed day of TSBS cpu-only data (100 hosts, 10 s)
//! answered by the storage node's read paths, against DataFusion over a zstd
//! Parquet file of the same rows in the same run, one thread each (or
//! `--threads N` each: the storage node's split scan, DataFusion's target
//! partitions).
//!
//! Queries (each checked for parity before it is timed):
//! - `max(usage_user)` per host per minute over the day;
//! - the last point of every host;
//! - one host's rows over the day;
//! - `count(*)` of the rows where `usage_user + usage_system` passes a
//!   threshold: a full scan of two columns that nothing can prune (one
//!   threshold keeps about a fifth of the rows, the other none).
//!
//! Prints a markdown report: min / median / max of `--runs` runs after one
//! warm-up, rows covered per second, and what the node's counters say it
//! decoded and returned.
//!
//!   cargo run --release -p sealion-bench --bin read-bench -- --hosts 100 --runs 5 [--threads 2]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, bail};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, TimestampNanosecondType};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use sealion_bench::tsbs::{columns, generate, median, parquet_file, sorted_by_host};
use sealion_common::proto::{
    AggregateCall, AggregateFunction, AggregateSpec, ArithOp, CompareOp, FieldArith,
    FieldPredicate, FieldValue, FieldValueCompare, Literal, ScanMetrics, ScanRequest, TagOp,
    TagPredicate, field_predicate, field_value, literal,
};
use sealion_format::rows::{decode_key, encode_batch};
use sealion_format::scan::states::{StateColumn, final_array};
use sealion_format::scan::{Metrics, Output, Query};
use sealion_format::sealed::{SealedFile, SortedRow, write_sealed};
use sealion_partial::{AggregateKind, Finalize, GroupStates, Value, ValueType};
use sealion_storage::engine::read_shared_out;

const MINUTE_NS: i64 = 60_000_000_000;

/// Runs `req` on the sealed file; returns the batches and the node's
/// counters. On `threads` > 1, a query whose answer may be gathered in parts
/// (rows without a limit, aggregates) is shared out over that many threads
/// by the storage node's own code (`engine::read_shared_out`: runs of
/// contiguous row groups, at least two a thread, each thread collecting
/// its own answer).
fn node_scan(
    file: &Arc<SealedFile>,
    threads: usize,
    req: &ScanRequest,
) -> anyhow::Result<(Vec<RecordBatch>, ScanMetrics)> {
    let q = Query::compile(req)?;
    let batches = Mutex::new(Vec::new());
    let send = |b: RecordBatch| batches.lock().map(|mut v| v.push(b)).is_ok();
    let mut sink = |b: RecordBatch| send(b);
    let mut out = Output::new(&q, &mut sink);
    let parts = if threads > 1 && q.splits() {
        let files = vec![(file.clone(), file.groups_to_read(&q)?)];
        read_shared_out(&mut out, &files, threads, &send, &|| false)?
    } else {
        file.run(&mut out)?;
        ScanMetrics::default()
    };
    let mut m = out.finish()?;
    Metrics::add_proto(&mut m, &parts);
    let batches = batches
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a scan thread panicked"))?;
    Ok((batches, m))
}

fn bytes_of(batches: &[RecordBatch]) -> usize {
    batches
        .iter()
        .map(|b| sealion_format::batch_bytes(b) as usize)
        .sum()
}

fn time_runs<T>(
    runs: usize,
    mut f: impl FnMut() -> anyhow::Result<T>,
) -> anyhow::Result<(f64, f64, f64)> {
    let mut secs = Vec::new();
    for run in 0..=runs {
        let t = Instant::now();
        let v = f()?;
        let s = t.elapsed().as_secs_f64();
        drop(v);
        if run > 0 {
            secs.push(s);
        }
    }
    Ok(median(secs))
}

fn base_request(cols: &[sealion_common::proto::Column]) -> ScanRequest {
    ScanRequest {
        table_id: 1,
        partition_ids: vec![1],
        start_ns: i64::MIN,
        end_ns: i64::MAX,
        projection: cols.to_vec(),
        table_columns: cols.to_vec(),
        ..Default::default()
    }
}

/// The max states of an aggregate answer's last column, in whichever form
/// the node sent them (bytes, or the answers themselves).
fn max_states(b: &RecordBatch) -> anyhow::Result<StateColumn<'_>> {
    Ok(StateColumn::new(
        b.column(b.num_columns() - 1).as_ref(),
        AggregateKind::Max,
        ValueType::F64,
    )?)
}

/// (host, minute) → max from the node's partial states, finalized.
fn node_max_per_minute(batches: &[RecordBatch]) -> anyhow::Result<BTreeMap<(String, i64), f64>> {
    let mut out = BTreeMap::new();
    for b in batches {
        let bucket = b.column(0).as_primitive::<TimestampNanosecondType>();
        let host = b.column(1).as_string::<i32>();
        let states = max_states(b)?;
        for i in 0..b.num_rows() {
            let s = states.state(i)?;
            let Some(Value::F64(v)) = s.finalize(Finalize::Natural)? else {
                bail!("max state without a value");
            };
            // A group two parts of a split scan read comes back from each.
            out.entry((host.value(i).to_string(), bucket.value(i)))
                .and_modify(|m: &mut f64| *m = m.max(v))
                .or_insert(v);
        }
    }
    Ok(out)
}

/// Every max state of an aggregate answer taken into a query node's column
/// of states, one group per row (as its merger takes a new group), then
/// finalized.
fn finalize_all(batches: &[RecordBatch]) -> anyhow::Result<ArrayRef> {
    let rows = batches.iter().map(RecordBatch::num_rows).sum();
    let mut merged = GroupStates::new(AggregateKind::Max, ValueType::F64)?;
    merged.reserve(rows);
    for b in batches {
        let states = max_states(b)?;
        for i in 0..b.num_rows() {
            let g = merged.len();
            merged.push_empty();
            states.merge_into(i, &mut merged, g)?;
        }
    }
    Ok(final_array(&merged, 0..rows, Finalize::Natural)?)
}

fn df_max_per_minute(batches: &[RecordBatch]) -> BTreeMap<(String, i64), f64> {
    let mut out = BTreeMap::new();
    for b in batches {
        let host = b
            .column(0)
            .as_string_view_opt()
            .map(|a| {
                (0..a.len())
                    .map(|i| a.value(i).to_string())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_else(|| {
                let a = b.column(0).as_string::<i32>();
                (0..a.len()).map(|i| a.value(i).to_string()).collect()
            });
        let minute = b.column(1).as_primitive::<TimestampNanosecondType>();
        let max = b.column(2).as_primitive::<Float64Type>();
        for (i, h) in host.into_iter().enumerate() {
            out.insert((h, minute.value(i)), max.value(i));
        }
    }
    out
}

fn main() -> anyhow::Result<()> {
    let mut hosts = 100usize;
    let mut runs = 5usize;
    let mut rows_per_host = 8_640usize;
    // For profiling: run only the node's aggregate this many times.
    let mut repeat_aggregate = 0usize;
    // For profiling: run only the node's full scan (threshold 150, which reads
    // every page) this many times.
    let mut repeat_full_scan = 0usize;
    let mut threads = 1usize;
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--hosts" => hosts = v.parse().context("--hosts")?,
            "--runs" => runs = v.parse().context("--runs")?,
            "--rows-per-host" => rows_per_host = v.parse().context("--rows-per-host")?,
            "--repeat-aggregate" => repeat_aggregate = v.parse().context("--repeat-aggregate")?,
            "--repeat-full-scan" => repeat_full_scan = v.parse().context("--repeat-full-scan")?,
            "--threads" => threads = v.parse().context("--threads")?,
            other => bail!(
                "unknown argument {other}; use --hosts N --runs N --rows-per-host N --threads N"
            ),
        }
        i += 2;
    }
    if runs == 0 || hosts < 43 || rows_per_host == 0 || !(1..=64).contains(&threads) {
        bail!(
            "--runs and --rows-per-host must be positive, --threads 1 to 64 and --hosts at least 43 (host_42 is queried)"
        );
    }
    let rows = hosts * rows_per_host;
    let cols = columns();
    let batches = generate(hosts, rows_per_host, 50_000);

    // The sealed file, as the engine writes it: rows in key order.
    let mut kv = Vec::with_capacity(rows);
    for b in &batches {
        kv.extend(encode_batch(1, &cols, b)?);
    }
    kv.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let sorted_rows = kv.into_iter().map(|(k, v)| {
        let (_, series, time_ns) =
            decode_key(&k).ok_or_else(|| sealion_format::Error::Internal("bad key".into()))?;
        Ok(SortedRow {
            series: series.to_vec(),
            time_ns,
            value: v,
        })
    });
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("day.slf");
    write_sealed(&path, 1, &cols, sorted_rows)?;
    let file = Arc::new(SealedFile::open(&path)?);
    let sealed_bytes = std::fs::metadata(&path)?.len();

    // The Parquet file of the same rows.
    let pq_path = dir.path().join("day.parquet");
    std::fs::write(&pq_path, parquet_file(&sorted_by_host(&batches, hosts)?)?)?;
    drop(batches);
    let pq_bytes = std::fs::metadata(&pq_path)?.len();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(threads));
    rt.block_on(ctx.register_parquet(
        "cpu",
        pq_path.to_str().context("path")?,
        ParquetReadOptions::default(),
    ))?;
    let df_sql = |sql: &str| -> anyhow::Result<Vec<RecordBatch>> {
        Ok(rt.block_on(async { ctx.sql(sql).await?.collect().await })?)
    };

    let mut report = Vec::new();

    // 1. max(usage_user) per host per minute.
    let mut agg = base_request(&cols);
    agg.projection = vec![];
    agg.aggregate = Some(AggregateSpec {
        bucket_width_ns: MINUTE_NS,
        bucket_origin_ns: 0,
        group_tags: vec!["hostname".into()],
        calls: vec![AggregateCall {
            function: AggregateFunction::AggMax as i32,
            column: "usage_user".into(),
        }],
        // As a query node asks: max states come back as the maxima.
        states_as_answers: true,
    });
    if repeat_aggregate > 0 && repeat_full_scan == 0 {
        for _ in 0..repeat_aggregate {
            finalize_all(&node_scan(&file, threads, &agg)?.0)?;
        }
        return Ok(());
    }
    let max_sql = "SELECT hostname, date_bin(INTERVAL '1 minute', time, TIMESTAMP '1970-01-01T00:00:00Z') AS minute, max(usage_user) FROM cpu GROUP BY 1, 2";
    let (node_batches, agg_metrics) = node_scan(&file, threads, &agg)?;
    let node_answer = node_max_per_minute(&node_batches)?;
    let df_answer = df_max_per_minute(&df_sql(max_sql)?);
    if node_answer != df_answer {
        bail!(
            "parity: max per host per minute differs ({} vs {} groups)",
            node_answer.len(),
            df_answer.len()
        );
    }
    // Timed: the node's scan plus what a query node does with its answer
    // (decode and finalize each state); DataFusion's answer is its batches.
    let node_t = time_runs(runs, || finalize_all(&node_scan(&file, threads, &agg)?.0))?;
    let df_t = time_runs(runs, || df_sql(max_sql))?;
    report.push((
        "max(usage_user) per host per minute, whole day".to_string(),
        node_t,
        df_t,
        agg_metrics,
        bytes_of(&node_batches),
        node_answer.len(),
    ));

    // 2. The last point of every host.
    let mut last = base_request(&cols);
    last.last_per_series = true;
    let last_sql = "SELECT DISTINCT ON (hostname) * FROM cpu ORDER BY hostname, time DESC";
    let (last_batches, last_metrics) = node_scan(&file, threads, &last)?;
    let node_rows: usize = last_batches.iter().map(RecordBatch::num_rows).sum();
    let df_rows: usize = df_sql(last_sql)?.iter().map(RecordBatch::num_rows).sum();
    if node_rows != hosts || df_rows != hosts {
        bail!(
            "parity: last point returned {node_rows} rows (node) and {df_rows} (DataFusion), want {hosts}"
        );
    }
    if last_metrics.pages_decoded != 0 {
        bail!("last point decoded {} pages", last_metrics.pages_decoded);
    }
    let node_t = time_runs(runs, || node_scan(&file, threads, &last))?;
    let df_t = time_runs(runs, || df_sql(last_sql))?;
    report.push((
        "last point of every host".to_string(),
        node_t,
        df_t,
        last_metrics,
        bytes_of(&last_batches),
        node_rows,
    ));

    // 3. One host's rows over the day.
    let mut one = base_request(&cols);
    one.tag_predicates = vec![TagPredicate {
        column: "hostname".into(),
        op: TagOp::TagEq as i32,
        values: vec!["host_42".into()],
    }];
    let one_sql = "SELECT * FROM cpu WHERE hostname = 'host_42'";
    let (one_batches, one_metrics) = node_scan(&file, threads, &one)?;
    let node_rows: usize = one_batches.iter().map(RecordBatch::num_rows).sum();
    let df_rows: usize = df_sql(one_sql)?.iter().map(RecordBatch::num_rows).sum();
    if node_rows != rows_per_host || df_rows != rows_per_host {
        bail!(
            "parity: one host returned {node_rows} rows (node) and {df_rows} (DataFusion), want {rows_per_host}"
        );
    }
    let node_t = time_runs(runs, || node_scan(&file, threads, &one))?;
    let df_t = time_runs(runs, || df_sql(one_sql))?;
    report.push((
        "one host's rows over the day".to_string(),
        node_t,
        df_t,
        one_metrics,
        bytes_of(&one_batches),
        node_rows,
    ));

    // 4. Full scans: count(*) over an expression of two fields.
    for threshold in [150.0, 250.0] {
        let column = |name: &str| FieldValue {
            value: Some(field_value::Value::Column(name.into())),
        };
        let mut scan = base_request(&cols);
        scan.projection = vec![];
        scan.field_predicate = Some(FieldPredicate {
            expr: Some(field_predicate::Expr::CompareValues(FieldValueCompare {
                left: Some(FieldValue {
                    value: Some(field_value::Value::Arith(Box::new(FieldArith {
                        op: ArithOp::ArithAdd as i32,
                        left: Some(Box::new(column("usage_user"))),
                        right: Some(Box::new(column("usage_system"))),
                    }))),
                }),
                op: CompareOp::CmpGt as i32,
                right: Some(FieldValue {
                    value: Some(field_value::Value::Literal(Literal {
                        value: Some(literal::Value::F64(threshold)),
                    })),
                }),
            })),
        });
        scan.aggregate = Some(AggregateSpec {
            calls: vec![AggregateCall {
                function: AggregateFunction::AggCount as i32,
                column: String::new(),
            }],
            states_as_answers: true,
            ..Default::default()
        });
        let sql =
            format!("SELECT count(*) FROM cpu WHERE usage_user + usage_system > {threshold:.1}");
        let count_of = |batches: &[RecordBatch]| -> anyhow::Result<i64> {
            let mut n = 0;
            for b in batches {
                let c = b.column(b.num_columns() - 1);
                let c = c
                    .as_primitive_opt::<arrow::datatypes::Int64Type>()
                    .context("count answer is not Int64")?;
                n += c.iter().flatten().sum::<i64>();
            }
            Ok(n)
        };
        if repeat_full_scan > 0 {
            // The threshold-250 scan is proved empty by page statistics.
            if threshold < 200.0 {
                for _ in 0..repeat_full_scan {
                    node_scan(&file, threads, &scan)?;
                }
                return Ok(());
            }
            continue;
        }
        let (scan_batches, scan_metrics) = node_scan(&file, threads, &scan)?;
        let node_count = count_of(&scan_batches)?;
        let df_count = count_of(&df_sql(&sql)?)?;
        if node_count != df_count {
            bail!("parity: {sql}: node counted {node_count}, DataFusion {df_count}");
        }
        let node_t = time_runs(runs, || node_scan(&file, threads, &scan))?;
        let df_t = time_runs(runs, || df_sql(&sql))?;
        report.push((
            format!(
                "count(*) where usage_user + usage_system > {threshold} ({}; count {node_count})",
                if threshold < 200.0 {
                    "full scan"
                } else {
                    "bounded by page statistics for Sealion"
                }
            ),
            node_t,
            df_t,
            scan_metrics,
            bytes_of(&scan_batches),
            scan_batches.iter().map(RecordBatch::num_rows).sum(),
        ));
    }

    println!("# Sealion read-path benchmark\n");
    println!(
        "- date: {}",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    println!(
        "- build: {}",
        if cfg!(debug_assertions) {
            "debug (timings are not claims)"
        } else {
            "release"
        }
    );
    println!(
        "- data: TSBS cpu-only shape, {hosts} hosts x {rows_per_host} rows (10 s), one sealed partition of {rows} rows ({sealed_bytes} bytes); the same rows as zstd Parquet sorted by host and time ({pq_bytes} bytes)"
    );
    println!(
        "- Sealion: the storage node's read paths (`SealedFile::run`; on more than one thread the storage node's `read_shared_out`) on {threads} thread(s), partial states finalized as a query node would; DataFusion {}: `SessionContext` with {threads} target partition(s) over the Parquet file",
        datafusion::DATAFUSION_VERSION
    );
    println!(
        "- runs: {runs} after one warm-up; seconds min / median / max; parity of every answer checked before timing\n"
    );
    println!(
        "| query | Sealion s (min / med / max) | DataFusion s (min / med / max) | DataFusion / Sealion (median) | Sealion partition rows per s | row groups skipped / total | pages decoded | pages from statistics | rows returned | bytes returned |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, n, d, m, bytes, returned) in &report {
        println!(
            "| {name} | {:.4} / {:.4} / {:.4} | {:.4} / {:.4} / {:.4} | {:.2}x | {:.0} | {} / {} | {} | {} | {returned} | {bytes} |",
            n.0,
            n.1,
            n.2,
            d.0,
            d.1,
            d.2,
            d.1 / n.1,
            rows as f64 / n.1,
            m.row_groups_skipped,
            m.row_groups_total,
            m.pages_decoded,
            m.pages_from_stats
        );
    }
    Ok(())
}
