//! TSBS cpu-only shaped data, generated deterministically, and the small
//! measuring helpers the benchmarks share.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, StringArray, TimestampNanosecondArray};
use arrow::record_batch::RecordBatch;
use sealion_common::catalog::arrow_schema;
use sealion_common::proto::{Column, ColumnKind, DataType};

pub const TAGS: [&str; 10] = [
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
pub const FIELDS: [&str; 10] = [
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
pub const DAY0_NS: i64 = 1_704_067_200_000_000_000;
pub const STEP_NS: i64 = 10_000_000_000;

/// xorshift64*: deterministic, so every run and every system sees the same rows.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn columns() -> Vec<Column> {
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

pub fn host_tags(h: usize) -> Vec<String> {
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
pub fn generate(hosts: usize, rows_per_host: usize, chunk: usize) -> Vec<RecordBatch> {
    generate_hosts(0, hosts, rows_per_host, chunk)
}

/// The rows of hosts `first..first + hosts` only, for data sets generated a
/// slice of hosts at a time. The random stream is seeded by `first`, so
/// `generate_hosts(0, n, ..)` is `generate(n, ..)`.
pub fn generate_hosts(
    first: usize,
    hosts: usize,
    rows_per_host: usize,
    chunk: usize,
) -> Vec<RecordBatch> {
    Batches::new(first, hosts, rows_per_host, chunk).collect()
}

/// The rows of [`generate_hosts`] made a batch at a time, for data sets
/// larger than memory should hold.
pub struct Batches {
    schema: arrow::datatypes::SchemaRef,
    tags: Vec<Vec<String>>,
    rng: Rng,
    walk: Vec<[i64; 10]>,
    hosts: usize,
    chunk: usize,
    next: usize,
    total: usize,
}

impl Batches {
    pub fn new(first: usize, hosts: usize, rows_per_host: usize, chunk: usize) -> Self {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ first as u64);
        let walk = (0..hosts)
            .map(|_| std::array::from_fn(|_| rng.below(101) as i64))
            .collect();
        Batches {
            schema: arrow_schema(&columns()),
            tags: (first..first + hosts).map(host_tags).collect(),
            rng,
            walk,
            hosts,
            chunk: chunk.max(1),
            next: 0,
            total: hosts * rows_per_host,
        }
    }
}

impl Iterator for Batches {
    type Item = RecordBatch;

    fn next(&mut self) -> Option<RecordBatch> {
        let (start, hosts) = (self.next, self.hosts);
        if start >= self.total {
            return None;
        }
        let end = (start + self.chunk).min(self.total);
        self.next = end;
        let mut time = Vec::with_capacity(end - start);
        let mut tag_cols: Vec<Vec<&str>> = vec![Vec::with_capacity(end - start); 10];
        let mut field_cols: Vec<Vec<f64>> = vec![Vec::with_capacity(end - start); 10];
        for i in start..end {
            let (k, h) = (i / hosts, i % hosts);
            time.push(DAY0_NS + k as i64 * STEP_NS);
            for (t, col) in tag_cols.iter_mut().enumerate() {
                col.push(&self.tags[h][t]);
            }
            for (f, col) in field_cols.iter_mut().enumerate() {
                let step = self.rng.below(11) as i64 - 5;
                self.walk[h][f] = (self.walk[h][f] + step).clamp(0, 100);
                col.push(self.walk[h][f] as f64);
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
        Some(
            RecordBatch::try_new(self.schema.clone(), arrays)
                .expect("generated batch matches its schema"),
        )
    }
}

/// User plus system CPU seconds of this process so far.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}

pub fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

pub fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// The rows sorted by (host, time), as a time-series Parquet writer lays
/// them out. `batches` come from [`generate`] (time-major, hosts in turn).
pub fn sorted_by_host(batches: &[RecordBatch], hosts: usize) -> anyhow::Result<RecordBatch> {
    let all = arrow::compute::concat_batches(&batches[0].schema(), batches)?;
    let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
    order.sort_by_key(|&i| ((i as usize) % hosts, i));
    Ok(arrow::compute::take_record_batch(
        &all,
        &arrow::array::UInt32Array::from(order),
    )?)
}

/// A zstd (level 3) Parquet file of `batch`, row groups of up to 1M rows,
/// written by arrow's Parquet writer with its default statistics.
pub fn parquet_file(batch: &RecordBatch) -> anyhow::Result<Vec<u8>> {
    use parquet::arrow::ArrowWriter;
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::WriterProperties;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_max_row_group_row_count(Some(1 << 20))
        .build();
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props))?;
    w.write(batch)?;
    w.close()?;
    Ok(buf)
}
