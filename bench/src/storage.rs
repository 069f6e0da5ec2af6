//! Storage-engine benchmark: one day of TSBS cpu-only shaped data (10 tags,
//! 10 integer-valued `usage_*` fields, 10 s interval), written to a storage
//! engine, sealed, and compared with a zstd Parquet file of the same rows
//! written by arrow's Parquet writer in the same run.
//!
//! Prints a markdown report: bytes per value on disk, seal throughput (rows
//! per CPU-second and per wall-second), decode throughput per encoding,
//! peak memory. Timings are the median of `--runs` runs after a warm-up.
//!
//!   cargo run --release -p sealion-bench --bin storage-bench -- --hosts 100 --runs 5

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use arrow::array::{ArrayRef, Float64Array, StringArray, TimestampNanosecondArray};
use arrow::record_batch::RecordBatch;
use sealion_common::catalog::arrow_schema;
use sealion_common::proto::{Column, ColumnKind, DataType, ScanRequest};
use sealion_format::columnar::{
    ColumnValues, Compression, EncodeOptions, Encoding, Page, decode_page, encode_page,
};
use sealion_storage::engine::Engine;

const TAGS: [&str; 10] = [
    "hostname",
    "region",
    "datacenter",
    "rack",
    "os",
    "arch",
    "team",
    "service",
    "service_version",
    "service_environment",
];
const FIELDS: [&str; 10] = [
    "usage_user",
    "usage_system",
    "usage_idle",
    "usage_nice",
    "usage_iowait",
    "usage_irq",
    "usage_softirq",
    "usage_steal",
    "usage_guest",
    "usage_guest_nice",
];
const DAY0_NS: i64 = 1_704_067_200_000_000_000;
const STEP_NS: i64 = 10_000_000_000;

/// xorshift64*: deterministic, so every run and every system sees the same rows.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn columns() -> Vec<Column> {
    let mut c = vec![Column {
        name: "time".into(),
        kind: ColumnKind::Time as i32,
        data_type: DataType::Timestamp as i32,
    }];
    c.extend(TAGS.iter().map(|t| Column {
        name: (*t).into(),
        kind: ColumnKind::Tag as i32,
        data_type: DataType::String as i32,
    }));
    c.extend(FIELDS.iter().map(|f| Column {
        name: (*f).into(),
        kind: ColumnKind::Field as i32,
        data_type: DataType::Float64 as i32,
    }));
    c
}

fn host_tags(h: usize) -> Vec<String> {
    let regions = [
        "us-east-1",
        "us-west-1",
        "us-west-2",
        "eu-west-1",
        "eu-central-1",
        "ap-southeast-1",
        "ap-northeast-1",
        "sa-east-1",
    ];
    let r = regions[h % regions.len()];
    vec![
        format!("host_{h}"),
        r.to_string(),
        format!("{r}{}", ["a", "b", "c"][h % 3]),
        format!("{}", (h * 7) % 100),
        ["Ubuntu16.10", "Ubuntu16.04LTS", "Ubuntu15.10"][h % 3].to_string(),
        ["x64", "x86"][h % 2].to_string(),
        ["SF", "NYC", "LON", "CHI"][h % 4].to_string(),
        format!("{}", (h * 3) % 20),
        format!("{}", h % 2),
        ["production", "staging", "test"][h % 3].to_string(),
    ]
}

/// One day of rows for `hosts` hosts, as batches of at most `chunk` rows,
/// time-major like an agent fleet reporting.
fn generate(hosts: usize, rows_per_host: usize, chunk: usize) -> Vec<RecordBatch> {
    let schema = arrow_schema(&columns());
    let tags: Vec<Vec<String>> = (0..hosts).map(host_tags).collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut walk: Vec<[i64; 10]> = (0..hosts)
        .map(|_| std::array::from_fn(|_| rng.below(101) as i64))
        .collect();
    let total = hosts * rows_per_host;
    let mut batches = Vec::new();
    let mut start = 0;
    while start < total {
        let end = (start + chunk).min(total);
        let mut time = Vec::with_capacity(end - start);
        let mut tag_cols: Vec<Vec<&str>> = vec![Vec::with_capacity(end - start); 10];
        let mut field_cols: Vec<Vec<f64>> = vec![Vec::with_capacity(end - start); 10];
        for i in start..end {
            let (k, h) = (i / hosts, i % hosts);
            time.push(DAY0_NS + k as i64 * STEP_NS);
            for (t, col) in tag_cols.iter_mut().enumerate() {
                col.push(&tags[h][t]);
            }
            for (f, col) in field_cols.iter_mut().enumerate() {
                let step = rng.below(11) as i64 - 5;
                walk[h][f] = (walk[h][f] + step).clamp(0, 100);
                col.push(walk[h][f] as f64);
            }
        }
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(
            TimestampNanosecondArray::from(time).with_timezone("UTC"),
        )];
        arrays.extend(
            tag_cols
                .into_iter()
                .map(|c| Arc::new(StringArray::from(c)) as ArrayRef),
        );
        arrays.extend(
            field_cols
                .into_iter()
                .map(|c| Arc::new(Float64Array::from(c)) as ArrayRef),
        );
        batches.push(
            RecordBatch::try_new(schema.clone(), arrays)
                .expect("generated batch matches its schema"),
        );
        start = end;
    }
    batches
}

/// User plus system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn parquet_bytes(batches: &[RecordBatch], hosts: usize) -> anyhow::Result<u64> {
    use parquet::arrow::ArrowWriter;
    use parquet::basic::{Compression as PqCompression, ZstdLevel};
    use parquet::file::properties::WriterProperties;
    // Sorted by (host, time), as a time-series Parquet writer would lay it out.
    let all = arrow::compute::concat_batches(&batches[0].schema(), batches)?;
    let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
    order.sort_by_key(|&i| ((i as usize) % hosts, i));
    let sorted = arrow::compute::take_record_batch(&all, &arrow::array::UInt32Array::from(order))?;
    let props = WriterProperties::builder()
        .set_compression(PqCompression::ZSTD(ZstdLevel::try_new(3)?))
        .set_max_row_group_row_count(Some(1 << 20))
        .build();
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, sorted.schema(), Some(props))?;
    w.write(&sorted)?;
    w.close()?;
    Ok(buf.len() as u64)
}

fn decode_rate(
    name: &str,
    page: &Page,
    encoding: Encoding,
    runs: usize,
) -> anyhow::Result<(String, String, f64)> {
    let bytes = encode_page(
        page,
        &EncodeOptions {
            compression: Compression::None,
            encoding: Some(encoding),
        },
    )
    .with_context(|| format!("encoding {name}"))?;
    let n = page.values.len() as f64;
    let mut rates = Vec::new();
    for _ in 0..runs + 1 {
        let start = Instant::now();
        let mut decoded = 0usize;
        while start.elapsed().as_millis() < 300 {
            for _ in 0..100 {
                let p = decode_page(&bytes)?;
                decoded += p.values.len();
            }
        }
        rates.push(decoded as f64 / start.elapsed().as_secs_f64());
    }
    rates.remove(0); // warm-up
    let (_, med, _) = median(rates);
    Ok((
        name.to_string(),
        format!("{:.3}", bytes.len() as f64 / n),
        med,
    ))
}

fn main() -> anyhow::Result<()> {
    let mut hosts = 100usize;
    let mut runs = 5usize;
    let mut rows_per_host = 8_640usize;
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--hosts" => hosts = v.parse().context("--hosts")?,
            "--runs" => runs = v.parse().context("--runs")?,
            "--rows-per-host" => rows_per_host = v.parse().context("--rows-per-host")?,
            other => bail!("unknown argument {other}; use --hosts N --runs N --rows-per-host N"),
        }
        i += 2;
    }
    if runs == 0 || hosts == 0 || rows_per_host == 0 {
        bail!("--hosts, --runs and --rows-per-host must be positive");
    }
    let rows = hosts * rows_per_host;
    let values = (rows * FIELDS.len()) as f64;
    let batches = generate(hosts, rows_per_host, 50_000);
    let cols = columns();

    // Seal: the same partition written and sealed `runs + 1` times.
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    let mut file_bytes = 0u64;
    let mut check_rows = 0u64;
    for run in 0..=runs {
        let dir = tempfile::tempdir()?;
        let engine = Engine::open(dir.path())?;
        for b in &batches {
            engine.write(&cols, &[(1, vec![b.clone()])])?;
        }
        let (c0, t0) = (cpu_seconds(), Instant::now());
        let outcome = engine.seal(1, &cols)?;
        let (c1, t1) = (cpu_seconds(), t0.elapsed().as_secs_f64());
        if run > 0 {
            wall.push(rows as f64 / t1);
            cpu.push(rows as f64 / (c1 - c0).max(0.01));
        }
        if let sealion_storage::engine::SealOutcome::Sealed { bytes, .. } = outcome {
            file_bytes = bytes;
        }
        // Parity: the sealed partition returns every row.
        let mut n = 0u64;
        engine.scan(
            &ScanRequest {
                table_id: 1,
                partition_ids: vec![1],
                start_ns: i64::MIN,
                end_ns: i64::MAX,
                projection: vec![],
                table_columns: cols.clone(),
                limit: 0,
                ..Default::default()
            },
            |b| {
                n += b.num_rows() as u64;
                true
            },
        )?;
        check_rows = n;
    }
    if check_rows != rows as u64 {
        bail!("parity check failed: sealed partition returned {check_rows} rows, wrote {rows}");
    }
    let pq = parquet_bytes(&batches, hosts)?;

    // Decode throughput per encoding, on 1,024-value pages.
    let mut rng = Rng(42);
    let ints: Vec<i64> = (0..1024).map(|_| rng.below(101) as i64).collect();
    let times: Vec<i64> = (0..1024).map(|k| DAY0_NS + k * STEP_NS).collect();
    let mut w = 50i64;
    let walk: Vec<f64> = (0..1024)
        .map(|_| {
            w = (w + rng.below(11) as i64 - 5).clamp(0, 100);
            w as f64
        })
        .collect();
    let floats: Vec<f64> = (0..1024).map(|_| rng.below(1 << 52) as f64 / 7.3).collect();
    let text: Vec<String> = (0..1024).map(|k| format!("host_{}", k / 103)).collect();
    let page = |v: ColumnValues| Page {
        values: v,
        nulls: None,
    };
    let rates = vec![
        decode_rate(
            "integers 0-100, frame of reference",
            &page(ColumnValues::Int64(ints)),
            Encoding::FrameOfReference,
            runs,
        )?,
        decode_rate(
            "timestamps 10 s, delta",
            &page(ColumnValues::Timestamp(times.clone())),
            Encoding::Delta,
            runs,
        )?,
        decode_rate(
            "timestamps 10 s, delta of delta",
            &page(ColumnValues::Timestamp(times)),
            Encoding::DeltaOfDelta,
            runs,
        )?,
        decode_rate(
            "integer-valued floats",
            &page(ColumnValues::Float64(walk)),
            Encoding::IntegerFloat,
            runs,
        )?,
        decode_rate(
            "random floats, Gorilla",
            &page(ColumnValues::Float64(floats)),
            Encoding::Gorilla,
            runs,
        )?,
        decode_rate(
            "tag text, dictionary",
            &page(ColumnValues::Text(text)),
            Encoding::Dictionary,
            runs,
        )?,
    ];

    let (wmin, wmed, wmax) = median(wall);
    let (cmin, cmed, cmax) = median(cpu);
    println!("# Sealion storage benchmark\n");
    println!(
        "- date: {}",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    println!(
        "- machine: {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "- data: TSBS cpu-only shape, {hosts} hosts x {rows_per_host} rows (10 s), 10 tags, 10 integer-valued float fields: {rows} rows, {} field values",
        rows * 10
    );
    println!("- runs: {runs} after one warm-up; min / median / max\n");
    println!(
        "| measure | Sealion sealed file | zstd Parquet (arrow writer, same rows, sorted by host, time) |"
    );
    println!("|---|---|---|");
    println!("| bytes on disk | {file_bytes} | {pq} |");
    println!(
        "| bytes per field value (time and tags included) | {:.3} | {:.3} |",
        file_bytes as f64 / values,
        pq as f64 / values
    );
    println!(
        "| bytes per row | {:.2} | {:.2} |\n",
        file_bytes as f64 / rows as f64,
        pq as f64 / rows as f64
    );
    println!("| seal throughput | min | median | max |");
    println!("|---|---|---|---|");
    println!("| rows per CPU-second (all threads' CPU time) | {cmin:.0} | {cmed:.0} | {cmax:.0} |");
    println!("| rows per wall-second | {wmin:.0} | {wmed:.0} | {wmax:.0} |\n");
    println!("| decode, 1,024-value pages, no compression | bytes/value | values/s (median) |");
    println!("|---|---|---|");
    for (name, bpv, rate) in rates {
        println!("| {name} | {bpv} | {:.0}M |", rate / 1e6);
    }
    println!(
        "\npeak resident memory of the whole run (generation, RocksDB writes, seals): {:.0} MiB",
        peak_rss_mib()
    );
    Ok(())
}
