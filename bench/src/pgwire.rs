//! Row encoding for the PostgreSQL wire protocol: Sealion's column-at-a-time
//! encoder (`sealion_query::pg::encode_batch`) against arrow-pg's
//! value-by-value `encode_recordbatch`, which datafusion-postgres uses, on
//! the same TSBS cpu-only batches in the same run, one thread. No network
//! and no client: only the work of turning Arrow batches into `DataRow`
//! messages, which a query node does for every row a pgwire client fetches.
//!
//! Two answer shapes: `time, usage_user` (one host's rows over all history)
//! and every column (`SELECT *`: the time, ten tags, ten fields), each in
//! text (psql, psycopg) and binary (tokio-postgres, JDBC's binary
//! transfer). Both encoders must write the same bytes for every row before
//! either is timed. Runs alternate between the two; prints min / median /
//! max nanoseconds per row and the ratio of the medians.
//!
//!   cargo run --release -p sealion-bench --bin pgwire-bench -- --rows 100000 --runs 7

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use arrow::array::RecordBatch;
use clap::Parser;
use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use datafusion_postgres::pgwire::api::portal::Format;
use datafusion_postgres::pgwire::api::results::FieldInfo;
use datafusion_postgres::pgwire::error::PgWireResult;
use datafusion_postgres::pgwire::messages::data::DataRow;
use datafusion_postgres::pgwire::types::format::FormatOptions;
use sealion_bench::tsbs::{generate, median};
use sealion_query::pg::encode_batch;

#[derive(Parser, Debug)]
#[command(about = "pgwire row encoding: Sealion's encoder against arrow-pg's, same batches")]
struct Args {
    /// Rows per answer (hosts x readings; batches of 8,192 as DataFusion
    /// streams them).
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Timed runs per encoder, shape and format, after one warm-up each.
    #[arg(long, default_value_t = 7)]
    runs: usize,
}

/// Every row's bytes.
fn bytes(rows: impl IntoIterator<Item = PgWireResult<DataRow>>) -> anyhow::Result<Vec<Vec<u8>>> {
    rows.into_iter()
        .map(|r| r.map(|r| r.data.to_vec()).context("a row failed"))
        .collect()
}

/// Encodes every batch with `encode`, keeping each row's length (so
/// nothing is optimized away); returns the seconds taken.
fn run<I: IntoIterator<Item = PgWireResult<DataRow>>>(
    batches: &[RecordBatch],
    fields: &Arc<Vec<FieldInfo>>,
    encode: impl Fn(&Arc<Vec<FieldInfo>>, &RecordBatch) -> I,
) -> anyhow::Result<(f64, usize)> {
    let t = Instant::now();
    let mut total = 0usize;
    for b in batches {
        for row in encode(fields, b) {
            total += row?.data.len();
        }
    }
    Ok((t.elapsed().as_secs_f64(), total))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.runs == 0 || args.rows == 0 {
        bail!("--rows and --runs must be at least 1");
    }
    let hosts = 10;
    let batches = generate(hosts, args.rows.div_ceil(hosts), 8_192);
    let all = batches[0].schema();
    let time_and_one = all
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.name() == "time" || f.name() == "usage_user")
        .map(|(i, _)| i)
        .collect::<Vec<_>>();
    let shapes: Vec<(&str, Vec<RecordBatch>)> = vec![
        (
            "time, usage_user",
            batches
                .iter()
                .map(|b| b.project(&time_and_one))
                .collect::<Result<_, _>>()?,
        ),
        ("every column (21)", batches.clone()),
    ];
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    println!("# pgwire row encoding: Sealion's encoder against arrow-pg's\n");
    println!(
        "{rows} TSBS cpu-only rows ({hosts} hosts) in batches of 8,192; {} timed runs per cell after one warm-up, alternating; one thread.\n",
        args.runs
    );
    println!("| answer | format | arrow-pg ns/row | Sealion ns/row | Sealion / arrow-pg |");
    println!("|---|---|---|---|---|");
    for (name, batches) in &shapes {
        for (format_name, format) in [
            ("text", Format::UnifiedText),
            ("binary", Format::UnifiedBinary),
        ] {
            let fields = Arc::new(arrow_schema_to_pg_fields(
                &batches[0].schema(),
                &format,
                Some(Arc::new(FormatOptions::default())),
            )?);
            // Parity before timing.
            for b in batches {
                let theirs = bytes(encode_recordbatch(fields.clone(), b.clone()))?;
                let ours = bytes(encode_batch(&fields, b))?;
                if ours != theirs {
                    bail!("{name} ({format_name}): the encoders disagree");
                }
            }
            let theirs =
                |f: &Arc<Vec<FieldInfo>>, b: &RecordBatch| encode_recordbatch(f.clone(), b.clone());
            let ours = |f: &Arc<Vec<FieldInfo>>, b: &RecordBatch| encode_batch(f, b);
            run(batches, &fields, theirs)?;
            run(batches, &fields, ours)?;
            let (mut t_theirs, mut t_ours) = (Vec::new(), Vec::new());
            for _ in 0..args.runs {
                t_theirs.push(run(batches, &fields, theirs)?.0 * 1e9 / rows as f64);
                t_ours.push(run(batches, &fields, ours)?.0 * 1e9 / rows as f64);
            }
            let (a0, a, a1) = median(t_theirs);
            let (b0, b, b1) = median(t_ours);
            println!(
                "| {name} | {format_name} | {a:.0} ({a0:.0}-{a1:.0}) | {b:.0} ({b0:.0}-{b1:.0}) | {:.2} |",
                b / a
            );
        }
    }
    Ok(())
}
