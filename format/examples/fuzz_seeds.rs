//! Writes a starting corpus for the fuzz targets in `fuzz/`: valid pages of
//! every type, encoding and compression, a small sealed file, its tag filters
//! and row keys and values. `scripts/fuzz.sh` runs this before fuzzing, so the
//! fuzzer starts from well-formed inputs and mutates them.
//!
//! Usage: `cargo run --example fuzz_seeds -- DIR` (writes DIR/<target>/...).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray, TimestampNanosecondArray};
use arrow::record_batch::RecordBatch;
use sealion_common::catalog::arrow_schema;
use sealion_common::proto::{Column, ColumnKind, DataType};
use sealion_format::columnar::{
    ColumnType, ColumnValues, Compression, EncodeOptions, Page, encode_page,
};
use sealion_format::rows::encode_batch;
use sealion_format::sealed::{SealedFile, SortedRow, write_sealed};

fn col(name: &str, kind: ColumnKind, ty: DataType) -> Column {
    Column {
        name: name.to_string(),
        kind: kind as i32,
        data_type: ty as i32,
    }
}

fn sample(ty: ColumnType) -> Vec<ColumnValues> {
    let n = 300usize;
    match ty {
        ColumnType::Timestamp => vec![
            ColumnValues::Timestamp(
                (0..n as i64)
                    .map(|i| 1_700_000_000_000_000_000 + i * 10_000_000_000)
                    .collect(),
            ),
            ColumnValues::Timestamp(vec![i64::MIN, 0, i64::MAX]),
        ],
        ColumnType::Int64 => vec![
            ColumnValues::Int64((0..n as i64).map(|i| (i * 37) % 101).collect()),
            ColumnValues::Int64(vec![7; n]),
            ColumnValues::Int64(vec![i64::MIN, -1, 0, 1, i64::MAX]),
        ],
        ColumnType::UInt64 => vec![ColumnValues::UInt64((0..n as u64).map(|i| i * i).collect())],
        ColumnType::Float64 => vec![
            ColumnValues::Float64((0..n).map(|i| (i % 100) as f64).collect()),
            ColumnValues::Float64((0..n).map(|i| (i as f64).sin() * 1e3).collect()),
            ColumnValues::Float64(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 0.0]),
        ],
        ColumnType::Bool => vec![ColumnValues::Bool((0..n).map(|i| i % 3 == 0).collect())],
        ColumnType::Text => vec![
            ColumnValues::Text((0..n).map(|i| format!("host_{}", i / 50)).collect()),
            ColumnValues::Text(vec![String::new(), "é".into(), "x".repeat(100)]),
        ],
    }
}

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let d = dir.join(target);
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join(name), bytes)
}

fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/corpus".into()),
    );
    let mut pages = 0;
    let types = [
        ColumnType::Timestamp,
        ColumnType::Int64,
        ColumnType::UInt64,
        ColumnType::Float64,
        ColumnType::Bool,
        ColumnType::Text,
    ];
    for ty in types {
        for (v, values) in sample(ty).into_iter().enumerate() {
            let len = values.len();
            let plain = Page::new(values.clone());
            let nulls = Page::with_nulls(values, (0..len).map(|i| i % 7 == 3).collect());
            for (p, page) in [plain, nulls].iter().enumerate() {
                for &enc in ty.encodings() {
                    for comp in [Compression::None, Compression::Zstd, Compression::Lz4] {
                        let opts = EncodeOptions {
                            compression: comp,
                            encoding: Some(enc),
                        };
                        // Not every encoding fits every sample (that is the encoder's call).
                        let Ok(bytes) = encode_page(page, &opts) else {
                            continue;
                        };
                        let name = format!("{ty:?}-{v}-{p}-{enc:?}-{comp:?}");
                        write(&dir, "page", &name, &bytes)?;
                        pages += 1;
                    }
                }
            }
        }
    }

    // A small sealed file: 3 hosts, 2 fields, a few hundred rows.
    let columns = vec![
        col("host", ColumnKind::Tag, DataType::String),
        col("time", ColumnKind::Time, DataType::Timestamp),
        col("usage", ColumnKind::Field, DataType::Float64),
        col("count", ColumnKind::Field, DataType::Int64),
    ];
    let n = 600usize;
    let batch = RecordBatch::try_new(
        arrow_schema(&columns),
        vec![
            Arc::new(StringArray::from(
                (0..n).map(|i| format!("h{}", i % 3)).collect::<Vec<_>>(),
            )) as ArrayRef,
            Arc::new(
                TimestampNanosecondArray::from(
                    (0..n as i64).map(|i| i * 1_000_000_000).collect::<Vec<_>>(),
                )
                .with_timezone("UTC"),
            ),
            Arc::new(Float64Array::from(
                (0..n)
                    .map(|i| {
                        if i % 11 == 0 {
                            None
                        } else {
                            Some(i as f64 / 4.0)
                        }
                    })
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from((0..n as i64).collect::<Vec<_>>())),
        ],
    )?;
    let mut kv = encode_batch(1, &columns, &batch)?;
    kv.sort();
    for (i, (k, v)) in kv.iter().take(4).enumerate() {
        write(&dir, "row_codec", &format!("key-{i}"), k)?;
        write(&dir, "row_codec", &format!("value-{i}"), v)?;
    }
    let rows: Vec<SortedRow> = kv
        .iter()
        .filter_map(|(k, v)| {
            let (_, series, time_ns) = sealion_format::rows::decode_key(k)?;
            Some(SortedRow {
                series: series.to_vec(),
                time_ns,
                value: v.clone(),
            })
        })
        .collect();
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("seed.slf");
    write_sealed(&path, 1, &columns, rows.into_iter().map(Ok))?;
    write(&dir, "sealed_file", "seed.slf", &std::fs::read(&path)?)?;
    let file = SealedFile::open(&path)?;
    write(&dir, "tag_filters", "seed", file.tag_filter_bytes())?;
    println!(
        "fuzz seeds: {pages} pages, 1 sealed file, tag filters, rows in {}",
        dir.display()
    );
    Ok(())
}
