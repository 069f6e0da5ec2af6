//! The PostgreSQL wire protocol, served by datafusion-postgres over pgwire.
//!
//! datafusion-postgres brings the protocol, type encoding and `pg_catalog`
//! (so psql, Grafana and drivers work). Sealion adds one query hook in front
//! of its own: it picks the database from the connection's startup
//! parameters, runs catalog statements through meta, and turns errors into
//! the SQLSTATE codes clients expect (42P01 for a missing table, 42703 for a
//! missing column) instead of a generic internal error.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::ParamValues;
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{ObjectName, Set, Statement};
use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::pgwire::api::auth::StartupHandler;
use datafusion_postgres::pgwire::api::auth::noop::NoopStartupHandler;
use datafusion_postgres::pgwire::api::cancel::{CancelHandler, DefaultCancelHandler};
use datafusion_postgres::pgwire::api::portal::Format;
use datafusion_postgres::pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use datafusion_postgres::pgwire::api::results::{QueryResponse, Response, Tag};
use datafusion_postgres::pgwire::api::{ClientInfo, ConnectionManager, PgWireServerHandlers};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::data::DataRow;
use datafusion_postgres::pgwire::types::format::FormatOptions;
use datafusion_postgres::{DfSessionService, QueryHook};
use futures::StreamExt;

use crate::Error;
use crate::sql::{Handling, Output, Rows, SqlEngine, handling};

fn pg_error(e: Error) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        e.sqlstate().to_string(),
        e.to_string(),
    )))
}

fn database_of(client: &(dyn ClientInfo + Send + Sync)) -> String {
    client
        .metadata()
        .get("database")
        .filter(|d| !d.is_empty())
        .cloned()
        .unwrap_or_else(|| sealion_common::catalog::DEFAULT_DATABASE.to_string())
}

/// Statements left to datafusion-postgres's own hooks (session settings,
/// transactions, cursors).
fn left_to_others(stmt: &Statement) -> bool {
    matches!(
        stmt,
        Statement::Set { .. }
            | Statement::ShowVariable { .. }
            | Statement::ShowStatus { .. }
            | Statement::StartTransaction { .. }
            | Statement::Commit { .. }
            | Statement::Rollback { .. }
            | Statement::Declare { .. }
            | Statement::Fetch { .. }
            | Statement::Close { .. }
    )
}

/// The DataFusion option a `SET` names, if any (`datafusion.` and a key).
///
/// datafusion-postgres keeps PostgreSQL's session variables (`TimeZone`,
/// `statement_timeout`, `DateStyle`, `search_path`...) per connection, but
/// runs any other `SET` on the node's one shared `SessionContext`: a
/// `SET datafusion.execution.batch_size = 1` from one client would then hold
/// for every query on the node, every tenant's and the HTTP API's too. Such
/// statements are refused instead ([`SealionHook`]); other unknown
/// variables, which drivers set on connect, still answer `SET` and change
/// nothing.
pub fn shared_option_set(stmt: &Statement) -> Option<String> {
    let Statement::Set(set) = stmt else {
        return None;
    };
    let names: Vec<&ObjectName> = match set {
        Set::SingleAssignment { variable, .. } => vec![variable],
        Set::ParenthesizedAssignments { variables, .. } => variables.iter().collect(),
        Set::MultipleAssignments { assignments } => assignments.iter().map(|a| &a.name).collect(),
        _ => Vec::new(),
    };
    names
        .into_iter()
        .map(|n| n.to_string().to_ascii_lowercase())
        .find(|n| n.starts_with("datafusion."))
}

fn refuse_shared_option(name: &str) -> PgWireError {
    pg_error(Error::NotSupported(format!(
        "SET {name}: DataFusion options are the query node's, shared by every session and \
         tenant on it, so a session cannot set them; start the node with other settings instead"
    )))
}

pub struct SealionHook {
    pub sql: Arc<SqlEngine>,
}

fn empty_plan() -> LogicalPlan {
    LogicalPlan::EmptyRelation(EmptyRelation {
        produce_one_row: false,
        schema: Arc::new(datafusion::common::DFSchema::empty()),
    })
}

fn affected(tag: &str, rows: u64) -> Response {
    let mut t = Tag::new(tag);
    if tag == "INSERT" {
        t = t.with_oid(0).with_rows(rows as usize);
    } else if tag == "DELETE" {
        t = t.with_rows(rows as usize);
    }
    Response::Execution(t)
}

/// Rows in the PostgreSQL text format, streamed as they are computed; an
/// error before the first row keeps its SQLSTATE.
async fn encode_rows(rows: Rows, options: Arc<FormatOptions>) -> PgWireResult<QueryResponse> {
    let fields = Arc::new(arrow_schema_to_pg_fields(
        &rows.schema(),
        &Format::UnifiedText,
        Some(options),
    )?);
    let batches = rows.execute_stream().await.map_err(pg_error)?;
    let row_fields = fields.clone();
    let data = batches
        .map(
            move |batch| -> Box<dyn Iterator<Item = PgWireResult<DataRow>> + Send + Sync> {
                match batch {
                    Ok(batch) => encode_recordbatch(row_fields.clone(), batch),
                    Err(e) => Box::new(std::iter::once(Err(PgWireError::ApiError(e.into())))),
                }
            },
        )
        .flat_map(futures::stream::iter);
    Ok(QueryResponse::new(fields, data))
}

#[async_trait]
impl QueryHook for SealionHook {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        _session_context: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        if let Some(name) = shared_option_set(statement) {
            return Some(Err(refuse_shared_option(&name)));
        }
        if left_to_others(statement) {
            return None;
        }
        let db = database_of(&*client);
        let result = match self.sql.execute(&db, statement).await {
            Ok(Output::Rows(rows)) => {
                let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
                encode_rows(rows, options).await.map(Response::Query)
            }
            Ok(Output::Affected { tag, rows }) => Ok(affected(&tag, rows)),
            Err(e) => Err(pg_error(e)),
        };
        Some(result)
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _session_context: &SessionContext,
        client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        if let Some(name) = shared_option_set(statement) {
            return Some(Err(refuse_shared_option(&name)));
        }
        if left_to_others(statement) {
            return None;
        }
        let db = database_of(client);
        if handling(statement) == Handling::Sealion || self.sql.direct_insert(&db, statement) {
            // Run at execute time; no rows are described.
            return Some(Ok(empty_plan()));
        }
        Some(
            self.sql
                .plan(&db, statement)
                .await
                .map(|(_, plan)| plan)
                .map_err(pg_error),
        )
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        logical_plan: &LogicalPlan,
        _params: &ParamValues,
        _session_context: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        let is_delete = matches!(statement, Statement::Delete(_));
        let db = database_of(&*client);
        // Rows of literals were not planned at parse (they have no
        // parameters to bind): written directly, or planned now if the
        // table changed meanwhile.
        let direct = matches!(logical_plan, LogicalPlan::EmptyRelation(_))
            && matches!(statement, Statement::Insert(_));
        if (handling(statement) != Handling::Sealion && !is_delete && !direct)
            || left_to_others(statement)
        {
            // Planned in the parse phase against the right database; the
            // default path binds parameters and encodes in the portal's format.
            return None;
        }
        Some(match self.sql.execute(&db, statement).await {
            Ok(Output::Affected { tag, rows }) => Ok(affected(&tag, rows)),
            Ok(Output::Rows(rows)) => {
                let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
                encode_rows(rows, options).await.map(Response::Query)
            }
            Err(e) => Err(pg_error(e)),
        })
    }
}

struct Startup {
    connections: Arc<ConnectionManager>,
}

#[async_trait]
impl NoopStartupHandler for Startup {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.connections.clone())
    }
}

pub struct PgHandlers {
    service: Arc<DfSessionService>,
    startup: Arc<Startup>,
    cancel: Arc<DefaultCancelHandler>,
}

impl PgHandlers {
    pub fn new(sql: Arc<SqlEngine>) -> Self {
        let hooks: Vec<Arc<dyn QueryHook>> = vec![
            Arc::new(SealionHook { sql: sql.clone() }),
            Arc::new(SetShowHook),
            Arc::new(TransactionStatementHook),
            Arc::new(CursorStatementHook),
        ];
        let ctx = Arc::new(sql.ctx.clone());
        let connections = Arc::new(ConnectionManager::new());
        PgHandlers {
            service: Arc::new(DfSessionService::new_with_hooks(ctx, hooks)),
            startup: Arc::new(Startup {
                connections: connections.clone(),
            }),
            cancel: Arc::new(DefaultCancelHandler::new(connections)),
        }
    }
}

impl PgWireServerHandlers for PgHandlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.service.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.service.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        self.cancel.clone()
    }
}
