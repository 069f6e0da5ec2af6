//! Sealed-file tests: random tables against a plain model (rows, scans,
//! summary, series directory, tag filters), several row groups, empty input,
//! corruption at every byte, missing columns, and the size report.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray, TimestampNanosecondArray,
    UInt64Array,
};
use arrow::datatypes::DataType as ArrowType;
use arrow::record_batch::RecordBatch;
use proptest::prelude::*;
use sealion_common::catalog::arrow_schema;
use sealion_common::proto::{Column, ColumnKind, DataType, ScanRequest};

use super::writer::{Layout, write_sealed_with};
use super::*;
use crate::Error;
use crate::rows::{Value, decode_fields, decode_key, decode_series, encode_batch};

// ---------- building input the way the engine does ----------

fn col(name: &str, kind: ColumnKind, ty: DataType) -> Column {
    Column {
        name: name.to_string(),
        kind: kind as i32,
        data_type: ty as i32,
    }
}

fn time_col() -> Column {
    col("time", ColumnKind::Time, DataType::Timestamp)
}

/// A field value as generated.
#[derive(Debug, Clone)]
enum Raw {
    F(f64),
    I(i64),
    U(u64),
    B(bool),
    S(String),
}

/// One input row: the value of each column of `columns` (time excluded:
/// it is `time`), `None` = null.
#[derive(Debug, Clone)]
struct InRow {
    time: i64,
    cells: Vec<Option<Raw>>,
}

/// Encodes rows as the engine would (`rows::encode_batch`), then orders and
/// deduplicates them as RocksDB does: bytewise key order, last write wins.
fn engine_rows(pid: u64, columns: &[Column], rows: &[InRow]) -> Vec<SortedRow> {
    if rows.is_empty() {
        return Vec::new();
    }
    let mut arrays: Vec<ArrayRef> = Vec::new();
    let mut k = 0;
    for c in columns {
        if c.kind() == ColumnKind::Time {
            let t: Vec<i64> = rows.iter().map(|r| r.time).collect();
            arrays.push(Arc::new(
                TimestampNanosecondArray::from(t).with_timezone("UTC"),
            ));
            continue;
        }
        let cells: Vec<Option<Raw>> = rows.iter().map(|r| r.cells[k].clone()).collect();
        k += 1;
        let a: ArrayRef = match c.data_type() {
            DataType::Float64 => Arc::new(Float64Array::from(
                cells
                    .iter()
                    .map(|v| match v {
                        Some(Raw::F(x)) => Some(*x),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )),
            DataType::Int64 => Arc::new(Int64Array::from(
                cells
                    .iter()
                    .map(|v| match v {
                        Some(Raw::I(x)) => Some(*x),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )),
            DataType::Uint64 => Arc::new(UInt64Array::from(
                cells
                    .iter()
                    .map(|v| match v {
                        Some(Raw::U(x)) => Some(*x),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )),
            DataType::Bool => Arc::new(BooleanArray::from(
                cells
                    .iter()
                    .map(|v| match v {
                        Some(Raw::B(x)) => Some(*x),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )),
            _ => Arc::new(StringArray::from(
                cells
                    .iter()
                    .map(|v| match v {
                        Some(Raw::S(x)) => Some(x.clone()),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )),
        };
        arrays.push(a);
    }
    let batch = RecordBatch::try_new(arrow_schema(columns), arrays).unwrap();
    let mut kv: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for (key, value) in encode_batch(pid, columns, &batch).unwrap() {
        kv.insert(key, value);
    }
    kv.into_iter()
        .map(|(k, v)| {
            let (p, series, t) = decode_key(&k).unwrap();
            assert_eq!(p, pid);
            SortedRow {
                series: series.to_vec(),
                time_ns: t,
                value: v,
            }
        })
        .collect()
}

fn small_layout(rows_per_group: usize, values_per_page: usize) -> Layout {
    Layout {
        rows_per_group,
        values_per_page,
        parallel: false,
        ..Layout::default()
    }
}

fn write_file(
    path: &Path,
    pid: u64,
    columns: &[Column],
    rows: &[SortedRow],
    layout: Layout,
) -> SealedSummary {
    write_sealed_with(path, pid, columns, rows.iter().cloned().map(Ok), layout).unwrap()
}

// ---------- the model ----------

/// One cell, floats by their bits so that NaN and -0.0 compare exactly.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    T(i64),
    S(String),
    F(u64),
    I(i64),
    U(u64),
    B(bool),
}

fn model_cell(c: &Column, row: &SortedRow, file_columns: &[Column]) -> Cell {
    if c.kind() == ColumnKind::Time {
        return Cell::T(row.time_ns);
    }
    if !file_columns.iter().any(|f| f.name == c.name) {
        return Cell::Null;
    }
    if c.kind() == ColumnKind::Tag {
        return decode_series(&row.series)
            .unwrap()
            .into_iter()
            .find(|(n, _)| *n == c.name)
            .map_or(Cell::Null, |(_, v)| Cell::S(v.to_string()));
    }
    match decode_fields(&row.value, file_columns)
        .unwrap()
        .into_iter()
        .find(|(n, _)| *n == c.name)
    {
        None => Cell::Null,
        Some((_, Value::F64(x))) => Cell::F(x.to_bits()),
        Some((_, Value::I64(x))) => Cell::I(x),
        Some((_, Value::U64(x))) => Cell::U(x),
        Some((_, Value::Bool(x))) => Cell::B(x),
        Some((_, Value::Str(x))) => Cell::S(x),
    }
}

fn array_cells(a: &dyn Array) -> Vec<Cell> {
    (0..a.len())
        .map(|i| {
            if a.is_null(i) {
                return Cell::Null;
            }
            match a.data_type() {
                ArrowType::Timestamp(..) => Cell::T(
                    a.as_any()
                        .downcast_ref::<TimestampNanosecondArray>()
                        .unwrap()
                        .value(i),
                ),
                ArrowType::Utf8 => Cell::S(
                    a.as_any()
                        .downcast_ref::<StringArray>()
                        .unwrap()
                        .value(i)
                        .to_string(),
                ),
                ArrowType::Float64 => Cell::F(
                    a.as_any()
                        .downcast_ref::<Float64Array>()
                        .unwrap()
                        .value(i)
                        .to_bits(),
                ),
                ArrowType::Int64 => {
                    Cell::I(a.as_any().downcast_ref::<Int64Array>().unwrap().value(i))
                }
                ArrowType::UInt64 => {
                    Cell::U(a.as_any().downcast_ref::<UInt64Array>().unwrap().value(i))
                }
                ArrowType::Boolean => {
                    Cell::B(a.as_any().downcast_ref::<BooleanArray>().unwrap().value(i))
                }
                other => panic!("unexpected type {other:?}"),
            }
        })
        .collect()
}

fn request(start_ns: i64, end_ns: i64, projection: Vec<Column>, limit: u64) -> ScanRequest {
    ScanRequest {
        table_id: 1,
        partition_ids: vec![],
        start_ns,
        end_ns,
        projection,
        table_columns: vec![],
        limit,
        ..Default::default()
    }
}

/// Runs a scan; returns the batches.
fn scan_all(f: &SealedFile, req: &ScanRequest) -> crate::Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    f.scan(req, &mut |b| {
        out.push(b);
        true
    })?;
    Ok(out)
}

/// Scans and checks the result against the model: batch shape and schema,
/// then every cell, row by row.
fn check_scan(f: &SealedFile, model: &[SortedRow], file_columns: &[Column], req: &ScanRequest) {
    let batches = scan_all(f, req).unwrap();
    let schema = arrow_schema(&req.projection);
    for b in &batches {
        assert!(
            b.num_rows() > 0 && b.num_rows() <= 8192,
            "batch of {} rows",
            b.num_rows()
        );
        assert_eq!(b.schema(), schema);
    }
    let mut want: Vec<&SortedRow> = model
        .iter()
        .filter(|r| r.time_ns >= req.start_ns && r.time_ns < req.end_ns)
        .collect();
    if req.limit > 0 {
        want.truncate(req.limit as usize);
    }
    let got_rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(got_rows, want.len(), "row count for {req:?}");
    for (k, c) in req.projection.iter().enumerate() {
        let got: Vec<Cell> = batches
            .iter()
            .flat_map(|b| array_cells(b.column(k).as_ref()))
            .collect();
        let expected: Vec<Cell> = want
            .iter()
            .map(|r| model_cell(c, r, file_columns))
            .collect();
        assert_eq!(got, expected, "column {:?} for {req:?}", c.name);
    }
}

/// Everything the file must say about itself, checked against the model.
/// `rows` with their fields named (row format 1), in column order: how a
/// sealed file hands rows back and keeps each series' last row.
fn named(rows: &[SortedRow], columns: &[Column]) -> Vec<SortedRow> {
    rows.iter()
        .map(|row| {
            let fields = decode_fields(&row.value, columns).unwrap();
            let mut value = Vec::new();
            super::value::start_value(&mut value);
            for c in columns {
                if let Some((n, v)) = fields.iter().find(|(n, _)| *n == c.name) {
                    super::value::put_field(&mut value, n, v.into());
                }
            }
            SortedRow {
                series: row.series.clone(),
                time_ns: row.time_ns,
                value,
            }
        })
        .collect()
}

fn check_file(f: &SealedFile, path: &Path, model: &[SortedRow], rows_per_group: usize) {
    // rows() returns exactly the input, byte for byte, but for its fields
    // being named (stored by column index, handed back by name).
    let model = &named(model, f.columns());
    let back: Vec<SortedRow> = f.rows().collect::<crate::Result<_>>().unwrap();
    assert_eq!(&back, model);

    // Summary.
    let series: Vec<&[u8]> = {
        let mut s: Vec<&[u8]> = model.iter().map(|r| r.series.as_slice()).collect();
        s.dedup();
        s
    };
    let s = f.summary();
    assert_eq!(s.rows, model.len() as u64);
    assert_eq!(s.series, series.len() as u64);
    assert_eq!(s.row_groups as usize, model.len().div_ceil(rows_per_group));
    assert_eq!(s.bytes, std::fs::metadata(path).unwrap().len());
    assert_eq!(
        s.min_time_ns,
        model.iter().map(|r| r.time_ns).min().unwrap_or(i64::MAX)
    );
    assert_eq!(
        s.max_time_ns,
        model.iter().map(|r| r.time_ns).max().unwrap_or(i64::MIN)
    );

    // Series directory: ranges and last rows.
    assert_eq!(f.series().len(), series.len());
    let mut first = 0u64;
    for (info, key) in f.series().iter().zip(&series) {
        let rows: Vec<&SortedRow> = model.iter().filter(|r| r.series == *key).collect();
        assert_eq!(info.key, *key);
        assert_eq!(info.first_row, first);
        assert_eq!(info.rows, rows.len() as u64);
        let last = rows.last().unwrap();
        assert_eq!(info.last_time_ns, last.time_ns);
        assert_eq!(info.last_value, last.value);
        assert_eq!(f.last_row(key).as_ref(), Some(*last));
        first += rows.len() as u64;
    }
    assert_eq!(f.last_row(b"no such series"), None);

    // Tag filters: no false negatives.
    for key in &series {
        for (tag, value) in decode_series(key).unwrap() {
            assert!(
                f.may_contain_tag(tag, value),
                "{tag}={value:?} must be maybe-present"
            );
        }
    }
    let parsed = TagFilters::from_bytes(f.tag_filter_bytes()).unwrap();
    for key in &series {
        for (tag, value) in decode_series(key).unwrap() {
            assert!(parsed.may_contain(tag, value));
        }
    }

    // The series of each tag value: exactly those whose key holds it, in
    // directory order (the model: every key decoded and compared).
    let index = f.series_by_tag().unwrap();
    for key in &series {
        for (tag, value) in decode_series(key).unwrap() {
            let want: Vec<u32> = (0..series.len() as u32)
                .filter(|&i| {
                    decode_series(series[i as usize])
                        .unwrap()
                        .contains(&(tag, value))
                })
                .collect();
            assert_eq!(index.series(tag, value), want, "{tag}={value:?}");
            let other = format!("{value}\u{1}");
            assert!(index.series(tag, &other).is_empty());
        }
    }
    assert!(index.series("no such tag", "x").is_empty());

    // Each series' value of each tag, read through the tag's column: the
    // value its key holds, NULL where the key lacks the tag.
    assert_eq!(index.len(), series.len());
    let names: std::collections::BTreeSet<&str> = series
        .iter()
        .flat_map(|k| decode_series(k).unwrap().into_iter().map(|(t, _)| t))
        .collect();
    for tag in names {
        let column = index.column(tag).unwrap();
        for (i, key) in series.iter().enumerate() {
            let want = decode_series(key)
                .unwrap()
                .into_iter()
                .find(|&(t, _)| t == tag)
                .map(|(_, v)| v);
            assert_eq!(column.value(column.ids()[i]), want, "{tag} of series {i}");
        }
    }
    assert!(index.column("no such tag").is_none());
}

// ---------- random tables ----------

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        (-1000i64..1000).prop_map(|x| x as f64),
        any::<f64>(),
        Just(f64::NAN),
        Just(-0.0),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
    ]
}

fn int() -> impl Strategy<Value = i64> {
    prop_oneof![-10i64..10, any::<i64>(), Just(i64::MIN), Just(i64::MAX)]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-c]{0,3}", 1 => ".{0,80}"]
}

fn tag_value() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u8..40).prop_map(|i| format!("v{i}")),
        1 => Just(String::new()),
        1 => Just("é ü".to_string()),
    ]
}

fn time() -> impl Strategy<Value = i64> {
    prop_oneof![20 => -20i64..60, 1 => Just(i64::MIN), 1 => Just(i64::MAX)]
}

fn bound() -> impl Strategy<Value = i64> {
    prop_oneof![10 => -25i64..65, 1 => Just(i64::MIN), 1 => Just(i64::MAX)]
}

const FIELD_TYPES: [DataType; 5] = [
    DataType::Float64,
    DataType::Int64,
    DataType::Uint64,
    DataType::Bool,
    DataType::String,
];

#[derive(Debug, Clone)]
struct Scan {
    start: i64,
    end: i64,
    /// Indexes into the file's columns plus one column the file lacks.
    projection: Vec<usize>,
    limit: u64,
}

#[derive(Debug, Clone)]
struct Case {
    columns: Vec<Column>,
    rows: Vec<InRow>,
    scans: Vec<Scan>,
    rows_per_group: usize,
    values_per_page: usize,
    missing: Column,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0usize..=3,
        proptest::collection::vec(0usize..5, 0..=4),
        any::<bool>(),
        0usize..5,
    )
        .prop_flat_map(|(ntags, ftypes, reverse, missing_type)| {
            let nf = ftypes.len();
            let series = proptest::collection::vec(
                proptest::collection::vec(proptest::option::of(tag_value()), ntags),
                1..=12,
            );
            let raw = (float(), int(), any::<u64>(), any::<bool>(), text());
            let row = (
                0usize..12,
                time(),
                proptest::collection::vec(proptest::option::weighted(0.8, raw), nf),
            );
            let rows = proptest::collection::vec(row, 0..=120);
            let scan = (
                bound(),
                bound(),
                proptest::collection::vec(0usize..16, 0..=5),
                prop_oneof![Just(0u64), 1u64..30],
            );
            let scans = proptest::collection::vec(scan, 1..=4);
            (
                Just((ntags, ftypes, reverse, missing_type)),
                series,
                rows,
                scans,
                1usize..=40,
                1usize..=12,
            )
        })
        .prop_map(
            |(
                (ntags, ftypes, reverse, missing_type),
                series,
                rows,
                scans,
                rows_per_group,
                values_per_page,
            )| {
                let mut others: Vec<Column> = (0..ntags)
                    .map(|i| col(&format!("t{i}"), ColumnKind::Tag, DataType::String))
                    .collect();
                others.extend(
                    ftypes
                        .iter()
                        .enumerate()
                        .map(|(i, &t)| col(&format!("f{i}"), ColumnKind::Field, FIELD_TYPES[t])),
                );
                if reverse {
                    others.reverse();
                }
                let mut columns = vec![time_col()];
                columns.extend(others.iter().cloned());
                let in_rows = rows
                    .into_iter()
                    .map(|(s, t, raws)| {
                        let tags = &series[s % series.len()];
                        let cells = others
                            .iter()
                            .map(|c| {
                                let i: usize = c.name[1..].parse().unwrap();
                                if c.kind() == ColumnKind::Tag {
                                    return tags[i].clone().map(Raw::S);
                                }
                                raws[i].clone().map(|(f, n, u, b, s)| match c.data_type() {
                                    DataType::Float64 => Raw::F(f),
                                    DataType::Int64 => Raw::I(n),
                                    DataType::Uint64 => Raw::U(u),
                                    DataType::Bool => Raw::B(b),
                                    _ => Raw::S(s),
                                })
                            })
                            .collect();
                        InRow { time: t, cells }
                    })
                    .collect();
                let scans = scans
                    .into_iter()
                    .map(|(a, b, projection, limit)| Scan {
                        start: a.min(b),
                        end: a.max(b),
                        projection,
                        limit,
                    })
                    .collect();
                Case {
                    columns,
                    rows: in_rows,
                    scans,
                    rows_per_group,
                    values_per_page,
                    missing: col("added_later", ColumnKind::Field, FIELD_TYPES[missing_type]),
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sealed_file_equals_the_model(c in case()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sealed");
        let model = engine_rows(7, &c.columns, &c.rows);
        let summary = write_file(&path, 7, &c.columns, &model, small_layout(c.rows_per_group, c.values_per_page));
        let f = SealedFile::open(&path).unwrap();
        prop_assert_eq!(f.summary(), &summary);
        prop_assert_eq!(f.columns(), c.columns.as_slice());
        prop_assert_eq!(f.partition_id(), 7);
        check_file(&f, &path, &model, c.rows_per_group);

        // Absent tag values are mostly reported absent.
        let tags: Vec<&Column> = c.columns.iter().filter(|x| x.kind() == ColumnKind::Tag).collect();
        let mut false_positives = 0;
        for t in &tags {
            for i in 0..25 {
                if f.may_contain_tag(&t.name, &format!("absent-{i}")) {
                    false_positives += 1;
                }
            }
        }
        prop_assert!(false_positives <= 8, "{} false positives", false_positives);
        prop_assert!(!f.may_contain_tag("no_such_tag", "v1"));

        let mut candidates = c.columns.clone();
        candidates.push(c.missing.clone());
        for s in &c.scans {
            let projection: Vec<Column> = s.projection.iter().map(|&i| candidates[i % candidates.len()].clone()).collect();
            check_scan(&f, &model, &c.columns, &request(s.start, s.end, projection, s.limit));
        }
        // And a full scan of every column.
        check_scan(&f, &model, &c.columns, &request(i64::MIN, i64::MAX, candidates.clone(), 0));
    }

    /// Filter bytes with a valid checksum but mutated content never make
    /// parsing or a lookup panic.
    #[test]
    fn tag_filter_parsing_never_panics(n in 0usize..40, at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut values = BTreeMap::new();
        values.insert("host".to_string(), (0..n).map(|i| format!("h{i}")).collect::<BTreeSet<_>>());
        values.insert("region".to_string(), ["eu", "us"].iter().map(|s| s.to_string()).collect());
        let mut bytes = TagFilters::build(&values).to_bytes();
        let body = bytes.len() - 4;
        bytes[at.index(body)] = byte;
        let crc = crc32c::crc32c(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
        if let Ok(f) = TagFilters::from_bytes(&bytes) {
            for i in 0..50 {
                let _ = f.may_contain("host", &format!("h{i}"));
            }
        }
    }
}

// ---------- several row groups ----------

/// Three series: a (times 0..9000), b (100_000..109_000), c (200_000..202_000);
/// 20,000 rows, so row group 0 is a's start, 1 holds a's end and b's start
/// (a and b span row groups), 2 holds b's end and all of c.
fn three_series() -> (Vec<Column>, Vec<SortedRow>) {
    let columns = vec![
        time_col(),
        col("host", ColumnKind::Tag, DataType::String),
        col("usage", ColumnKind::Field, DataType::Float64),
        col("count", ColumnKind::Field, DataType::Int64),
        col("note", ColumnKind::Field, DataType::String),
    ];
    let mut rows = Vec::new();
    for (host, base, n) in [
        ("a", 0i64, 9000i64),
        ("b", 100_000, 9000),
        ("c", 200_000, 2000),
    ] {
        for i in 0..n {
            rows.push(InRow {
                time: base + i,
                cells: vec![
                    Some(Raw::S(host.into())),
                    Some(Raw::F((i % 100) as f64)),
                    (i % 7 != 0).then_some(Raw::I(i * 3)),
                    (i % 1000 == 0).then(|| Raw::S(format!("n{i}"))),
                ],
            });
        }
    }
    let model = engine_rows(3, &columns, &rows);
    (columns, model)
}

#[test]
fn twenty_thousand_rows_span_three_row_groups() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.sealed");
    let (columns, model) = three_series();
    assert_eq!(model.len(), 20_000);
    let summary = write_sealed(&path, 3, &columns, model.iter().cloned().map(Ok)).unwrap();
    assert_eq!(summary.row_groups, 3);
    let f = SealedFile::open(&path).unwrap();
    check_file(&f, &path, &model, ROWS_PER_GROUP);

    let groups = f.row_groups();
    assert_eq!(
        groups.iter().map(|g| g.rows).collect::<Vec<_>>(),
        vec![8192, 8192, 3616]
    );
    assert_eq!(
        (groups[0].first_key, groups[0].last_key),
        ((0, 0), (0, 8191))
    );
    assert_eq!(
        (groups[1].first_key, groups[1].last_key),
        ((0, 8192), (1, 107_383))
    );
    assert_eq!(
        (groups[2].first_key, groups[2].last_key),
        ((1, 107_384), (2, 201_999))
    );
    assert_eq!(groups[0].chunks[0].len(), 8, "8 pages of 1,024 times");

    let all = columns.clone();
    let batches = scan_all(&f, &request(i64::MIN, i64::MAX, all.clone(), 0)).unwrap();
    assert_eq!(
        batches
            .iter()
            .map(RecordBatch::num_rows)
            .collect::<Vec<_>>(),
        vec![8192, 8192, 3616]
    );
    check_scan(
        &f,
        &model,
        &columns,
        &request(i64::MIN, i64::MAX, all.clone(), 0),
    );
    check_scan(
        &f,
        &model,
        &columns,
        &request(5_000, 105_000, all.clone(), 0),
    );
    check_scan(
        &f,
        &model,
        &columns,
        &request(8_000, 8_500, vec![columns[2].clone()], 0),
    );
    check_scan(
        &f,
        &model,
        &columns,
        &request(i64::MIN, i64::MAX, vec![], 0),
    );
    check_scan(
        &f,
        &model,
        &columns,
        &request(i64::MIN, i64::MAX, all.clone(), 10_000),
    );
    // A limit that falls exactly on a batch boundary.
    let b = scan_all(&f, &request(i64::MIN, i64::MAX, vec![], 8192)).unwrap();
    assert_eq!(
        b.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(),
        vec![8192]
    );
    // Stopping early: emit returns false after the first batch.
    let mut seen = 0;
    f.scan(&request(i64::MIN, i64::MAX, all, 0), &mut |_| {
        seen += 1;
        false
    })
    .unwrap();
    assert_eq!(seen, 1);
}

/// Flips a byte of one page of column `column` in row group `group`.
fn corrupt_page(path: &Path, f: &SealedFile, group: usize, column: usize) -> u64 {
    let page = &f.row_groups()[group].chunks[column][0];
    let at = page.offset + u64::from(page.length) / 2;
    flip(path, at);
    at
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn scans_skip_row_groups_by_time_and_decode_only_projected_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.sealed");
    let (columns, model) = three_series();
    write_sealed(&path, 3, &columns, model.iter().cloned().map(Ok)).unwrap();
    // Damage `usage` in row group 2 and `count` in row group 0.
    {
        let f = SealedFile::open(&path).unwrap();
        corrupt_page(&path, &f, 2, 2);
        corrupt_page(&path, &f, 0, 3);
    }
    let f = SealedFile::open(&path).unwrap();
    let usage = vec![columns[0].clone(), columns[2].clone()];
    // Row group 2 (times 107_384..) is outside [0, 100_000): never read.
    check_scan(&f, &model, &columns, &request(0, 100_000, usage.clone(), 0));
    // `count` is not projected: its damaged page is never read.
    check_scan(
        &f,
        &model,
        &columns,
        &request(0, 100_000, vec![columns[1].clone(), columns[4].clone()], 0),
    );
    // Both damaged pages are found when they are needed.
    let e = scan_all(&f, &request(100_000, 250_000, usage, 0)).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::Corrupt {
                partition_id: 3,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains(&path.display().to_string())
            && msg.contains("row group 2")
            && msg.contains("\"usage\"")
            && msg.contains("page 0"),
        "{msg}"
    );
    let e = scan_all(&f, &request(0, 10, vec![columns[3].clone()], 0)).unwrap_err();
    assert!(e.to_string().contains("\"count\""), "{e}");
}

// ---------- empty input ----------

#[test]
fn empty_input_makes_a_valid_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.sealed");
    let columns = vec![
        time_col(),
        col("host", ColumnKind::Tag, DataType::String),
        col("v", ColumnKind::Field, DataType::Float64),
    ];
    let summary = write_sealed(&path, 9, &columns, std::iter::empty()).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(
        summary,
        SealedSummary {
            rows: 0,
            series: 0,
            bytes: len,
            min_time_ns: i64::MAX,
            max_time_ns: i64::MIN,
            row_groups: 0
        }
    );
    let f = SealedFile::open(&path).unwrap();
    assert_eq!(f.summary(), &summary);
    assert_eq!(f.rows().count(), 0);
    assert!(f.series().is_empty());
    assert!(!f.may_contain_tag("host", "a"));
    assert!(
        scan_all(&f, &request(i64::MIN, i64::MAX, columns.clone(), 0))
            .unwrap()
            .is_empty()
    );
    assert!(
        scan_all(&f, &request(i64::MIN, i64::MAX, vec![], 0))
            .unwrap()
            .is_empty()
    );
    TagFilters::from_bytes(f.tag_filter_bytes()).unwrap();
}

// ---------- corruption ----------

fn small_file(dir: &Path) -> (PathBuf, Vec<Column>, Vec<SortedRow>) {
    let path = dir.join("small.sealed");
    let columns = vec![
        time_col(),
        col("host", ColumnKind::Tag, DataType::String),
        col("v", ColumnKind::Field, DataType::Float64),
        col("n", ColumnKind::Field, DataType::Uint64),
        col("ok", ColumnKind::Field, DataType::Bool),
    ];
    let rows: Vec<InRow> = (0..40u32)
        .map(|i| InRow {
            time: 1_000 * i64::from(i % 20),
            cells: vec![
                Some(Raw::S(format!("h{}", i / 20))),
                Some(Raw::F(f64::from(i) * 0.5)),
                (i % 3 != 0).then_some(Raw::U(u64::from(i))),
                Some(Raw::B(i % 2 == 0)),
            ],
        })
        .collect();
    let model = engine_rows(5, &columns, &rows);
    write_file(&path, 5, &columns, &model, small_layout(16, 8));
    (path, columns, model)
}

#[test]
fn version_two_drops_tag_pages_and_reads_as_version_one_does() {
    let dir = tempfile::tempdir().unwrap();
    let columns = vec![
        col("host", ColumnKind::Tag, DataType::String),
        col("rack", ColumnKind::Tag, DataType::String),
        time_col(),
        col("v", ColumnKind::Field, DataType::Float64),
    ];
    // 30 series (some without a rack) of 100 rows.
    let rows: Vec<InRow> = (0..3_000i64)
        .map(|i| InRow {
            time: 1_000 * (i / 30),
            cells: vec![
                Some(Raw::S(format!("h{}", i % 30))),
                (i % 30 % 7 != 0).then(|| Raw::S(format!("r{}", i % 30 % 4))),
                Some(Raw::F((i % 13) as f64)),
            ],
        })
        .collect();
    let model = engine_rows(9, &columns, &rows);
    let write = |version: u32| {
        let path = dir.path().join(format!("v{version}.sealed"));
        let layout = Layout {
            rows_per_group: 256,
            values_per_page: 64,
            parallel: false,
            version,
        };
        let summary = write_file(&path, 9, &columns, &model, layout);
        (SealedFile::open(&path).unwrap(), summary)
    };
    let (v1, s1) = write(1);
    let (v2, s2) = write(SEALED_FORMAT_VERSION);
    let tag_pages = |f: &SealedFile| -> usize {
        f.row_groups()
            .iter()
            .map(|g| g.chunks[0].len() + g.chunks[1].len())
            .sum()
    };
    assert!(tag_pages(&v1) > 0, "version 1 keeps tag pages");
    assert_eq!(tag_pages(&v2), 0, "version 2 has none");
    assert!(s2.bytes < s1.bytes, "{} vs {} bytes", s2.bytes, s1.bytes);
    let rows1: Vec<SortedRow> = v1.rows().map(Result::unwrap).collect();
    let rows2: Vec<SortedRow> = v2.rows().map(Result::unwrap).collect();
    assert_eq!(rows1, named(&model, &columns));
    assert_eq!(rows2, named(&model, &columns));
    for projection in [
        columns.clone(),
        vec![columns[1].clone(), columns[3].clone()],
    ] {
        let req = request(i64::MIN, i64::MAX, projection, 0);
        let a = scan_all(&v1, &req).unwrap();
        let b = scan_all(&v2, &req).unwrap();
        assert_eq!(a, b);
        let racks = b.iter().map(|b| b.column(0).null_count()).sum::<usize>();
        if req.projection[0].name == "rack" {
            assert_eq!(racks, 500, "series without a rack read as null");
        }
    }
}

fn open_err(path: &Path) -> Error {
    match SealedFile::open(path) {
        Ok(_) => panic!("open of {} must fail", path.display()),
        Err(e) => e,
    }
}

#[test]
fn a_flipped_byte_in_any_page_fails_the_scan_never_a_wrong_value() {
    let dir = tempfile::tempdir().unwrap();
    let (path, columns, model) = small_file(dir.path());
    let good = std::fs::read(&path).unwrap();
    let f = SealedFile::open(&path).unwrap();
    let dir_start = f
        .row_groups()
        .last()
        .unwrap()
        .chunks
        .last()
        .unwrap()
        .last()
        .map(|p| p.offset + u64::from(p.length))
        .unwrap() as usize;
    // Tags have no pages (they come from the series keys in the directory,
    // checksummed with it): every byte between header and directory belongs
    // to a page that a full scan reads.
    assert!(
        f.row_groups().iter().all(|g| g.chunks[1].is_empty()),
        "the tag column has no pages"
    );
    let damaged = dir.path().join("damaged.sealed");
    for at in format::HEADER_LEN..dir_start {
        let mut bytes = good.clone();
        bytes[at] ^= 0x01;
        std::fs::write(&damaged, &bytes).unwrap();
        let f = SealedFile::open(&damaged).unwrap();
        let Err(e) = scan_all(&f, &request(i64::MIN, i64::MAX, columns.clone(), 0)) else {
            panic!("byte {at}: a damaged page was read without an error");
        };
        let msg = e.to_string();
        assert!(
            matches!(
                e,
                Error::Corrupt {
                    partition_id: 5,
                    ..
                }
            ),
            "byte {at}: {msg}"
        );
        assert!(
            msg.contains("damaged.sealed") && msg.contains("page"),
            "byte {at}: {msg}"
        );
        let rows: Vec<_> = f.rows().collect();
        assert!(
            rows.last().unwrap().is_err(),
            "byte {at}: rows() must end in an error"
        );
        for (i, r) in rows.iter().enumerate() {
            if let Ok(r) = r {
                assert_eq!(
                    r,
                    &named(&model[i..=i], &columns)[0],
                    "byte {at}: rows() returned a wrong row"
                );
            }
        }
    }
}

#[test]
fn a_flipped_byte_in_header_directory_or_footer_fails_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _, _) = small_file(dir.path());
    let good = std::fs::read(&path).unwrap();
    let f = SealedFile::open(&path).unwrap();
    let dir_start = f
        .row_groups()
        .last()
        .unwrap()
        .chunks
        .last()
        .unwrap()
        .last()
        .map(|p| p.offset + u64::from(p.length))
        .unwrap() as usize;
    drop(f);
    let damaged = dir.path().join("damaged.sealed");
    let positions = (0..format::HEADER_LEN).chain(dir_start..good.len());
    for at in positions {
        let mut bytes = good.clone();
        bytes[at] ^= 0x01;
        std::fs::write(&damaged, &bytes).unwrap();
        let e = open_err(&damaged);
        assert!(matches!(e, Error::Corrupt { .. }), "byte {at}: {e}");
        assert!(e.to_string().contains("damaged.sealed"), "byte {at}: {e}");
    }
}

#[test]
fn truncation_wrong_magic_and_unknown_version_fail_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _, _) = small_file(dir.path());
    let good = std::fs::read(&path).unwrap();
    let damaged = dir.path().join("damaged.sealed");
    for keep in [
        0,
        10,
        format::HEADER_LEN + format::FOOTER_LEN - 1,
        good.len() / 2,
        good.len() - 1,
    ] {
        std::fs::write(&damaged, &good[..keep]).unwrap();
        let e = open_err(&damaged);
        assert!(
            e.to_string().contains("damaged.sealed"),
            "truncated to {keep}: {e}"
        );
    }
    // Wrong magic at both ends.
    let mut bytes = good.clone();
    bytes[0..4].copy_from_slice(b"PAR1");
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(b"PAR1");
    std::fs::write(&damaged, &bytes).unwrap();
    let e = open_err(&damaged);
    assert!(e.to_string().contains("magic"), "{e}");
    // A future version, with valid checksums.
    let future = SEALED_FORMAT_VERSION + 1;
    let mut header: [u8; format::HEADER_LEN] = good[..format::HEADER_LEN].try_into().unwrap();
    header[4..8].copy_from_slice(&future.to_le_bytes());
    let crc = crc32c::crc32c(&header[..20]);
    header[20..24].copy_from_slice(&crc.to_le_bytes());
    let mut footer: [u8; format::FOOTER_LEN] = good[n - format::FOOTER_LEN..].try_into().unwrap();
    footer[20..24].copy_from_slice(&future.to_le_bytes());
    let crc = crc32c::crc32c(&footer[..32]);
    footer[32..36].copy_from_slice(&crc.to_le_bytes());
    let mut bytes = good.clone();
    bytes[..format::HEADER_LEN].copy_from_slice(&header);
    bytes[n - format::FOOTER_LEN..].copy_from_slice(&footer);
    std::fs::write(&damaged, &bytes).unwrap();
    let e = open_err(&damaged);
    assert!(
        e.to_string()
            .contains(&format!("unsupported sealed format version {future}")),
        "{e}"
    );
    assert!(
        matches!(
            e,
            Error::Corrupt {
                partition_id: 5,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_file_truncated_after_open_is_an_error_naming_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let (path, columns, _) = small_file(dir.path());
    let f = SealedFile::open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    let e = scan_all(&f, &request(i64::MIN, i64::MAX, columns, 0)).unwrap_err();
    assert!(
        matches!(e, Error::Corrupt { .. }) && e.to_string().contains("page"),
        "{e}"
    );
}

// ---------- the writer's contract ----------

#[test]
fn rows_out_of_order_or_unknown_fields_are_refused_and_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let columns = vec![
        time_col(),
        col("host", ColumnKind::Tag, DataType::String),
        col("v", ColumnKind::Field, DataType::Float64),
    ];
    let rows: Vec<InRow> = (0..3)
        .map(|i| InRow {
            time: i,
            cells: vec![
                Some(Raw::S(if i == 2 {
                    "long-host".into()
                } else {
                    "h".into()
                })),
                Some(Raw::F(1.0)),
            ],
        })
        .collect();
    let model = engine_rows(1, &columns, &rows);
    let path = dir.path().join("p.sealed");
    for bad in [
        vec![model[1].clone(), model[0].clone()], // time goes back
        vec![model[0].clone(), model[0].clone()], // duplicate key
        vec![model[2].clone(), model[0].clone()], // longer series key first
    ] {
        let e = write_sealed(&path, 1, &columns, bad.into_iter().map(Ok)).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        assert!(!path.exists());
    }
    // A field the columns do not have.
    let e = write_sealed(&path, 1, &columns[..2], model.iter().cloned().map(Ok)).unwrap_err();
    assert!(
        e.to_string()
            .contains("no field among the table's 2 columns"),
        "{e}"
    );
    let e = write_sealed(
        &path,
        1,
        &columns[..2],
        named(&model, &columns).into_iter().map(Ok),
    )
    .unwrap_err();
    assert!(e.to_string().contains("\"v\""), "{e}");
    assert!(!path.exists());
    // A field of the wrong type.
    let wrong = vec![
        time_col(),
        col("host", ColumnKind::Tag, DataType::String),
        col("v", ColumnKind::Field, DataType::Int64),
    ];
    let e = write_sealed(&path, 1, &wrong, model.iter().cloned().map(Ok)).unwrap_err();
    assert!(e.to_string().contains("\"v\" holds"), "{e}");
    assert!(!path.exists());
    // A row value cut short, and a field name that is not UTF-8 (the value
    // is version byte, name length, name "v", type, payload), in a later row
    // than the first, whose field names the writer has then seen.
    let mut cut = model[1].clone();
    cut.value.truncate(cut.value.len() - 3);
    let mut not_utf8 = named(&model[1..2], &columns).remove(0);
    assert_eq!(not_utf8.value[3], b'v');
    not_utf8.value[3] = 0xff;
    for (bad, says) in [(cut, "bad row value"), (not_utf8, "not UTF-8")] {
        let rows = vec![named(&model[..1], &columns).remove(0), bad];
        let e = write_sealed(&path, 1, &columns, rows.into_iter().map(Ok)).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains(says), "{e}");
        assert!(!path.exists());
    }
    // An error from the row source.
    let e = write_sealed(
        &path,
        1,
        &columns,
        vec![Ok(model[0].clone()), Err(Error::Internal("boom".into()))].into_iter(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("boom"));
    assert!(!path.exists());
    // create_new: an existing file is not overwritten.
    std::fs::write(&path, b"x").unwrap();
    assert!(write_sealed(&path, 1, &columns, model.iter().cloned().map(Ok)).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"x");
}

// ---------- missing columns ----------

#[test]
fn projected_columns_the_file_lacks_come_back_null_of_their_type() {
    let dir = tempfile::tempdir().unwrap();
    let (path, columns, model) = small_file(dir.path());
    let f = SealedFile::open(&path).unwrap();
    let mut projection = vec![
        columns[2].clone(),
        col("region", ColumnKind::Tag, DataType::String),
    ];
    for (i, t) in FIELD_TYPES.iter().enumerate() {
        projection.push(col(&format!("new{i}"), ColumnKind::Field, *t));
    }
    let batches = scan_all(&f, &request(0, 5_000, projection.clone(), 0)).unwrap();
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, model.iter().filter(|r| r.time_ns < 5_000).count());
    for b in &batches {
        assert_eq!(b.schema(), arrow_schema(&projection));
        for (k, c) in projection.iter().enumerate().skip(1) {
            assert_eq!(
                b.column(k).null_count(),
                b.num_rows(),
                "column {:?}",
                c.name
            );
        }
    }
    check_scan(&f, &model, &columns, &request(0, 5_000, projection, 0));
    // The same name with another type is an error, not a silent reinterpretation.
    let e = scan_all(
        &f,
        &request(
            0,
            5_000,
            vec![col("v", ColumnKind::Field, DataType::Int64)],
            0,
        ),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
}

// ---------- tag filters ----------

#[test]
fn tag_filters_have_no_false_negatives_few_false_positives_and_stay_small() {
    let mut values = BTreeMap::new();
    values.insert(
        "host".to_string(),
        (0..1000)
            .map(|i| format!("host_{i}"))
            .collect::<BTreeSet<_>>(),
    );
    values.insert(
        "region".to_string(),
        ["eu-west-1", "us-east-1"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    );
    values.insert("empty".to_string(), BTreeSet::new());
    let bytes = TagFilters::build(&values).to_bytes();
    let f = TagFilters::from_bytes(&bytes).unwrap();
    // About 1.2 bytes per value at this size (binary fuse needs ~1.13 asymptotically).
    assert!(bytes.len() < 1600, "{} bytes for 1,002 values", bytes.len());
    for i in 0..1000 {
        assert!(f.may_contain("host", &format!("host_{i}")));
    }
    let fp = (0..10_000)
        .filter(|i| f.may_contain("host", &format!("other_{i}")))
        .count();
    assert!(fp < 100, "{fp} false positives in 10,000");
    assert!(f.may_contain("region", "eu-west-1") && !f.may_contain("region", "ap-south-1"));
    assert!(!f.may_contain("empty", "") && !f.may_contain("nope", "x"));
    assert_eq!(f.distinct_values("host"), 1000);
    assert_eq!(f.tags().collect::<Vec<_>>(), vec!["host", "region"]);
    // A damaged filter is refused.
    let mut bad = bytes.clone();
    bad[10] ^= 1;
    assert!(TagFilters::from_bytes(&bad).is_err());
    assert!(TagFilters::from_bytes(&bytes[..bytes.len() - 1]).is_err());
}

#[test]
fn sealed_files_are_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SealedFile>();
    let dir = tempfile::tempdir().unwrap();
    let (path, columns, model) = small_file(dir.path());
    let f = Arc::new(SealedFile::open(&path).unwrap());
    std::thread::scope(|s| {
        for _ in 0..2 {
            let f = f.clone();
            let (columns, model) = (&columns, &model);
            s.spawn(move || {
                check_scan(
                    &f,
                    model,
                    columns,
                    &request(i64::MIN, i64::MAX, columns.clone(), 0),
                )
            });
        }
    });
}

// ---------- size report ----------

/// One day of 10 hosts at 10 s (8,640 rows each), two tags and ten
/// integer-valued float fields that random-walk in 0..=100 like TSBS cpu.
/// Prints the file size; run with
/// `cargo test --workspace --lib sealed::tests::size_of_one_day_of_ten_hosts -- --nocapture`.
#[test]
fn size_of_one_day_of_ten_hosts() {
    let mut columns = vec![
        time_col(),
        col("hostname", ColumnKind::Tag, DataType::String),
        col("region", ColumnKind::Tag, DataType::String),
    ];
    let names = [
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
    columns.extend(
        names
            .iter()
            .map(|n| col(n, ColumnKind::Field, DataType::Float64)),
    );
    let day0 = 1_700_006_400_000_000_000i64;
    let step = 10_000_000_000i64;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut rows = Vec::with_capacity(86_400);
    for h in 0..10 {
        let mut v = [50i64; 10];
        for i in 0..8_640 {
            let mut cells = vec![
                Some(Raw::S(format!("host_{h}"))),
                Some(Raw::S(
                    ["eu-west-1", "us-east-1", "ap-south-1"][h % 3].into(),
                )),
            ];
            for x in &mut v {
                *x = (*x + (rand() % 11) as i64 - 5).clamp(0, 100);
                cells.push(Some(Raw::F(*x as f64)));
            }
            rows.push(InRow {
                time: day0 + i * step,
                cells,
            });
        }
    }
    let model = engine_rows(1, &columns, &rows);
    assert_eq!(model.len(), 86_400);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("day.sealed");
    let s = write_sealed(&path, 1, &columns, model.iter().cloned().map(Ok)).unwrap();
    let f = SealedFile::open(&path).unwrap();
    let filters = f.tag_filter_bytes().len();
    let per_row = s.bytes as f64 / s.rows as f64;
    println!(
        "sealed size: {} rows, {} bytes, {:.3} bytes/row, {:.3} bytes/field value (10 fields; time and tags included), \
         {} row groups, tag filters {} bytes",
        s.rows,
        s.bytes,
        per_row,
        per_row / 10.0,
        s.row_groups,
        filters
    );
    let mut pages = 0u64;
    for (c, column) in columns.iter().enumerate() {
        let (n, b): (usize, u64) = f
            .row_groups()
            .iter()
            .flat_map(|g| g.chunks[c].iter())
            .fold((0, 0), |(n, b), p| (n + 1, b + u64::from(p.length)));
        pages += b;
        println!(
            "  column {:<16} {n:>3} pages {b:>7} bytes  {:.3} bytes/value",
            column.name,
            b as f64 / s.rows as f64
        );
    }
    println!(
        "  header+footer {} bytes, directory {} bytes",
        format::HEADER_LEN + format::FOOTER_LEN,
        s.bytes - pages - (format::HEADER_LEN + format::FOOTER_LEN) as u64
    );
    assert_eq!(s.rows, 86_400);
    // A guard against regressions: raw f64s alone would be 80 bytes/row.
    assert!(per_row < 20.0, "{per_row} bytes/row");
    check_scan(
        &f,
        &model,
        &columns,
        &request(day0, day0 + 3_600 * 1_000_000_000, columns.clone(), 0),
    );
}
