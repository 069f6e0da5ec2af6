//! Ingest benchmark of the storage engine alone: TSBS cpu-only rows
//! (time-major, as a fleet reports them, one partition per day) written to
//! an `Engine` in synced batches by several writer threads, as a storage
//! node writes them for its `Write` RPCs. No HTTP, no parsing, no network:
//! what is left is encoding the rows and RocksDB (memtables, the
//! write-ahead log and its syncs, flushes and compactions).
//!
//! It prints the rate of every window of `--window` rows, so a rate that
//! falls as the store grows shows, then the whole run's rate, the CPU it
//! took and what RocksDB says of its stalls and compactions. The knobs of
//! `RowStoreOptions` are flags, so one binary compares settings.
//!
//!   cargo run --release -p sealion-bench --bin ingest-bench -- --hosts 100 --rows 10000000

use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use arrow::array::{Array, TimestampNanosecondArray};
use arrow::record_batch::RecordBatch;
use clap::Parser;
use sealion_bench::tsbs::{Batches, DAY0_NS, columns, cpu_seconds, median, peak_rss_mib};
use sealion_common::proto::ScanRequest;
use sealion_storage::engine::{Engine, RowStoreOptions};

const DAY_NS: i64 = 86_400_000_000_000;

#[derive(Parser, Debug)]
#[command(about = "Synced batched writes of TSBS cpu-only rows into a storage engine")]
struct Args {
    /// Hosts (series); rows come a reading of every host at a time.
    #[arg(long, default_value_t = 100)]
    hosts: usize,
    /// Rows written in all.
    #[arg(long, default_value_t = 10_000_000)]
    rows: usize,
    /// Rows per write (one synced RocksDB batch each).
    #[arg(long, default_value_t = 1_000)]
    batch_rows: usize,
    /// Writer threads.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Rows per reported window.
    #[arg(long, default_value_t = 1_000_000)]
    window: usize,
    /// Where the store goes (default: a temporary directory, removed after).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Memtable size of the rows' column family, MiB.
    #[arg(long)]
    write_buffer_mib: Option<usize>,
    /// Memtables kept.
    #[arg(long)]
    max_write_buffers: Option<i32>,
    /// Level-0 files that start a compaction.
    #[arg(long)]
    l0_compaction_trigger: Option<i32>,
    /// Level-0 files past which writes slow down.
    #[arg(long)]
    l0_slowdown_files: Option<i32>,
    /// Level-0 files past which writes stop.
    #[arg(long)]
    l0_stop_files: Option<i32>,
    /// Flush and compaction threads.
    #[arg(long)]
    background_jobs: Option<i32>,
    /// Bytes of level 1, MiB.
    #[arg(long)]
    level1_mib: Option<u64>,
    /// Levels, from level 0, written uncompressed (the rest: LZ4).
    #[arg(long)]
    uncompressed_levels: Option<usize>,
}

impl Args {
    fn tuning(&self) -> RowStoreOptions {
        let d = RowStoreOptions::default();
        RowStoreOptions {
            write_buffer_bytes: self
                .write_buffer_mib
                .map_or(d.write_buffer_bytes, |m| m << 20),
            max_write_buffers: self.max_write_buffers.unwrap_or(d.max_write_buffers),
            l0_compaction_trigger: self
                .l0_compaction_trigger
                .unwrap_or(d.l0_compaction_trigger),
            l0_slowdown_files: self.l0_slowdown_files.unwrap_or(d.l0_slowdown_files),
            l0_stop_files: self.l0_stop_files.unwrap_or(d.l0_stop_files),
            background_jobs: self.background_jobs.unwrap_or(d.background_jobs),
            level1_bytes: self.level1_mib.map_or(d.level1_bytes, |m| m << 20),
            uncompressed_levels: self.uncompressed_levels.unwrap_or(d.uncompressed_levels),
        }
    }
}

/// The partition (day number, from 1) of each row, and the batch cut where
/// the day changes: rows are time-major, so a batch holds one day or the
/// end of one and the start of the next.
fn by_day(batch: RecordBatch) -> Vec<(u64, RecordBatch)> {
    let Some(time) = batch
        .column(0)
        .as_any()
        .downcast_ref::<TimestampNanosecondArray>()
    else {
        return Vec::new();
    };
    let day = |i: usize| ((time.value(i) - DAY0_NS).div_euclid(DAY_NS) + 1) as u64;
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=time.len() {
        if i == time.len() || day(i) != day(start) {
            out.push((day(start), batch.slice(start, i - start)));
            start = i;
        }
    }
    out
}

/// Milliseconds a scan of every row and column of partition `pid` takes,
/// the median of three.
fn scan_ms(engine: &Engine, pid: u64) -> anyhow::Result<f64> {
    let req = ScanRequest {
        table_id: 1,
        partition_ids: vec![pid],
        start_ns: i64::MIN,
        end_ns: i64::MAX,
        projection: columns(),
        table_columns: columns(),
        ..Default::default()
    };
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let mut rows = 0;
        engine.scan(&req, |b| {
            rows += b.num_rows();
            true
        })?;
        anyhow::ensure!(rows > 0, "the scan of partition {pid} found no rows");
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(times).1)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.hosts > 0 && args.rows > 0 && args.batch_rows > 0 && args.writers > 0,
        "--hosts, --rows, --batch-rows and --writers must be positive"
    );
    let tmp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let tuning = args.tuning();
    let engine = Arc::new(Engine::open_with(&dir, &tuning)?);
    let cols = Arc::new(columns());
    let readings = args.rows.div_ceil(args.hosts);

    // One thread makes the batches, a few ahead of the writers.
    let (tx, rx) = sync_channel::<(u64, RecordBatch)>(4 * args.writers);
    let (hosts, batch_rows, total) = (args.hosts, args.batch_rows, args.rows);
    let producer = std::thread::spawn(move || {
        let mut sent = 0;
        for b in Batches::new(0, hosts, readings, batch_rows) {
            let b = b.slice(0, b.num_rows().min(total - sent));
            sent += b.num_rows();
            for part in by_day(b) {
                if tx.send(part).is_err() {
                    return;
                }
            }
            if sent >= total {
                return;
            }
        }
    });

    let rx = Arc::new(Mutex::new(rx));
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (c0, t0) = (cpu_seconds(), Instant::now());
    let windows = Arc::new(Mutex::new(Vec::<(usize, f64)>::new()));
    let mut writers = Vec::new();
    for _ in 0..args.writers {
        let (rx, engine, cols, written, windows) = (
            rx.clone(),
            engine.clone(),
            cols.clone(),
            written.clone(),
            windows.clone(),
        );
        let window = args.window;
        writers.push(std::thread::spawn(move || -> anyhow::Result<()> {
            loop {
                let next = rx.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.recv();
                let Ok((pid, batch)) = next else {
                    return Ok(());
                };
                let n = batch.num_rows();
                engine.write(&cols, &[(pid, vec![batch])])?;
                let before = written.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                if (before + n) / window > before / window {
                    let at = t0.elapsed().as_secs_f64();
                    windows
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .push(((before + n) / window * window, at));
                }
            }
        }));
    }
    for w in writers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a writer panicked"))??;
    }
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("the producer panicked"))?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - c0;
    let rows = written.load(std::sync::atomic::Ordering::Relaxed);

    println!("# Storage-engine ingest: {rows} rows");
    println!();
    println!(
        "- {} hosts, batches of {} rows, {} writer threads, every write synced",
        args.hosts, args.batch_rows, args.writers
    );
    println!("- RocksDB: {tuning:?}");
    println!();
    println!("| rows written | window rows/s |");
    println!("|---|---|");
    let mut prev = (0usize, 0f64);
    let mut ws = windows
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    ws.sort_by_key(|w| w.0);
    for (at_rows, at_s) in ws {
        let rate = (at_rows - prev.0) as f64 / (at_s - prev.1).max(1e-9);
        println!("| {at_rows} | {rate:.0} |");
        prev = (at_rows, at_s);
    }
    println!();
    println!(
        "- whole run: {:.1} s, {:.0} rows/s, {:.1} CPU-seconds ({:.2} of the machine's cores busy), peak RSS {:.0} MiB",
        wall,
        rows as f64 / wall,
        cpu,
        cpu / wall,
        peak_rss_mib()
    );
    let newest = (DAY0_NS + (readings as i64 - 1) * sealion_bench::tsbs::STEP_NS - DAY0_NS)
        .div_euclid(DAY_NS) as u64
        + 1;
    let level0 = |e: &Engine| -> anyhow::Result<String> {
        Ok(e.rows_property("rocksdb.num-files-at-level0")?
            .unwrap_or_default())
    };
    println!(
        "- a full scan of the newest (open) partition right after the writes, {} level-0 files: {:.0} ms (median of 3)",
        level0(&engine)?,
        scan_ms(&engine, newest)?
    );
    let (c1, t1) = (cpu_seconds(), Instant::now());
    engine.wait_for_background_work()?;
    println!(
        "- then RocksDB's flushes and compactions took {:.1} s more ({:.1} CPU-seconds)",
        t1.elapsed().as_secs_f64(),
        cpu_seconds() - c1
    );
    println!(
        "- the same scan once they are done, {} level-0 files: {:.0} ms",
        level0(&engine)?,
        scan_ms(&engine, newest)?
    );
    let stats = engine
        .rows_property("rocksdb.stats")?
        .context("no rocksdb.stats")?;
    println!();
    println!("RocksDB (rows column family):");
    println!();
    println!("```");
    for line in stats.lines().filter(|l| {
        l.contains("Cumulative writes")
            || l.contains("Cumulative WAL")
            || l.contains("Cumulative stall")
            || l.contains("Cumulative compaction")
            || l.starts_with("Stalls(count)")
            || l.trim_start().starts_with("L0")
            || l.trim_start().starts_with("L1")
            || l.trim_start().starts_with("L2")
            || l.trim_start().starts_with("Sum")
            || l.trim_start().starts_with("Level")
    }) {
        println!("{line}");
    }
    println!("```");
    Ok(())
}
