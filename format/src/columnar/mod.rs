//! Page codecs of the sealed column store.
//!
//! Why this module exists: a sealed partition stores each column in pages of
//! up to [`MAX_PAGE_VALUES`] values. This module turns one page of one column
//! into bytes and back: it picks, per page, the smallest encoding for the
//! data ([`int`], [`float`], [`text`], [`bitmap`]), then compresses the result
//! when that pays, and seals the page with CRC32C checksums. It knows nothing
//! of files, row groups or partitions; the sealed-file writer above it does.
//!
//! What it must never do: panic on any input bytes, or return a value it could
//! not verify. A damaged page is an error ([`ColumnarError`]), never a wrong
//! value; the caller adds the file and page to the message.
//!
//! # Page layout (format version 1, little-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `SLP1` |
//! | 1 | format version (1) |
//! | 1 | column type ([`ColumnType`] id) |
//! | 1 | encoding ([`Encoding`] id) |
//! | 1 | compression (0 none, 1 zstd, 2 lz4) |
//! | 2 | row count (at most [`MAX_PAGE_VALUES`]) |
//! | 2 | null count |
//! | var | statistics: min, max, sum, by type (see [`PageStats`]) |
//! | 4 | uncompressed payload length |
//! | 4 | stored payload length |
//! | 4 | CRC32C of the header bytes before it |
//! | var | payload, maybe compressed |
//! | 4 | CRC32C of every byte before it |
//!
//! The header has its own checksum so that [`page_stats`] can trust a page's
//! statistics after reading only the header. The payload is the null mask
//! (only when the null count is nonzero; see [`bitmap`]) followed by the
//! non-null values in the page's encoding.
//!
//! # Nulls
//!
//! [`ColumnValues`] always holds one value per row. On encode, the values at
//! null slots are ignored (anything may be there); on decode they are the
//! type's default (`0`, `0.0`, `false`, `""`), as in an Arrow array. A page
//! without nulls decodes with `nulls: None`, even if it was encoded with
//! `Some` of an all-false mask.

mod bitmap;
mod bits;
mod error;
mod float;
mod int;
mod page;
mod stats;
#[cfg(test)]
mod tests;
mod text;

pub use error::{ColumnarError, Result};
pub use page::{decode_page, encode_page, page_header, page_stats};
pub use stats::{PageStats, StatValue, Sum};

/// The most values one page holds (rows, nulls included).
pub const MAX_PAGE_VALUES: usize = 1024;

/// The largest uncompressed payload a page may have. A limit on everything:
/// a page header read from disk cannot make a reader allocate more than this.
/// 1,024 values of 64 KiB strings fit; larger text pages must be split.
pub const MAX_PAGE_PAYLOAD_BYTES: usize = 64 << 20;

/// `SLP1`: Sealion page, format 1.
pub const PAGE_MAGIC: [u8; 4] = *b"SLP1";

/// The page format version this build writes and reads.
pub const PAGE_FORMAT_VERSION: u8 = 1;

/// The type of a column, as stored in the page header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnType {
    /// Nanoseconds since the Unix epoch, UTC.
    Timestamp,
    Int64,
    UInt64,
    Float64,
    Bool,
    Text,
}

impl ColumnType {
    pub fn id(self) -> u8 {
        match self {
            ColumnType::Timestamp => 1,
            ColumnType::Int64 => 2,
            ColumnType::UInt64 => 3,
            ColumnType::Float64 => 4,
            ColumnType::Bool => 5,
            ColumnType::Text => 6,
        }
    }

    pub fn from_id(id: u8) -> Result<Self> {
        Ok(match id {
            1 => ColumnType::Timestamp,
            2 => ColumnType::Int64,
            3 => ColumnType::UInt64,
            4 => ColumnType::Float64,
            5 => ColumnType::Bool,
            6 => ColumnType::Text,
            other => return Err(error::corrupt(format!("unknown column type {other}"))),
        })
    }

    /// The encodings a page of this type may use.
    pub fn encodings(self) -> &'static [Encoding] {
        match self {
            ColumnType::Timestamp | ColumnType::Int64 | ColumnType::UInt64 => &int::INT_ENCODINGS,
            ColumnType::Float64 => &float::FLOAT_ENCODINGS,
            ColumnType::Bool => &bitmap::BOOL_ENCODINGS,
            ColumnType::Text => &text::TEXT_ENCODINGS,
        }
    }
}

/// The values of one page, one per row (see the module docs on nulls).
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValues {
    Timestamp(Vec<i64>),
    Int64(Vec<i64>),
    UInt64(Vec<u64>),
    Float64(Vec<f64>),
    Bool(Vec<bool>),
    Text(Vec<String>),
}

impl ColumnValues {
    pub fn column_type(&self) -> ColumnType {
        match self {
            ColumnValues::Timestamp(_) => ColumnType::Timestamp,
            ColumnValues::Int64(_) => ColumnType::Int64,
            ColumnValues::UInt64(_) => ColumnType::UInt64,
            ColumnValues::Float64(_) => ColumnType::Float64,
            ColumnValues::Bool(_) => ColumnType::Bool,
            ColumnValues::Text(_) => ColumnType::Text,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ColumnValues::Timestamp(v) | ColumnValues::Int64(v) => v.len(),
            ColumnValues::UInt64(v) => v.len(),
            ColumnValues::Float64(v) => v.len(),
            ColumnValues::Bool(v) => v.len(),
            ColumnValues::Text(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One page of one column.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// One value per row; the value at a null slot is ignored on encode and
    /// is the type's default after decode.
    pub values: ColumnValues,
    /// `true` = null. `None` = no nulls. When `Some`, as long as `values`.
    pub nulls: Option<Vec<bool>>,
}

impl Page {
    pub fn new(values: ColumnValues) -> Self {
        Self {
            values,
            nulls: None,
        }
    }

    pub fn with_nulls(values: ColumnValues, nulls: Vec<bool>) -> Self {
        Self {
            values,
            nulls: Some(nulls),
        }
    }

    /// Rows in the page, nulls included.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn is_null(&self, row: usize) -> bool {
        self.nulls
            .as_ref()
            .is_some_and(|n| n.get(row).copied().unwrap_or(false))
    }
}

/// How a page's values are laid out. Ids are part of the on-disk format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// Raw values: 8 bytes each for numbers, a bitmap for booleans,
    /// length-prefixed bytes for text.
    Plain,
    /// Every value equal: stored once (integers).
    Constant,
    /// Runs of equal values: run values and run lengths, each bit-packed
    /// (integers, booleans).
    RunLength,
    /// Minimum, then `value - minimum` bit-packed at the width of the range.
    FrameOfReference,
    /// First value, then deltas, frame-of-reference bit-packed.
    Delta,
    /// First value and delta, then deltas of deltas, frame-of-reference
    /// bit-packed: a regular series packs at width 0.
    DeltaOfDelta,
    /// Gorilla XOR of consecutive float bit patterns.
    Gorilla,
    /// Floats that are all integers in ±2^53 (and not `-0.0`), stored as
    /// `i64` in the smallest integer encoding.
    IntegerFloat,
    /// Sorted distinct values, then the indexes in the smallest integer
    /// encoding (run-length for tag columns).
    Dictionary,
    /// Minimum, then `value - minimum` as digits of base `range + 1`, as
    /// many per 32-bit word as fit: a range of 11 values packs 9 to a word
    /// (3.6 bits each, where bit-packing takes 4).
    RadixFrame,
    /// First value, then deltas packed as in [`Encoding::RadixFrame`]: a
    /// random walk with steps of -5..=5 takes 3.6 bits per value.
    RadixDelta,
}

impl Encoding {
    pub fn id(self) -> u8 {
        match self {
            Encoding::Plain => 0,
            Encoding::Constant => 1,
            Encoding::RunLength => 2,
            Encoding::FrameOfReference => 3,
            Encoding::Delta => 4,
            Encoding::DeltaOfDelta => 5,
            Encoding::Gorilla => 6,
            Encoding::IntegerFloat => 7,
            Encoding::Dictionary => 8,
            Encoding::RadixFrame => 9,
            Encoding::RadixDelta => 10,
        }
    }

    pub fn from_id(id: u8) -> Result<Self> {
        Ok(match id {
            0 => Encoding::Plain,
            1 => Encoding::Constant,
            2 => Encoding::RunLength,
            3 => Encoding::FrameOfReference,
            4 => Encoding::Delta,
            5 => Encoding::DeltaOfDelta,
            6 => Encoding::Gorilla,
            7 => Encoding::IntegerFloat,
            8 => Encoding::Dictionary,
            9 => Encoding::RadixFrame,
            10 => Encoding::RadixDelta,
            other => return Err(error::corrupt(format!("unknown encoding {other}"))),
        })
    }
}

/// Compression of the encoded payload. Payloads under 64 bytes are never
/// compressed, whatever the choice: the frame overhead outweighs any saving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// zstd level 3, kept only when it saves at least 10% of the payload.
    #[default]
    Auto,
    /// zstd level 3, kept whenever it makes the payload smaller.
    Zstd,
    /// LZ4 block, kept whenever it makes the payload smaller: for columns
    /// where decode speed matters more than size.
    Lz4,
    /// Never compress.
    None,
}

/// Options of [`encode_page`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EncodeOptions {
    pub compression: Compression,
    /// Force this encoding instead of choosing the smallest; for tests and
    /// benchmarks. Encoding fails if it does not fit the column type or data.
    pub encoding: Option<Encoding>,
}

/// Everything the page header says, read without decoding values.
#[derive(Debug, Clone, PartialEq)]
pub struct PageHeader {
    pub column_type: ColumnType,
    pub encoding: Encoding,
    /// The compression actually stored: never [`Compression::Auto`].
    pub compression: Compression,
    pub stats: PageStats,
    pub raw_payload_bytes: usize,
    pub stored_payload_bytes: usize,
    /// Length of the header, checksum included; the payload starts here.
    pub header_bytes: usize,
}

impl PageHeader {
    /// Total length of the page in bytes.
    pub fn page_bytes(&self) -> usize {
        self.header_bytes + self.stored_payload_bytes + 4
    }
}
