//! The storage node's error type and its mapping to gRPC status codes.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("corrupt row in partition {partition_id}: {reason}")]
    Corrupt { partition_id: u64, reason: String },
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A pushed aggregate over the node's group limits.
    #[error("{0}")]
    TooManyGroups(String),
    #[error("partition {partition_id} is not held by storage node {node_id}")]
    NotHeld { partition_id: u64, node_id: u64 },
    #[error("storage node {node_id} is not the primary of partition {partition_id}")]
    NotPrimary { partition_id: u64, node_id: u64 },
    #[error(
        "stale epoch for partition {partition_id}: the request has {request}, this node knows {known}"
    )]
    StaleEpoch {
        partition_id: u64,
        request: u64,
        known: u64,
    },
    #[error("{0}")]
    Unavailable(String),
    /// A replica's rows differ from its primary's: its copy is not used.
    #[error(
        "partition {partition_id} differs from its primary: expected {expected}, found {found}"
    )]
    DigestMismatch {
        partition_id: u64,
        expected: String,
        found: String,
    },
    #[error("meta: {0}")]
    Meta(#[from] sealion_common::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("internal: {0}")]
    Internal(String),
}

impl From<sealion_format::Error> for Error {
    fn from(e: sealion_format::Error) -> Self {
        use sealion_format::Error as F;
        match e {
            F::Arrow(e) => Error::Arrow(e),
            F::Corrupt {
                partition_id,
                reason,
            } => Error::Corrupt {
                partition_id,
                reason,
            },
            F::Invalid(m) => Error::Invalid(m),
            F::TooManyGroups(m) => Error::TooManyGroups(m),
            F::Io(e) => Error::Io(e),
            F::Internal(m) => Error::Internal(m),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A stale epoch where the request's epoch is the older one.
    pub fn is_older_epoch(&self) -> bool {
        matches!(self, Error::StaleEpoch { request, known, .. } if request < known)
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::Invalid(_) | Error::Arrow(_) => tonic::Status::invalid_argument(message),
            Error::TooManyGroups(_) => tonic::Status::resource_exhausted(message),
            Error::NotHeld { .. } | Error::NotPrimary { .. } => {
                tonic::Status::failed_precondition(message)
            }
            Error::StaleEpoch { .. } => tonic::Status::aborted(message),
            Error::Meta(_) | Error::Unavailable(_) => tonic::Status::unavailable(message),
            Error::Corrupt { .. } | Error::DigestMismatch { .. } => {
                tonic::Status::data_loss(message)
            }
            Error::Rocks(_) | Error::Io(_) | Error::Internal(_) => tonic::Status::internal(message),
        }
    }
}
