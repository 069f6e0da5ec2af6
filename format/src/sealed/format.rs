//! The byte layout of a sealed file around its pages: the fixed header, the
//! directory (prost messages defined here, not in `sealion.proto`: the
//! directory is a storage-node file format, not a wire format) and the fixed
//! footer. The layout is documented in the parent module.

use std::cmp::Ordering;

use sealion_common::proto::Column;

/// `SLSF`: Sealion sealed file. First four bytes of the header and last four
/// of the footer.
pub const SEALED_MAGIC: [u8; 4] = *b"SLSF";

/// The sealed file format version this build writes.
///
/// - 1: every column, tags included, has pages in every row group.
/// - 2: tag columns have no pages (their chunks are empty): a tag is constant
///   within a series, and readers take it from the series key in the
///   directory. Everything else is as in version 1.
pub const SEALED_FORMAT_VERSION: u32 = 2;

/// The oldest sealed format version this build reads.
pub const OLDEST_READABLE_VERSION: u32 = 1;

/// Whether files of `version` keep pages for tag columns.
pub fn has_tag_pages(version: u32) -> bool {
    version < 2
}

/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 24;

/// Bytes of the fixed footer.
pub const FOOTER_LEN: usize = 40;

/// Text statistics longer than this are left out of the directory (the page
/// header still has them), so one long string cannot bloat the directory.
pub const MAX_DIRECTORY_TEXT_STAT: usize = 64;

pub fn encode_header(partition_id: u64, version: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&SEALED_MAGIC);
    h[4..8].copy_from_slice(&version.to_le_bytes());
    h[8..16].copy_from_slice(&partition_id.to_le_bytes());
    // 16..20: reserved flags, zero in version 1.
    let crc = crc32c::crc32c(&h[0..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// The fields of a header; `Err` says what is wrong with it.
pub struct Header {
    pub version: u32,
    pub partition_id: u64,
}

pub fn decode_header(h: &[u8; HEADER_LEN]) -> Result<Header, String> {
    if h[0..4] != SEALED_MAGIC {
        return Err(format!("bad header magic {:?}", &h[0..4]));
    }
    let crc = le_u32(&h[20..24]);
    if !crate::checksum_ok(crc, crc32c::crc32c(&h[0..20])) {
        return Err("header checksum mismatch".into());
    }
    Ok(Header {
        version: le_u32(&h[4..8]),
        partition_id: le_u64(&h[8..16]),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    pub directory_offset: u64,
    pub directory_len: u64,
    pub directory_crc: u32,
    pub version: u32,
    pub partition_id: u64,
}

pub fn encode_footer(f: &Footer) -> [u8; FOOTER_LEN] {
    let mut b = [0u8; FOOTER_LEN];
    b[0..8].copy_from_slice(&f.directory_offset.to_le_bytes());
    b[8..16].copy_from_slice(&f.directory_len.to_le_bytes());
    b[16..20].copy_from_slice(&f.directory_crc.to_le_bytes());
    b[20..24].copy_from_slice(&f.version.to_le_bytes());
    b[24..32].copy_from_slice(&f.partition_id.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..32]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    b[36..40].copy_from_slice(&SEALED_MAGIC);
    b
}

pub fn decode_footer(b: &[u8; FOOTER_LEN]) -> Result<Footer, String> {
    if b[36..40] != SEALED_MAGIC {
        return Err(format!(
            "bad footer magic {:?} (not a sealed file, or truncated)",
            &b[36..40]
        ));
    }
    if !crate::checksum_ok(le_u32(&b[32..36]), crc32c::crc32c(&b[0..32])) {
        return Err("footer checksum mismatch".into());
    }
    Ok(Footer {
        directory_offset: le_u64(&b[0..8]),
        directory_len: le_u64(&b[8..16]),
        directory_crc: le_u32(&b[16..20]),
        version: le_u32(&b[20..24]),
        partition_id: le_u64(&b[24..32]),
    })
}

/// The order of rows in the open partition's RocksDB keys, which a sealed
/// file keeps: series key length, then series key bytes, then time.
pub fn key_cmp(a_series: &[u8], a_time: i64, b_series: &[u8], b_time: i64) -> Ordering {
    series_cmp(a_series, b_series).then(a_time.cmp(&b_time))
}

/// Series keys in RocksDB key order: by length first, then bytes.
pub fn series_cmp(a: &[u8], b: &[u8]) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

// ---------- the directory ----------

/// The directory: everything a reader needs to find, skip and check pages.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Directory {
    #[prost(uint32, tag = "1")]
    pub format_version: u32,
    #[prost(uint64, tag = "2")]
    pub partition_id: u64,
    /// The table's columns at seal time; column chunk `i` of every row group
    /// holds `columns[i]`.
    #[prost(message, repeated, tag = "3")]
    pub columns: Vec<Column>,
    #[prost(uint64, tag = "4")]
    pub rows: u64,
    #[prost(sint64, tag = "5")]
    pub min_time_ns: i64,
    #[prost(sint64, tag = "6")]
    pub max_time_ns: i64,
    #[prost(message, repeated, tag = "7")]
    pub row_groups: Vec<RowGroupEntry>,
    #[prost(message, repeated, tag = "8")]
    pub series: Vec<SeriesEntry>,
    /// [`super::TagFilters`] bytes, with their own checksum.
    #[prost(bytes = "vec", tag = "9")]
    pub tag_filters: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RowGroupEntry {
    #[prost(uint32, tag = "1")]
    pub rows: u32,
    /// Index into `Directory.series` of the first row's series.
    #[prost(uint64, tag = "2")]
    pub first_series: u64,
    #[prost(sint64, tag = "3")]
    pub first_time_ns: i64,
    #[prost(uint64, tag = "4")]
    pub last_series: u64,
    #[prost(sint64, tag = "5")]
    pub last_time_ns: i64,
    #[prost(sint64, tag = "6")]
    pub min_time_ns: i64,
    #[prost(sint64, tag = "7")]
    pub max_time_ns: i64,
    /// One per column, in `Directory.columns` order.
    #[prost(message, repeated, tag = "8")]
    pub chunks: Vec<ChunkEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ChunkEntry {
    /// File offset of the chunk's first page; the pages follow back to back,
    /// so page `i` starts at `offset + sum(length of pages before i)`.
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(message, repeated, tag = "2")]
    pub pages: Vec<PageEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PageEntry {
    #[prost(uint32, tag = "1")]
    pub length: u32,
    #[prost(uint32, tag = "2")]
    pub rows: u32,
    #[prost(uint32, tag = "3")]
    pub null_count: u32,
    /// Absent when every row is null, or for text longer than
    /// [`MAX_DIRECTORY_TEXT_STAT`] bytes.
    #[prost(message, optional, tag = "4")]
    pub min: Option<Stat>,
    #[prost(message, optional, tag = "5")]
    pub max: Option<Stat>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Stat {
    #[prost(oneof = "stat::Value", tags = "1, 2, 3, 4, 5")]
    pub value: Option<stat::Value>,
}

pub mod stat {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        /// Timestamp and Int64 columns, and Float64 columns whose statistic
        /// is an integer of at most 2^53 in magnitude (and not -0.0).
        #[prost(sint64, tag = "1")]
        Int(i64),
        #[prost(uint64, tag = "2")]
        UInt(u64),
        #[prost(double, tag = "3")]
        Float(f64),
        #[prost(bool, tag = "4")]
        Bool(bool),
        #[prost(string, tag = "5")]
        Text(::prost::alloc::string::String),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SeriesEntry {
    /// The series key exactly as in the open partition (`rows.rs`).
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// Index of the series' first row in the file.
    #[prost(uint64, tag = "2")]
    pub first_row: u64,
    #[prost(uint64, tag = "3")]
    pub rows: u64,
    #[prost(sint64, tag = "4")]
    pub last_time_ns: i64,
    /// The last row's fields in the open partition's value format
    /// (`rows::decode_fields`), fields in column order.
    #[prost(bytes = "vec", tag = "5")]
    pub last_value: Vec<u8>,
}

/// FNV-1a, 64-bit: the fixed hash of tag values in the tag filters.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
