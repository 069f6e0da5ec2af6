//! Errors of the shared layer, mostly from talking to meta.

use tonic::Code;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("meta service unavailable: {0}")]
    MetaUnavailable(String),
    /// Meta applied the command and refused it; `kind` says why.
    #[error("{message}")]
    Rejected { kind: String, message: String },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("timed out waiting for {0}")]
    Timeout(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True when the same call may succeed later without the caller changing it.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::MetaUnavailable(_) | Error::Timeout(_))
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Rejected { kind, .. } if kind == "not_found")
    }

    pub fn from_status(status: tonic::Status) -> Self {
        match status.code() {
            Code::InvalidArgument => Error::Invalid(status.message().to_string()),
            _ => Error::MetaUnavailable(format!("{}: {}", status.code(), status.message())),
        }
    }
}
