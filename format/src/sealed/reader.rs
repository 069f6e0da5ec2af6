//! Reads a sealed file: opens it by its footer and directory, scans row
//! groups (skipping by time, decoding only projected columns) and streams
//! every row back in file order.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use arrow::array::ArrayRef;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use prost::Message;
use sealion_common::catalog::arrow_schema;
use sealion_common::proto::{Column, ColumnKind, ScanRequest};

use super::filter::TagFilters;
use super::format::{
    self, Directory, FOOTER_LEN, HEADER_LEN, OLDEST_READABLE_VERSION, SEALED_FORMAT_VERSION, Stat,
    series_cmp, stat,
};
use super::value::{self, ChunkRole, ChunkSpec, FieldRef};
use super::{MAX_ROWS_PER_GROUP, SealedSummary, SortedRow};
use crate::columnar::{self, ColumnType, ColumnValues, MAX_PAGE_VALUES, Page, StatValue};
use crate::rows::{ColumnBuilder as Builder, decode_series};
use crate::{Error, Result};

/// One series of the file, from the directory.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesInfo {
    /// The series key, byte for byte as in the open partition.
    pub key: Vec<u8>,
    /// Index of its first row in the file.
    pub first_row: u64,
    pub rows: u64,
    /// Time of its last (newest) row.
    pub last_time_ns: i64,
    /// Its last row's fields in the open partition's value format
    /// (`rows::decode_fields`), fields in column order.
    pub last_value: Vec<u8>,
}

/// One page of one column chunk, from the directory.
#[derive(Debug, Clone, PartialEq)]
pub struct PageInfo {
    pub offset: u64,
    pub length: u32,
    /// First row of the page within its row group.
    pub first_row: u32,
    pub rows: u32,
    pub null_count: u32,
    /// `None` when every row is null, or for text over 64 bytes (the page
    /// header has it).
    pub min: Option<StatValue>,
    pub max: Option<StatValue>,
}

/// One row group, from the directory.
#[derive(Debug, Clone, PartialEq)]
pub struct RowGroupInfo {
    /// Index of its first row in the file.
    pub first_row: u64,
    pub rows: u32,
    /// First and last key: (index into [`SealedFile::series`], time).
    pub first_key: (u64, i64),
    pub last_key: (u64, i64),
    pub min_time_ns: i64,
    pub max_time_ns: i64,
    /// Pages of each column, in [`SealedFile::columns`] order.
    pub chunks: Vec<Vec<PageInfo>>,
}

/// An open sealed partition file. Cheap to share in an `Arc`: reads use
/// positional I/O and no locks.
#[derive(Debug)]
pub struct SealedFile {
    path: PathBuf,
    file: File,
    partition_id: u64,
    summary: SealedSummary,
    columns: Vec<Column>,
    specs: Vec<ChunkSpec>,
    time_chunk: usize,
    groups: Vec<RowGroupInfo>,
    series: Vec<SeriesInfo>,
    filters: TagFilters,
    filter_bytes: Vec<u8>,
    /// The series of each tag value, made from the directory's keys by the
    /// first scan that can use it (`SealedFile::series_by_tag`).
    by_tag: std::sync::OnceLock<Option<SeriesByTag>>,
    /// Pages in all, over every row group and column.
    pages: u64,
}

/// The directory's tags, decoded once per file: for each tag, its distinct
/// values, the series (indexes into the directory's series, in order) that
/// hold each value, and each series' value. A scan with `tag IN (...)`
/// finds its series here instead of decoding every series key of the file,
/// and an aggregate the directory answers reads each series' tags here.
#[derive(Debug, Default)]
pub struct SeriesByTag {
    series: usize,
    tags: std::collections::HashMap<String, TagColumn>,
}

/// One tag's values over a file's series ([`SeriesByTag::column`]).
#[derive(Debug, Default)]
pub struct TagColumn {
    /// The distinct values, by id, in the order series first hold them.
    values: Vec<String>,
    ids: std::collections::HashMap<String, u32>,
    /// Per value id, the series holding it, in directory order.
    holders: Vec<Vec<u32>>,
    /// Per series, the id of its value; `TagColumn::NULL` where its key
    /// lacks the tag.
    of_series: Vec<u32>,
}

impl TagColumn {
    /// The id of a series that lacks the tag.
    pub const NULL: u32 = u32::MAX;

    /// The distinct values, by id.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Per series, the id of its value (`TagColumn::NULL` for none).
    pub fn ids(&self) -> &[u32] {
        &self.of_series
    }

    /// The value of id `id` (None for `TagColumn::NULL`).
    pub fn value(&self, id: u32) -> Option<&str> {
        self.values.get(id as usize).map(String::as_str)
    }
}

impl SeriesByTag {
    /// The index of `series`' keys; None when a key does not decode (the
    /// scan then reads every key, and reports the bad one).
    fn build(series: &[SeriesInfo]) -> Option<SeriesByTag> {
        let n = series.len();
        let mut index = SeriesByTag {
            series: n,
            tags: std::collections::HashMap::new(),
        };
        for (i, s) in series.iter().enumerate() {
            let i = u32::try_from(i).ok()?;
            for (name, value) in decode_series(&s.key)? {
                let column = match index.tags.get_mut(name) {
                    Some(column) => column,
                    None => index
                        .tags
                        .entry(name.to_string())
                        .or_insert_with(|| TagColumn {
                            of_series: vec![TagColumn::NULL; n],
                            ..TagColumn::default()
                        }),
                };
                let id = match column.ids.get(value) {
                    Some(&id) => id,
                    None => {
                        let id = u32::try_from(column.values.len()).ok()?;
                        column.values.push(value.to_string());
                        column.ids.insert(value.to_string(), id);
                        column.holders.push(Vec::new());
                        id
                    }
                };
                column.holders[id as usize].push(i);
                column.of_series[i as usize] = id;
            }
        }
        Some(index)
    }

    /// The series whose value of `tag` is `value`, in directory order.
    pub fn series(&self, tag: &str, value: &str) -> &[u32] {
        self.tags
            .get(tag)
            .and_then(|c| {
                c.ids
                    .get(value)
                    .map(|&id| c.holders[id as usize].as_slice())
            })
            .unwrap_or(&[])
    }

    /// The values of `tag` over the file's series; None when no series of
    /// the file has the tag (every series' value is NULL).
    pub fn column(&self, tag: &str) -> Option<&TagColumn> {
        self.tags.get(tag)
    }

    /// How many series the index covers (the directory's).
    pub fn len(&self) -> usize {
        self.series
    }

    pub fn is_empty(&self) -> bool {
        self.series == 0
    }
}

thread_local! {
    /// Pages this thread has decoded, for scan counters: a scan runs on one
    /// thread and reads the difference.
    static PAGES_DECODED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Pages decoded by this thread so far.
pub fn pages_decoded() -> u64 {
    PAGES_DECODED.with(std::cell::Cell::get)
}

mod paths;

/// Selected rows of a row group as sorted disjoint ranges, and the time
/// pages decoded to find them.
type Selection = (Vec<(usize, usize)>, Vec<Option<Page>>);

/// Where a projected column's values come from.
#[derive(Debug, Clone, Copy)]
enum Source {
    Chunk(usize),
    /// A tag: constant within a series, so taken from the series key in the
    /// directory (null where the key lacks it), never from pages. Format
    /// version 1 files also hold tag pages; they are never read.
    Tag,
    /// Not in the file (added to the table after sealing): all null.
    Missing,
}

impl SealedFile {
    /// Opens the file and reads its header, footer and directory (no pages).
    /// A wrong magic, an unknown version, a checksum mismatch, a truncated
    /// file or an inconsistent directory is `Error::Corrupt` naming the file
    /// (partition id 0 when neither header nor footer can be read).
    pub fn open(path: &Path) -> Result<SealedFile> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let fail = |pid: u64, msg: String| Error::Corrupt {
            partition_id: pid,
            reason: format!("sealed file {}: {msg}", path.display()),
        };
        if len < (HEADER_LEN + FOOTER_LEN) as u64 {
            return Err(fail(
                0,
                format!("{len} bytes is shorter than a header and footer (truncated?)"),
            ));
        }
        let mut header = [0u8; HEADER_LEN];
        file.read_exact_at(&mut header, 0)?;
        let mut footer = [0u8; FOOTER_LEN];
        file.read_exact_at(&mut footer, len - FOOTER_LEN as u64)?;
        let header = format::decode_header(&header);
        let footer = format::decode_footer(&footer);
        let pid = match (&header, &footer) {
            (Ok(h), _) => h.partition_id,
            (_, Ok(f)) => f.partition_id,
            _ => 0,
        };
        let header = header.map_err(|e| fail(pid, e))?;
        let footer = footer.map_err(|e| fail(pid, e))?;
        for v in [header.version, footer.version] {
            if !(OLDEST_READABLE_VERSION..=SEALED_FORMAT_VERSION).contains(&v) {
                return Err(fail(
                    pid,
                    format!(
                        "unsupported sealed format version {v} (this build reads \
                         {OLDEST_READABLE_VERSION} to {SEALED_FORMAT_VERSION})"
                    ),
                ));
            }
        }
        if header.version != footer.version {
            return Err(fail(
                pid,
                format!(
                    "header says format version {}, footer says {}",
                    header.version, footer.version
                ),
            ));
        }
        if header.partition_id != footer.partition_id {
            return Err(fail(
                pid,
                format!(
                    "header says partition {}, footer says {}",
                    header.partition_id, footer.partition_id
                ),
            ));
        }
        let dir_end = footer
            .directory_offset
            .checked_add(footer.directory_len)
            .and_then(|e| e.checked_add(FOOTER_LEN as u64));
        if footer.directory_offset < HEADER_LEN as u64 || dir_end != Some(len) {
            return Err(fail(
                pid,
                format!(
                    "directory at {} of {} bytes does not end at the footer of a {len}-byte file (truncated?)",
                    footer.directory_offset, footer.directory_len
                ),
            ));
        }
        let mut dir_bytes = vec![0u8; footer.directory_len as usize];
        file.read_exact_at(&mut dir_bytes, footer.directory_offset)?;
        if !crate::checksum_ok(footer.directory_crc, crc32c::crc32c(&dir_bytes)) {
            return Err(fail(pid, "directory checksum mismatch".into()));
        }
        let dir = Directory::decode(dir_bytes.as_slice())
            .map_err(|e| fail(pid, format!("directory does not decode: {e}")))?;
        Self::from_directory(
            path,
            file,
            len,
            footer.directory_offset,
            footer.version,
            dir,
        )
        .map_err(|e| fail(pid, format!("inconsistent directory: {e}")))
    }

    fn from_directory(
        path: &Path,
        file: File,
        len: u64,
        dir_offset: u64,
        version: u32,
        dir: Directory,
    ) -> Result<SealedFile, String> {
        if dir.format_version != version {
            return Err(format!(
                "directory version {}, the footer says {version}",
                dir.format_version
            ));
        }
        let tag_pages = format::has_tag_pages(version);
        let specs = value::chunk_specs(&dir.columns)?;
        let time_chunk = specs
            .iter()
            .position(|s| s.role == ChunkRole::Time)
            .ok_or("no time column")?;

        let mut series = Vec::with_capacity(dir.series.len());
        let mut next_row = 0u64;
        for (i, s) in dir.series.into_iter().enumerate() {
            if s.first_row != next_row || s.rows == 0 {
                return Err(format!(
                    "series {i} starts at row {} with {} rows",
                    s.first_row, s.rows
                ));
            }
            if let Some(prev) = series.last().map(|p: &SeriesInfo| &p.key)
                && series_cmp(prev, &s.key) != std::cmp::Ordering::Less
            {
                return Err(format!("series {i} is out of order"));
            }
            next_row = next_row.checked_add(s.rows).ok_or("row count overflows")?;
            series.push(SeriesInfo {
                key: s.key,
                first_row: s.first_row,
                rows: s.rows,
                last_time_ns: s.last_time_ns,
                last_value: s.last_value,
            });
        }
        if next_row != dir.rows {
            return Err(format!(
                "series hold {next_row} rows, directory says {}",
                dir.rows
            ));
        }
        let series_of = |row: u64| series.partition_point(|s| s.first_row + s.rows <= row) as u64;

        let mut groups = Vec::with_capacity(dir.row_groups.len());
        let mut offset = HEADER_LEN as u64;
        let mut first_row = 0u64;
        for (g, rg) in dir.row_groups.into_iter().enumerate() {
            let rows = rg.rows as usize;
            if rows == 0 || rows > MAX_ROWS_PER_GROUP {
                return Err(format!("row group {g} has {rows} rows"));
            }
            if rg.chunks.len() != specs.len() {
                return Err(format!(
                    "row group {g} has {} column chunks",
                    rg.chunks.len()
                ));
            }
            let last_row = first_row + rg.rows as u64 - 1;
            if last_row >= dir.rows
                || rg.first_series != series_of(first_row)
                || rg.last_series != series_of(last_row)
                || rg.min_time_ns > rg.max_time_ns
            {
                return Err(format!("row group {g} keys disagree with the series"));
            }
            let mut chunks = Vec::with_capacity(rg.chunks.len());
            for (c, chunk) in rg.chunks.into_iter().enumerate() {
                if chunk.offset != offset {
                    return Err(format!(
                        "row group {g} column {c} starts at {}, expected {offset}",
                        chunk.offset
                    ));
                }
                let mut pages = Vec::with_capacity(chunk.pages.len());
                let mut page_row = 0u32;
                for p in chunk.pages {
                    if p.rows == 0
                        || p.rows as usize > MAX_PAGE_VALUES
                        || p.null_count > p.rows
                        || p.length == 0
                    {
                        return Err(format!(
                            "row group {g} column {c} has a page of {} rows, {} nulls, {} bytes",
                            p.rows, p.null_count, p.length
                        ));
                    }
                    if c == time_chunk && p.null_count != 0 {
                        return Err(format!("row group {g} has null times"));
                    }
                    let ty = specs[c].ty;
                    pages.push(PageInfo {
                        offset,
                        length: p.length,
                        first_row: page_row,
                        rows: p.rows,
                        null_count: p.null_count,
                        min: stat_value(p.min, ty)?,
                        max: stat_value(p.max, ty)?,
                    });
                    offset += u64::from(p.length);
                    page_row = page_row.checked_add(p.rows).ok_or("page rows overflow")?;
                }
                let expected = if specs[c].role == ChunkRole::Tag && !tag_pages {
                    0
                } else {
                    rg.rows
                };
                if page_row != expected {
                    return Err(format!(
                        "row group {g} column {c} pages hold {page_row} rows of {expected}"
                    ));
                }
                chunks.push(pages);
            }
            groups.push(RowGroupInfo {
                first_row,
                rows: rg.rows,
                first_key: (rg.first_series, rg.first_time_ns),
                last_key: (rg.last_series, rg.last_time_ns),
                min_time_ns: rg.min_time_ns,
                max_time_ns: rg.max_time_ns,
                chunks,
            });
            first_row += u64::from(rg.rows);
        }
        if first_row != dir.rows {
            return Err(format!(
                "row groups hold {first_row} rows, directory says {}",
                dir.rows
            ));
        }
        if offset != dir_offset {
            return Err(format!(
                "pages end at {offset}, directory starts at {dir_offset}"
            ));
        }
        let filters = TagFilters::from_bytes(&dir.tag_filters)?;
        let pages = groups
            .iter()
            .flat_map(|g| &g.chunks)
            .map(|c| c.len() as u64)
            .sum();
        Ok(SealedFile {
            path: path.to_path_buf(),
            file,
            partition_id: dir.partition_id,
            summary: SealedSummary {
                rows: dir.rows,
                series: series.len() as u64,
                bytes: len,
                min_time_ns: dir.min_time_ns,
                max_time_ns: dir.max_time_ns,
                row_groups: groups.len() as u32,
            },
            columns: dir.columns,
            specs,
            time_chunk,
            groups,
            series,
            filters,
            filter_bytes: dir.tag_filters,
            by_tag: std::sync::OnceLock::new(),
            pages,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn partition_id(&self) -> u64 {
        self.partition_id
    }

    pub fn summary(&self) -> &SealedSummary {
        &self.summary
    }

    /// The table's columns when the file was sealed.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Every series, in file order.
    pub fn series(&self) -> &[SeriesInfo] {
        &self.series
    }

    /// The series with this key, found by binary search in the directory.
    pub fn find_series(&self, key: &[u8]) -> Option<&SeriesInfo> {
        self.series
            .binary_search_by(|s| series_cmp(&s.key, key))
            .ok()
            .map(|i| &self.series[i])
    }

    /// A series' last row, from the directory alone (no page is read).
    pub fn last_row(&self, key: &[u8]) -> Option<SortedRow> {
        self.find_series(key).map(|s| SortedRow {
            series: s.key.clone(),
            time_ns: s.last_time_ns,
            value: s.last_value.clone(),
        })
    }

    pub fn row_groups(&self) -> &[RowGroupInfo] {
        &self.groups
    }

    /// Whether tag `tag` may hold `value`; `false` means certainly not.
    pub fn may_contain_tag(&self, tag: &str, value: &str) -> bool {
        self.filters.may_contain(tag, value)
    }

    /// The series of each tag value (made on first use and kept with the
    /// file); None when a series key in the directory does not decode.
    pub fn series_by_tag(&self) -> Option<&SeriesByTag> {
        self.by_tag
            .get_or_init(|| SeriesByTag::build(&self.series))
            .as_ref()
    }

    pub fn tag_filters(&self) -> &TagFilters {
        &self.filters
    }

    /// The serialized tag filters ([`TagFilters::from_bytes`] reads them).
    pub fn tag_filter_bytes(&self) -> &[u8] {
        &self.filter_bytes
    }

    fn page_error(&self, g: usize, c: usize, p: usize, what: impl std::fmt::Display) -> Error {
        let page = &self.groups[g].chunks[c][p];
        Error::Corrupt {
            partition_id: self.partition_id,
            reason: format!(
                "sealed file {}: row group {g}, column {:?}, page {p} (offset {}, {} bytes): {what}",
                self.path.display(),
                self.specs[c].name,
                page.offset,
                page.length
            ),
        }
    }

    /// Reads and decodes the pages of chunk `c` of group `g` that `wanted`
    /// marks, reading each run of wanted pages with one read.
    fn decode_pages(&self, g: usize, c: usize, wanted: &[bool]) -> Result<Vec<Option<Page>>> {
        let pages = &self.groups[g].chunks[c];
        let mut out: Vec<Option<Page>> = (0..pages.len()).map(|_| None).collect();
        let mut p = 0;
        while p < pages.len() {
            if !wanted[p] {
                p += 1;
                continue;
            }
            let mut q = p;
            while q + 1 < pages.len() && wanted[q + 1] {
                q += 1;
            }
            let start = pages[p].offset;
            let end = pages[q].offset + u64::from(pages[q].length);
            let mut buf = vec![0u8; (end - start) as usize];
            if let Err(e) = self.file.read_exact_at(&mut buf, start) {
                return Err(match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => {
                        self.page_error(g, c, p, "file is truncated")
                    }
                    _ => Error::Io(e),
                });
            }
            for (i, slot) in out.iter_mut().enumerate().take(q + 1).skip(p) {
                let info = &pages[i];
                let a = (info.offset - start) as usize;
                let bytes = &buf[a..a + info.length as usize];
                let page = columnar::decode_page(bytes).map_err(|e| self.page_error(g, c, i, e))?;
                PAGES_DECODED.with(|n| n.set(n.get() + 1));
                if page.len() != info.rows as usize {
                    return Err(self.page_error(
                        g,
                        c,
                        i,
                        format!("{} rows, directory says {}", page.len(), info.rows),
                    ));
                }
                if page.values.column_type() != self.specs[c].ty {
                    return Err(self.page_error(
                        g,
                        c,
                        i,
                        format!(
                            "{:?} page in a {:?} column",
                            page.values.column_type(),
                            self.specs[c].ty
                        ),
                    ));
                }
                *slot = Some(page);
            }
            p = q + 1;
        }
        Ok(out)
    }

    /// Decodes a whole chunk into one page-like column.
    fn decode_chunk(&self, g: usize, c: usize) -> Result<Page> {
        let n = self.groups[g].chunks[c].len();
        let pages = self.decode_pages(g, c, &vec![true; n])?;
        concat_pages(pages.into_iter().flatten().collect(), self.specs[c].ty)
    }

    /// The rows of group `g` with `start <= time < end`, as sorted disjoint
    /// ranges of row indexes within the group, and the time pages decoded to
    /// find them.
    fn select(&self, g: usize, start: i64, end: i64) -> Result<Selection> {
        let group = &self.groups[g];
        let pages = &group.chunks[self.time_chunk];
        if group.min_time_ns >= start && group.max_time_ns < end {
            return Ok((
                vec![(0, group.rows as usize)],
                (0..pages.len()).map(|_| None).collect(),
            ));
        }
        #[derive(Clone, Copy, PartialEq)]
        enum Fit {
            None,
            All,
            Some,
        }
        let fits: Vec<Fit> = pages
            .iter()
            .map(|p| match (&p.min, &p.max) {
                (Some(StatValue::Timestamp(lo)), Some(StatValue::Timestamp(hi))) => {
                    if *hi < start || *lo >= end {
                        Fit::None
                    } else if *lo >= start && *hi < end {
                        Fit::All
                    } else {
                        Fit::Some
                    }
                }
                _ => Fit::Some,
            })
            .collect();
        let wanted: Vec<bool> = fits.iter().map(|f| *f == Fit::Some).collect();
        let decoded = self.decode_pages(g, self.time_chunk, &wanted)?;
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        let mut push = |a: usize, b: usize| match ranges.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => ranges.push((a, b)),
        };
        for (i, p) in pages.iter().enumerate() {
            let base = p.first_row as usize;
            match fits[i] {
                Fit::None => {}
                Fit::All => push(base, base + p.rows as usize),
                Fit::Some => {
                    let Some(ColumnValues::Timestamp(times)) =
                        decoded[i].as_ref().map(|p| &p.values)
                    else {
                        return Err(Error::Internal("time page was not decoded".into()));
                    };
                    let mut run: Option<usize> = None;
                    for (j, &t) in times.iter().enumerate() {
                        let inside = t >= start && t < end;
                        match (inside, run) {
                            (true, None) => run = Some(j),
                            (false, Some(a)) => {
                                push(base + a, base + j);
                                run = None;
                            }
                            _ => {}
                        }
                    }
                    if let Some(a) = run {
                        push(base + a, base + times.len());
                    }
                }
            }
        }
        Ok((ranges, decoded))
    }

    /// The (name, value) tags of series `s` (an index into the directory's
    /// series), from its key.
    fn series_tags(&self, s: usize) -> Result<Vec<(&str, &str)>> {
        self.series
            .get(s)
            .and_then(|info| decode_series(&info.key))
            .ok_or_else(|| Error::Corrupt {
                partition_id: self.partition_id,
                reason: format!(
                    "sealed file {}: bad series key {s} in the directory",
                    self.path.display()
                ),
            })
    }

    fn source_of(&self, c: &Column) -> Result<Source> {
        let found = self
            .specs
            .iter()
            .position(|s| s.name == c.name)
            .or_else(|| (c.kind() == ColumnKind::Time).then_some(self.time_chunk));
        let Some(i) = found else {
            // A tag the file has no column for may still be in the series
            // keys (tags sealed before the table listed them).
            return Ok(if c.kind() == ColumnKind::Tag {
                Source::Tag
            } else {
                Source::Missing
            });
        };
        let want = match c.kind() {
            ColumnKind::Time => ColumnType::Timestamp,
            ColumnKind::Tag => ColumnType::Text,
            ColumnKind::Field | ColumnKind::Unspecified => value::field_type(c.data_type()),
        };
        if want != self.specs[i].ty {
            return Err(Error::Invalid(format!(
                "column {:?} is {:?} in sealed file {}, the scan asks for {want:?}",
                c.name,
                self.specs[i].ty,
                self.path.display()
            )));
        }
        if self.specs[i].role == ChunkRole::Tag {
            return Ok(Source::Tag);
        }
        Ok(Source::Chunk(i))
    }

    /// Rows with `start_ns <= time < end_ns` in file order, the projected
    /// columns (empty projection = zero-column batches carrying row counts;
    /// a column the file lacks is all null), batches of at most 8,192 rows,
    /// stopping when `emit` returns false or after `req.limit` rows (0 = no
    /// limit); predicates and other answers as `crate::scan` describes.
    /// `req.partition_ids` is not consulted; when `req.table_columns` is
    /// empty, the file's columns and the projection stand for the table.
    pub fn scan(&self, req: &ScanRequest, emit: &mut dyn FnMut(RecordBatch) -> bool) -> Result<()> {
        let mut req = req.clone();
        if req.table_columns.is_empty() {
            req.table_columns = self.columns.clone();
            for c in &req.projection {
                if !req.table_columns.iter().any(|t| t.name == c.name) {
                    req.table_columns.push(c.clone());
                }
            }
        }
        let query = crate::scan::Query::compile(&req)?;
        let mut out = crate::scan::Output::new(&query, emit);
        self.run(&mut out)?;
        out.finish()?;
        Ok(())
    }

    /// Every row in file order, one row group decoded at a time. The series
    /// key is the stored one, byte for byte; the value has the row's non-null
    /// fields in column order, in the open partition's value format.
    pub fn rows(&self) -> impl Iterator<Item = Result<SortedRow>> + '_ {
        self.rows_of_groups((0..self.groups.len()).collect())
    }

    /// The rows of the given row groups, in the order given (each group's
    /// rows in file order), decoding every field column of each.
    pub(crate) fn rows_of_groups(
        &self,
        groups: Vec<usize>,
    ) -> impl Iterator<Item = Result<SortedRow>> + '_ {
        RowsIter {
            file: self,
            groups,
            next_group: 0,
            data: None,
            pos: 0,
            series: 0,
            failed: false,
        }
    }
}

fn stat_value(s: Option<Stat>, ty: ColumnType) -> Result<Option<StatValue>, String> {
    let Some(v) = s.and_then(|s| s.value) else {
        return Ok(None);
    };
    Ok(Some(match (v, ty) {
        (stat::Value::Int(x), ColumnType::Timestamp) => StatValue::Timestamp(x),
        (stat::Value::Int(x), ColumnType::Int64) => StatValue::Int64(x),
        (stat::Value::UInt(x), ColumnType::UInt64) => StatValue::UInt64(x),
        (stat::Value::Float(x), ColumnType::Float64) => StatValue::Float64(x),
        // Integer-valued floats are stored as integers (exact below 2^53).
        (stat::Value::Int(x), ColumnType::Float64) if x.unsigned_abs() <= 1 << 53 => {
            StatValue::Float64(x as f64)
        }
        (stat::Value::Bool(x), ColumnType::Bool) => StatValue::Bool(x),
        (stat::Value::Text(x), ColumnType::Text) => StatValue::Text(x),
        (v, ty) => return Err(format!("statistic {v:?} in a {ty:?} column")),
    }))
}

/// Concatenates the pages of a chunk.
fn concat_pages(pages: Vec<Page>, ty: ColumnType) -> Result<Page> {
    let any_null = pages.iter().any(|p| p.nulls.is_some());
    let mut nulls = Vec::new();
    if any_null {
        for p in &pages {
            match &p.nulls {
                Some(n) => nulls.extend_from_slice(n),
                None => nulls.extend(std::iter::repeat_n(false, p.len())),
            }
        }
    }
    let mismatch = || Error::Internal("page type changed within a chunk".into());
    macro_rules! cat {
        ($variant:ident) => {{
            let mut all = Vec::new();
            for p in pages {
                match p.values {
                    ColumnValues::$variant(v) => all.extend(v),
                    _ => return Err(mismatch()),
                }
            }
            ColumnValues::$variant(all)
        }};
    }
    let values = match ty {
        ColumnType::Timestamp => cat!(Timestamp),
        ColumnType::Int64 => cat!(Int64),
        ColumnType::UInt64 => cat!(UInt64),
        ColumnType::Float64 => cat!(Float64),
        ColumnType::Bool => cat!(Bool),
        ColumnType::Text => cat!(Text),
    };
    Ok(Page {
        values,
        nulls: any_null.then_some(nulls),
    })
}

/// Appends rows `[a, b)` of `page` (page-local indexes).
fn append_page(builder: &mut Builder, page: &Page, a: usize, b: usize) -> Result<(), String> {
    macro_rules! put {
        ($b:expr, $v:expr) => {{
            match &page.nulls {
                None => $b.append_slice(&$v[a..b]),
                Some(n) => {
                    for i in a..b {
                        if n[i] {
                            $b.append_null()
                        } else {
                            $b.append_value($v[i])
                        }
                    }
                }
            }
        }};
    }
    match (builder, &page.values) {
        (Builder::Time(bl), ColumnValues::Timestamp(v)) => put!(bl, v),
        (Builder::I64(bl), ColumnValues::Int64(v)) => put!(bl, v),
        (Builder::U64(bl), ColumnValues::UInt64(v)) => put!(bl, v),
        (Builder::F64(bl), ColumnValues::Float64(v)) => put!(bl, v),
        (Builder::Bool(bl), ColumnValues::Bool(v)) => put!(bl, v),
        (Builder::Str(bl), ColumnValues::Text(v)) => {
            for (i, s) in v.iter().enumerate().take(b).skip(a) {
                if page.is_null(i) {
                    bl.append_null()
                } else {
                    bl.append_value(s)
                }
            }
        }
        (_, v) => {
            return Err(format!(
                "{:?} page for a different builder",
                v.column_type()
            ));
        }
    }
    Ok(())
}

/// Appends rows `[a, b)` of a row group from the chunk's decoded pages.
fn append_rows(
    builder: &mut Builder,
    infos: &[PageInfo],
    pages: &[Option<Page>],
    a: usize,
    b: usize,
) -> Result<(), String> {
    let mut p = infos.partition_point(|i| (i.first_row + i.rows) as usize <= a);
    let mut at = a;
    while at < b {
        let info = infos.get(p).ok_or("rows past the last page")?;
        let page = pages
            .get(p)
            .and_then(Option::as_ref)
            .ok_or("page was not decoded")?;
        let base = info.first_row as usize;
        let stop = b.min(base + info.rows as usize);
        append_page(builder, page, at - base, stop - base)?;
        at = stop;
        p += 1;
    }
    Ok(())
}

struct OutBatch {
    schema: SchemaRef,
    builders: Vec<Builder>,
    rows: usize,
}

impl OutBatch {
    fn new(projection: &[Column]) -> Self {
        OutBatch {
            schema: arrow_schema(projection),
            builders: projection.iter().map(Builder::for_column).collect(),
            rows: 0,
        }
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        let arrays: Vec<ArrayRef> = self.builders.iter_mut().map(Builder::finish).collect();
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        self.rows = 0;
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &options,
        )?)
    }
}

/// Value `i` of a field page as the row format takes it; None when null
/// (or timestamp-typed, which the row format cannot hold).
fn field_ref(page: &Page, i: usize) -> Option<FieldRef<'_>> {
    if page.is_null(i) {
        return None;
    }
    Some(match &page.values {
        ColumnValues::Float64(v) => FieldRef::F64(v[i]),
        ColumnValues::Int64(v) => FieldRef::I64(v[i]),
        ColumnValues::UInt64(v) => FieldRef::U64(v[i]),
        ColumnValues::Bool(v) => FieldRef::Bool(v[i]),
        ColumnValues::Text(v) => FieldRef::Str(&v[i]),
        ColumnValues::Timestamp(_) => return None,
    })
}

/// A row group decoded for `rows()`: times and every field column.
struct GroupRows {
    first_row: u64,
    times: Vec<i64>,
    /// (field name, whole-group column).
    fields: Vec<(usize, Page)>,
}

struct RowsIter<'a> {
    file: &'a SealedFile,
    groups: Vec<usize>,
    next_group: usize,
    data: Option<GroupRows>,
    pos: usize,
    series: usize,
    failed: bool,
}

impl RowsIter<'_> {
    fn load(&mut self, g: usize) -> Result<GroupRows> {
        let f = self.file;
        let time = f.decode_chunk(g, f.time_chunk)?;
        let ColumnValues::Timestamp(times) = time.values else {
            return Err(Error::Internal("time chunk is not timestamps".into()));
        };
        let mut fields = Vec::new();
        for (c, spec) in f.specs.iter().enumerate() {
            if spec.role == ChunkRole::Field {
                fields.push((c, f.decode_chunk(g, c)?));
            }
        }
        Ok(GroupRows {
            first_row: f.groups[g].first_row,
            times,
            fields,
        })
    }
}

impl Iterator for RowsIter<'_> {
    type Item = Result<SortedRow>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            match &self.data {
                Some(d) if self.pos < d.times.len() => break,
                _ => {
                    let &g = self.groups.get(self.next_group)?;
                    self.next_group += 1;
                    match self.load(g) {
                        Ok(d) => {
                            let first = d.first_row;
                            self.series = self
                                .file
                                .series
                                .partition_point(|s| s.first_row + s.rows <= first);
                            self.data = Some(d);
                            self.pos = 0;
                        }
                        Err(e) => {
                            self.failed = true;
                            return Some(Err(e));
                        }
                    }
                }
            }
        }
        let d = self.data.as_ref()?;
        let row = d.first_row + self.pos as u64;
        let series = &self.file.series;
        while self.series < series.len()
            && series[self.series].first_row + series[self.series].rows <= row
        {
            self.series += 1;
        }
        let Some(s) = series.get(self.series) else {
            self.failed = true;
            return Some(Err(Error::Internal("row past the last series".into())));
        };
        let i = self.pos;
        let mut value = Vec::new();
        value::start_value(&mut value);
        for (c, page) in &d.fields {
            if let Some(v) = field_ref(page, i) {
                value::put_field(&mut value, &self.file.specs[*c].name, v);
            }
        }
        let out = SortedRow {
            series: s.key.clone(),
            time_ns: d.times[i],
            value,
        };
        self.pos += 1;
        Some(Ok(out))
    }
}
