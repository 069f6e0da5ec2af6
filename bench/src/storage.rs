//! Storage-engine benchmark: one day of TSBS cpu-only shaped data (10 tags,
//! 10 integer-valued `usage_*` fields, 10 s interval), written to a storage
//! engine, sealed, and compared with a zstd Parquet file of the same rows
//! written by arrow's Parquet writer in the same run.
//!
//! Prints a markdown report: bytes per value on disk, seal throughput (rows
//! per CPU-second and per wall-second, timed once the writes' background
//! flushes and compactions are done), decode throughput per encoding,
//! peak memory. Timings are the median of `--runs` runs after a warm-up.
//!
//!   cargo run --release -p sealion-bench --bin storage-bench -- --hosts 100 --runs 5

use std::time::Instant;

use anyhow::{Context, bail};
use arrow::record_batch::RecordBatch;
use sealion_bench::tsbs::{
    DAY0_NS, FIELDS, Rng, STEP_NS, columns, cpu_seconds, generate, median, parquet_file,
    peak_rss_mib, sorted_by_host,
};
use sealion_common::proto::{ColumnKind, ScanRequest};
use sealion_format::columnar::{
    ColumnValues, Compression, EncodeOptions, Encoding, Page, decode_page, encode_page,
};
use sealion_format::sealed::SealedFile;
use sealion_storage::engine::Engine;

fn parquet_bytes(batches: &[RecordBatch], hosts: usize) -> anyhow::Result<u64> {
    Ok(parquet_file(&sorted_by_host(batches, hosts)?)?.len() as u64)
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

/// Resident memory of this process now, in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The sealed file under an engine's `root` (one partition), its bytes split
/// into the time column's pages, the tag columns' pages, the field columns'
/// pages, and the rest (header, directory, footer).
fn bytes_by_kind(root: &std::path::Path) -> anyhow::Result<Vec<(&'static str, u64)>> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "slf") {
                files.push(p);
            }
        }
    }
    let [path] = files.as_slice() else {
        bail!(
            "expected one sealed file under {}, found {}",
            root.display(),
            files.len()
        );
    };
    let f = SealedFile::open(path)?;
    let mut parts = [
        ("time pages", 0u64),
        ("tag pages", 0),
        ("field pages", 0),
        ("header, directory, footer", 0),
    ];
    for g in f.row_groups() {
        for (c, pages) in g.chunks.iter().enumerate() {
            let k = match ColumnKind::try_from(f.columns()[c].kind) {
                Ok(ColumnKind::Time) => 0,
                Ok(ColumnKind::Tag) => 1,
                _ => 2,
            };
            parts[k].1 += pages.iter().map(|p| u64::from(p.length)).sum::<u64>();
        }
    }
    parts[3].1 = f.summary().bytes - parts[..3].iter().map(|p| p.1).sum::<u64>();
    Ok(parts.to_vec())
}

/// `--seal-only DIR`: opens the engine in DIR, seals partition 1 and prints
/// what that cost; run as a child so its peak memory is the seal's alone.
fn seal_only(dir: &str) -> anyhow::Result<()> {
    let engine = Engine::open(std::path::Path::new(dir))?;
    let before = rss_mib();
    let (c0, t0) = (cpu_seconds(), Instant::now());
    let outcome = engine.seal(1, &columns())?;
    let (cpu, wall) = (cpu_seconds() - c0, t0.elapsed().as_secs_f64());
    let rows = match outcome {
        sealion_storage::engine::SealOutcome::Sealed { rows, .. } => rows,
        other => bail!("seal did not seal: {other:?}"),
    };
    println!(
        "rows={rows} rss_before_mib={before:.0} peak_mib={:.0} wall_s={wall:.2} cpu_s={cpu:.2}",
        peak_rss_mib()
    );
    Ok(())
}

/// `--seal-memory`: writes `hosts * rows_per_host` rows into one partition,
/// then seals it in a child process and reports the child's peak memory.
fn seal_memory(hosts: usize, rows_per_host: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let engine = Engine::open(dir.path())?;
        let cols = columns();
        // Hosts in slices, so the generated batches never hold the whole set.
        let slice = 100.min(hosts);
        let mut done = 0;
        while done < hosts {
            let n = slice.min(hosts - done);
            for b in sealion_bench::tsbs::generate_hosts(done, n, rows_per_host, 50_000) {
                engine.write(&cols, &[(1, vec![b])])?;
            }
            done += n;
        }
    }
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(["--seal-only", dir.path().to_str().context("temp dir path")?])
        .output()?;
    if !out.status.success() {
        bail!(
            "seal child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    println!(
        "| seal of {} rows ({hosts} hosts x {rows_per_host}) in a child process | {} |",
        hosts * rows_per_host,
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--seal-only") {
        return seal_only(args.get(2).context("--seal-only DIR")?);
    }
    let mut memory_only = false;
    let mut hosts = 100usize;
    let mut runs = 5usize;
    let mut rows_per_host = 8_640usize;
    let mut i = 1;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seal-memory" => {
                memory_only = true;
                i += 1;
                continue;
            }
            "--hosts" => hosts = v.parse().context("--hosts")?,
            "--runs" => runs = v.parse().context("--runs")?,
            "--rows-per-host" => rows_per_host = v.parse().context("--rows-per-host")?,
            other => bail!(
                "unknown argument {other}; use --hosts N --runs N --rows-per-host N [--seal-memory]"
            ),
        }
        i += 2;
    }
    if runs == 0 || hosts == 0 || rows_per_host == 0 {
        bail!("--hosts, --runs and --rows-per-host must be positive");
    }
    if memory_only {
        return seal_memory(hosts, rows_per_host);
    }
    let rows = hosts * rows_per_host;
    let values = (rows * FIELDS.len()) as f64;
    let batches = generate(hosts, rows_per_host, 50_000);
    let cols = columns();

    // Seal: the same partition written and sealed `runs + 1` times.
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    let mut file_bytes = 0u64;
    let mut breakdown = Vec::new();
    let mut check_rows = 0u64;
    for run in 0..=runs {
        let dir = tempfile::tempdir()?;
        let engine = Engine::open(dir.path())?;
        for b in &batches {
            engine.write(&cols, &[(1, vec![b.clone()])])?;
        }
        // As after `seal_idle`: the writes' flushes and compactions done.
        engine.wait_for_background_work()?;
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
        breakdown = bytes_by_kind(dir.path())?;
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
    let walk_ints: Vec<i64> = (0..1024)
        .map(|_| {
            w = (w + rng.below(11) as i64 - 5).clamp(0, 100);
            w
        })
        .collect();
    let walk: Vec<f64> = walk_ints.iter().map(|&v| v as f64).collect();
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
            "random walk 0-100 by -5..=5, radix delta",
            &page(ColumnValues::Int64(walk_ints)),
            Encoding::RadixDelta,
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
    println!("| part of the sealed file | bytes | bytes per row |");
    println!("|---|---|---|");
    for (part, bytes) in &breakdown {
        println!("| {part} | {bytes} | {:.3} |", *bytes as f64 / rows as f64);
    }
    println!();
    println!(
        "Seal timed from after the writes' RocksDB flushes and compactions finished (as after `seal_idle`).\n"
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
