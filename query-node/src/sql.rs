//! The SQL front of a query node, shared by HTTP and the PostgreSQL wire.
//!
//! DataFusion plans and runs queries and `INSERT`s. Statements that change
//! the catalog (`CREATE TABLE` with a time column and tags, `DROP TABLE`,
//! `CREATE DATABASE`) and Sealion's `SHOW` statements are handled here,
//! through meta, because the catalog lives in meta and not in DataFusion.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, StringArray};
use arrow::datatypes::{DataType as ArrowType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionState;
use datafusion::execution::memory_pool::{GreedyMemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::optimizer::{Optimizer, OptimizerRule};
use datafusion::physical_plan::execute_stream;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    ColumnOption, CreateTableOptions, Expr as SqlExpr, Ident, ObjectName, ObjectType, SqlOption,
    Statement, TableConstraint, Value as SqlValue,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use futures::StreamExt;
use sealion_common::catalog::{DEFAULT_DATABASE, find_table, kind_name, type_name};
use sealion_common::catalog::{MAX_REPLICATION_FACTOR, MAX_SHARDS};
use sealion_common::proto::meta_command::Cmd;
use sealion_common::proto::{
    Column, ColumnKind, CreateDatabase, CreateTable, DataType, DropDatabase, DropPartitionsRequest,
    DropTable, Table,
};
use sealion_common::time::{DEFAULT_PARTITION_INTERVAL_NS, parse_duration_ns};

use crate::catalog::{CATALOG, SealionCatalog, Shared};
use crate::plan_cache::PhysicalSlot;
use crate::{Error, Result};

/// Longest SQL text accepted, in bytes.
pub const MAX_SQL_BYTES: usize = 1 << 20;

pub enum Output {
    /// Rows to stream back.
    Rows(Rows),
    /// A statement that changed something: the command tag and row count.
    Affected { tag: String, rows: u64 },
}

/// The rows of a statement, not yet run.
pub enum Rows {
    /// An optimized plan in a session state of the query's own (a copy of
    /// the shared one), run with a task context that carries the query's
    /// memory pool.
    /// The shared state is not rebuilt per query (`SessionStateBuilder`
    /// would register every function again).
    Planned {
        state: Arc<SessionState>,
        plan: LogicalPlan,
        runtime: Arc<RuntimeEnv>,
        /// Where the physical plan of a kept plan is kept
        /// ([`crate::plan_cache`]): taken from there when it was made in
        /// `state`, else made and put there.
        physical: Option<Arc<PhysicalSlot>>,
    },
    /// What DataFusion's own context runs (DDL and session statements) and
    /// fixed rows.
    Frame(DataFrame),
}

impl Rows {
    pub fn schema(&self) -> SchemaRef {
        match self {
            Rows::Planned { plan, .. } => Arc::new(plan.schema().as_arrow().clone()),
            Rows::Frame(df) => Arc::new(df.schema().as_arrow().clone()),
        }
    }

    /// Plans the rows physically and starts them.
    pub async fn execute_stream(self) -> Result<SendableRecordBatchStream> {
        self.start(None).await
    }

    /// [`Rows::execute_stream`], its operators told the query's deadline
    /// (a scan run in place stops there by itself).
    async fn start(self, deadline: Option<Instant>) -> Result<SendableRecordBatchStream> {
        match self {
            Rows::Planned {
                state,
                plan,
                runtime,
                physical,
            } => {
                let kept = physical.as_ref().and_then(|slot| slot.get(&state));
                let plan = match kept {
                    Some(template) => {
                        metrics::counter!("sealion_query_physical_plans_reused_total").increment(1);
                        reset_plan_states(template)?
                    }
                    None => {
                        let plan = state
                            .query_planner()
                            .create_physical_plan(&plan, state.as_ref())
                            .await?;
                        if let Some(slot) = &physical {
                            // The kept copy is never run: runs take copies.
                            slot.put(Arc::clone(&state), reset_plan_states(Arc::clone(&plan))?);
                        }
                        plan
                    }
                };
                Ok(execute_stream(
                    plan,
                    task_context(&state, runtime, deadline),
                )?)
            }
            Rows::Frame(df) => Ok(df.execute_stream().await?),
        }
    }

    pub async fn collect(self) -> Result<Vec<RecordBatch>> {
        self.collect_by(None).await
    }

    /// [`Rows::execute_stream`], held to `deadline` (see
    /// [`SqlEngine::deadline`]): planning must end before it, and the
    /// stream ends with [`Error::Timeout`] once it passes, which drops the
    /// plan and so cancels the query's work here and on storage nodes.
    pub async fn execute_stream_by(
        self,
        deadline: Option<Instant>,
    ) -> Result<SendableRecordBatchStream> {
        let Some(at) = deadline else {
            return self.execute_stream().await;
        };
        let deadline = tokio::time::Instant::from_std(at);
        let stream = tokio::time::timeout_at(deadline, self.start(Some(at)))
            .await
            .map_err(|_| timed_out())??;
        let schema = stream.schema();
        let bounded = futures::stream::unfold(Some(stream), move |left| async move {
            let mut stream = left?;
            tokio::select! {
                biased;
                item = stream.next() => item.map(|item| (item, Some(stream))),
                () = tokio::time::sleep_until(deadline) => Some((
                    Err(datafusion::error::DataFusionError::External(Box::new(timed_out()))),
                    None,
                )),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, bounded)))
    }

    /// Every batch, held to `deadline` as [`Rows::execute_stream_by`] is.
    pub async fn collect_by(self, deadline: Option<Instant>) -> Result<Vec<RecordBatch>> {
        let stream = self.execute_stream_by(deadline).await?;
        Ok(datafusion::physical_plan::common::collect(stream).await?)
    }
}

pub(crate) fn timed_out() -> Error {
    Error::Timeout(
        "canceling statement due to statement timeout (--query-timeout-secs, or the \
         session's statement_timeout)"
            .to_string(),
    )
}

/// The context a query's operators run in: the session's id and options,
/// the query's own runtime (its memory pool) and its deadline
/// ([`crate::scan_exec::QueryDeadline`]).
///
/// It carries no function registry. Operators never look functions up
/// while they run (planning resolved every call to its implementation),
/// and `TaskContext::from(&SessionState)` copies the registry, some 600
/// names, for every query: with the copy of the whole state that planning
/// needs, more than a small answer costs.
fn task_context(
    state: &SessionState,
    runtime: Arc<RuntimeEnv>,
    deadline: Option<Instant>,
) -> Arc<TaskContext> {
    let mut config = state.config().clone();
    if let Some(at) = deadline {
        config = config.with_extension(Arc::new(crate::scan_exec::QueryDeadline(at)));
    }
    Arc::new(TaskContext::new(
        None,
        state.session_id().to_string(),
        config,
        Default::default(),
        Default::default(),
        Default::default(),
        Default::default(),
        runtime,
    ))
}

/// Databases whose session state [`ReusedStates`] keeps at most (one
/// state holds every function's name, some 100 KB); a full map is emptied
/// before the next one goes in.
pub const MAX_REUSED_STATES: usize = 256;

/// Per database, a session state made once from the shared one (with that
/// database as the default schema) for the plans of the plan cache to run
/// in, instead of a copy per query: a copy is every function's name and
/// every option, more than a small answer costs.
///
/// Only for kept plans: they call no function whose answer depends on the
/// query's start time (see `plan_cache::reusable`), which is what a fresh
/// copy would set. A state is made again once the shared options have
/// changed: each entry holds the `Arc` of the options it was made from, so
/// a change to the shared ones (`Arc::make_mut`) copies them and the
/// pointers differ.
#[derive(Default)]
pub struct ReusedStates {
    states: std::sync::Mutex<
        std::collections::HashMap<
            String,
            (Arc<datafusion::config::ConfigOptions>, Arc<SessionState>),
        >,
    >,
}

impl ReusedStates {
    /// The state kept for `db`, or `make()`'s, kept, when there is none or
    /// the shared options of `ctx` changed since it was made.
    pub fn get(
        &self,
        ctx: &SessionContext,
        db: &str,
        make: impl FnOnce() -> SessionState,
    ) -> Arc<SessionState> {
        let options = Arc::clone(ctx.state_ref().read().config().options());
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((from, state)) = states.get(db)
            && Arc::ptr_eq(from, &options)
        {
            return Arc::clone(state);
        }
        if states.len() >= MAX_REUSED_STATES {
            states.clear();
        }
        let state = Arc::new(make());
        states.insert(db.to_string(), (options, Arc::clone(&state)));
        state
    }
}

pub struct SqlEngine {
    pub ctx: SessionContext,
    pub shared: Shared,
    /// Most bytes one query's operators may reserve (0: no limit).
    pub memory_limit: u64,
    /// Longest one query may run (`None`: no limit); a session may ask
    /// for less ([`SqlEngine::deadline`]).
    pub query_timeout: Option<Duration>,
    /// Optimized plans of repeated queries (crate::plan_cache).
    pub plans: crate::plan_cache::PlanCache,
    /// Statements of repeated SQL texts (crate::plan_cache).
    pub parsed: crate::plan_cache::ParseCache,
    /// Session states that plans from `plans` run in.
    states: ReusedStates,
}

/// Who runs a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// Catalog statements: run by Sealion, through meta.
    Sealion,
    /// Planned and run by DataFusion.
    DataFusion,
}

pub fn handling(stmt: &Statement) -> Handling {
    match stmt {
        Statement::CreateTable(_)
        | Statement::CreateSchema { .. }
        | Statement::CreateDatabase { .. }
        | Statement::ShowTables { .. }
        | Statement::ShowColumns { .. }
        | Statement::ShowDatabases { .. }
        | Statement::ShowSchemas { .. } => Handling::Sealion,
        Statement::Drop { object_type, .. }
            if matches!(
                object_type,
                ObjectType::Table | ObjectType::Schema | ObjectType::Database
            ) =>
        {
            Handling::Sealion
        }
        _ => Handling::DataFusion,
    }
}

/// Parses `sql` (PostgreSQL dialect) into statements.
pub fn parse(sql: &str) -> Result<Vec<Statement>> {
    if sql.len() > MAX_SQL_BYTES {
        return Err(Error::TooLarge(format!(
            "SQL text of {} bytes is over the limit of {MAX_SQL_BYTES}",
            sql.len()
        )));
    }
    Parser::parse_sql(&PostgreSqlDialect {}, sql).map_err(|e| Error::Syntax(e.to_string()))
}

/// An identifier as DataFusion would see it: unquoted names are lowercased.
fn normalize(ident: &Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// (database, table) of a possibly qualified name.
fn split_name(name: &ObjectName, default_db: &str) -> Result<(String, String)> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| {
            p.as_ident()
                .map(normalize)
                .ok_or_else(|| Error::Invalid(format!("bad name {name}")))
        })
        .collect::<Result<_>>()?;
    match parts.as_slice() {
        [t] => Ok((default_db.to_string(), t.clone())),
        [d, t] => Ok((d.clone(), t.clone())),
        [_, d, t] => Ok((d.clone(), t.clone())),
        _ => Err(Error::Invalid(format!("bad table name {name}"))),
    }
}

fn sql_type(text: &str) -> Result<DataType> {
    let t = text.to_ascii_uppercase();
    let base = t.split('(').next().unwrap_or("").trim();
    Ok(match base {
        "TIMESTAMP"
        | "TIMESTAMPTZ"
        | "TIMESTAMP WITH TIME ZONE"
        | "TIMESTAMP WITHOUT TIME ZONE" => DataType::Timestamp,
        "TEXT" | "VARCHAR" | "STRING" | "CHAR" | "CHARACTER VARYING" | "CHARACTER" => {
            DataType::String
        }
        "DOUBLE" | "DOUBLE PRECISION" | "FLOAT" | "FLOAT8" | "FLOAT64" | "REAL" | "FLOAT4" => {
            DataType::Float64
        }
        "BIGINT" | "INT" | "INTEGER" | "INT8" | "INT4" | "SMALLINT" | "INT2" | "INT64" => {
            DataType::Int64
        }
        "BIGINT UNSIGNED" | "UBIGINT" | "UINT64" | "INT UNSIGNED" | "INTEGER UNSIGNED" => {
            DataType::Uint64
        }
        "BOOLEAN" | "BOOL" => DataType::Bool,
        _ => {
            return Err(Error::NotSupported(format!(
                "column type {text}; use TIMESTAMP, TEXT, DOUBLE, BIGINT, BIGINT UNSIGNED or BOOLEAN"
            )));
        }
    })
}

/// A table option that counts something, from 1 to `max`.
fn count_option(name: &str, v: &str, max: u32) -> Result<u32> {
    match v.trim().parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(Error::Invalid(format!(
            "{name} must be a whole number from 1 to {max}, not {v:?}"
        ))),
    }
}

fn option_text(value: &SqlExpr) -> Result<String> {
    match value {
        SqlExpr::Value(v) => match &v.value {
            SqlValue::SingleQuotedString(s) | SqlValue::DoubleQuotedString(s) => Ok(s.clone()),
            SqlValue::Number(n, _) => Ok(n.clone()),
            other => Ok(other.to_string()),
        },
        SqlExpr::Identifier(i) => Ok(i.value.clone()),
        other => Err(Error::Invalid(format!(
            "table option value {other} must be a string"
        ))),
    }
}

/// Translates `CREATE TABLE` into a Sealion table.
///
/// The time column is the one TIMESTAMP column (or, if there are several,
/// the one named `time`). Tags are the other columns of the PRIMARY KEY
/// (`PRIMARY KEY (host, region, time)`), or those listed in the option
/// `tags = 'host,region'`; every other column is a field. Options:
/// `partition_interval` (default 1 day), `retention` (default none),
/// `shards` (per time partition, default 1, at most `MAX_SHARDS`), and
/// `replication_factor` (default: the cluster's).
pub fn table_from_create(stmt: &Statement, default_db: &str) -> Result<(Table, bool)> {
    let Statement::CreateTable(ct) = stmt else {
        return Err(Error::Internal("not a CREATE TABLE".into()));
    };
    if ct.query.is_some() {
        return Err(Error::NotSupported("CREATE TABLE ... AS SELECT".into()));
    }
    let (database, name) = split_name(&ct.name, default_db)?;
    let mut key: Vec<String> = Vec::new();
    for c in &ct.constraints {
        if let TableConstraint::PrimaryKey(pk) = c {
            for ic in &pk.columns {
                key.push(match &ic.column.expr {
                    SqlExpr::Identifier(i) => normalize(i),
                    other => {
                        return Err(Error::Invalid(format!(
                            "PRIMARY KEY part {other} must be a column"
                        )));
                    }
                });
            }
        }
    }
    let mut columns: Vec<Column> = Vec::new();
    for cd in &ct.columns {
        let cname = normalize(&cd.name);
        let data_type = sql_type(&cd.data_type.to_string())?;
        if cd
            .options
            .iter()
            .any(|o| matches!(o.option, ColumnOption::PrimaryKey(_)))
        {
            key.push(cname.clone());
        }
        if columns.iter().any(|c| c.name == cname) {
            return Err(Error::Invalid(format!("column {cname} is declared twice")));
        }
        columns.push(Column {
            name: cname,
            kind: ColumnKind::Field as i32,
            data_type: data_type as i32,
        });
    }
    let mut interval = DEFAULT_PARTITION_INTERVAL_NS;
    let mut retention = 0i64;
    let mut shards = 1u32;
    let mut replication_factor = 0u32;
    let options: &[SqlOption] = match &ct.table_options {
        CreateTableOptions::With(o)
        | CreateTableOptions::Options(o)
        | CreateTableOptions::Plain(o) => o,
        _ => &[],
    };
    for o in options {
        let SqlOption::KeyValue { key: k, value } = o else {
            return Err(Error::Invalid(format!("unsupported table option {o}")));
        };
        let v = option_text(value)?;
        match k.value.to_ascii_lowercase().as_str() {
            "partition_interval" => interval = parse_duration_ns(&v)?,
            "retention" => retention = parse_duration_ns(&v)?,
            "replication_factor" => {
                replication_factor = count_option("replication_factor", &v, MAX_REPLICATION_FACTOR)?
            }
            "shards" => shards = count_option("shards", &v, MAX_SHARDS)?,
            "tags" => key.extend(
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty()),
            ),
            other => {
                return Err(Error::Invalid(format!(
                    "unknown table option {other}; known: partition_interval, replication_factor, retention, shards, tags"
                )));
            }
        }
    }
    let timestamps: Vec<usize> = columns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.data_type() == DataType::Timestamp)
        .map(|(i, _)| i)
        .collect();
    let time_idx = match timestamps.as_slice() {
        [] => {
            return Err(Error::Invalid(format!(
                "table {name} needs a TIMESTAMP column for time"
            )));
        }
        [i] => *i,
        many => *many
            .iter()
            .find(|&&i| columns[i].name == "time")
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "table {name} has several TIMESTAMP columns and none is named time"
                ))
            })?,
    };
    columns[time_idx].kind = ColumnKind::Time as i32;
    for k in &key {
        let Some(c) = columns.iter_mut().find(|c| &c.name == k) else {
            return Err(Error::ColumnNotFound(format!(
                "{k} (named in PRIMARY KEY or tags)"
            )));
        };
        if c.kind() == ColumnKind::Time {
            continue;
        }
        if c.data_type() != DataType::String {
            return Err(Error::Invalid(format!(
                "tag column {k} must be TEXT, not {}",
                type_name(c.data_type())
            )));
        }
        c.kind = ColumnKind::Tag as i32;
    }
    // The time column first, as tables that line protocol creates have it.
    let time = columns.remove(time_idx);
    columns.insert(0, time);
    Ok((
        Table {
            id: 0,
            database,
            name,
            columns,
            partition_interval_ns: interval,
            retention_ns: retention,
            schema_version: 0,
            shards,
            replication_factor,
        },
        ct.if_not_exists,
    ))
}

/// DataFusion's rules with Sealion's gap filling and aggregate pushdown
/// placed after filters are pushed down and before `count(DISTINCT)` is
/// rewritten into two aggregations (which the nodes would no longer recognize), and the
/// time-order and bucket-limit pushdowns last, once limits sit on their sorts.
fn optimizer_rules() -> Vec<Arc<dyn OptimizerRule + Send + Sync>> {
    let mut rules = Optimizer::new().rules;
    let at = rules
        .iter()
        .position(|r| r.name() == "single_distinct_aggregation_to_group_by")
        .unwrap_or(rules.len());
    rules.insert(at, Arc::new(crate::aggregate::AggregatePushdown));
    rules.insert(at, Arc::new(crate::gapfill::GapFillRule));
    rules.push(Arc::new(crate::topn::TimeOrderPushdown));
    rules.push(Arc::new(crate::aggregate::BucketLimitPushdown));
    rules.push(Arc::new(crate::topn::LastPointPushdown));
    rules.push(Arc::new(crate::topn::SeriesLimitPushdown));
    rules
}

impl SqlEngine {
    pub fn new(
        shared: Shared,
        memory_limit: u64,
        query_timeout: Option<Duration>,
    ) -> Result<Arc<Self>> {
        let config = SessionConfig::new()
            .with_create_default_catalog_and_schema(false)
            .with_default_catalog_and_schema(CATALOG, DEFAULT_DATABASE)
            .with_information_schema(true);
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_query_planner(Arc::new(crate::aggregate::SealionQueryPlanner))
            .with_optimizer_rules(optimizer_rules())
            .with_physical_optimizer_rule(Arc::new(crate::sorted_runs::SortedRunsRule))
            .build();
        let ctx = SessionContext::new_with_state(state);
        // `time_bucket` is `date_bin` under the name TimescaleDB users know.
        ctx.register_udf(crate::aggregate::date_bin_udf().as_ref().clone());
        for f in crate::functions::first_last() {
            ctx.register_udaf(f);
        }
        for f in crate::gapfill::udfs() {
            ctx.register_udf(f);
        }
        ctx.register_udtf(
            "asof_join",
            Arc::new(crate::asof::AsofJoinFunction {
                shared: shared.clone(),
            }),
        );
        ctx.register_catalog(CATALOG, Arc::new(SealionCatalog::new(shared.clone())));
        datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog(
            &ctx,
            CATALOG,
            datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider,
        )
        .map_err(|e| Error::Internal(format!("pg_catalog: {e}")))?;
        Ok(Arc::new(SqlEngine {
            ctx,
            shared,
            memory_limit,
            query_timeout,
            plans: Default::default(),
            parsed: Default::default(),
            states: Default::default(),
        }))
    }

    /// When a query started now must have ended: the node's limit or the
    /// session's (`SET statement_timeout` over pgwire), whichever is
    /// shorter. A session can shorten the node's limit, never lift it.
    pub fn deadline(&self, session: Option<Duration>) -> Option<Instant> {
        let limit = match (self.query_timeout, session) {
            (Some(node), Some(session)) => Some(node.min(session)),
            (node, session) => node.or(session),
        };
        limit.map(|l| Instant::now() + l)
    }

    /// A session state whose unqualified table names resolve in `db` (a
    /// copy of the shared state; `now()` is fixed at this call).
    pub fn state_for(&self, db: &str) -> SessionState {
        let mut state = self.ctx.state();
        state.config_mut().options_mut().catalog.default_schema = db.to_string();
        state
    }

    /// The runtime one query runs in: a memory pool of its own, so that one
    /// query cannot take another's memory and one over its limit fails
    /// alone.
    fn runtime_for(&self, state: &SessionState) -> Arc<RuntimeEnv> {
        let shared = state.runtime_env().clone();
        if self.memory_limit == 0 {
            return shared;
        }
        let limit = usize::try_from(self.memory_limit).unwrap_or(usize::MAX);
        let pool = TrackConsumersPool::new(
            GreedyMemoryPool::new(limit),
            std::num::NonZeroUsize::new(3).expect("3 is not zero"),
        );
        RuntimeEnvBuilder::from_runtime_env(&shared)
            .with_memory_pool(Arc::new(pool))
            .build_arc()
            .unwrap_or_else(|e| {
                // Keeping the shared runtime is safe; it only loses the limit.
                tracing::warn!("query memory pool: {e}");
                shared
            })
    }

    /// Plans a statement that DataFusion runs.
    pub async fn plan(&self, db: &str, stmt: &Statement) -> Result<(SessionState, LogicalPlan)> {
        let state = self.state_for(db);
        let plan = state
            .statement_to_plan(DfStatement::Statement(Box::new(stmt.clone())))
            .await?;
        Ok((state, plan))
    }

    /// The rows of a query a client prepared (the extended protocol), its
    /// parameters bound: optimized in a fresh copy of the database's state
    /// (a fresh start time for `now()`) and run in a memory pool of its
    /// own, as [`SqlEngine::execute`] runs a query.
    pub fn execute_bound(&self, db: &str, plan: &LogicalPlan) -> Result<Rows> {
        let state = self.state_for(db);
        let plan = state.optimize(plan)?;
        let runtime = self.runtime_for(&state);
        Ok(Rows::Planned {
            state: Arc::new(state),
            plan,
            runtime,
            physical: None,
        })
    }

    /// Whether `stmt` is an INSERT of literal rows that
    /// [`SqlEngine::execute`] writes without a DataFusion plan.
    pub fn direct_insert(&self, db: &str, stmt: &Statement) -> bool {
        matches!(stmt, Statement::Insert(insert)
            if crate::insert::literal_rows(&self.shared.meta.state(), db, insert).is_some())
    }

    /// Writes `stmt` when it is an INSERT of literal rows (see
    /// [`SqlEngine::direct_insert`]); `None`, having done nothing, when it
    /// is not.
    pub async fn execute_direct_insert(
        &self,
        db: &str,
        stmt: &Statement,
    ) -> Option<Result<Output>> {
        let Statement::Insert(insert) = stmt else {
            return None;
        };
        let (table, batch) = crate::insert::literal_rows(&self.shared.meta.state(), db, insert)?;
        Some(self.write_literals(&table, batch).await)
    }

    /// Writes the text `sql` when it is an INSERT of literal rows that
    /// [`crate::insert::text_rows`] reads without parsing it; `None`,
    /// having done nothing, when it is not.
    pub async fn execute_insert_text(&self, db: &str, sql: &str) -> Option<Result<Output>> {
        let (table, batch) = crate::insert::text_rows(&self.shared.meta.state(), db, sql)?;
        Some(self.write_literals(&table, batch).await)
    }

    async fn write_literals(
        &self,
        table: &sealion_common::proto::Table,
        batch: RecordBatch,
    ) -> Result<Output> {
        let rows = self.shared.router.write(table, batch).await?;
        Ok(Output::Affected {
            tag: "INSERT".into(),
            rows,
        })
    }

    /// Runs one statement against database `db`.
    pub async fn execute(&self, db: &str, stmt: &Statement) -> Result<Output> {
        if handling(stmt) == Handling::Sealion {
            return self.execute_catalog(db, stmt).await;
        }
        // Rows of literals go straight to the router (crate::insert).
        if let Some(written) = self.execute_direct_insert(db, stmt).await {
            return written;
        }
        // Read before planning: a plan is kept under the version it cannot
        // be older than.
        let version = self.shared.meta.state().version;
        let (state, plan, physical) = match self.plans.get(version, db, stmt) {
            Some((plan, physical)) => {
                metrics::counter!("sealion_query_plans_reused_total").increment(1);
                let state = self.states.get(&self.ctx, db, || self.state_for(db));
                (state, plan, Some(physical))
            }
            None => {
                let (state, plan) = self.plan(db, stmt).await?;
                if matches!(plan, LogicalPlan::Ddl(_) | LogicalPlan::Statement(_)) {
                    // DataFusion's context runs these itself (on a copy of
                    // the state: they change nothing shared).
                    let ctx = SessionContext::new_with_state(state);
                    return Ok(Output::Rows(Rows::Frame(
                        ctx.execute_logical_plan(plan).await?,
                    )));
                }
                let keep = crate::plan_cache::reusable(stmt, &plan);
                let optimized = state.optimize(&plan)?;
                let physical = if keep {
                    self.plans.put(version, db, stmt, optimized.clone())
                } else {
                    None
                };
                // A kept plan is planned physically in the state that its
                // repeats run in, so that they can take its physical plan.
                let state = match physical {
                    Some(_) => self.states.get(&self.ctx, db, || self.state_for(db)),
                    None => Arc::new(state),
                };
                (state, optimized, physical)
            }
        };
        let runtime = self.runtime_for(&state);
        let rows = Rows::Planned {
            state,
            plan,
            runtime,
            physical,
        };
        if matches!(stmt, Statement::Insert(_) | Statement::Delete(_)) {
            let tag = if matches!(stmt, Statement::Insert(_)) {
                "INSERT"
            } else {
                "DELETE"
            };
            let batches = rows.collect().await?;
            let rows = batches
                .first()
                .and_then(|b| b.column_by_name("count"))
                .and_then(|c| c.as_any().downcast_ref::<arrow::array::UInt64Array>())
                .map_or(0, |a| a.value(0));
            return Ok(Output::Affected {
                tag: tag.into(),
                rows,
            });
        }
        Ok(Output::Rows(rows))
    }

    fn rows(&self, fields: Vec<(&str, Vec<String>)>) -> Result<Output> {
        let schema = Arc::new(Schema::new(
            fields
                .iter()
                .map(|(n, _)| Field::new(*n, ArrowType::Utf8, false))
                .collect::<Vec<_>>(),
        ));
        let arrays: Vec<ArrayRef> = fields
            .into_iter()
            .map(|(_, v)| Arc::new(StringArray::from(v)) as ArrayRef)
            .collect();
        let batch = RecordBatch::try_new(schema, arrays)?;
        Ok(Output::Rows(Rows::Frame(self.ctx.read_batch(batch)?)))
    }

    async fn execute_catalog(&self, db: &str, stmt: &Statement) -> Result<Output> {
        let meta = &self.shared.meta;
        match stmt {
            Statement::CreateTable(_) => {
                let (table, if_not_exists) = table_from_create(stmt, db)?;
                meta.propose(Cmd::CreateTable(CreateTable {
                    table: Some(table),
                    if_not_exists,
                }))
                .await
                .map_err(|e| match e {
                    sealion_common::Error::Rejected { kind, message } if kind == "not_found" => {
                        Error::DatabaseNotFound(message)
                    }
                    other => other.into(),
                })?;
                Ok(Output::Affected {
                    tag: "CREATE TABLE".into(),
                    rows: 0,
                })
            }
            Statement::CreateSchema {
                schema_name,
                if_not_exists,
                ..
            } => {
                let name = schema_name.to_string().trim_matches('"').to_string();
                meta.propose(Cmd::CreateDatabase(CreateDatabase {
                    name,
                    if_not_exists: *if_not_exists,
                }))
                .await?;
                Ok(Output::Affected {
                    tag: "CREATE SCHEMA".into(),
                    rows: 0,
                })
            }
            Statement::CreateDatabase {
                db_name,
                if_not_exists,
                ..
            } => {
                let (_, name) = split_name(db_name, db)?;
                meta.propose(Cmd::CreateDatabase(CreateDatabase {
                    name,
                    if_not_exists: *if_not_exists,
                }))
                .await?;
                Ok(Output::Affected {
                    tag: "CREATE DATABASE".into(),
                    rows: 0,
                })
            }
            Statement::Drop {
                object_type,
                if_exists,
                names,
                ..
            } => {
                for name in names {
                    match object_type {
                        ObjectType::Table => self.drop_table(db, name, *if_exists).await?,
                        _ => {
                            let (_, dbname) = split_name(name, db)?;
                            let doomed = self.partitions_of(|t| t.database == dbname);
                            meta.propose(Cmd::DropDatabase(DropDatabase {
                                name: dbname,
                                if_exists: *if_exists,
                            }))
                            .await?;
                            self.drop_on_storage(doomed).await;
                        }
                    }
                }
                Ok(Output::Affected {
                    tag: format!("DROP {}", object_type.to_string().to_uppercase()),
                    rows: 0,
                })
            }
            Statement::ShowTables { .. } => {
                let state = meta.state();
                let mut names: Vec<String> = state
                    .tables
                    .iter()
                    .filter(|t| t.database == db)
                    .map(|t| t.name.clone())
                    .collect();
                names.sort();
                self.rows(vec![("table_name", names)])
            }
            Statement::ShowDatabases { .. } | Statement::ShowSchemas { .. } => {
                let state = meta.state();
                let mut names: Vec<String> =
                    state.databases.iter().map(|d| d.name.clone()).collect();
                names.sort();
                self.rows(vec![("database", names)])
            }
            Statement::ShowColumns { .. } => {
                // `SHOW [FULL] COLUMNS FROM t [FROM db]`, read from the text so
                // it does not depend on the parser's structure for it.
                let text = stmt.to_string();
                let words: Vec<&str> = text.split_whitespace().collect();
                let from: Vec<usize> = words
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| w.eq_ignore_ascii_case("FROM") || w.eq_ignore_ascii_case("IN"))
                    .map(|(i, _)| i)
                    .collect();
                let name_at = from.first().map(|i| i + 1);
                let table_text = name_at
                    .and_then(|i| words.get(i))
                    .ok_or_else(|| Error::Syntax("SHOW COLUMNS needs FROM <table>".into()))?;
                let name = Parser::new(&PostgreSqlDialect {})
                    .try_with_sql(table_text)
                    .and_then(|mut p| p.parse_object_name(false))
                    .map_err(|e| Error::Syntax(e.to_string()))?;
                let (mut dbname, tname) = split_name(&name, db)?;
                if let Some(i) = from.get(1).and_then(|i| words.get(i + 1)) {
                    dbname = i.trim_matches('"').to_string();
                }
                let state = meta.state();
                let table = find_table(&state, &dbname, &tname)
                    .ok_or_else(|| Error::TableNotFound(format!("{dbname}.{tname}")))?;
                self.rows(vec![
                    (
                        "column_name",
                        table.columns.iter().map(|c| c.name.clone()).collect(),
                    ),
                    (
                        "data_type",
                        table
                            .columns
                            .iter()
                            .map(|c| type_name(c.data_type()).to_string())
                            .collect(),
                    ),
                    (
                        "kind",
                        table
                            .columns
                            .iter()
                            .map(|c| kind_name(c.kind()).to_string())
                            .collect(),
                    ),
                ])
            }
            other => Err(Error::NotSupported(format!("{other}"))),
        }
    }

    fn partitions_of(&self, pred: impl Fn(&Table) -> bool) -> Vec<(u64, Vec<u64>)> {
        let state = self.shared.meta.state();
        let ids: Vec<u64> = state
            .tables
            .iter()
            .filter(|t| pred(t))
            .map(|t| t.id)
            .collect();
        state
            .partitions
            .iter()
            .filter(|p| ids.contains(&p.table_id))
            .map(|p| (p.id, p.replicas.clone()))
            .collect()
    }

    async fn drop_table(&self, db: &str, name: &ObjectName, if_exists: bool) -> Result<()> {
        let (dbname, tname) = split_name(name, db)?;
        let doomed = self.partitions_of(|t| t.database == dbname && t.name == tname);
        self.shared
            .meta
            .propose(Cmd::DropTable(DropTable {
                database: dbname.clone(),
                table: tname.clone(),
                if_exists,
            }))
            .await
            .map_err(|e| {
                if e.is_not_found() {
                    Error::TableNotFound(format!("{dbname}.{tname}"))
                } else {
                    e.into()
                }
            })?;
        self.drop_on_storage(doomed).await;
        Ok(())
    }

    /// Deletes the rows of dropped partitions from the nodes that hold them.
    /// Best effort: meta no longer maps them, so they can never be read; a
    /// node that misses this keeps dead rows until the retention issue's
    /// sweeper removes unmapped partitions.
    async fn drop_on_storage(&self, partitions: Vec<(u64, Vec<u64>)>) {
        let state = self.shared.meta.state();
        let mut by_node: std::collections::HashMap<u64, Vec<u64>> = Default::default();
        for (pid, replicas) in partitions {
            for n in replicas {
                by_node.entry(n).or_default().push(pid);
            }
        }
        for (node_id, ids) in by_node {
            let Some(addr) = sealion_common::catalog::node(&state, node_id).map(|n| n.addr.clone())
            else {
                continue;
            };
            if let Ok(mut client) = self.shared.storage.storage(&addr) {
                if let Err(status) = client
                    .drop_partitions(DropPartitionsRequest { partition_ids: ids })
                    .await
                {
                    tracing::warn!(node_id, %status, "could not drop partitions on storage node");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(sql: &str) -> Result<Table> {
        let stmt = parse(sql)?.remove(0);
        table_from_create(&stmt, "public").map(|(t, _)| t)
    }

    #[test]
    fn create_table_marks_time_tags_and_fields() {
        let t = create(
            "CREATE TABLE cpu (host TEXT, region TEXT, usage DOUBLE, n BIGINT, ok BOOLEAN, \
             time TIMESTAMP NOT NULL, PRIMARY KEY (host, region, time)) WITH (partition_interval = '1h')",
        )
        .unwrap();
        assert_eq!(t.name, "cpu");
        assert_eq!(t.columns[0].name, "time");
        assert_eq!(t.columns[0].kind(), ColumnKind::Time);
        let kind = |n: &str| t.columns.iter().find(|c| c.name == n).unwrap().kind();
        assert_eq!(kind("host"), ColumnKind::Tag);
        assert_eq!(kind("region"), ColumnKind::Tag);
        assert_eq!(kind("usage"), ColumnKind::Field);
        assert_eq!(t.partition_interval_ns, 3_600_000_000_000);
    }

    #[test]
    fn reused_states_are_made_once_per_database_and_again_after_a_shared_change() {
        let ctx = SessionContext::new();
        let reused = ReusedStates::default();
        let made = std::cell::Cell::new(0);
        let state_for = |db: &str| {
            made.set(made.get() + 1);
            let mut state = ctx.state();
            state.config_mut().options_mut().catalog.default_schema = db.to_string();
            state
        };
        let a = reused.get(&ctx, "a", || state_for("a"));
        let again = reused.get(&ctx, "a", || state_for("a"));
        assert!(Arc::ptr_eq(&a, &again));
        let b = reused.get(&ctx, "b", || state_for("b"));
        assert_eq!(made.get(), 2);
        assert_eq!(a.config().options().catalog.default_schema, "a");
        assert_eq!(b.config().options().catalog.default_schema, "b");
        // A change to the shared options is seen: the state is made again.
        let before = a.config().options().optimizer.max_passes;
        ctx.state_ref()
            .write()
            .config_mut()
            .options_mut()
            .optimizer
            .max_passes = before + 7;
        let changed = reused.get(&ctx, "a", || state_for("a"));
        assert_eq!(made.get(), 3);
        assert_eq!(changed.config().options().optimizer.max_passes, before + 7);
        assert!(Arc::ptr_eq(
            &changed,
            &reused.get(&ctx, "a", || state_for("a"))
        ));
        // Bounded: past the limit the map starts again.
        for i in 0..MAX_REUSED_STATES + 1 {
            reused.get(&ctx, &format!("db{i}"), || state_for("x"));
        }
        assert!(reused.states.lock().unwrap().len() <= MAX_REUSED_STATES);
    }

    #[test]
    fn create_table_errors_name_the_problem() {
        let e = create("CREATE TABLE t (a TEXT)").unwrap_err().to_string();
        assert!(e.contains("TIMESTAMP"), "{e}");
        let e = create("CREATE TABLE t (time TIMESTAMP, n BIGINT, PRIMARY KEY (n, time))")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tag column n must be TEXT"), "{e}");
        let e = create("CREATE TABLE t (time TIMESTAMP, x INTERVAL)")
            .unwrap_err()
            .to_string();
        assert!(e.contains("INTERVAL"), "{e}");
        let e = create("CREATE TABLE t (time TIMESTAMP) WITH (colour = 'red')")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown table option colour"), "{e}");
        let e = create("CREATE TABLE t (time TIMESTAMP, PRIMARY KEY (nope, time))").unwrap_err();
        assert!(matches!(e, Error::ColumnNotFound(_)), "{e}");
    }
}
