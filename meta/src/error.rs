//! The one error type of the meta crate, and its single mapping to gRPC.
//!
//! Errors that a command itself produces (a missing table, a type conflict)
//! are not here: they are part of the replicated outcome and travel inside
//! `MetaResponse.error`. This enum is for what goes wrong around the command:
//! storage, transport, leadership and configuration.

use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid meta configuration: {0}")]
    Config(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("rocksdb: {0}")]
    RocksDb(#[from] rocksdb::Error),
    #[error("encoding: {0}")]
    Json(#[from] serde_json::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("grpc transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Raft could not take the request; usually a leader change or a shutdown.
    #[error("raft: {0}")]
    Raft(String),
    /// No leader is known, or it cannot be reached: the caller may retry.
    #[error("meta unavailable: {0}")]
    Unavailable(String),
    #[error("timed out: {0}")]
    Timeout(String),
    /// An error that a peer returned while a request was forwarded to it.
    #[error("{0}")]
    Remote(Status),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True when the same call may succeed later without the caller changing
    /// it (leader elections, restarts, a peer that is down).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unavailable(_) | Error::Timeout(_) | Error::Raft(_) | Error::Transport(_) => {
                true
            }
            Error::Remote(status) => matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
            ),
            _ => false,
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(m) | Error::Config(m) => Status::invalid_argument(m),
            Error::Unavailable(m) | Error::Raft(m) => Status::unavailable(m),
            Error::Transport(e) => Status::unavailable(e.to_string()),
            Error::Timeout(m) => Status::deadline_exceeded(m),
            Error::Remote(status) => status,
            e @ (Error::RocksDb(_) | Error::Json(_) | Error::Io(_)) => {
                Status::internal(e.to_string())
            }
        }
    }
}
