//! The query node's error type, and the one place that says whose fault an
//! error is: as an HTTP status and as a PostgreSQL SQLSTATE.

use axum::http::StatusCode;
use datafusion::error::DataFusionError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("table {0} does not exist")]
    TableNotFound(String),
    #[error("column {0} does not exist")]
    ColumnNotFound(String),
    #[error("database {0} does not exist")]
    DatabaseNotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("syntax error: {0}")]
    Syntax(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TypeConflict(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("not supported: {0}")]
    NotSupported(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A query needed more memory than its limit allows.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// A query ran past its time limit and was cancelled.
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    DataFusion(DataFusionError),
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<DataFusionError> for Error {
    fn from(e: DataFusionError) -> Self {
        classify_datafusion(e)
    }
}

impl From<arrow::error::ArrowError> for Error {
    fn from(e: arrow::error::ArrowError) -> Self {
        Error::Internal(format!("arrow: {e}"))
    }
}

impl From<sealion_common::Error> for Error {
    fn from(e: sealion_common::Error) -> Self {
        use sealion_common::Error as C;
        match e {
            C::Rejected { kind, message } => match kind.as_str() {
                "not_found" => Error::Invalid(message),
                "already_exists" => Error::AlreadyExists(message),
                "conflict" => Error::TypeConflict(message),
                "unavailable" => Error::Unavailable(message),
                _ => Error::Invalid(message),
            },
            C::Invalid(m) => Error::Invalid(m),
            C::MetaUnavailable(m) | C::Timeout(m) => Error::Unavailable(format!("meta: {m}")),
        }
    }
}

/// Finds the user's mistake inside a DataFusion error, if it was one.
fn classify_datafusion(e: DataFusionError) -> Error {
    let root = e.find_root();
    match root {
        DataFusionError::SchemaError(schema_err, _) => {
            let text = schema_err.to_string();
            if text.contains("No field named") || text.contains("not found") {
                return Error::ColumnNotFound(strip_prefix(&text));
            }
            Error::Invalid(text)
        }
        DataFusionError::SQL(parser_err, _) => Error::Syntax(parser_err.to_string()),
        DataFusionError::Plan(msg) => {
            if msg.starts_with("table '") && msg.ends_with("not found") {
                let name = msg
                    .trim_start_matches("table ")
                    .trim_end_matches(" not found");
                return Error::TableNotFound(name.to_string());
            }
            Error::Invalid(msg.clone())
        }
        DataFusionError::NotImplemented(msg) => Error::NotSupported(msg.clone()),
        DataFusionError::ResourcesExhausted(msg) => Error::OutOfMemory(format!(
            "the query needs more memory than its limit (--query-memory-limit-mb): {msg}"
        )),
        DataFusionError::External(inner) => {
            match inner.downcast_ref::<Error>().and_then(Error::same_kind) {
                Some(err) => err,
                None => Error::DataFusion(e),
            }
        }
        _ => Error::DataFusion(e),
    }
}

fn strip_prefix(text: &str) -> String {
    text.trim_start_matches("Schema error: ").to_string()
}

impl Error {
    /// A copy of this error (DataFusion errors, which cannot be copied, give
    /// `None`).
    fn same_kind(&self) -> Option<Error> {
        Some(match self {
            Error::TableNotFound(m) => Error::TableNotFound(m.clone()),
            Error::ColumnNotFound(m) => Error::ColumnNotFound(m.clone()),
            Error::DatabaseNotFound(m) => Error::DatabaseNotFound(m.clone()),
            Error::AlreadyExists(m) => Error::AlreadyExists(m.clone()),
            Error::Syntax(m) => Error::Syntax(m.clone()),
            Error::Invalid(m) => Error::Invalid(m.clone()),
            Error::TypeConflict(m) => Error::TypeConflict(m.clone()),
            Error::TooLarge(m) => Error::TooLarge(m.clone()),
            Error::NotSupported(m) => Error::NotSupported(m.clone()),
            Error::Unavailable(m) => Error::Unavailable(m.clone()),
            Error::OutOfMemory(m) => Error::OutOfMemory(m.clone()),
            Error::Timeout(m) => Error::Timeout(m.clone()),
            Error::Internal(m) => Error::Internal(m.clone()),
            Error::DataFusion(_) => return None,
        })
    }

    pub fn http_status(&self) -> StatusCode {
        match self {
            Error::TableNotFound(_) | Error::DatabaseNotFound(_) => StatusCode::NOT_FOUND,
            Error::ColumnNotFound(_)
            | Error::Syntax(_)
            | Error::Invalid(_)
            | Error::TypeConflict(_)
            | Error::NotSupported(_) => StatusCode::BAD_REQUEST,
            Error::AlreadyExists(_) => StatusCode::CONFLICT,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Unavailable(_) | Error::OutOfMemory(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Error::DataFusion(_) | Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// PostgreSQL error code (SQLSTATE) of this error.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            Error::TableNotFound(_) => "42P01",
            Error::ColumnNotFound(_) => "42703",
            Error::DatabaseNotFound(_) => "3D000",
            Error::AlreadyExists(_) => "42P07",
            Error::Syntax(_) => "42601",
            Error::Invalid(_) => "22023",
            Error::TypeConflict(_) => "42804",
            Error::TooLarge(_) => "54000",
            Error::NotSupported(_) => "0A000",
            Error::Unavailable(_) => "57P03",
            Error::OutOfMemory(_) => "53200",
            // query_canceled, what PostgreSQL answers at statement_timeout.
            Error::Timeout(_) => "57014",
            Error::DataFusion(_) | Error::Internal(_) => "XX000",
        }
    }

    /// Wraps this error so it can travel through DataFusion and be found
    /// again by `classify_datafusion`.
    pub fn into_datafusion(self) -> DataFusionError {
        DataFusionError::External(Box::new(self))
    }
}
