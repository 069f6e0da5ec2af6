//! Errors from the row codec and the sealed file (the page codecs have their
//! own, [`crate::columnar::ColumnarError`], which the sealed reader wraps with
//! the file and page it came from).

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Stored bytes are damaged or unreadable; `reason` names the file and
    /// page (or the row) where that was found.
    #[error("corrupt row in partition {partition_id}: {reason}")]
    Corrupt { partition_id: u64, reason: String },
    /// The caller asked for something that cannot be written or read (a name
    /// too long, a type that does not match the schema).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A pushed aggregate would hold more groups than one storage node
    /// keeps (`scan::MAX_GROUPS` and the state limits); the query node
    /// aggregates the rows itself instead.
    #[error("{0}")]
    TooManyGroups(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A broken invariant of this crate; never caused by input bytes.
    #[error("internal: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
