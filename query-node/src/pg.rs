//! The PostgreSQL wire protocol, served by datafusion-postgres over pgwire.
//!
//! datafusion-postgres brings the protocol, type encoding and `pg_catalog`
//! (so psql, Grafana and drivers work). Sealion adds one query hook in front
//! of its own: it picks the database from the connection's startup
//! parameters, runs catalog statements through meta, and turns errors into
//! the SQLSTATE codes clients expect (42P01 for a missing table, 42703 for a
//! missing column) instead of a generic internal error. Queries sent over
//! the extended protocol run on Sealion's own query path
//! ([`SealionExtended`]), with the per-query memory limit and the plan
//! cache, as queries over the simple protocol and HTTP do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ParamValues;
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{ObjectName, Set, Statement};
use datafusion_postgres::arrow_pg::datatypes::arrow_schema_to_pg_fields;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters_with_server_types;
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::pgwire::api::ClientPortalStore;
use datafusion_postgres::pgwire::api::Type;
use datafusion_postgres::pgwire::api::auth::StartupHandler;
use datafusion_postgres::pgwire::api::auth::noop::NoopStartupHandler;
use datafusion_postgres::pgwire::api::cancel::{CancelHandler, DefaultCancelHandler};
use datafusion_postgres::pgwire::api::portal::{Format, Portal};
use datafusion_postgres::pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use datafusion_postgres::pgwire::api::results::{QueryResponse, Response, Tag};
use datafusion_postgres::pgwire::api::stmt::QueryParser;
use datafusion_postgres::pgwire::api::store::PortalStore;
use datafusion_postgres::pgwire::api::{ClientInfo, ConnectionManager, PgWireServerHandlers};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::PgWireBackendMessage;
use datafusion_postgres::pgwire::messages::data::DataRow;
use datafusion_postgres::pgwire::messages::response::TransactionStatus;
use datafusion_postgres::pgwire::types::format::FormatOptions;
use datafusion_postgres::{DfSessionService, QueryHook};
use futures::StreamExt;

use crate::Error;
use crate::sql::{Handling, Output, Rows, SqlEngine, handling};

mod rows;
pub use rows::encode_batch;

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

/// The session's `statement_timeout`, which datafusion-postgres's
/// `SET statement_timeout` keeps in the connection's metadata under this
/// key (in milliseconds; absent when 0). A test sets it over the wire and
/// sees a query cancelled, so a change of key upstream does not go unseen.
fn statement_timeout(client: &(dyn ClientInfo + Send + Sync)) -> Option<Duration> {
    client
        .metadata()
        .get("statement_timeout_ms")
        .and_then(|ms| ms.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
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

/// Rows in the PostgreSQL wire format, streamed as they are computed; an
/// error keeps its SQLSTATE, before the first row or after.
/// `format` is the client's choice of text or binary per column (always
/// text over the simple protocol).
async fn encode_rows(
    rows: Rows,
    options: Arc<FormatOptions>,
    format: &Format,
    deadline: Option<Instant>,
) -> PgWireResult<QueryResponse> {
    let fields = Arc::new(arrow_schema_to_pg_fields(
        &rows.schema(),
        format,
        Some(options),
    )?);
    let batches = rows.execute_stream_by(deadline).await.map_err(pg_error)?;
    let row_fields = fields.clone();
    let data = batches
        .map(
            move |batch| -> Box<dyn Iterator<Item = PgWireResult<DataRow>> + Send + Sync> {
                match batch {
                    // A column at a time (`rows`), as arrow-pg's
                    // encoder would write each value.
                    Ok(batch) => Box::new(rows::encode_batch(&row_fields, &batch).into_iter()),
                    // With its SQLSTATE (53200 for a query over its memory
                    // limit), as an error before the stream started has.
                    Err(e) => Box::new(std::iter::once(Err(df_error(e)))),
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
        let deadline = self.sql.deadline(statement_timeout(&*client));
        let result = match self.sql.execute(&db, statement).await {
            Ok(Output::Rows(rows)) => {
                let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
                encode_rows(rows, options, &Format::UnifiedText, deadline)
                    .await
                    .map(Response::Query)
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
        let deadline = self.sql.deadline(statement_timeout(&*client));
        Some(match self.sql.execute(&db, statement).await {
            Ok(Output::Affected { tag, rows }) => Ok(affected(&tag, rows)),
            Ok(Output::Rows(rows)) => {
                let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
                encode_rows(rows, options, &Format::UnifiedText, deadline)
                    .await
                    .map(Response::Query)
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

/// The extended protocol (Parse, Bind, Execute: what most drivers speak)
/// on Sealion's query path. datafusion-postgres runs a bound plan on the
/// node's one shared context, outside the query's own memory pool, so a
/// query sent this way would escape `--query-memory-limit-mb`; here a
/// query (`SELECT`, `WITH`, `VALUES`...) runs as one sent over the simple
/// protocol does: in its database's state, in a memory pool of its own,
/// and, when it has no parameters, from the plan cache; so does `EXPLAIN`
/// (`EXPLAIN ANALYZE` runs its query). Everything else
/// (writes, catalog statements, session settings, cursors) goes to
/// datafusion-postgres and its hooks, [`SealionHook`] first.
pub struct SealionExtended {
    service: Arc<DfSessionService>,
    sql: Arc<SqlEngine>,
}

type DfStatement = <DfSessionService as ExtendedQueryHandler>::Statement;

impl SealionExtended {
    /// The rows of the portal's query, its parameters bound.
    async fn rows<C>(
        &self,
        client: &C,
        portal: &Portal<DfStatement>,
        statement: &Statement,
        plan: &LogicalPlan,
    ) -> PgWireResult<Rows>
    where
        C: ClientInfo + Send + Sync,
    {
        let db = database_of(client);
        let types = plan.get_parameter_types().map_err(df_error)?;
        if types.is_empty() {
            // The plan cache's plan, unless the table changed since the
            // statement was described (the client expects those columns).
            if let Output::Rows(rows) = self.sql.execute(&db, statement).await.map_err(pg_error)?
                && same_columns(&rows.schema(), plan)
            {
                return Ok(rows);
            }
            return self.sql.execute_bound(&db, plan).map_err(pg_error);
        }
        // Positional order: $1, $2, ... (the map has no order).
        let mut inferred: Vec<(u32, Option<DataType>)> = types
            .into_iter()
            .map(|(id, t)| (id.trim_start_matches('$').parse().unwrap_or(u32::MAX), t))
            .collect();
        inferred.sort_by_key(|(n, _)| *n);
        let inferred: Vec<Option<&DataType>> = inferred.iter().map(|(_, t)| t.as_ref()).collect();
        // The types the client was told when it described the statement.
        let told = self
            .service
            .query_parser()
            .get_parameter_types(&portal.statement.statement)?;
        let told: Vec<Option<&Type>> = told.iter().map(Some).collect();
        let values = deserialize_parameters_with_server_types(portal, &inferred, &told)?;
        let bound = plan
            .clone()
            .replace_params_with_values(&values)
            .map_err(df_error)?;
        self.sql.execute_bound(&db, &bound).map_err(pg_error)
    }
}

fn df_error(e: datafusion::error::DataFusionError) -> PgWireError {
    pg_error(Error::from(e))
}

/// Whether `rows` has the columns (names and types) `plan` describes.
fn same_columns(rows: &datafusion::arrow::datatypes::Schema, plan: &LogicalPlan) -> bool {
    let described = plan.schema().as_arrow();
    rows.fields().len() == described.fields().len()
        && rows
            .fields()
            .iter()
            .zip(described.fields().iter())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
}

#[async_trait]
impl ExtendedQueryHandler for SealionExtended {
    type Statement = DfStatement;
    type QueryParser = <DfSessionService as ExtendedQueryHandler>::QueryParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.service.query_parser()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo
            + ClientPortalStore
            + futures::Sink<PgWireBackendMessage>
            + Unpin
            + Send
            + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: std::fmt::Debug,
        PgWireError: From<<C as futures::Sink<PgWireBackendMessage>>::Error>,
    {
        let service = &*self.service;
        let (_, Some((statement, plan))) = &portal.statement.statement else {
            return ExtendedQueryHandler::do_query(service, client, portal, max_rows).await;
        };
        // Queries, and EXPLAIN (whose ANALYZE runs the query).
        if !matches!(statement, Statement::Query(_) | Statement::Explain { .. }) {
            return ExtendedQueryHandler::do_query(service, client, portal, max_rows).await;
        }
        if client.transaction_status() == TransactionStatus::Error {
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "ERROR".to_string(),
                "25P02".to_string(),
                "current transaction is aborted, commands ignored until end of transaction block"
                    .to_string(),
            ))));
        }
        let deadline = self.sql.deadline(statement_timeout(&*client));
        let rows = self.rows(&*client, portal, statement, plan).await?;
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        encode_rows(rows, options, &portal.result_column_format, deadline)
            .await
            .map(Response::Query)
    }
}

/// The simple protocol (one `Query` message: psql, and drivers' plain
/// `execute` without parameters) as datafusion-postgres serves it, but for
/// an `INSERT ... VALUES` of literals alone into a Sealion table (one
/// statement, outside an aborted transaction): that is parsed by
/// sqlparser's PostgreSQL dialect alone and written straight away, as the
/// first hook ([`SealionHook`]) would write it. Its rows are read from the
/// tokens of its text when they are plain (`insert::text_rows`), else
/// from the statement sqlparser parses.
///
/// datafusion-postgres's parser, made for the queries of psql, drivers and
/// BI tools on `pg_catalog`, runs a dozen rewrite rules over every
/// statement, each a walk of its whole syntax tree, after a pass over its
/// tokens; for a 1,000-row INSERT (21,000 literals) that was nine tenths of
/// the statement's time. None of those rules changes a literal value or a
/// table name that is not `pg_catalog`'s; any statement this path does not
/// take (a query, an INSERT with an expression, a cast, a parameter,
/// several statements) goes to datafusion-postgres as before.
pub struct SealionSimple {
    service: Arc<DfSessionService>,
    sql: Arc<SqlEngine>,
}

/// The one statement of `query` when it is an `INSERT`, by sqlparser's
/// PostgreSQL dialect.
fn lone_insert(query: &str) -> Option<Statement> {
    let head = query.trim_start().get(..6)?;
    if !head.eq_ignore_ascii_case("insert") {
        return None;
    }
    let dialect = datafusion::sql::sqlparser::dialect::PostgreSqlDialect {};
    let mut statements =
        datafusion::sql::sqlparser::parser::Parser::parse_sql(&dialect, query).ok()?;
    match (statements.pop(), statements.is_empty()) {
        (Some(insert @ Statement::Insert(_)), true) => Some(insert),
        _ => None,
    }
}

#[async_trait]
impl SimpleQueryHandler for SealionSimple {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo
            + ClientPortalStore
            + futures::Sink<PgWireBackendMessage>
            + Unpin
            + Send
            + Sync,
        C::PortalStore: PortalStore,
        C::Error: std::fmt::Debug,
        PgWireError: From<<C as futures::Sink<PgWireBackendMessage>>::Error>,
    {
        if client.transaction_status() != TransactionStatus::Error {
            let db = database_of(&*client);
            let mut written = self.sql.execute_insert_text(&db, query).await;
            if written.is_none()
                && let Some(insert) = lone_insert(query)
            {
                written = self.sql.execute_direct_insert(&db, &insert).await;
            }
            if let Some(written) = written {
                return match written {
                    Ok(Output::Affected { tag, rows }) => Ok(vec![affected(&tag, rows)]),
                    Ok(Output::Rows(_)) => Err(pg_error(Error::Internal(
                        "an INSERT answered with rows".into(),
                    ))),
                    Err(e) => Err(pg_error(e)),
                };
            }
        }
        SimpleQueryHandler::do_query(&*self.service, client, query).await
    }
}

pub struct PgHandlers {
    simple: Arc<SealionSimple>,
    extended: Arc<SealionExtended>,
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
        let service = Arc::new(DfSessionService::new_with_hooks(ctx, hooks));
        PgHandlers {
            simple: Arc::new(SealionSimple {
                service: service.clone(),
                sql: sql.clone(),
            }),
            extended: Arc::new(SealionExtended { service, sql }),
            startup: Arc::new(Startup {
                connections: connections.clone(),
            }),
            cancel: Arc::new(DefaultCancelHandler::new(connections)),
        }
    }
}

impl PgWireServerHandlers for PgHandlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.simple.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.extended.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        self.cancel.clone()
    }
}
