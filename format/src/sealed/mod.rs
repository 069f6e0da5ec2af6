//! Sealed partition files: the column store a closed partition is rewritten
//! into.
//!
//! Why this module exists: once a partition's time has passed, its rows move
//! out of RocksDB into one immutable file per partition, column by column, so
//! that scans read only the columns and row groups they need, and the file is
//! its own index (design brief, lesson 2). This module writes such a file
//! ([`write_sealed`]) from rows in engine key order and reads it back
//! ([`SealedFile`]). It builds on the page codecs in [`crate::columnar`]; it
//! knows nothing of when or why a partition is sealed (the sealing lifecycle
//! does).
//!
//! What it must never do: return a value it could not verify. Every page,
//! the directory, the header and the footer carry CRC32C checksums; damage is
//! [`crate::Error::Corrupt`] naming the partition, the file and (for a page)
//! the row group, column, page and offset.
//!
//! # Row order
//!
//! Rows keep the open partition's RocksDB key order, which the rest of the
//! engine merges in: series key *length*, then series key bytes, then time;
//! each (series, time) once. The writer rejects any other order.
//!
//! # File layout (format version 2, little-endian)
//!
//! | part | bytes |
//! |---|---|
//! | header | magic `SLSF` (4), format version u32, partition id u64, reserved u32 (0), CRC32C of the previous 20 bytes (4) = 24 bytes |
//! | row group 0: column chunk 0 | pages from [`crate::columnar::encode_page`], back to back |
//! | row group 0: column chunk 1 ... | one chunk per table column, in the directory's column order |
//! | row group 1 ... | |
//! | directory | a prost message ([`format::Directory`]), see below |
//! | footer | directory offset u64, directory length u64, directory CRC32C u32, format version u32, partition id u64, CRC32C of the previous 32 bytes u32, magic `SLSF` (4) = 40 bytes |
//!
//! Row groups hold [`ROWS_PER_GROUP`] rows (the last one fewer); pages hold
//! up to 1,024 values (text pages fewer when their strings pass 8 MiB). Page
//! boundaries are per column: the directory records each page's row count.
//! The time column's pages are also cut at a series start when that makes
//! them smaller per row (times jump back at each new series, and one jump
//! widens every delta of a page).
//! Every column of the table at seal time has a chunk in every row group:
//! the time column as `Timestamp` pages; each field column by its type
//! (`DOUBLE` → Float64, `BIGINT` → Int64, `BIGINT UNSIGNED` → UInt64,
//! `BOOLEAN` → Bool, `TEXT` → Text), null where the row lacks the field;
//! each tag column as an empty chunk (no pages). A tag is constant within a
//! series and every row's series key is in the directory, so readers take
//! tags from there (null when the series lacks the tag). The page codec
//! picks each page's encoding (delta-of-delta for times, frame-of-reference
//! or delta for integer-valued floats, ...) and compression.
//!
//! Version 1 files (still read) differ only there: each tag chunk holds
//! `Text` pages of the tag's value per row, filled from the series key.
//! Readers never decode them. Dropping them took a sealed TSBS cpu-only day
//! (100 hosts, ten tags) from 7.18 to 6.20 bytes per row: each tag page's
//! header, statistics and directory entry cost more than its values.
//!
//! The directory holds:
//! - the table's columns at seal time (chunk `i` is column `i`);
//! - rows, min and max time;
//! - per row group: rows, first and last key (series index, time), min and
//!   max time, and per column per page: length (offsets follow from the
//!   chunk's start offset), rows, nulls, min and max (text statistics over
//!   64 bytes are left out; integer-valued float statistics are stored as
//!   integers, exactly);
//! - per series, in file order: the series key, first row, row count, and
//!   its last row (time and all fields, in the open partition's value
//!   format), so "last point" reads no page;
//! - the tag filters ([`TagFilters`]: per tag, exact hashes or a binary fuse
//!   filter over FNV-1a 64 of the values), a few KiB for meta.
//!
//! [`SealedFile::open`] reads only the header, the footer and the directory,
//! checks all three checksums and the directory's consistency (page offsets
//! contiguous and ending at the directory, row counts adding up, series in
//! order), and keeps the directory in memory.
//!
//! # Empty partitions
//!
//! No rows make a valid file: 0 rows, 0 row groups, 0 series,
//! `min_time_ns = i64::MAX`, `max_time_ns = i64::MIN`.

mod filter;
pub mod format;
mod reader;
pub(crate) mod value;
pub(crate) mod writer;

#[cfg(test)]
mod tests;

pub use filter::TagFilters;
pub use format::{SEALED_FORMAT_VERSION, SEALED_MAGIC};
pub use reader::{
    PageInfo, RowGroupInfo, SealedFile, SeriesByTag, SeriesInfo, TagColumn, pages_decoded,
};
pub use writer::write_sealed;

/// Rows per row group.
pub const ROWS_PER_GROUP: usize = 8_192;

/// The most rows a reader accepts in one row group (a bound on memory).
pub const MAX_ROWS_PER_GROUP: usize = 1 << 20;

/// One row in engine key order: the series key, the time and the row value,
/// both in the open partition's format (`crate::rows`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortedRow {
    pub series: Vec<u8>,
    pub time_ns: i64,
    pub value: Vec<u8>,
}

/// What a sealed file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedSummary {
    pub rows: u64,
    pub series: u64,
    /// Size of the file.
    pub bytes: u64,
    /// `i64::MAX` when there are no rows.
    pub min_time_ns: i64,
    /// `i64::MIN` when there are no rows.
    pub max_time_ns: i64,
    pub row_groups: u32,
}
