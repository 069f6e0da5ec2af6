//! The column store's codec error.
//!
//! Why a separate enum: the codecs know nothing of files, partitions or
//! RocksDB, so they cannot fill in `crate::Error::Corrupt { partition_id, .. }`.
//! The caller that reads a page from a sealed file wraps a [`ColumnarError`]
//! with the file and page it came from. Decoders return this error for every
//! malformed input; they never panic and never return a value they could not
//! verify.

/// Errors from encoding or decoding a column page.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ColumnarError {
    /// The stored CRC32C does not match the bytes: the page was damaged.
    #[error("page checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    /// The bytes are not a well-formed page (bad magic, truncated, a field out
    /// of range, trailing bytes, invalid UTF-8, ...).
    #[error("corrupt page: {0}")]
    Corrupt(String),
    /// The page was written by a newer format version than this build reads.
    #[error("unsupported page format version {0}")]
    UnsupportedVersion(u8),
    /// The caller asked for something the encoder cannot do (too many values,
    /// mismatched null bitmap length, a forced encoding that does not fit).
    /// This is a programmer or input error on the write side, not corruption.
    #[error("invalid page: {0}")]
    Invalid(String),
}

impl ColumnarError {
    /// True when the error means stored bytes are damaged or unreadable, as
    /// opposed to a bad request on the write side.
    pub fn is_corruption(&self) -> bool {
        !matches!(self, ColumnarError::Invalid(_))
    }
}

pub(crate) fn corrupt(what: impl Into<String>) -> ColumnarError {
    ColumnarError::Corrupt(what.into())
}

pub type Result<T, E = ColumnarError> = std::result::Result<T, E>;
