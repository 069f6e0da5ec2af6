//! Writes a sealed file from rows in engine key order.
//!
//! One row group (8,192 rows) is buffered at a time, column by column; when
//! it is full its columns are encoded (in parallel, one column per worker)
//! and appended to the file, and only their directory entries are kept. The
//! directory (row groups, series, tag filters) is written last, then the
//! footer, then the file is synced.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

use prost::Message;
use sealion_common::proto::Column;

use super::filter::TagFilters;
use super::format::{
    self, ChunkEntry, Directory, Footer, MAX_DIRECTORY_TEXT_STAT, PageEntry, RowGroupEntry,
    SEALED_FORMAT_VERSION, SeriesEntry, Stat, series_cmp, stat,
};
use super::value::{self, ChunkRole, ChunkSpec, FieldRef};
use super::{SealedSummary, SortedRow};
use crate::columnar::{
    self, ColumnType, ColumnValues, EncodeOptions, MAX_PAGE_VALUES, Page, StatValue,
};
use crate::rows::{Value, decode_fields, decode_series, for_each_field_value};
use crate::{Error, Result};

/// Text pages are cut before their values pass this many bytes, far below
/// the codec's payload limit, so that a page of long strings still encodes.
const MAX_TEXT_PAGE_BYTES: usize = 8 << 20;

/// Row group and page sizes. The file format allows any sizes (the directory
/// records them); production writes [`Layout::default`], tests use small
/// ones to get many groups and pages from few rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub rows_per_group: usize,
    pub values_per_page: usize,
    /// Encode the columns of a row group on several threads.
    pub parallel: bool,
    /// The format version to write: [`SEALED_FORMAT_VERSION`], or 1 (tag
    /// pages included) to test that files written before version 2 read
    /// the same.
    pub version: u32,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            rows_per_group: super::ROWS_PER_GROUP,
            values_per_page: MAX_PAGE_VALUES,
            parallel: true,
            version: SEALED_FORMAT_VERSION,
        }
    }
}

/// Writes the sealed file of `partition_id` at `path` from `rows`, which must
/// be in engine key order (series key length, series key bytes, time), each
/// (series, time) once. The file is created with `create_new` (an existing
/// file is an error), synced before this returns, and removed again if
/// writing fails. The caller renames it into place and syncs the directory.
///
/// `columns` are the table's columns: exactly one time column, tags of text
/// type. Every field in the rows must be one of them, with its type. Tags in
/// a series key that are not columns are kept in the series key (and in the
/// tag filters) but get no column chunk.
///
/// No rows make a valid file with 0 rows, 0 row groups, and
/// `min_time_ns = i64::MAX`, `max_time_ns = i64::MIN`.
pub fn write_sealed(
    path: &Path,
    partition_id: u64,
    columns: &[Column],
    rows: impl Iterator<Item = Result<SortedRow>>,
) -> Result<SealedSummary> {
    write_sealed_with(path, partition_id, columns, rows, Layout::default())
}

pub(crate) fn write_sealed_with(
    path: &Path,
    partition_id: u64,
    columns: &[Column],
    rows: impl Iterator<Item = Result<SortedRow>>,
    layout: Layout,
) -> Result<SealedSummary> {
    let invalid = |msg: String| {
        Error::Invalid(format!(
            "sealing partition {partition_id} into {}: {msg}",
            path.display()
        ))
    };
    if layout.rows_per_group == 0
        || layout.values_per_page == 0
        || layout.values_per_page > MAX_PAGE_VALUES
        || layout.rows_per_group > super::MAX_ROWS_PER_GROUP
        || !(format::OLDEST_READABLE_VERSION..=SEALED_FORMAT_VERSION).contains(&layout.version)
    {
        return Err(invalid(format!("bad layout {layout:?}")));
    }
    let specs = value::chunk_specs(columns).map_err(invalid)?;
    let file = OpenOptions::new().write(true).create_new(true).open(path)?;
    let result = (|| {
        let mut w = Writer::new(path, partition_id, columns, specs, layout, file)?;
        for row in rows {
            w.push(row?)?;
        }
        w.finish()
    })();
    if result.is_err() {
        // Best effort: the caller never sees a half-written file at `path`.
        let _ = std::fs::remove_file(path);
    }
    result
}

/// The values of one column chunk of the row group being built.
enum Buf {
    I(Vec<i64>),
    U(Vec<u64>),
    F(Vec<f64>),
    B(Vec<bool>),
    T(Vec<String>),
}

struct ChunkBuf {
    ty: ColumnType,
    values: Buf,
    nulls: Vec<bool>,
    null_count: usize,
}

impl ChunkBuf {
    fn new(ty: ColumnType, cap: usize) -> Self {
        let values = match ty {
            ColumnType::Timestamp | ColumnType::Int64 => Buf::I(Vec::with_capacity(cap)),
            ColumnType::UInt64 => Buf::U(Vec::with_capacity(cap)),
            ColumnType::Float64 => Buf::F(Vec::with_capacity(cap)),
            ColumnType::Bool => Buf::B(Vec::with_capacity(cap)),
            ColumnType::Text => Buf::T(Vec::with_capacity(cap)),
        };
        ChunkBuf {
            ty,
            values,
            nulls: Vec::with_capacity(cap),
            null_count: 0,
        }
    }

    fn clear(&mut self) {
        match &mut self.values {
            Buf::I(v) => v.clear(),
            Buf::U(v) => v.clear(),
            Buf::F(v) => v.clear(),
            Buf::B(v) => v.clear(),
            Buf::T(v) => v.clear(),
        }
        self.nulls.clear();
        self.null_count = 0;
    }

    fn len(&self) -> usize {
        self.nulls.len()
    }

    fn push_null(&mut self) {
        match &mut self.values {
            Buf::I(v) => v.push(0),
            Buf::U(v) => v.push(0),
            Buf::F(v) => v.push(0.0),
            Buf::B(v) => v.push(false),
            Buf::T(v) => v.push(String::new()),
        }
        self.nulls.push(true);
        self.null_count += 1;
    }

    fn push_time(&mut self, t: i64) {
        if let Buf::I(v) = &mut self.values {
            v.push(t);
            self.nulls.push(false);
        }
    }

    fn push_text(&mut self, s: Option<&str>) {
        match (s, &mut self.values) {
            (Some(s), Buf::T(v)) => {
                v.push(s.to_string());
                self.nulls.push(false);
            }
            _ => self.push_null(),
        }
    }

    /// Pushes a field value; the caller has checked that it fits the type.
    fn push_value(&mut self, v: Value) {
        match (v, &mut self.values) {
            (Value::F64(x), Buf::F(vs)) => vs.push(x),
            (Value::I64(x), Buf::I(vs)) => vs.push(x),
            (Value::U64(x), Buf::U(vs)) => vs.push(x),
            (Value::Bool(x), Buf::B(vs)) => vs.push(x),
            (Value::Str(x), Buf::T(vs)) => vs.push(x),
            _ => return self.push_null(),
        }
        self.nulls.push(false);
    }

    /// Rows `[a, b)` as a page.
    fn page(&self, a: usize, b: usize) -> Page {
        let values = match &self.values {
            Buf::I(v) if self.ty == ColumnType::Timestamp => {
                ColumnValues::Timestamp(v[a..b].to_vec())
            }
            Buf::I(v) => ColumnValues::Int64(v[a..b].to_vec()),
            Buf::U(v) => ColumnValues::UInt64(v[a..b].to_vec()),
            Buf::F(v) => ColumnValues::Float64(v[a..b].to_vec()),
            Buf::B(v) => ColumnValues::Bool(v[a..b].to_vec()),
            Buf::T(v) => ColumnValues::Text(v[a..b].to_vec()),
        };
        let nulls = &self.nulls[a..b];
        if self.null_count > 0 && nulls.iter().any(|&n| n) {
            Page::with_nulls(values, nulls.to_vec())
        } else {
            Page::new(values)
        }
    }

    /// Where pages end: every `per_page` rows, earlier for long text.
    fn page_bounds(&self, per_page: usize) -> Vec<(usize, usize)> {
        let n = self.len();
        let mut out = Vec::with_capacity(n.div_ceil(per_page));
        let mut start = 0;
        match &self.values {
            Buf::T(v) => {
                let mut bytes = 0usize;
                for (i, s) in v.iter().enumerate() {
                    let len = s.len() + 8;
                    if i > start && (i - start == per_page || bytes + len > MAX_TEXT_PAGE_BYTES) {
                        out.push((start, i));
                        start = i;
                        bytes = 0;
                    }
                    bytes += len;
                }
            }
            _ => {
                while n - start > per_page {
                    out.push((start, start + per_page));
                    start += per_page;
                }
            }
        }
        if start < n {
            out.push((start, n));
        }
        out
    }
}

fn stat_of(v: Option<StatValue>) -> Option<Stat> {
    let value = match v? {
        StatValue::Timestamp(x) | StatValue::Int64(x) => stat::Value::Int(x),
        StatValue::UInt64(x) => stat::Value::UInt(x),
        // Integer-valued floats (TSBS-style metrics) as a short varint; the
        // conversion is exact both ways (|x| <= 2^53, not -0.0).
        StatValue::Float64(x)
            if x.fract() == 0.0
                && x.abs() <= (1u64 << 53) as f64
                && !(x == 0.0 && x.is_sign_negative()) =>
        {
            stat::Value::Int(x as i64)
        }
        StatValue::Float64(x) => stat::Value::Float(x),
        StatValue::Bool(x) => stat::Value::Bool(x),
        StatValue::Text(s) if s.len() <= MAX_DIRECTORY_TEXT_STAT => stat::Value::Text(s),
        StatValue::Text(_) => return None,
    };
    Some(Stat { value: Some(value) })
}

struct EncodedPage {
    bytes: Vec<u8>,
    entry: PageEntry,
}

fn encode_range(buf: &ChunkBuf, a: usize, b: usize) -> columnar::Result<EncodedPage> {
    let bytes = columnar::encode_page(&buf.page(a, b), &EncodeOptions::default())?;
    let stats = columnar::page_header(&bytes)?.stats;
    let entry = PageEntry {
        length: bytes.len() as u32,
        rows: stats.count as u32,
        null_count: stats.null_count as u32,
        min: stat_of(stats.min),
        max: stat_of(stats.max),
    };
    Ok(EncodedPage { bytes, entry })
}

fn encode_chunk(buf: &ChunkBuf, per_page: usize) -> columnar::Result<Vec<EncodedPage>> {
    buf.page_bounds(per_page)
        .into_iter()
        .map(|(a, b)| encode_range(buf, a, b))
        .collect()
}

/// Encodes the time chunk. Times are regular within a series but jump back
/// at each new series, and one jump widens a whole page's deltas (a page of
/// regular 10 s times is 61 bytes; one spanning two series, about 8 KiB).
/// So a page that would contain a series start is also tried cut at the
/// last series start inside it, and the cut is kept when it costs fewer
/// bytes per row. `series_starts` are the group's rows where a series
/// begins, ascending.
fn encode_time_chunk(
    buf: &ChunkBuf,
    per_page: usize,
    series_starts: &[usize],
) -> columnar::Result<Vec<EncodedPage>> {
    let n = buf.len();
    let mut out = Vec::with_capacity(n.div_ceil(per_page));
    let mut start = 0;
    while start < n {
        let end = (start + per_page).min(n);
        let whole = encode_range(buf, start, end)?;
        let cut = series_starts.iter().rev().find(|&&b| b > start && b < end);
        if let Some(&cut) = cut {
            let part = encode_range(buf, start, cut)?;
            if part.bytes.len() * (end - start) < whole.bytes.len() * (cut - start) {
                out.push(part);
                start = cut;
                continue;
            }
        }
        out.push(whole);
        start = end;
    }
    Ok(out)
}

struct CurrentSeries {
    key: Vec<u8>,
    first_row: u64,
    rows: u64,
    last_time: i64,
    last_value: Vec<u8>,
    /// The series' value of each tag chunk (indexed like `Writer::tag_chunks`),
    /// kept only when the format has tag pages.
    tags: Vec<Option<String>>,
}

struct Writer<'a> {
    path: &'a Path,
    partition_id: u64,
    /// The table's columns, which name the fields of the rows.
    columns: &'a [Column],
    specs: Vec<ChunkSpec>,
    layout: Layout,
    out: BufWriter<File>,
    offset: u64,
    time_chunk: usize,
    /// Chunk index of each tag column that gets pages (none from format
    /// version 2 on: tags come from the series keys).
    tag_chunks: Vec<usize>,
    /// Field name -> chunk index.
    fields: HashMap<String, usize>,
    /// The previous row's fields (name, chunk), in its order.
    last_fields: Vec<(String, usize)>,
    /// This row's value of each chunk (fields only), reused across rows.
    slots: Vec<Option<Value>>,
    chunks: Vec<ChunkBuf>,
    group_rows: usize,
    /// Rows of the group being built where a new series starts (not 0).
    group_series_starts: Vec<usize>,
    group_first: (u64, i64),
    group_last: (u64, i64),
    group_min: i64,
    group_max: i64,
    current: Option<CurrentSeries>,
    dir: Directory,
    tag_values: BTreeMap<String, BTreeSet<String>>,
}

impl<'a> Writer<'a> {
    fn new(
        path: &'a Path,
        partition_id: u64,
        columns: &'a [Column],
        specs: Vec<ChunkSpec>,
        layout: Layout,
        file: File,
    ) -> Result<Self> {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&format::encode_header(partition_id, layout.version))?;
        let time_chunk = specs
            .iter()
            .position(|s| s.role == ChunkRole::Time)
            .ok_or_else(|| Error::Internal("no time column".into()))?;
        let tag_chunks: Vec<usize> = match format::has_tag_pages(layout.version) {
            true => specs
                .iter()
                .enumerate()
                .filter(|(_, s)| s.role == ChunkRole::Tag)
                .map(|(i, _)| i)
                .collect(),
            false => Vec::new(),
        };
        let fields = specs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.role == ChunkRole::Field)
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let cap = layout.rows_per_group.min(super::ROWS_PER_GROUP);
        // Tag chunks without pages (format version 2) stay empty.
        let chunks = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let pages = s.role != ChunkRole::Tag || tag_chunks.contains(&i);
                ChunkBuf::new(s.ty, if pages { cap } else { 0 })
            })
            .collect();
        Ok(Writer {
            path,
            partition_id,
            columns,
            slots: vec![None; specs.len()],
            specs,
            layout,
            out,
            offset: format::HEADER_LEN as u64,
            time_chunk,
            tag_chunks,
            fields,
            last_fields: Vec::new(),
            chunks,
            group_rows: 0,
            group_series_starts: Vec::new(),
            group_first: (0, 0),
            group_last: (0, 0),
            group_min: i64::MAX,
            group_max: i64::MIN,
            current: None,
            dir: Directory {
                format_version: layout.version,
                partition_id,
                columns: columns.to_vec(),
                rows: 0,
                min_time_ns: i64::MAX,
                max_time_ns: i64::MIN,
                ..Default::default()
            },
            tag_values: BTreeMap::new(),
        })
    }

    fn invalid(&self, msg: String) -> Error {
        Error::Invalid(format!(
            "sealing partition {} into {}: {msg}",
            self.partition_id,
            self.path.display()
        ))
    }

    fn corrupt(&self, msg: String) -> Error {
        Error::Corrupt {
            partition_id: self.partition_id,
            reason: format!("while sealing into {}: {msg}", self.path.display()),
        }
    }

    fn push(&mut self, row: SortedRow) -> Result<()> {
        let SortedRow {
            series,
            time_ns,
            value,
        } = row;
        let row_index = self.dir.rows;
        let new_series = match &self.current {
            Some(cur) if cur.key == series => {
                if time_ns <= cur.last_time {
                    return Err(self.invalid(format!(
                        "row {row_index}: time {time_ns} does not follow {} in the same series \
                         (rows must be sorted by series, then time, each once)",
                        cur.last_time
                    )));
                }
                false
            }
            Some(cur) => {
                if series_cmp(&series, &cur.key) != Ordering::Greater {
                    return Err(self.invalid(format!(
                        "row {row_index}: series key is not after the previous one \
                         (rows must be sorted by series key length, then bytes)"
                    )));
                }
                true
            }
            None => true,
        };
        if new_series {
            self.finish_series()?;
            self.start_series(series, row_index)?;
            if self.group_rows > 0 {
                self.group_series_starts.push(self.group_rows);
            }
        }

        // Any error aborts the whole write, so nothing needs undoing.
        let mut failed = None;
        let mut j = 0;
        let columns = self.columns;
        let well_formed = for_each_field_value(&value, columns, |name, v| {
            let Some(name) = name else {
                failed = Some(self.invalid(format!(
                    "row {row_index}: a field names no field among the table's {} columns",
                    columns.len()
                )));
                return false;
            };
            match self.field_chunk(j, name, &v, row_index) {
                Ok(chunk) => {
                    self.slots[chunk] = Some(v);
                    j += 1;
                    true
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if !well_formed {
            return Err(self.corrupt(format!("row {row_index}: bad row value")));
        }

        let Some(cur) = self.current.as_mut() else {
            return Err(Error::Internal("no current series".into()));
        };
        let series_index = self.dir.series.len() as u64;
        self.chunks[self.time_chunk].push_time(time_ns);
        for (i, &c) in self.tag_chunks.iter().enumerate() {
            self.chunks[c].push_text(cur.tags[i].as_deref());
        }
        for (c, spec) in self.specs.iter().enumerate() {
            if spec.role == ChunkRole::Field {
                match self.slots[c].take() {
                    Some(v) => self.chunks[c].push_value(v),
                    None => self.chunks[c].push_null(),
                }
            }
        }
        cur.rows += 1;
        cur.last_time = time_ns;
        cur.last_value = value;

        if self.group_rows == 0 {
            self.group_first = (series_index, time_ns);
        }
        self.group_last = (series_index, time_ns);
        self.group_rows += 1;
        self.group_min = self.group_min.min(time_ns);
        self.group_max = self.group_max.max(time_ns);
        self.dir.rows += 1;
        self.dir.min_time_ns = self.dir.min_time_ns.min(time_ns);
        self.dir.max_time_ns = self.dir.max_time_ns.max(time_ns);
        if self.group_rows == self.layout.rows_per_group {
            self.flush_group()?;
        }
        Ok(())
    }

    /// The chunk of the `j`th field of a row, named `name` and holding `v`;
    /// an error when it is not a column of the table or not of its type.
    fn field_chunk(&mut self, j: usize, name: &[u8], v: &Value, row_index: u64) -> Result<usize> {
        // Rows of one table mostly list the same fields in the same order:
        // compare with the previous row's (as bytes) before anything else.
        let chunk = match self.last_fields.get(j) {
            Some((n, c)) if n.as_bytes() == name => *c,
            _ => {
                let Ok(name) = std::str::from_utf8(name) else {
                    return Err(self.corrupt(format!("row {row_index}: a field name is not UTF-8")));
                };
                let Some(&chunk) = self.fields.get(name) else {
                    return Err(self.invalid(format!(
                        "row {row_index}: field {name:?} is not a column of the table"
                    )));
                };
                self.last_fields.truncate(j);
                self.last_fields.push((name.to_string(), chunk));
                chunk
            }
        };
        if !value::value_fits(v, self.specs[chunk].ty) {
            return Err(self.invalid(format!(
                "row {row_index}: field {:?} holds {v:?}, the column is {:?}",
                String::from_utf8_lossy(name),
                self.specs[chunk].ty
            )));
        }
        Ok(chunk)
    }

    fn start_series(&mut self, key: Vec<u8>, first_row: u64) -> Result<()> {
        let tags = decode_series(&key)
            .ok_or_else(|| self.corrupt(format!("row {first_row}: bad series key")))?;
        for (name, v) in &tags {
            self.tag_values
                .entry((*name).to_string())
                .or_default()
                .insert((*v).to_string());
        }
        let values = self
            .tag_chunks
            .iter()
            .map(|&c| {
                tags.iter()
                    .find(|(n, _)| *n == self.specs[c].name)
                    .map(|(_, v)| (*v).to_string())
            })
            .collect();
        self.current = Some(CurrentSeries {
            key,
            first_row,
            rows: 0,
            last_time: i64::MIN,
            last_value: Vec::new(),
            tags: values,
        });
        Ok(())
    }

    /// Records the current series in the directory, its last row's fields
    /// rewritten in column order.
    fn finish_series(&mut self) -> Result<()> {
        let Some(cur) = self.current.take() else {
            return Ok(());
        };
        let parsed = decode_fields(&cur.last_value, self.columns)
            .ok_or_else(|| self.corrupt("bad row value".into()))?;
        let mut last_value = Vec::new();
        value::start_value(&mut last_value);
        for spec in &self.specs {
            if spec.role != ChunkRole::Field {
                continue;
            }
            if let Some((name, v)) = parsed.iter().find(|(n, _)| *n == spec.name) {
                value::put_field(&mut last_value, name, FieldRef::from(v));
            }
        }
        self.dir.series.push(SeriesEntry {
            key: cur.key,
            first_row: cur.first_row,
            rows: cur.rows,
            last_time_ns: cur.last_time,
            last_value,
        });
        Ok(())
    }

    fn encode_group(&self) -> Result<Vec<Vec<EncodedPage>>> {
        let n = self.chunks.len();
        let per_page = self.layout.values_per_page;
        let (time_chunk, starts) = (self.time_chunk, self.group_series_starts.as_slice());
        let encode = |i: usize, chunk: &ChunkBuf| {
            if i == time_chunk {
                encode_time_chunk(chunk, per_page, starts)
            } else {
                encode_chunk(chunk, per_page)
            }
        };
        let threads = if self.layout.parallel && self.group_rows >= 1024 {
            std::thread::available_parallelism()
                .map(|p| p.get())
                .unwrap_or(1)
                .min(n)
        } else {
            1
        };
        let mut results: Vec<Option<columnar::Result<Vec<EncodedPage>>>> =
            (0..n).map(|_| None).collect();
        if threads <= 1 {
            for (i, (slot, chunk)) in results.iter_mut().zip(&self.chunks).enumerate() {
                *slot = Some(encode(i, chunk));
            }
        } else {
            let next = AtomicUsize::new(0);
            let chunks = &self.chunks;
            let done: Vec<Vec<(usize, columnar::Result<Vec<EncodedPage>>)>> =
                std::thread::scope(|s| {
                    let workers: Vec<_> = (0..threads)
                        .map(|_| {
                            s.spawn(|| {
                                let mut mine = Vec::new();
                                loop {
                                    let i = next.fetch_add(1, AtomicOrdering::Relaxed);
                                    if i >= n {
                                        break;
                                    }
                                    mine.push((i, encode(i, &chunks[i])));
                                }
                                mine
                            })
                        })
                        .collect();
                    workers
                        .into_iter()
                        .map(|w| {
                            w.join()
                                .map_err(|_| Error::Internal("column encoder panicked".into()))
                        })
                        .collect::<Result<_>>()
                })?;
            for (i, r) in done.into_iter().flatten() {
                results[i] = Some(r);
            }
        }
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.ok_or_else(|| Error::Internal("a column was not encoded".into()))?
                    .map_err(|e| {
                        Error::Internal(format!(
                            "sealing partition {}: encoding column {:?}: {e}",
                            self.partition_id, self.specs[i].name
                        ))
                    })
            })
            .collect()
    }

    fn flush_group(&mut self) -> Result<()> {
        if self.group_rows == 0 {
            return Ok(());
        }
        let encoded = self.encode_group()?;
        let mut chunks = Vec::with_capacity(encoded.len());
        for pages in encoded {
            let mut entry = ChunkEntry {
                offset: self.offset,
                pages: Vec::with_capacity(pages.len()),
            };
            for p in pages {
                self.out.write_all(&p.bytes)?;
                self.offset += p.bytes.len() as u64;
                entry.pages.push(p.entry);
            }
            chunks.push(entry);
        }
        self.dir.row_groups.push(RowGroupEntry {
            rows: self.group_rows as u32,
            first_series: self.group_first.0,
            first_time_ns: self.group_first.1,
            last_series: self.group_last.0,
            last_time_ns: self.group_last.1,
            min_time_ns: self.group_min,
            max_time_ns: self.group_max,
            chunks,
        });
        for c in &mut self.chunks {
            c.clear();
        }
        self.group_rows = 0;
        self.group_series_starts.clear();
        self.group_min = i64::MAX;
        self.group_max = i64::MIN;
        Ok(())
    }

    fn finish(mut self) -> Result<SealedSummary> {
        self.finish_series()?;
        self.flush_group()?;
        let filters = TagFilters::build(&self.tag_values);
        self.dir.tag_filters = filters.to_bytes();
        let dir = self.dir.encode_to_vec();
        let footer = Footer {
            directory_offset: self.offset,
            directory_len: dir.len() as u64,
            directory_crc: crc32c::crc32c(&dir),
            version: self.layout.version,
            partition_id: self.partition_id,
        };
        self.out.write_all(&dir)?;
        self.out.write_all(&format::encode_footer(&footer))?;
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(SealedSummary {
            rows: self.dir.rows,
            series: self.dir.series.len() as u64,
            bytes: self.offset + dir.len() as u64 + format::FOOTER_LEN as u64,
            min_time_ns: self.dir.min_time_ns,
            max_time_ns: self.dir.max_time_ns,
            row_groups: self.dir.row_groups.len() as u32,
        })
    }
}
